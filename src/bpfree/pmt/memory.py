"""Int8 (MCU) memory rules: PMT §3.2.2 / §3.4 / Algorithm 1 and the baselines of §4.2.2 / §4.3.

Registered with :func:`~bpfree.memory.rules.register_rule` on import (``pmt``, ``pmt-sparse``,
``mezo``, ``cge``, ``bp-int8``, ``sparse-bp``), with :func:`pmt_modes` (PMT's WP / NP choice per
layer), :func:`layer_memory` (the per-layer terms behind the totals) and
:func:`cge_coordinates` (the coordinates CGE perturbs per step). The conventions are those of
:mod:`bpfree.memory.rules`: BatchNorm folded, weights int8, biases int32, gradient
accumulators fp32 / int32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from ..memory.profile import LayerProfile, ModelProfile
from ..memory.report import MemoryReport
from ..memory.rules import prepare_profile, register_rule
from ..memory.terms import (BIAS_BYTES, GRAD_BYTES, NONLINEAR_LAYER_TYPES, bp_macs,
                            canonical_parts, inference_peak_bytes, inputs_bytes,
                            layer_trainable_numel, layer_trainable_weight_numel, layerwise_macs,
                            live_per_layer, positive_int, queries_macs, saves_input, scaled,
                            seeds_losses_bytes, trainable_layer_indices, trainable_numel)

__all__ = ["LayerMemory", "cge_coordinates", "layer_memory", "pmt_modes"]


def _quantized_parameters_bytes(profile: ModelProfile, dtype_bytes: int) -> int:
    """Weights at ``dtype_bytes`` (int8: 1), biases int32 (:data:`BIAS_BYTES`)."""
    return sum(n * (BIAS_BYTES if name.endswith("bias") else dtype_bytes)
               for name, n in profile.parameter_numel.items())


def _pmt_d_w(layer: LayerProfile, trainable: frozenset[str]) -> int:
    """PMT's d_w of a trainable layer: its trainable weight elements, bias excluded.

    PMT §3.2.2 ("the dimension of weight is d_w") and Algorithm 1 line 7 (``d_W < d_a``) name
    the weight alone, and :class:`bpfree.pmt.PMTTrainer`'s WP perturbs only the integer
    weights (:attr:`bpfree.quant.graph.TrainableLayer.d_w` is ``weight.numel()``). A layer
    whose only trainable parameter is its bias counts the bias.
    """
    return layer_trainable_weight_numel(layer, trainable) or \
        layer_trainable_numel(layer, trainable)


def _pmt_mode(layer: LayerProfile, trainable: frozenset[str]) -> str:
    # PMT §3.2.2 "Adaptive Weight Perturbation and Node Perturbation" / Algorithm 1 line 7:
    # WP for layer i if d_w(i) < d_a(i), else NP; d_w the trainable weights (_pmt_d_w), d_a
    # the layer's output values per sample.
    return "WP" if _pmt_d_w(layer, trainable) < layer.d_a else "NP"


def _pmt_grad_numel(layer: LayerProfile, trainable: frozenset[str], mode: str) -> int:
    """Elements of layer i's gradient buffer ∇θ^(i) (Algorithm 1 lines 15 / 29).

    NP fills weight and bias (∇W = ∇z·a^T, ∇b = ∇z, Eq. 10); WP estimates the weights only
    (:func:`_pmt_d_w`; a ±1 step of an int32 bias is below the output's resolution), as
    :class:`bpfree.pmt.PMTTrainer` does.
    """
    if mode == "WP":
        return _pmt_d_w(layer, trainable)
    return layer_trainable_numel(layer, trainable)


def _pmt_layer_peak(profile: ModelProfile, live: list[int], i: int, mode: str,
                    batch_size: int) -> int:
    """Activation elements live while layer ``i``'s gradient is estimated (Algorithm 1).

    WP (lines 8-16, §3.4.2 "the input activation of the current layer is saved in the
    activation buffer; the perturbed forward passes start from the current layer"):
    a^(i) is kept (N·d_in) while the perturbed forward runs from layer i on.
    NP (lines 18-31): a^(i) is kept for ∇W = ∇z·a^T (Eq. 10) and a^(i+1) (N·d_a) is
    perturbed in place, restored from the regenerated ξ, and finally holds ∇a^(i+1)
    (line 28); the perturbed forward starts at layer i+1, whose own live set already
    contains a^(i+1).
    A residual skip held across layer j is part of live[j]. When a^(i) is itself such
    a skip it is counted twice (an upper bound).
    """
    layer = profile.layers[i]
    d_in = batch_size * layer.d_in
    if mode == "WP":
        return max(live[i], d_in + max(live[i + 1:], default=0))
    d_a = batch_size * layer.d_a
    return d_in + max(max(live[i + 1:i + 2], default=0), d_a + max(live[i + 2:], default=0))


def _pmt_common(name: str, profile: ModelProfile, *, batch_size: int, num_queries: int,
                dtype_bytes: int, trainable: frozenset[str], grad_bytes: int) -> MemoryReport:
    n, q = batch_size, num_queries
    grad_bytes = positive_int("grad_bytes", grad_bytes)
    live = live_per_layer(profile, n)
    inference_peak = max(live, default=0)
    peak, grad, query_losses, any_np = inference_peak, 0, 0, False
    indices = trainable_layer_indices(profile, trainable)
    for i in indices:
        layer = profile.layers[i]
        mode = _pmt_mode(layer, trainable)
        any_np |= mode == "NP"
        peak = max(peak, _pmt_layer_peak(profile, live, i, mode, n))
        grad = max(grad, _pmt_grad_numel(layer, trainable, mode))
        query_losses = max(query_losses, q if mode == "WP" else n * q)
    clean_losses = (n if any_np else 1) if indices else 0
    return MemoryReport(name, canonical_parts(
        parameters=_quantized_parameters_bytes(profile, dtype_bytes),
        activations=inference_peak * dtype_bytes,
        saved_activations=(peak - inference_peak) * dtype_bytes,
        gradient_buffers=grad * grad_bytes,
        seeds_losses=seeds_losses_bytes(1 if indices else 0, clean_losses + query_losses),
    ))


def pmt_rule(profile: ModelProfile, *, batch_size: int, num_queries: int, dtype_bytes: int,
             trainable: frozenset[str], grad_bytes: int = GRAD_BYTES) -> MemoryReport:
    """PMT: layer-wise adaptive WP/NP with the memory-efficient schedule (Algorithm 1).

    Layers are visited one at a time; trainable layer i uses WP if d_w(i) < d_a(i) else
    NP (§3.2.2, :func:`pmt_modes`). One layer's estimate is formed and applied before the
    next, so every buffer below is reused across layers and counts once, at its largest.

    - parameters: every parameter of the int8 graph (BatchNorm folded), int8 weights
      (``dtype_bytes``) and int32 biases — Table 3 "Inference Only" d_w term. On the MCU
      the frozen ones may stay in flash (§3.4.1); all are counted here;
    - activations: the inference working set, max over layers of (input + output + held
      skip) for N samples at ``dtype_bytes`` — Table 3 "Inference Only" N·2d_a, per layer;
    - saved_activations: what the layer-wise estimation keeps beyond that working set,
      max over trainable layers of :func:`_pmt_layer_peak` minus the inference peak:
      a^(i) (both modes, §3.4.2) and, for NP, the perturbed a^(i+1) — Table 3 NP
      (Efficient) reuses the activation buffer, so this is often 0 or small;
    - gradient_buffers: ∇θ^(i) of the layer being updated (Algorithm 1 lines 15 / 29,
      later swapped with the old θ^(i) for the line-34 recompute, §3.2.2), fp32/int32,
      max over trainable layers of the layer's trainable weight + bias elements — Table 3
      NP (Efficient) "+ d_w"; WP needs it too because θ^(i) is updated after all Q queries
      (line 33; for a WP layer the weights only, :func:`_pmt_grad_numel`), at ``grad_bytes``
      per value: :data:`GRAD_BYTES` (4, the MCU's fp32 / int32 accumulator) by default; 8
      describes bpfree's simulator, whose :class:`bpfree.pmt.PMTTrainer` accumulates the
      estimate in float64 (what :func:`bpfree.memory.measure_peak` sees);
    - seeds_losses: one uint32 seed per layer (Algorithm 1 lines 8 / 18: ξ is regenerated
      from S by resetting the RNG), the clean losses (N per-sample losses if any layer uses
      NP, else the batch loss) and the query losses of one layer (Q batch losses for WP —
      the perturbation is shared across the batch, §4.1 — or N·Q sample losses for NP) —
      Table 3 WP (Efficient) L·Q and NP (Efficient) N·L·Q, for the one layer in flight.
    No trainable copy and no optimizer state (ZO-SGD without momentum, §4.1). Not counted: the
    copy of a WP layer's int8 weights that the simulator and the generated C
    (:mod:`bpfree.device.plan`) keep while perturbing it, because a weight saturated at
    +-127 cannot be restored by subtracting the direction (Table 3 assumes it can).
    """
    return _pmt_common("pmt", profile, batch_size=batch_size, num_queries=num_queries,
                       dtype_bytes=dtype_bytes, trainable=trainable, grad_bytes=grad_bytes)


def pmt_sparse_rule(profile: ModelProfile, *, batch_size: int, num_queries: int,
                    dtype_bytes: int, trainable: frozenset[str],
                    grad_bytes: int = GRAD_BYTES) -> MemoryReport:
    """PMT sparse training (§3.3): :func:`pmt_rule` with only the ``trainable`` subset
    (e.g. one of four blocks, §3.3.1) perturbed, buffered and updated.

    Memory is that of ``pmt`` restricted to the subset (the gradient buffer and saved
    activations come from the selected layers only); compute drops more, since the prefix
    before the first trainable layer runs once (:func:`macs_per_iteration`).
    """
    return _pmt_common("pmt-sparse", profile, batch_size=batch_size, num_queries=num_queries,
                       dtype_bytes=dtype_bytes, trainable=trainable, grad_bytes=grad_bytes)


def mezo_rule(profile: ModelProfile, *, batch_size: int, num_queries: int, dtype_bytes: int,
              trainable: frozenset[str]) -> MemoryReport:
    """MeZO [58]: model-wise WP of all trainable parameters in place — PMT Table 3
    "Weight Perturbation (Efficient)", on the int8 graph.

    Parameters (int8 weights, int32 biases) + the inference working set + Q uint32 seeds
    + Q+1 fp32 batch losses (one-sided RGE, Eq. 6). No gradient buffer: θ is updated in
    place query by query with ξ regenerated from its seed.
    """
    q = num_queries
    return MemoryReport("mezo", canonical_parts(
        parameters=_quantized_parameters_bytes(profile, dtype_bytes),
        activations=inference_peak_bytes(profile, batch_size, dtype_bytes),
        seeds_losses=seeds_losses_bytes(q, q + 1),
    ))


def cge_coordinates(profile: ModelProfile, num_queries: int, coordinates: int | None,
                    trainable: frozenset[str]) -> int:
    """Coordinates CGE perturbs per step: ``coordinates`` (default ``num_queries``), capped
    at d, the trainable parameter count, as :func:`bpfree.estimators.cge` caps it."""
    k = num_queries if coordinates is None else positive_int("coordinates", coordinates)
    return min(k, trainable_numel(profile, trainable))


def coordinates_macs(profile: ModelProfile, *, batch_size: int, num_queries: int,
                     trainable: frozenset[str], coordinates: int | None = None,
                     **_: Any) -> int:
    k = cge_coordinates(profile, num_queries, coordinates, trainable)
    return (k + 1) * batch_size * profile.macs


def cge_rule(profile: ModelProfile, *, batch_size: int, num_queries: int, dtype_bytes: int,
             trainable: frozenset[str], coordinates: int | None = None) -> MemoryReport:
    """DeepZero [11]-style coordinate-wise gradient estimation (CGE) on the int8 graph.

    Each step perturbs ``coordinates`` parameters one at a time (default: ``num_queries``)
    and keeps one finite-difference loss each plus the clean loss; the coordinates come
    from one uint32 sampler seed. Memory = parameters + inference working set + that.
    """
    k = cge_coordinates(profile, num_queries, coordinates, trainable)
    return MemoryReport("cge", canonical_parts(
        parameters=_quantized_parameters_bytes(profile, dtype_bytes),
        activations=inference_peak_bytes(profile, batch_size, dtype_bytes),
        seeds_losses=seeds_losses_bytes(1, k + 1),
    ))


def bp_int8_rule(profile: ModelProfile, *, batch_size: int, num_queries: int,
                 dtype_bytes: int, trainable: frozenset[str]) -> MemoryReport:
    """Back-propagation on the int8 graph (MCUTrain [55] style): PMT Table 3
    "Back-propagation" N·L·d_a + L·d_w.

    - parameters: int8 weights, int32 biases (BatchNorm folded);
    - activations: the input of every parametrized or nonlinear layer kept for the
      backward pass, N samples at ``dtype_bytes`` (int8, as MCUTrain stores them);
    - activation_gradients: the fp32 gradients of one layer's input and output plus held
      skips — the inference peak's element count at :data:`GRAD_BYTES`;
    - gradient_buffers: fp32 ∇θ of every trainable parameter. No optimizer state (SGD).
    """
    kept = [layer for layer in profile.layers if saves_input(layer)]
    return MemoryReport("bp-int8", canonical_parts(
        parameters=_quantized_parameters_bytes(profile, dtype_bytes),
        activations=inputs_bytes(kept, profile, batch_size, dtype_bytes),
        activation_gradients=scaled(profile.inference_peak_numel, profile.batch_size,
                                    batch_size) * GRAD_BYTES,
        gradient_buffers=trainable_numel(profile, trainable) * GRAD_BYTES,
    ))


def sparse_bp_rule(profile: ModelProfile, *, batch_size: int, num_queries: int,
                   dtype_bytes: int, trainable: frozenset[str]) -> MemoryReport:
    """Sparse back-propagation (MCUTrain [55] sparse update) on the int8 graph.

    The backward pass stops at the first trainable layer f, so:

    - activations: inputs kept only where the backward needs them — layers whose weight
      (not only bias: ∇b = ∇z needs no input) trains, and nonlinear layers after f;
      N samples at ``dtype_bytes``;
    - activation_gradients: fp32, max over layers from f on of their live elements;
    - gradient_buffers: fp32 ∇θ of the trainable parameters only.
    """
    indices = trainable_layer_indices(profile, trainable)
    parts = canonical_parts(parameters=_quantized_parameters_bytes(profile, dtype_bytes))
    if indices:
        f = indices[0]
        kept = [layer for j, layer in enumerate(profile.layers) if j >= f and (
            layer_trainable_weight_numel(layer, trainable)
            or (j > f and layer.type in NONLINEAR_LAYER_TYPES))]
        parts.update(
            activations=inputs_bytes(kept, profile, batch_size, dtype_bytes),
            activation_gradients=max(live_per_layer(profile, batch_size)[f:]) * GRAD_BYTES,
            gradient_buffers=trainable_numel(profile, trainable) * GRAD_BYTES,
        )
    else:
        parts["activation_gradients"] = 0
    return MemoryReport("sparse-bp", parts)


def _pmt_macs(profile: ModelProfile, *, trainable: frozenset[str], **kw: Any) -> int:
    kw.pop("coordinates", None)
    return layerwise_macs(profile, trainable=trainable,
                          mode=lambda layer: _pmt_mode(layer, trainable), **kw)


register_rule("pmt", pmt_rule, dtype_bytes=1, fold_bn=True, macs=_pmt_macs)
register_rule("pmt-sparse", pmt_sparse_rule, dtype_bytes=1, fold_bn=True, macs=_pmt_macs)
register_rule("mezo", mezo_rule, dtype_bytes=1, fold_bn=True, macs=queries_macs)
register_rule("cge", cge_rule, dtype_bytes=1, fold_bn=True, macs=coordinates_macs)
register_rule("bp-int8", bp_int8_rule, dtype_bytes=1, fold_bn=True, macs=bp_macs)
register_rule("sparse-bp", sparse_bp_rule, dtype_bytes=1, fold_bn=True, macs=bp_macs)


def pmt_modes(model: nn.Module | ModelProfile, trainable: Any = None, *,
              fold_bn: bool = True, input_shape: Any = None,
              example_input: Any = None) -> dict[str, str]:
    """PMT's perturbation mode per trainable layer, ``{layer name: "WP" | "NP"}``, in
    execution order: WP if d_w(i) < d_a(i) else NP (§3.2.2, Algorithm 1 line 7), with
    d_w the layer's trainable weights (bias excluded, as PMT and :class:`bpfree.pmt.PMTTrainer`
    define it) and d_a its output values per sample. BatchNorm is folded first unless
    ``fold_bn=False``."""
    _, profile, trainable_set = prepare_profile(model, "pmt", input_shape, example_input,
                                                fold_bn, trainable)
    return {profile.layers[i].name: _pmt_mode(profile.layers[i], trainable_set)
            for i in trainable_layer_indices(profile, trainable_set)}


@dataclass(frozen=True)
class LayerMemory:
    """Per-layer memory of one layer for N samples (:func:`layer_memory`); bytes unless noted.

    - ``d_w``: the layer's weight elements (PMT's d_w, bias excluded); ``d_a``: output
      elements per sample; ``mode``: PMT's "WP" / "NP" for a trainable layer, else None;
    - ``live_bytes``: the inference working set while the layer runs (input + output +
      held skip); its max over layers is the inference peak (``activations`` of ``pmt``);
    - ``bp_saved_bytes``: the activation back-propagation keeps for this layer's backward
      (its input, for a parametrized or nonlinear layer); their sum is the ``activations``
      part of ``bp`` / ``bp-int8`` (BP keeps them all at once; exact for a one-sample
      profile, each layer rounded up otherwise);
    - ``pmt_peak_bytes``: PMT's activation peak while this layer's gradient is estimated
      (Algorithm 1; 0 for a frozen layer); the max over layers minus the inference peak is
      ``pmt``'s ``saved_activations``;
    - ``pmt_grad_bytes``: PMT's gradient buffer ∇θ^(i) for this layer at :data:`GRAD_BYTES`
      (trainable weight + bias for NP, weights only for WP); the max over layers is
      ``pmt``'s ``gradient_buffers`` (one buffer, reused layer by layer);
    - ``macs``: multiply-accumulates of one forward of the layer for N samples.
    """

    name: str
    type: str
    d_w: int
    d_a: int
    mode: str | None
    live_bytes: int
    bp_saved_bytes: int
    pmt_peak_bytes: int
    pmt_grad_bytes: int
    macs: int


def layer_memory(model: nn.Module | ModelProfile, *, batch_size: int | None = None,
                 dtype_bytes: int = 1, trainable: Any = None, fold_bn: bool = True,
                 input_shape: Any = None, example_input: Any = None) -> list[LayerMemory]:
    """Per-layer memory (:class:`LayerMemory`) of every layer, in execution order, for
    ``batch_size`` samples at ``dtype_bytes`` per activation value — the per-layer terms the
    ``bp`` / ``bp-int8`` and ``pmt`` / ``pmt-sparse`` rules sum or take the max of.

    ``model``, ``input_shape``, ``example_input`` and ``trainable`` as in :func:`analytic`;
    BatchNorm is folded first unless ``fold_bn=False`` (the int8 graph PMT trains).
    """
    _, profile, trainable_set = prepare_profile(model, "pmt", input_shape, example_input,
                                                fold_bn, trainable)
    n = profile.batch_size if batch_size is None else positive_int("batch_size", batch_size)
    dtype_bytes = positive_int("dtype_bytes", dtype_bytes)
    live = live_per_layer(profile, n)
    out = []
    for i, layer in enumerate(profile.layers):
        trains = bool(layer_trainable_numel(layer, trainable_set))
        mode = _pmt_mode(layer, trainable_set) if trains else None
        saved = inputs_bytes([layer], profile, n, dtype_bytes) if saves_input(layer) else 0
        out.append(LayerMemory(
            name=layer.name, type=layer.type, d_w=layer.weight_numel, d_a=layer.d_a, mode=mode,
            live_bytes=live[i] * dtype_bytes, bp_saved_bytes=saved,
            pmt_peak_bytes=(_pmt_layer_peak(profile, live, i, mode, n) * dtype_bytes
                            if trains else 0),
            pmt_grad_bytes=(_pmt_grad_numel(layer, trainable_set, mode) * GRAD_BYTES
                            if trains else 0),
            macs=n * layer.macs,
        ))
    return out
