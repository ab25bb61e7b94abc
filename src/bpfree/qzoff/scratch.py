"""QZO-FF Figures 3 / 4: scratch vs weight memory of BP and forward-gradient training.

QZO-FF (Feng et al., NeurIPS 2024) App. B.1 / B.2 split the memory of training into "a
scratch buffer used for input and output activation tensors for gradient calculation
and storage, and allocated memory for weights storage", for back-propagation (BP) and
forward gradients (FF, sign-m-SPSA), in fp16 and in 16w8a (16-bit weights, 8-bit
activations, perturbations and gradients), for full fine-tuning (FT), linear probing (LP)
and sparse update (90 % of the trainable weights pruned from the update).

:func:`scratch_vs_weights` evaluates the analytic rules ``"bp-ff-compare"`` and ``"ff"``
(:mod:`bpfree.memory.rules`) over those configurations — scratch = every part except the
weights (``parameters``), weights = ``parameters`` — and :func:`plot_scratch_vs_weights`
draws the stacked bar chart.

Modes: ``FT`` trains every parameter; ``LP`` only ``head`` (default: the module of the
last layer that owns parameters, i.e. the classifier); ``sparse`` trains every parameter
with ``sparsity`` of them pruned from the update (z, g and the BP gradient only for the
kept ones) plus the mask (default a bitmap of 1 bit per trainable weight).

Limitation: :func:`~bpfree.memory.profile.profile_model` sees leaf modules and the torch
functions called outside them. Attention written with ``matmul`` / ``softmax`` in a
non-leaf module (timm style) is fully visible; ``F.scaled_dot_product_attention`` is one
op (its inputs q, k, v and output are counted, not a materialized attention matrix — the
fused kernels do not keep one); ``nn.MultiheadAttention`` is one opaque op whose q/k/v
projections and attention matrix are added from its shapes and heads (found on the
model here); a *leaf* module that computes attention internally is counted by its input
and output only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..memory.profile import ModelProfile, profile_model
from ..memory.rules import analytic
from ..models import get_model
from ..plotting import pyplot, save_figure
from .memory import FF_PRECISIONS, SPARSE_MASKS, _parameter_owners

__all__ = ["FF_METHODS", "FF_MODES", "attention_heads", "default_head", "plot_scratch_vs_weights",
           "scratch_vs_weights"]

#: Method label -> registered rule.
FF_METHODS: dict[str, str] = {"bp": "bp-ff-compare", "ff": "ff"}
#: Training modes of QZO-FF Figures 3 / 4.
FF_MODES: tuple[str, ...] = ("FT", "LP", "sparse")


def _choices(name: str, values: Any, allowed: Sequence[str]) -> tuple[str, ...]:
    if isinstance(values, str):
        values = (values,)
    try:
        values = tuple(values)
    except TypeError:
        raise ValueError(f"{name} must be a sequence of {', '.join(allowed)}, got {values!r}") \
            from None
    if not values:
        raise ValueError(f"{name} must not be empty; allowed: {', '.join(allowed)}")
    for value in values:
        if value not in allowed:
            raise ValueError(f"{name}: unknown {value!r}; allowed: {', '.join(allowed)}")
    return values


def attention_heads(model: nn.Module) -> dict[str, int]:
    """``{module name: num_heads}`` of every ``nn.MultiheadAttention`` in ``model``."""
    return {name: int(m.num_heads) for name, m in model.named_modules()
            if isinstance(m, nn.MultiheadAttention)}


def default_head(profile: ModelProfile) -> str:
    """Module name of the last layer that owns parameters (the classifier head)."""
    owners = _parameter_owners(profile)
    if not owners:
        raise ValueError("the model has no parameters: nothing to train")
    last = max(owners.values())
    names = [n for n, i in owners.items() if i == last]
    module = names[0].rsplit(".", 1)[0] if "." in names[0] else names[0]
    return module


def _resolve_model(model: Any, example_input: Any) -> tuple[ModelProfile, dict[str, int]]:
    if isinstance(model, str):
        spec = get_model(model)
        if example_input is None:
            example_input = torch.zeros(1, *spec.input_shape)
        model = spec.build()
    if isinstance(model, ModelProfile):
        if example_input is not None:
            raise ValueError("example_input must be None when model is a ModelProfile")
        return model, {}
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, a ModelProfile or a registered model "
                        f"name, got {type(model).__name__}")
    if example_input is None:
        raise ValueError("example_input (batch first) is required for an nn.Module")
    return profile_model(model, example_input), attention_heads(model)


def scratch_vs_weights(model: Any, example_input: Any = None, *,
                       methods: Iterable[str] = ("bp", "ff"),
                       precisions: Iterable[str] = ("fp16", "16w8a"),
                       modes: Iterable[str] = FF_MODES, head: Any = None,
                       sparsity: float = 0.9, batch_size: int | None = None,
                       num_queries: int = 1, mask: str = "bitmap") -> list[dict]:
    """Scratch vs weight bytes of BP and FF training per (method, precision, mode).

    ``model`` is an ``nn.Module`` (profiled on ``example_input``, batch first), a
    :class:`ModelProfile` or a registered model name (``"mnist-cnn"``; one zero sample if
    ``example_input`` is None). ``methods`` ⊆ ("bp", "ff"); ``precisions`` ⊆ ("fp16",
    "16w8a"); ``modes`` ⊆ ("FT", "LP", "sparse"). ``head`` is what LP trains (parameter /
    module names or globs, as ``trainable`` in :func:`~bpfree.memory.analytic`; default
    :func:`default_head`). ``sparsity`` ∈ [0, 1) is the pruned fraction in ``sparse``
    mode; ``mask`` how the kept set is stored (``"bitmap"``, ``"index"``, ``"seed"``).
    ``batch_size`` defaults to the profiled batch; ``num_queries`` is FF's m.

    Returns one dict per configuration, in the order method × precision × mode:
    ``{"method", "precision", "mode", "scratch_bytes", "weight_bytes", "total_bytes",
    "parts"}`` (``parts``: the rule's :class:`MemoryReport` parts).
    """
    methods = _choices("methods", methods, tuple(FF_METHODS))
    precisions = _choices("precisions", precisions, tuple(FF_PRECISIONS))
    modes = _choices("modes", modes, FF_MODES)
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)) \
            or not 0.0 <= float(sparsity) < 1.0:
        raise ValueError(f"sparsity must be a number in [0, 1), got {sparsity!r}")
    if mask not in SPARSE_MASKS:
        raise ValueError(f"mask must be one of {', '.join(SPARSE_MASKS)}, got {mask!r}")
    profile, heads = _resolve_model(model, example_input)
    lp_head = default_head(profile) if head is None else head
    rows = []
    for method in methods:
        for precision in precisions:
            for mode in modes:
                report = analytic(
                    profile, FF_METHODS[method], batch_size=batch_size,
                    num_queries=num_queries, trainable=lp_head if mode == "LP" else None,
                    precision=precision, sparsity=float(sparsity) if mode == "sparse" else 0.0,
                    mask=mask, attention_heads=heads,
                )
                weights = report.parts["parameters"]
                rows.append({
                    "method": method, "precision": precision, "mode": mode,
                    "scratch_bytes": report.total - weights, "weight_bytes": weights,
                    "total_bytes": report.total, "parts": dict(report.parts),
                })
    return rows


def plot_scratch_vs_weights(rows: Sequence[dict], path: str | Path,
                            title: str | None = None) -> Path:
    """Stacked bar chart (scratch below, weights on top, MB = 10^6 B) of
    :func:`scratch_vs_weights` rows, one bar per configuration; rows with a ``"model"``
    key get one panel per model. Writes a PNG at ``path`` and returns it."""
    rows = list(rows)
    if not rows:
        raise ValueError("rows is empty: nothing to plot")
    for row in rows:
        missing = {"method", "precision", "mode", "scratch_bytes", "weight_bytes"} - set(row)
        if missing:
            raise ValueError(f"row {row!r} lacks {', '.join(sorted(missing))}")
    plt = pyplot()

    models = list(dict.fromkeys(row.get("model") for row in rows))
    fig, axes = plt.subplots(len(models), 1, figsize=(max(6.0, 0.75 * len(rows) / len(models)
                                                          + 2), 3.6 * len(models)),
                             squeeze=False)
    for ax, model in zip(axes[:, 0], models):
        sub = [row for row in rows if row.get("model") == model]
        labels = [f"{r['method'].upper()}\n{r['precision']}\n{r['mode']}" for r in sub]
        scratch = [r["scratch_bytes"] / 1e6 for r in sub]
        weights = [r["weight_bytes"] / 1e6 for r in sub]
        x = range(len(sub))
        ax.bar(x, scratch, color="tab:orange", label="scratch (activations, gradients)")
        ax.bar(x, weights, bottom=scratch, color="tab:blue", label="weights")
        for i, (s, w) in enumerate(zip(scratch, weights)):
            ax.annotate(f"{s:.3g}", (i, s / 2), ha="center", va="center", fontsize=7)
            ax.annotate(f"{s + w:.3g}", (i, s + w), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(x), labels, fontsize=7)
        ax.set_ylabel("memory (MB)")
        if model is not None:
            ax.set_title(str(model), fontsize=9)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)
