"""Quantized zeroth-order gradient estimates of integer layers (PMT §3.1–3.2, Algorithm 1).

All estimates are in the units of the integer parameters (int8 weight LSBs, int32 bias LSBs),
with Rademacher perturbations of magnitude ``mu = 1`` (the smallest integer, §3.1.1):

* weight perturbation (WP), Eq. 6: ``g = 1/Q sum_q mean_n[l(W + xi_q; x_n) - l(W; x_n)] xi_q``
  with ``xi_q`` shared across the mini-batch (§4.1). The perturbed weight saturates to int8
  (a weight at 127 cannot go to 128), as a saturating MCU add would.
* node perturbation (NP), Eq. 9: ``g_z[n] = 1/Q sum_q [l_q(x_n) - l(x_n)] xi_{q,n}`` with i.i.d.
  perturbations per sample, added to the layer's requantized pre-activation output before its
  fused ReLU / ReLU6 clamp. The weight gradient follows Eq. 10 through the layer's integer graph:
  ``z_q = M (sum_k W_k (x_k - z_x) + b)`` with ``M = s_in s_w / s_out`` per channel, so
  ``dL/dW = M g_z (x - z_x)^T`` and ``dL/db = M g_z`` (the paper writes ``g_z a^T``; the
  constant ``M`` matters here because it differs per channel and QAS rescales per channel).

A *group* of layers is perturbed simultaneously: one layer at a time is PMT's layer-wise
estimation (§3.2.2), all layers at once is the model-wise baseline of Table 2 / Fig. 5.
Directions are regenerated from XORShift32 seeds (Appendix F) derived from
``(seed, layer index, query)``, so an MCU can replay them without storing them.
"""

from __future__ import annotations

import torch
from torch.nn.grad import conv2d_weight

from ..perturb import derive_seed, rademacher_xorshift
from ..quant.graph import StagedModel, TrainableLayer, per_sample_loss
from ..quant.layers import QConv2d
from ..updates.integer_layer import LayerEstimate

MODES = ("wp", "np")


def requant_scale(layer: torch.nn.Module) -> torch.Tensor:
    """Per-channel real multiplier ``M = s_in s_w / s_out`` of an integer affine layer (float64)."""
    s_w = torch.tensor(layer.weight_quant.scales, dtype=torch.float64)
    return s_w * layer.input_quant.scale / layer.output_quant.scale


