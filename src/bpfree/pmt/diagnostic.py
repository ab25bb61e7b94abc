"""Gradient-quality diagnostic (PMT Fig. 4, 5, 8): cosine of ZO estimates with the BP gradient.

For each integer layer, the quantized ZO estimate of ``dL/dW`` (int8 weight units) is compared
with the BP gradient of the model's float twin in the same units
(:func:`bpfree.quant.float_twin`, fake-quantized with straight-through estimators, so it
differentiates the same quantized function the integer model computes). Schemes:

* ``wp-model`` / ``np-model``: every layer perturbed at once (Table 2, "model-wise");
* ``wp-layer`` / ``np-layer``: one layer at a time (§3.2.2, "layer-wise");
* ``adaptive``: layer-wise with WP where ``d_w < d_a`` and NP elsewhere (PMT's choice).

Budgets are equal per scheme (Fig. 5): a layer-wise scheme spends Q queries on each of the L
layers, so model-wise schemes get ``L * Q`` queries for the whole model.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..perturb import derive_seed
from ..plotting import pyplot, save_figure
from ..quant import float_twin
from .estimate import estimate_group
from ..quant.graph import StagedModel, find_layers, per_sample_loss

SCHEMES = ("wp-model", "wp-layer", "np-model", "np-layer", "adaptive")


def bp_gradients(qmodel, x: torch.Tensor, y: torch.Tensor, *, fake_quant: bool = True
                 ) -> dict[str, torch.Tensor]:
    """``dL/dW`` of each integer layer (int8 weight units, float64) by BP through the twin."""
    twin = float_twin(qmodel, fake_quant=fake_quant)
    twin.zero_grad(set_to_none=True)
    xf = x if x.dtype != torch.int8 else qmodel.input_quant.dequantize(x)
    loss = torch.nn.functional.cross_entropy(twin(xf), y)
    loss.backward()
    grads = {}
    for layer in find_layers(qmodel, x):
        grads[layer.name] = twin.get_submodule(layer.name).weight.grad.detach().to(torch.float64)
    return grads


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.reshape(-1), b.reshape(-1)
    denom = float(a.norm() * b.norm())
    return float(a @ b) / denom if denom > 0 else 0.0


def zo_gradients(qmodel, x: torch.Tensor, y: torch.Tensor, scheme: str, queries: int,
                 seed: int = 0) -> dict[str, torch.Tensor]:
    """The ZO weight-gradient estimate of every integer layer under ``scheme``."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    layers = find_layers(qmodel, x)
    staged = StagedModel(qmodel)
    xq = staged.quantize(x)
    clean = per_sample_loss(staged.clean(xq), y, qmodel.output_quant)
    indices = list(range(len(layers)))
    if scheme.endswith("-model"):
        mode = scheme.split("-")[0]
        est = estimate_group(staged, [(layer, mode) for layer in layers], indices, y, clean,
                             queries * len(layers), derive_seed(seed, 1))
        return {name: e.weight for name, e in est.items()}
    out = {}
    for i, layer in enumerate(layers):
        mode = layer.preferred_mode if scheme == "adaptive" else scheme.split("-")[0]
        est = estimate_group(staged, [(layer, mode)], [i], y, clean, queries,
                             derive_seed(seed, 1))
        out[layer.name] = est[layer.name].weight
    return out


def gradient_cosines(qmodel, x: torch.Tensor, y: torch.Tensor, *,
                     queries: tuple[int, ...] = (1, 10, 100), schemes=SCHEMES, seed: int = 0,
                     repeats: int = 1) -> dict:
    """Cosine similarity per scheme, Q and layer (mean over ``repeats`` seeds).

    Returns ``{"layers": [...], "d_w": [...], "d_a": [...], "cosine": {scheme: {Q: [per
    layer]}}}``.
    """
    if repeats < 1 or any(q < 1 for q in queries):
        raise ValueError(f"repeats and every Q must be >= 1, got {repeats} and {queries}")
    layers = find_layers(qmodel, x)
    reference = bp_gradients(qmodel, x, y)
    table: dict = {}
    for scheme in schemes:
        table[scheme] = {}
        for q in queries:
            sums = [0.0] * len(layers)
            for r in range(repeats):
                est = zo_gradients(qmodel, x, y, scheme, q, seed=derive_seed(seed, r))
                for i, layer in enumerate(layers):
                    sums[i] += _cosine(est[layer.name], reference[layer.name])
            table[scheme][q] = [s / repeats for s in sums]
    return {"layers": [l.name for l in layers], "d_w": [l.d_w for l in layers],
            "d_a": [l.d_a for l in layers], "cosine": table}


def plot_cosines(result: dict, path: str | Path) -> Path:
    """Fig. 5 analogue: per-layer cosine of each scheme, one panel per Q; writes a PNG."""
    plt = pyplot()

    qs = sorted({q for per_q in result["cosine"].values() for q in per_q})
    fig, axes = plt.subplots(1, len(qs), figsize=(4.2 * len(qs), 3.4), sharey=True,
                             squeeze=False)
    idx = list(range(1, len(result["layers"]) + 1))
    for ax, q in zip(axes[0], qs):
        for scheme, per_q in result["cosine"].items():
            if q in per_q:
                ax.plot(idx, per_q[q], marker="o", ms=3, label=scheme)
        ax.set_title(f"Q = {q} per layer")
        ax.set_xlabel("integer layer (input -> output)")
        ax.axhline(0, color="grey", lw=0.5)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("cosine(ZO, BP)")
    axes[0][-1].legend(fontsize=7)
    return save_figure(fig, path)