def node_to_parameter_gradients(layer: torch.nn.Module, layer_input: torch.Tensor,
                                node_grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 10 through the integer graph: (dL/dW, dL/db) from dL/dz of the int8 output.

    ``layer_input`` is the layer's int8 input (N, ...), ``node_grad`` the float64 gradient with
    respect to its int8 output (N, ...). Both results are means over the N samples.
    """
    n = node_grad.shape[0]
    channel_axis = 1
    m = requant_scale(layer).to(node_grad.device)
    shape = [1] * node_grad.dim()
    shape[channel_axis if isinstance(layer, QConv2d) else -1] = -1
    g = node_grad * m.view(shape)
    x = layer_input.to(torch.float64) - layer.input_quant.zero_point
    if isinstance(layer, QConv2d):
        grad_w = conv2d_weight(x, tuple(layer.weight.shape), g, stride=layer.stride,
                               padding=layer.padding, dilation=layer.dilation,
                               groups=layer.groups)
        grad_b = g.sum(dim=(0, 2, 3))
    else:
        g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
        grad_w = g2.T @ x2
        grad_b = g2.sum(0)
    return grad_w.div_(n), grad_b.div_(n)


def capture_inputs(staged: StagedModel, layers: list[TrainableLayer], stage: int
                   ) -> dict[str, torch.Tensor]:
    """Inputs of ``layers`` recomputed from the cached input of ``stage`` (the activation buffer
    of Algorithm 1: the MCU holds a^(i) when it reaches layer i; nothing is counted as a pass)."""
    captured: dict[str, torch.Tensor] = {}
    handles = [layer.module.register_forward_pre_hook(
        lambda mod, args, name=layer.name: captured.setdefault(name, args[0]))
        for layer in layers]
    try:
        h = staged.inputs[stage]
        for s in staged.stages[stage:max(layer.stage for layer in layers) + 1]:
            h = s(h)
    finally:
        for handle in handles:
            handle.remove()
    return captured


def wp_direction(layer: TrainableLayer, index: int, seed: int, query: int) -> torch.Tensor:
    """The ±1 direction ``xi_q`` of Eq. 6 for ``layer`` (its ``index`` among the model's
    trainable layers) at step seed ``seed``: regenerated, never stored."""
    return rademacher_xorshift(derive_seed(seed, index, query), layer.module.weight.shape,
                               device=layer.module.weight.device)


def perturb_weight_(module: torch.nn.Module, original: torch.Tensor, xi: torch.Tensor) -> None:
    """Set ``module.weight`` to ``original + xi``, saturated to int8 as an MCU add would."""
    module.weight.copy_(original.to(torch.int16).add_(xi).clamp_(-128, 127))


def wp_estimate_from_scalars(layer: TrainableLayer, index: int, seed: int,
                             scalars: list[float]) -> LayerEstimate:
    """Eq. 6 from its Q scalars ``mean_n[l(W + xi_q) - l(W)]``: the directions regenerated.

    The accumulation is the one :func:`estimate_group` does, in the same order, so a step
    rebuilt from all-reduced scalars updates the weights as the single-process step would
    with the same scalars.
    """
    acc = torch.zeros(layer.module.weight.shape, dtype=torch.float64,
                      device=layer.module.weight.device)
    for q, s in enumerate(scalars):
        acc.add_(wp_direction(layer, index, seed, q), alpha=float(s))
    return LayerEstimate(acc.div_(len(scalars)), None, directions=len(scalars),
                         dimension=layer.d_w)


def _query_chunk(batch: int, layers: list[tuple[TrainableLayer, str]], budget: int) -> int:
    if any(mode == "wp" for _, mode in layers):
        return 1  # WP needs one weight copy per query: queries run one after another
    per_query = batch * max(layer.d_a for layer, _ in layers)
    return max(1, budget // max(per_query, 1))


@torch.no_grad()
def estimate_group(staged: StagedModel, group: list[tuple[TrainableLayer, str]],
                   indices: list[int], target: torch.Tensor, clean_loss: torch.Tensor,
                   queries: int, seed: int, *, chunk_elements: int = 2**23
                   ) -> dict[str, LayerEstimate]:
    """Perturb every layer of ``group`` together, Q times, and estimate each layer's gradient.

    Args:
        staged: the model with the clean pass cached (:meth:`StagedModel.clean`).
        group: (layer, mode) pairs, mode "wp" or "np".
        indices: each layer's index in the model's trainable-layer list (seeds derive from it).
        target: (N,) labels; clean_loss: (N,) float64 losses of the clean pass.
        queries: Q; seed: the step's seed.
        chunk_elements: NP queries are batched as long as Q_chunk * N * d_a stays below this.

    Returns:
        name -> :class:`LayerEstimate`. Costs ``Q * N`` (partial) forward passes.
    """
    n = target.shape[0]
    start = min(layer.stage for layer, _ in group)
    np_layers = [layer for layer, mode in group if mode == "np"]
    inputs = capture_inputs(staged, np_layers, start) if np_layers else {}
    device = target.device
    acc_w = {layer.name: torch.zeros(layer.module.weight.shape, dtype=torch.float64,
                                     device=device) for layer, mode in group if mode == "wp"}
    acc_z = {layer.name: torch.zeros((n, *layer.output_shape), dtype=torch.float64,
                                     device=device) for layer in np_layers}
    originals = {layer.name: layer.module.weight.clone() for layer, mode in group if mode == "wp"}
    chunk = _query_chunk(n, group, chunk_elements)
    # A lone layer's queries start at that layer's input inside its stage (computed once).
    entry = staged.entry(start, group[0][0].module if len(group) == 1 else None)
    try:
        for q0 in range(0, queries, chunk):
            qs = range(q0, min(q0 + chunk, queries))
            xis = {}
            for (layer, mode), idx in zip(group, indices):
                if mode == "wp":
                    xi = wp_direction(layer, idx, seed, q0)
                    perturb_weight_(layer.module, originals[layer.name], xi)
                else:
                    xi = torch.stack([rademacher_xorshift(derive_seed(seed, idx, q),
                                                          (n, *layer.output_shape), device=device)
                                      for q in qs])
                    layer.module.node_offset = xi.reshape(-1, *layer.output_shape)
                xis[layer.name] = xi
            logits = staged.from_entry(entry, copies=len(qs))
            loss = per_sample_loss(logits, target.repeat(len(qs)), staged.model.output_quant)
            diff = loss.view(len(qs), n) - clean_loss.view(1, n)
            for layer, mode in group:
                xi = xis[layer.name]
                if mode == "wp":
                    acc_w[layer.name].add_(xi, alpha=float(diff.mean()))
                else:
                    d = diff.view(len(qs), n, *[1] * len(layer.output_shape))
                    # d * xi promotes the int8 xi to float64 exactly inside the product: the
                    # same values as converting xi first, without that extra pass over it
                    acc_z[layer.name].add_((d * xi).sum(0))
    finally:
        for layer, mode in group:
            if mode == "wp":
                layer.module.weight.copy_(originals[layer.name])
            else:
                layer.module.node_offset = None
    out = {}
    for layer, mode in group:
        if mode == "wp":
            out[layer.name] = LayerEstimate(acc_w[layer.name].div_(queries), None,
                                            directions=queries, dimension=layer.d_w)
        else:
            gz = acc_z[layer.name].div_(queries)
            gw, gb = node_to_parameter_gradients(layer.module, inputs[layer.name], gz)
            out[layer.name] = LayerEstimate(gw, gb, directions=n * queries, dimension=layer.d_a)
    return out
