"""Analytic training memory from layer shapes: a registry of per-method rules.

A rule is ``fn(profile, *, batch_size, num_queries, dtype_bytes, trainable, **options)``
returning a :class:`~bpfree.memory.report.MemoryReport`. ``profile`` is a
:class:`~bpfree.memory.profile.ModelProfile`; ``batch_size`` is N; ``num_queries`` is Q;
``dtype_bytes`` is the storage size of one parameter / activation element (4 for fp32, 1
for int8 on an MCU); ``trainable`` is a frozenset of parameter names. Later issues add
each method's refined rules with :func:`register_rule`.

The built-in rules follow PMT (Poor Man's Training) Table 3 "Memory Cost Comparison"
(inference N(2d_a + d_w); WP vanilla L·d_w, efficient L·Q; NP vanilla N·L·d_a + L·d_w,
efficient N·L·Q + d_w; BP N·L·d_a + L·d_w), made concrete for a real network: per-layer
d_a and d_w come from the profile instead of "L identical layers".

Shared assumptions: every element of parameters and activations takes ``dtype_bytes``;
seeds are uint32 (4 bytes) and losses fp32 (4 bytes) whatever ``dtype_bytes`` is;
activations scale linearly with batch; the live set of a layer is its input, its output
and the tensors held across it (a residual skip); no kernel workspaces.

The int8 rules (``pmt``, ``pmt-sparse``, ``mezo``, ``cge``, ``bp-int8``, ``sparse-bp``)
model the MCU deployment of PMT §3.4 / §4.1: BatchNorm folded into the preceding conv
(:meth:`~bpfree.memory.profile.ModelProfile.fold_batchnorm`), weights and activations of
``dtype_bytes`` (default 1, int8), biases int32 (:data:`BIAS_BYTES`), gradient
accumulators fp32/int32 (:data:`GRAD_BYTES`). Each method registers its defaults
(:func:`method_defaults`) and, where known, a compute rule: :func:`macs_per_iteration`
gives the multiply-accumulates of one training iteration.
"""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .profile import LayerProfile, ModelProfile, profile_model
from .report import MemoryReport

__all__ = [
    "BIAS_BYTES",
    "FF_PRECISIONS",
    "GRAD_BYTES",
    "LOSS_BYTES",
    "NONLINEAR_LAYER_TYPES",
    "SEED_BYTES",
    "SIGN_BYTES",
    "SPARSE_MASKS",
    "LayerMemory",
    "analytic",
    "bp_ff_compare_rule",
    "ff_rule",
    "macs_per_iteration",
    "layer_memory",
    "method_defaults",
    "pmt_modes",
    "register_rule",
    "registered_rules",
]

#: A perturbation seed is a uint32 (the device's XORShift32 state).
SEED_BYTES = 4
#: A loss value is one fp32 scalar.
LOSS_BYTES = 4
#: A bias of the int8 graph is int32 (TinyEngine / TFLite convention).
BIAS_BYTES = 4
#: A gradient (or gradient accumulator) value is fp32 or int32.
GRAD_BYTES = 4

#: Parameter-free layers whose backward needs their input (or output) kept: BP keeps it.
NONLINEAR_LAYER_TYPES: frozenset[str] = frozenset({
    "ReLU", "ReLU6", "LeakyReLU", "PReLU", "RReLU", "ELU", "SELU", "CELU", "GELU", "SiLU",
    "Mish", "Sigmoid", "Tanh", "Hardtanh", "Hardswish", "Hardsigmoid", "Softplus",
    "Softsign", "Softmax", "LogSoftmax", "Softmin", "Tanhshrink", "GLU", "LogSigmoid",
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    # The same operations called functionally in a container's forward (profile op names).
    "relu", "relu6", "leaky_relu", "elu", "selu", "celu", "gelu", "silu", "mish", "sigmoid",
    "tanh", "hardtanh", "hardswish", "hardsigmoid", "softplus", "softmax", "log_softmax",
    "max_pool1d", "max_pool2d", "max_pool3d", "adaptive_max_pool2d",
})


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


Rule = Callable[..., MemoryReport]
MacsRule = Callable[..., int]


@dataclass(frozen=True)
class _Method:
    rule: Rule
    dtype_bytes: int = 4
    fold_bn: bool = False
    macs: MacsRule | None = None


_RULES: dict[str, _Method] = {}


def register_rule(name: str, fn: Rule, *, replace: bool = False, dtype_bytes: int = 4,
                  fold_bn: bool = False, macs: MacsRule | None = None) -> None:
    """Register ``fn(profile, **options) -> MemoryReport`` as the rule for method ``name``.

    Re-registering an existing name needs ``replace=True`` so two issues cannot silently
    overwrite each other's rule. ``dtype_bytes`` and ``fold_bn`` are the method's
    defaults in :func:`analytic` (1 and True for a method that runs the int8 graph);
    ``macs(profile, *, batch_size, num_queries, trainable, coordinates) -> int`` is its
    compute per iteration for :func:`macs_per_iteration`.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if macs is not None and not callable(macs):
        raise TypeError(f"macs must be callable or None, got {type(macs).__name__}")
    _positive_int("dtype_bytes", dtype_bytes)
    if name in _RULES and not replace:
        raise ValueError(f"name {name!r} is already registered; pass replace=True to override")
    _RULES[name] = _Method(fn, dtype_bytes, bool(fold_bn), macs)


def registered_rules() -> tuple[str, ...]:
    """Names of the registered methods, sorted."""
    return tuple(sorted(_RULES))


def method_defaults(method: str) -> dict[str, Any]:
    """``{"dtype_bytes", "fold_bn", "has_macs"}``: what :func:`analytic` uses for ``method``
    when not told otherwise, and whether :func:`macs_per_iteration` knows it."""
    entry = _entry(method)
    return {"dtype_bytes": entry.dtype_bytes, "fold_bn": entry.fold_bn,
            "has_macs": entry.macs is not None}


def _entry(method: str) -> _Method:
    if method not in _RULES:
        raise ValueError(
            f"method {method!r} is not registered; registered: {', '.join(registered_rules())}"
        )
    return _RULES[method]


# ---------------------------------------------------------------------------------------
# Small pure helpers shared by the rules. All counts are elements unless named *_bytes.


def _scaled(numel: int, profile_batch: int, batch_size: int) -> int:
    """Elements at batch ``batch_size`` for a count measured at ``profile_batch`` (ceil)."""
    return -(-numel * batch_size // profile_batch)


def _parameters_bytes(profile: ModelProfile, dtype_bytes: int) -> int:
    return profile.num_parameters * dtype_bytes


def _inference_peak_bytes(profile: ModelProfile, batch_size: int, dtype_bytes: int) -> int:
    return _scaled(profile.inference_peak_numel, profile.batch_size, batch_size) * dtype_bytes


def _trainable_numel(profile: ModelProfile, trainable: frozenset[str]) -> int:
    return sum(n for name, n in profile.parameter_numel.items() if name in trainable)


def _layer_trainable_numel(layer: LayerProfile, trainable: frozenset[str]) -> int:
    return sum(n for name, n in layer.parameter_numel.items() if name in trainable)


def _saves_input(layer: LayerProfile) -> bool:
    # Parametrized layers need a^(i) for dW = dz · a^T (PMT Eq. 3); nonlinear ones need
    # z^(i) for h'(z). Views and Dropout-at-eval keep nothing worth counting.
    return bool(layer.parameter_numel) or layer.type in NONLINEAR_LAYER_TYPES


def _inputs_bytes(layers: Iterable[LayerProfile], profile: ModelProfile, batch_size: int,
                  dtype_bytes: int) -> int:
    numel = sum(layer.input_numel for layer in layers)
    return _scaled(numel, profile.batch_size, batch_size) * dtype_bytes


def _seeds_losses_bytes(num_seeds: int, num_losses: int) -> int:
    return num_seeds * SEED_BYTES + num_losses * LOSS_BYTES


def _parts(**parts: int) -> dict[str, int]:
    # Every built-in rule reports all canonical parts so stacked figures line up.
    base = dict.fromkeys(
        ("parameters", "trainable_copy", "activations", "gradient_buffers", "optimizer_state",
         "seeds_losses"), 0)
    base.update(parts)
    return base


# ---------------------------------------------------------------------------------------
# Built-in rules.


def inference_rule(profile: ModelProfile, *, batch_size: int, num_queries: int,
                   dtype_bytes: int, trainable: frozenset[str]) -> MemoryReport:
    """Plain inference: parameters + the layer-by-layer activation peak.

    PMT Table 3 "Inference Only": N(2d_a + d_w) — the largest layer's input and output for
    N samples (here the max over layers of (input + output) elements) plus the weights,
    which an MCU keeps in flash/SRAM for all layers (we count all of them).
    """
    return MemoryReport("inference", _parts(
        parameters=_parameters_bytes(profile, dtype_bytes),
        activations=_inference_peak_bytes(profile, batch_size, dtype_bytes),
    ))


def bp_rule(profile: ModelProfile, *, batch_size: int, num_queries: int, dtype_bytes: int,
            trainable: frozenset[str], momentum: bool = False,
            optimizer_states: int | None = None) -> MemoryReport:
    """Back-propagation: PMT Table 3 "Back-propagation" N·L·d_a + L·d_w, and §2 "Extra Memory".

    Assumptions:
    - activations: the input of every parametrized or nonlinear layer is kept for the
      backward pass, for all N samples (PMT §2: all a^(i) and z^(i)); all parameters stay
      resident even if frozen;
    - activation_gradients (extra part): while a layer back-propagates, its output
      gradient and input gradient are both live — at most the inference peak;
    - gradient_buffers: one ``.grad`` per trainable parameter;
    - optimizer_state: ``optimizer_states`` tensors per trainable parameter (1 for SGD
      momentum, 2 for Adam); ``momentum=True`` is shorthand for 1. Default 0 (plain SGD).
    """
    if optimizer_states is None:
        optimizer_states = 1 if momentum else 0
    if isinstance(optimizer_states, bool) or not isinstance(optimizer_states, int) \
            or optimizer_states < 0:
        raise ValueError(f"optimizer_states must be an int >= 0, got {optimizer_states!r}")
    n_train = _trainable_numel(profile, trainable)
    kept = [layer for layer in profile.layers if _saves_input(layer)]
    return MemoryReport("bp", _parts(
        parameters=_parameters_bytes(profile, dtype_bytes),
        activations=_inputs_bytes(kept, profile, batch_size, dtype_bytes),
        activation_gradients=_inference_peak_bytes(profile, batch_size, dtype_bytes),
        gradient_buffers=n_train * dtype_bytes,
        optimizer_state=optimizer_states * n_train * dtype_bytes,
    ))


def zo_wp_lean_rule(profile: ModelProfile, *, batch_size: int, num_queries: int,
                    dtype_bytes: int, trainable: frozenset[str]) -> MemoryReport:
    """MeZO-style weight perturbation in place: PMT Table 3 "Weight Perturbation (Efficient)".

    θ is perturbed to θ+μξ in place and restored, ξ regenerated from its seed for the
    update (PMT §3.2.1: WP stores only scalars). Memory = parameters + the inference
    activation peak + Q seeds (uint32) + Q+1 batch losses (the clean one and one per
    query, fp32). No trainable copy, no gradient buffer, no optimizer state (ZO-SGD).
    PMT's L·Q counts one seed per layer and query for layer-wise WP; this is model-wise.
    """
    q = num_queries
    return MemoryReport("zo_wp_lean", _parts(
        parameters=_parameters_bytes(profile, dtype_bytes),
        activations=_inference_peak_bytes(profile, batch_size, dtype_bytes),
        seeds_losses=_seeds_losses_bytes(q, q + 1),
    ))


def zo_wp_batched_rule(profile: ModelProfile, *, batch_size: int, num_queries: int,
                       dtype_bytes: int, trainable: frozenset[str]) -> MemoryReport:
    """Weight perturbation with all Q queries evaluated in one stacked (vmap) forward.

    Trades memory for speed against PMT Table 3 "Weight Perturbation": Q perturbed copies
    of the trainable parameters are materialized (trainable_copy = Q·d_trainable), and the
    stacked forward runs Q·N samples, so the activation peak is Q times the inference peak.
    Seeds/losses as in ``zo_wp_lean`` (Q seeds kept to regenerate ξ for the update).
    The clean forward is assumed to run separately, not stacked with the Q queries.
    """
    q = num_queries
    return MemoryReport("zo_wp_batched", _parts(
        parameters=_parameters_bytes(profile, dtype_bytes),
        trainable_copy=q * _trainable_numel(profile, trainable) * dtype_bytes,
        activations=_inference_peak_bytes(profile, q * batch_size, dtype_bytes),
        seeds_losses=_seeds_losses_bytes(q, q + 1),
    ))


def zo_np_lean_rule(profile: ModelProfile, *, batch_size: int, num_queries: int,
                    dtype_bytes: int, trainable: frozenset[str]) -> MemoryReport:
    """Layer-wise node perturbation, memory-efficient: PMT Table 3 "Node Perturbation
    (Efficient)" N·L·Q + d_w.

    One layer at a time: its output z^(i) is perturbed per sample and query (Eq. 9),
    the weight gradient ∇W = ∇z · a^T (Eq. 10) is formed in one buffer of that layer's
    d_w (largest trainable layer counted, weight + bias) and applied at once, so no
    activation outlives the layer-by-layer engine. Seeds: one per (sample, query), N·Q;
    losses: sample-wise, N·(Q+1).
    """
    n, q = batch_size, num_queries
    largest = max((_layer_trainable_numel(layer, trainable) for layer in profile.layers),
                  default=0)
    return MemoryReport("zo_np_lean", _parts(
        parameters=_parameters_bytes(profile, dtype_bytes),
        activations=_inference_peak_bytes(profile, n, dtype_bytes),
        gradient_buffers=largest * dtype_bytes,
        seeds_losses=_seeds_losses_bytes(n * q, n * (q + 1)),
    ))


def zo_np_batched_rule(profile: ModelProfile, *, batch_size: int, num_queries: int,
                       dtype_bytes: int, trainable: frozenset[str]) -> MemoryReport:
    """Model-wise node perturbation with Q queries stacked: PMT Table 3 "Node Perturbation
    (Vanilla)" N·L·d_a + L·d_w, with the Q queries run as one Q·N-sample forward.

    Activations: Q times the inference peak (Q×N stacked samples) plus the input a^(i) of
    every trainable layer, kept for N samples until ∇W = ∇z · a^T (Eq. 10) is formed;
    gradient_buffers: every trainable layer's weight gradient at once (L·d_w).
    Seeds/losses as in ``zo_np_lean``.
    """
    n, q = batch_size, num_queries
    trained_layers = [layer for layer in profile.layers
                      if _layer_trainable_numel(layer, trainable)]
    stacked = _inference_peak_bytes(profile, q * n, dtype_bytes)
    return MemoryReport("zo_np_batched", _parts(
        parameters=_parameters_bytes(profile, dtype_bytes),
        activations=stacked + _inputs_bytes(trained_layers, profile, n, dtype_bytes),
        gradient_buffers=_trainable_numel(profile, trainable) * dtype_bytes,
        seeds_losses=_seeds_losses_bytes(n * q, n * (q + 1)),
    ))


# ---------------------------------------------------------------------------------------
# Int8 (MCU) rules: PMT §3.2.2 / §3.4 / Algorithm 1, and the baselines of §4.2.2 / §4.3.


def _quantized_parameters_bytes(profile: ModelProfile, dtype_bytes: int) -> int:
    """Weights at ``dtype_bytes`` (int8: 1), biases int32 (:data:`BIAS_BYTES`)."""
    return sum(n * (BIAS_BYTES if name.endswith("bias") else dtype_bytes)
               for name, n in profile.parameter_numel.items())


def _layer_trainable_weight_numel(layer: LayerProfile, trainable: frozenset[str]) -> int:
    return sum(n for name, n in layer.parameter_numel.items()
               if name in trainable and not name.endswith("bias"))


def _trainable_layer_indices(profile: ModelProfile, trainable: frozenset[str]) -> list[int]:
    return [i for i, layer in enumerate(profile.layers)
            if _layer_trainable_numel(layer, trainable)]


def _live(profile: ModelProfile, batch_size: int) -> list[int]:
    """Per layer, elements live while it runs (input + output + held) for ``batch_size``."""
    return [_scaled(layer.live_numel, profile.batch_size, batch_size) for layer in profile.layers]


def _pmt_d_w(layer: LayerProfile, trainable: frozenset[str]) -> int:
    """PMT's d_w of a trainable layer: its trainable weight elements, bias excluded.

    PMT §3.2.2 ("the dimension of weight is d_w") and Algorithm 1 line 7 (``d_W < d_a``) name
    the weight alone, and :class:`bpfree.pmt.PMTTrainer`'s WP perturbs only the integer
    weights (:attr:`bpfree.pmt.graph.TrainableLayer.d_w` is ``weight.numel()``). A layer
    whose only trainable parameter is its bias counts the bias.
    """
    return _layer_trainable_weight_numel(layer, trainable) or \
        _layer_trainable_numel(layer, trainable)


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
    return _layer_trainable_numel(layer, trainable)


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
                dtype_bytes: int, trainable: frozenset[str]) -> MemoryReport:
    n, q = batch_size, num_queries
    live = _live(profile, n)
    inference_peak = max(live, default=0)
    peak, grad, query_losses, any_np = inference_peak, 0, 0, False
    indices = _trainable_layer_indices(profile, trainable)
    for i in indices:
        layer = profile.layers[i]
        mode = _pmt_mode(layer, trainable)
        any_np |= mode == "NP"
        peak = max(peak, _pmt_layer_peak(profile, live, i, mode, n))
        grad = max(grad, _pmt_grad_numel(layer, trainable, mode))
        query_losses = max(query_losses, q if mode == "WP" else n * q)
    clean_losses = (n if any_np else 1) if indices else 0
    return MemoryReport(name, _parts(
        parameters=_quantized_parameters_bytes(profile, dtype_bytes),
        activations=inference_peak * dtype_bytes,
        saved_activations=(peak - inference_peak) * dtype_bytes,
        gradient_buffers=grad * GRAD_BYTES,
        seeds_losses=_seeds_losses_bytes(1 if indices else 0, clean_losses + query_losses),
    ))


def pmt_rule(profile: ModelProfile, *, batch_size: int, num_queries: int, dtype_bytes: int,
             trainable: frozenset[str]) -> MemoryReport:
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
      (line 33; for a WP layer the weights only, :func:`_pmt_grad_numel`);
    - seeds_losses: one uint32 seed per layer (Algorithm 1 lines 8 / 18: ξ is regenerated
      from S by resetting the RNG), the clean losses (N per-sample losses if any layer uses
      NP, else the batch loss) and the query losses of one layer (Q batch losses for WP —
      the perturbation is shared across the batch, §4.1 — or N·Q sample losses for NP) —
      Table 3 WP (Efficient) L·Q and NP (Efficient) N·L·Q, for the one layer in flight.
    No trainable copy and no optimizer state (ZO-SGD without momentum, §4.1).
    """
    return _pmt_common("pmt", profile, batch_size=batch_size, num_queries=num_queries,
                       dtype_bytes=dtype_bytes, trainable=trainable)


def pmt_sparse_rule(profile: ModelProfile, *, batch_size: int, num_queries: int,
                    dtype_bytes: int, trainable: frozenset[str]) -> MemoryReport:
    """PMT sparse training (§3.3): :func:`pmt_rule` with only the ``trainable`` subset
    (e.g. one of four blocks, §3.3.1) perturbed, buffered and updated.

    Memory is that of ``pmt`` restricted to the subset (the gradient buffer and saved
    activations come from the selected layers only); compute drops more, since the prefix
    before the first trainable layer runs once (:func:`macs_per_iteration`).
    """
    return _pmt_common("pmt-sparse", profile, batch_size=batch_size, num_queries=num_queries,
                       dtype_bytes=dtype_bytes, trainable=trainable)


def mezo_rule(profile: ModelProfile, *, batch_size: int, num_queries: int, dtype_bytes: int,
              trainable: frozenset[str]) -> MemoryReport:
    """MeZO [58]: model-wise WP of all trainable parameters in place — PMT Table 3
    "Weight Perturbation (Efficient)", on the int8 graph.

    Parameters (int8 weights, int32 biases) + the inference working set + Q uint32 seeds
    + Q+1 fp32 batch losses (one-sided RGE, Eq. 6). No gradient buffer: θ is updated in
    place query by query with ξ regenerated from its seed.
    """
    q = num_queries
    return MemoryReport("mezo", _parts(
        parameters=_quantized_parameters_bytes(profile, dtype_bytes),
        activations=_inference_peak_bytes(profile, batch_size, dtype_bytes),
        seeds_losses=_seeds_losses_bytes(q, q + 1),
    ))


def cge_rule(profile: ModelProfile, *, batch_size: int, num_queries: int, dtype_bytes: int,
             trainable: frozenset[str], coordinates: int | None = None) -> MemoryReport:
    """DeepZero [11]-style coordinate-wise gradient estimation (CGE) on the int8 graph.

    Each step perturbs ``coordinates`` parameters one at a time (default: ``num_queries``)
    and keeps one finite-difference loss each plus the clean loss; the coordinates come
    from one uint32 sampler seed. Memory = parameters + inference working set + that.
    """
    k = cge_coordinates(profile, num_queries, coordinates, trainable)
    return MemoryReport("cge", _parts(
        parameters=_quantized_parameters_bytes(profile, dtype_bytes),
        activations=_inference_peak_bytes(profile, batch_size, dtype_bytes),
        seeds_losses=_seeds_losses_bytes(1, k + 1),
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
    kept = [layer for layer in profile.layers if _saves_input(layer)]
    return MemoryReport("bp-int8", _parts(
        parameters=_quantized_parameters_bytes(profile, dtype_bytes),
        activations=_inputs_bytes(kept, profile, batch_size, dtype_bytes),
        activation_gradients=_scaled(profile.inference_peak_numel, profile.batch_size,
                                     batch_size) * GRAD_BYTES,
        gradient_buffers=_trainable_numel(profile, trainable) * GRAD_BYTES,
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
    indices = _trainable_layer_indices(profile, trainable)
    parts = _parts(parameters=_quantized_parameters_bytes(profile, dtype_bytes))
    if indices:
        f = indices[0]
        kept = [layer for j, layer in enumerate(profile.layers) if j >= f and (
            _layer_trainable_weight_numel(layer, trainable)
            or (j > f and layer.type in NONLINEAR_LAYER_TYPES))]
        parts.update(
            activations=_inputs_bytes(kept, profile, batch_size, dtype_bytes),
            activation_gradients=max(_live(profile, batch_size)[f:]) * GRAD_BYTES,
            gradient_buffers=_trainable_numel(profile, trainable) * GRAD_BYTES,
        )
    else:
        parts["activation_gradients"] = 0
    return MemoryReport("sparse-bp", parts)


# ---------------------------------------------------------------------------------------
# Compute rules: multiply-accumulates of one training iteration (N samples, Q queries).


def _macs_layers(profile: ModelProfile) -> list[int]:
    return [layer.macs for layer in profile.layers]


def _forward_macs(profile: ModelProfile, *, batch_size: int, **_: Any) -> int:
    return batch_size * profile.macs


def _queries_macs(profile: ModelProfile, *, batch_size: int, num_queries: int,
                  **_: Any) -> int:
    # Model-wise estimators: one clean forward and Q perturbed ones.
    return (num_queries + 1) * batch_size * profile.macs


def cge_coordinates(profile: ModelProfile, num_queries: int, coordinates: int | None,
                    trainable: frozenset[str]) -> int:
    """Coordinates CGE perturbs per step: ``coordinates`` (default ``num_queries``), capped
    at d, the trainable parameter count, as :func:`bpfree.estimators.cge` caps it."""
    k = num_queries if coordinates is None else _positive_int("coordinates", coordinates)
    return min(k, _trainable_numel(profile, trainable))


def _coordinates_macs(profile: ModelProfile, *, batch_size: int, num_queries: int,
                      trainable: frozenset[str], coordinates: int | None = None,
                      **_: Any) -> int:
    k = cge_coordinates(profile, num_queries, coordinates, trainable)
    return (k + 1) * batch_size * profile.macs


def _layerwise_macs(profile: ModelProfile, *, batch_size: int, num_queries: int,
                    trainable: frozenset[str], mode: Callable[[LayerProfile], str]) -> int:
    """Algorithm 1: clean forward (line 4) + the layer-by-layer forward up to the last
    trainable layer (line 6) + per trainable layer i, Q·N perturbed partial forwards
    (WP: layers i.., line 10; NP: layers i+1.., line 23) and the recompute of layer i
    (line 34)."""
    n, q = batch_size, num_queries
    macs = _macs_layers(profile)
    total = n * sum(macs)
    indices = _trainable_layer_indices(profile, trainable)
    if not indices:
        return total
    total += n * sum(macs[:indices[-1] + 1])
    for i in indices:
        start = i if mode(profile.layers[i]) == "WP" else i + 1
        total += q * n * sum(macs[start:]) + n * macs[i]
    return total


def _pmt_macs(profile: ModelProfile, *, trainable: frozenset[str], **kw: Any) -> int:
    kw.pop("coordinates", None)
    return _layerwise_macs(profile, trainable=trainable,
                           mode=lambda layer: _pmt_mode(layer, trainable), **kw)


def _np_layerwise_macs(profile: ModelProfile, **kw: Any) -> int:
    kw.pop("coordinates", None)
    return _layerwise_macs(profile, mode=lambda layer: "NP", **kw)


def _bp_macs(profile: ModelProfile, *, batch_size: int, trainable: frozenset[str],
             **_: Any) -> int:
    """Forward + backward ≈ 3·N·MACs: the backward computes ∇a through every layer after
    the first trainable one f (one layer's MACs each) and ∇W of every layer whose weight
    trains (its MACs again); a frozen prefix costs forward only (sparse-bp)."""
    macs = _macs_layers(profile)
    indices = _trainable_layer_indices(profile, trainable)
    total = sum(macs)
    if indices:
        f = indices[0]
        total += sum(macs[f + 1:])
        total += sum(m for layer, m in zip(profile.layers, macs)
                     if _layer_trainable_weight_numel(layer, trainable))
    return batch_size * total


def tinyfoa_rule(profile: ModelProfile, **_options: Any) -> MemoryReport:
    """TinyFoA §3 (Table 1 "TinyFoA" row): binary weights and activations, layer-wise local
    losses, vertical training over M = 2 slices; parts ``forward``, ``gradient``, ``update``.

    The Linear layers of ``profile`` are read as the FC network; the formulas live in
    :mod:`bpfree.tinyfoa.accounting` (imported lazily: that package imports training code).
    """
    from ..tinyfoa.accounting import memory_rule

    return memory_rule("TinyFoA")(profile)


register_rule("inference", inference_rule, macs=_forward_macs)
register_rule("bp", bp_rule, macs=_bp_macs)
register_rule("zo_wp_lean", zo_wp_lean_rule, macs=_queries_macs)
register_rule("zo_wp_batched", zo_wp_batched_rule, macs=_queries_macs)
register_rule("zo_np_lean", zo_np_lean_rule, macs=_np_layerwise_macs)
register_rule("zo_np_batched", zo_np_batched_rule, macs=_queries_macs)
register_rule("pmt", pmt_rule, dtype_bytes=1, fold_bn=True, macs=_pmt_macs)
register_rule("pmt-sparse", pmt_sparse_rule, dtype_bytes=1, fold_bn=True, macs=_pmt_macs)
register_rule("mezo", mezo_rule, dtype_bytes=1, fold_bn=True, macs=_queries_macs)
register_rule("cge", cge_rule, dtype_bytes=1, fold_bn=True, macs=_coordinates_macs)
register_rule("bp-int8", bp_int8_rule, dtype_bytes=1, fold_bn=True, macs=_bp_macs)
register_rule("sparse-bp", sparse_bp_rule, dtype_bytes=1, fold_bn=True, macs=_bp_macs)
register_rule("tinyfoa", tinyfoa_rule, dtype_bytes=1)


# ---------------------------------------------------------------------------------------
# Entry points.


_GLOB_CHARS = frozenset("*?[")


def _module_prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts))]


def _resolve_trainable(profile: ModelProfile, trainable: Any) -> frozenset[str]:
    """Parameter names that train: all (None), a predicate on the name, or names/prefixes.

    A name selects the parameter of that name or every parameter under that module prefix
    (``"0"`` selects ``"0.weight"`` and ``"0.bias"``). A name with ``*``, ``?`` or ``[`` is
    a glob (:mod:`fnmatch`, case-sensitive) matched against the parameter names and their
    module prefixes (``"4.*"`` selects block 4, ``"*.conv.1.0"`` every depthwise conv).
    """
    names = tuple(profile.parameter_numel)
    if trainable is None:
        return frozenset(names)
    if callable(trainable):
        return frozenset(n for n in names if trainable(n))
    if isinstance(trainable, str):
        trainable = (trainable,)
    try:
        wanted = tuple(trainable)
    except TypeError:
        raise TypeError(
            "trainable must be None, a predicate name -> bool, or an iterable of parameter / "
            f"module names, got {type(trainable).__name__}"
        ) from None
    selected: set[str] = set()
    for want in wanted:
        if not isinstance(want, str):
            raise TypeError(f"trainable: names must be str, got {want!r}")
        if _GLOB_CHARS & set(want):
            hits = [n for n in names if fnmatch.fnmatchcase(n, want)
                    or any(fnmatch.fnmatchcase(p, want) for p in _module_prefixes(n))]
        else:
            hits = [n for n in names if n == want or n.startswith(f"{want}.")]
        if not hits:
            raise ValueError(
                f"trainable: {want!r} matches no parameter; parameters are {', '.join(names)}"
            )
        selected.update(hits)
    return frozenset(selected)


def _profile_for(model: Any, input_shape: Any, example_input: Any) -> ModelProfile:
    if isinstance(model, ModelProfile):
        if input_shape is not None or example_input is not None:
            raise ValueError(
                "input_shape/example_input must be None when model is a ModelProfile"
            )
        return model
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module or ModelProfile, got {type(model).__name__}"
        )
    if (input_shape is None) == (example_input is None):
        raise ValueError(
            "give exactly one of input_shape (per sample, no batch dim) or example_input"
        )
    if example_input is None:
        # Profile one sample: per-sample counts are all the rules need.
        example_input = torch.zeros((1, *tuple(input_shape)))
    return profile_model(model, example_input)


def _prepare(model: Any, method: str, input_shape: Any, example_input: Any, fold_bn: Any,
             trainable: Any) -> tuple[_Method, ModelProfile, frozenset[str]]:
    entry = _entry(method)
    profile = _profile_for(model, input_shape, example_input)
    if fold_bn is None:
        fold_bn = entry.fold_bn
    if not isinstance(fold_bn, bool):
        raise ValueError(f"fold_bn must be True, False or None (the method's default), "
                         f"got {fold_bn!r}")
    if fold_bn:
        profile = profile.fold_batchnorm()
    return entry, profile, _resolve_trainable(profile, trainable)


def analytic(model: nn.Module | ModelProfile, method: str, *, input_shape: Any = None,
             example_input: Any = None, batch_size: int | None = None, num_queries: int = 1,
             dtype_bytes: int | None = None, trainable: Any = None, fold_bn: bool | None = None,
             **options: Any) -> MemoryReport:
    """Analytic training memory of ``method`` for ``model``, from its layer shapes.

    ``model`` is an ``nn.Module`` (profiled once with ``example_input`` — batch first — or
    with zeros of ``(1, *input_shape)``) or an existing :class:`ModelProfile`.
    ``batch_size`` defaults to the example's batch (1 with ``input_shape``).
    ``trainable`` is None (all parameters), a predicate on the parameter name, or names /
    module prefixes / globs. ``dtype_bytes`` and ``fold_bn`` default to the method's own
    (:func:`method_defaults`: 1 and True for the int8 methods, 4 and False otherwise);
    with BatchNorm folded, trainable names refer to the folded graph (a conv's folded
    bias is ``"<conv>.bias"``). Extra ``options`` go to the rule (e.g. ``momentum=True``
    for ``"bp"``, ``coordinates=K`` for ``"cge"``).
    """
    entry, profile, trainable_set = _prepare(model, method, input_shape, example_input,
                                             fold_bn, trainable)
    rule = entry.rule
    n = profile.batch_size if batch_size is None else _positive_int("batch_size", batch_size)
    kwargs = dict(
        batch_size=n,
        num_queries=_positive_int("num_queries", num_queries),
        dtype_bytes=_positive_int("dtype_bytes",
                                  entry.dtype_bytes if dtype_bytes is None else dtype_bytes),
        trainable=trainable_set,
        **options,
    )
    # Check the options against the rule's signature first, so a typo names the method
    # instead of surfacing as a TypeError from deep inside the rule.
    try:
        inspect.signature(rule).bind(profile, **kwargs)
    except TypeError as exc:
        raise ValueError(f"options for method {method!r}: {exc}") from None
    except ValueError:  # no introspectable signature (builtins); let the call decide
        pass
    return rule(profile, **kwargs)


def macs_per_iteration(model: nn.Module | ModelProfile, method: str,
                       batch_size: int | None = None, num_queries: int = 1, *,
                       trainable: Any = None, coordinates: int | None = None,
                       fold_bn: bool | None = None, input_shape: Any = None,
                       example_input: Any = None) -> int:
    """Multiply-accumulates of one training iteration of ``method`` (N samples, Q queries).

    Per-layer MACs are :attr:`LayerProfile.macs` (Conv / Linear only). Rules:

    - ``inference``: N·M (M = MACs of one forward of one sample);
    - ``pmt``, ``pmt-sparse`` (Algorithm 1): N·M clean forward (line 4), the layer-wise
      forward up to the last trainable layer (line 6), and per trainable layer i: Q·N
      perturbed partial forwards (WP: layers i.., line 10; NP: layers i+1.., line 23)
      plus N·MACs(i) to recompute a^(i+1) with the old weights (line 34);
      ``zo_np_lean``: the same with NP everywhere;
    - ``mezo``, ``zo_wp_lean``, ``zo_wp_batched``, ``zo_np_batched``: (Q+1)·N·M
      (one-sided: the clean forward plus Q perturbed ones);
    - ``cge``: (K+1)·N·M with K = ``coordinates`` (default Q), capped at d;
    - ``bp``, ``bp-int8``, ``sparse-bp``: forward N·M + backward: ∇a through every layer
      after the first trainable one and ∇W of every layer whose weight trains, each one
      layer's MACs — ≈ 3·N·M when everything trains.

    ``trainable``, ``fold_bn``, ``input_shape`` and ``example_input`` are as in
    :func:`analytic`.
    """
    entry, profile, trainable_set = _prepare(model, method, input_shape, example_input,
                                             fold_bn, trainable)
    if entry.macs is None:
        known = ", ".join(name for name in registered_rules() if _RULES[name].macs is not None)
        raise ValueError(f"method {method!r} has no MACs rule; methods with one: {known}")
    n = profile.batch_size if batch_size is None else _positive_int("batch_size", batch_size)
    return int(entry.macs(
        profile, batch_size=n, num_queries=_positive_int("num_queries", num_queries),
        trainable=trainable_set,
        coordinates=None if coordinates is None else _positive_int("coordinates", coordinates),
    ))


def pmt_modes(model: nn.Module | ModelProfile, trainable: Any = None, *,
              fold_bn: bool = True, input_shape: Any = None,
              example_input: Any = None) -> dict[str, str]:
    """PMT's perturbation mode per trainable layer, ``{layer name: "WP" | "NP"}``, in
    execution order: WP if d_w(i) < d_a(i) else NP (§3.2.2, Algorithm 1 line 7), with
    d_w the layer's trainable weights (bias excluded, as PMT and :class:`bpfree.pmt.PMTTrainer`
    define it) and d_a its output values per sample. BatchNorm is folded first unless
    ``fold_bn=False``."""
    _, profile, trainable_set = _prepare(model, "pmt", input_shape, example_input, fold_bn,
                                         trainable)
    return {profile.layers[i].name: _pmt_mode(profile.layers[i], trainable_set)
            for i in _trainable_layer_indices(profile, trainable_set)}


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
    _, profile, trainable_set = _prepare(model, "pmt", input_shape, example_input, fold_bn,
                                         trainable)
    n = profile.batch_size if batch_size is None else _positive_int("batch_size", batch_size)
    dtype_bytes = _positive_int("dtype_bytes", dtype_bytes)
    live = _live(profile, n)
    out = []
    for i, layer in enumerate(profile.layers):
        trains = bool(_layer_trainable_numel(layer, trainable_set))
        mode = _pmt_mode(layer, trainable_set) if trains else None
        saved = _inputs_bytes([layer], profile, n, dtype_bytes) if _saves_input(layer) else 0
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


# ---------------------------------------------------------------------------------------
# QZO-FF (Feng et al., NeurIPS 2024) App. B, Figures 3 / 4: scratch vs weight memory of
# forward-gradient (sign-m-SPSA) training and of back-propagation, in fp16 and 16w8a,
# full fine-tuning, linear probing and sparse update.

#: Bytes per (weight, activation, gradient / perturbation) value of each QZO-FF precision:
#: fp16 everywhere, or 16-bit weights with 8-bit activations, perturbations z and
#: gradients g_q (QZO-FF §3.3 "weights in 16-bit, while the perturbation z and gradient g
#: can be in 8-bit"; §4 "16w8a").
FF_PRECISIONS: dict[str, tuple[int, int, int]] = {
    "fp16": (2, 2, 2),
    "16w8a": (2, 1, 1),
}
#: How a sparse update stores which weights train: a bitmap of 1 bit per candidate
#: (trainable) weight, a uint32 index per kept weight, or nothing (a random mask
#: regenerated from a seed, QZO-FF §3.4 "randomized pruning").
SPARSE_MASKS: dict[str, str] = {"bitmap": "1 bit per trainable weight",
                                "index": "4 B (uint32) per kept weight",
                                "seed": "0 B (random mask regenerated from a seed)"}
#: Bytes of one sign of (l+ - l-) kept per query by sign-m-SPSA (an int8).
SIGN_BYTES = 1

#: Parameter-free functional ops (profile pseudo-layers) whose backward needs their
#: activation inputs: products of two activations or of an activation and a weight owned
#: by a non-leaf module, and normalizations.
_PRODUCT_OPS: frozenset[str] = frozenset({
    "matmul", "bmm", "baddbmm", "mm", "addmm", "addbmm", "linear", "einsum", "conv1d",
    "conv2d", "conv3d", "scaled_dot_product_attention", "multi_head_attention_forward",
})
_NORM_TYPES: frozenset[str] = frozenset({
    "LayerNorm", "GroupNorm", "RMSNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
    "SyncBatchNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "layer_norm",
    "group_norm", "rms_norm", "batch_norm", "instance_norm", "normalize",
})
_ELEMENTWISE_PRODUCTS: frozenset[str] = frozenset({"mul", "div", "truediv"})
_MHA_OP = "multi_head_attention_forward"


def _ff_precision(precision: str | None, dtype_bytes: int) -> tuple[int, int, int]:
    if precision is None:
        return dtype_bytes, dtype_bytes, dtype_bytes
    if precision not in FF_PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(FF_PRECISIONS)} (or None: "
                         f"dtype_bytes for everything), got {precision!r}")
    return FF_PRECISIONS[precision]


def _check_sparsity(sparsity: Any) -> float:
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)) \
            or not 0.0 <= float(sparsity) < 1.0:
        raise ValueError(f"sparsity must be a number in [0, 1) (the fraction of trainable "
                         f"weights pruned from the update), got {sparsity!r}")
    return float(sparsity)


def _check_mask(mask: Any) -> str:
    if mask not in SPARSE_MASKS:
        raise ValueError(f"mask must be one of {', '.join(SPARSE_MASKS)}, got {mask!r}")
    return mask


def _kept(numel: int, sparsity: float) -> int:
    """Weights updated out of ``numel`` when ``sparsity`` of them are pruned (ceil)."""
    if sparsity == 0.0:
        return numel
    # Exact for the decimal fractions people use (0.9 -> 1/10 kept), ceil otherwise.
    keep = round(1.0 - sparsity, 12)
    return -(-round(numel * keep * 10**12) // 10**12)


def _mask_bytes(n_train: int, sparsity: float, mask: str) -> int:
    if sparsity == 0.0 or mask == "seed":
        return 0
    if mask == "index":
        return _kept(n_train, sparsity) * 4
    return -(-n_train // 8)


def _module_of(layer_name: str) -> str:
    return layer_name.split(":", 1)[0]


def _parameter_owners(profile: ModelProfile) -> dict[str, int]:
    """Parameter name -> index of the layer that owns it.

    A leaf module's parameters belong to its (first) call. A parameter of a non-leaf
    module (``nn.MultiheadAttention.in_proj_weight``, its never-called ``out_proj``, an
    ``nn.Parameter`` used with ``F.linear`` in a container's forward) belongs to the first
    layer recorded under its module, or under the nearest enclosing module with one; a
    parameter used by no recorded layer goes to layer 0 (conservative for BP).
    """
    owners: dict[str, int] = {}
    for i, layer in enumerate(profile.layers):
        for name in layer.parameter_numel:
            owners.setdefault(name, i)
    modules = [_module_of(layer.name) for layer in profile.layers]
    for name in profile.parameter_numel:
        if name in owners:
            continue
        prefix = name.rsplit(".", 1)[0] if "." in name else ""
        index = None
        while index is None:
            index = next((i for i, m in enumerate(modules)
                          if not prefix or m == prefix or m.startswith(f"{prefix}.")), None)
            if index is not None or not prefix:
                break
            prefix = prefix.rsplit(".", 1)[0] if "." in prefix else ""
        owners[name] = 0 if index is None else index
    return owners


def _unit_trainable(profile: ModelProfile, trainable: frozenset[str]) -> dict[int, int]:
    """Layer index -> trainable elements it owns (:func:`_parameter_owners`)."""
    units: dict[int, int] = {}
    for name, index in _parameter_owners(profile).items():
        if name in trainable:
            units[index] = units.get(index, 0) + profile.parameter_numel[name]
    return units


def _mha_dims(layer: LayerProfile) -> tuple[int, int, int, int] | None:
    """(batch, target length L, source length S, embed E) of a profiled
    ``F.multi_head_attention_forward`` call (inputs are sequence-first)."""
    if layer.type != _MHA_OP or len(layer.input_shapes) < 2:
        return None
    q, k = layer.input_shapes[0], layer.input_shapes[1]
    if len(q) == 3 and len(k) == 3:
        return q[1], q[0], k[0], q[2]
    if len(q) == 2 and len(k) == 2:
        return 1, q[0], k[0], q[1]
    return None


def _mha_heads(layer: LayerProfile, attention_heads: Any) -> int:
    if not attention_heads:
        return 1
    return int(attention_heads.get(_module_of(layer.name), 1))


def _mha_internal(layer: LayerProfile, attention_heads: Any) -> tuple[int, int]:
    """(extra live, extra saved) elements inside an opaque ``nn.MultiheadAttention`` call,
    profiled batch: the projected q, k, v (N(L+2S)E), the attention scores and
    probabilities (2·N·h·L·S live at the softmax) and, for BP, q, k, v + the
    probabilities + the context fed to out_proj (N·L·E)."""
    dims = _mha_dims(layer)
    if dims is None:
        return 0, 0
    n, tgt, src, embed = dims
    heads = _mha_heads(layer, attention_heads)
    qkv = n * (tgt + 2 * src) * embed
    probs = n * heads * tgt * src
    return qkv + 2 * probs, qkv + probs + n * tgt * embed


def _unique_input_numel(profile: ModelProfile, layer: LayerProfile) -> int:
    if layer.input_ids and profile.buffer_numel:
        return sum(profile.buffer_numel.get(t, 0) for t in dict.fromkeys(layer.input_ids))
    return layer.input_numel


def _ff_live(profile: ModelProfile, attention_heads: Any) -> list[int]:
    """Per layer, live elements for the profiled batch (opaque MHA internals added)."""
    return [layer.live_numel + _mha_internal(layer, attention_heads)[0]
            for layer in profile.layers]


#: Layers whose backward PyTorch computes from their output (saved instead of the input).
_SAVES_OUTPUT: frozenset[str] = frozenset({
    "ReLU", "relu", "Sigmoid", "sigmoid", "Tanh", "tanh", "Softmax", "softmax",
    "LogSoftmax", "log_softmax",
})


def _bp_saved(profile: ModelProfile, trainable: frozenset[str], first: int,
              attention_heads: Any) -> tuple[list[int], list[int]]:
    """Per layer, elements (profiled batch) BP newly stores for the backward pass, and the
    elements of that layer's own input/output already stored by earlier layers.

    From the first trainable layer ``first`` on: the input of a layer whose own weight
    (not only its bias) trains — for dW = dz·a^T — or that owns a trainable parameter of
    a non-leaf module; of every nonlinear layer (h'(z); ReLU, sigmoid, tanh and softmax
    store their output, as PyTorch does) and normalization (LayerNorm, BatchNorm); of
    every functional product of activations (matmul, bmm, linear, attention;
    ``mul``/``div`` of two activations); and, for an opaque ``nn.MultiheadAttention``,
    its internals (:func:`_mha_internal`). A storage kept by two layers (a ReLU output
    that is the next Linear's input, q and k as views of one qkv tensor) counts once.
    Views, adds, average pooling and the frozen prefix keep nothing.
    """
    owners = _parameter_owners(profile)
    owns_trainable = {i for name, i in owners.items()
                      if name in trainable and not name.endswith("bias")}
    stored: set[int] = set()
    saved, overlap = [], []
    for j, layer in enumerate(profile.layers):
        own = dict.fromkeys((*layer.input_ids, *layer.output_ids))
        overlap.append(sum(profile.buffer_numel.get(t, 0) for t in own if t in stored))
        if j < first:
            saved.append(0)
            continue
        keeps = (_layer_trainable_weight_numel(layer, trainable) or j in owns_trainable
                 or layer.type in NONLINEAR_LAYER_TYPES or layer.type in _NORM_TYPES
                 or layer.type in _PRODUCT_OPS
                 or (layer.type in _ELEMENTWISE_PRODUCTS and len(layer.input_shapes) >= 2))
        numel = 0
        if keeps:
            output = layer.type in _SAVES_OUTPUT and not _layer_trainable_numel(layer, trainable)
            ids = layer.output_ids if output else layer.input_ids
            if ids and profile.buffer_numel:
                new = [t for t in dict.fromkeys(ids) if t not in stored]
                numel = sum(profile.buffer_numel.get(t, 0) for t in new)
                stored.update(new)
            else:  # hand-built profile without buffer tokens
                numel = layer.output_numel if output else layer.input_numel
        numel += _mha_internal(layer, attention_heads)[1]
        saved.append(numel)
    return saved, overlap


def ff_rule(profile: ModelProfile, *, batch_size: int, num_queries: int, dtype_bytes: int,
            trainable: frozenset[str], precision: str | None = None, sparsity: float = 0.0,
            mask: str = "bitmap", attention_heads: Any = None) -> MemoryReport:
    """QZO-FF forward-gradient training (sign-m-SPSA, Algorithm 1), memory as parts.

    ``num_queries`` is m, the perturbations per step. Per query the trainable weights are
    perturbed in place to w+εz, a forward gives l+, then w-εz gives l-, then
    g += sign(l+ - l-)·z and w is restored (lines 5-11). No activation is stored, so:

    - parameters: every parameter at the weight precision (fp16 and 16w8a: 2 B);
    - activations: the inference working set, max over layers of input + output + held
      skips for N samples at the activation precision (two live layer buffers);
    - perturbation: z is regenerated from the query's seed one layer at a time (the
      per-tensor perturbation of line 22), so at most one layer's z lives: the largest
      trainable layer's (kept) weights at the gradient/perturbation precision b_z;
    - gradient_buffers: the accumulator g_q of every (kept) trainable weight at b_z
      (QZO-FF keeps g_q in 8 bits in 16w8a), applied after the m queries (lines 13-17);
    - sparse_mask: with ``sparsity`` > 0, which weights train (:data:`SPARSE_MASKS`);
    - seeds_losses: m uint32 seeds, m int8 signs and the two fp32 losses l+, l- of the
      query in flight.

    ``precision`` "fp16" / "16w8a" sets (weight, activation, gradient) bytes
    (:data:`FF_PRECISIONS`); None uses ``dtype_bytes`` for all three. ``sparsity`` is the
    fraction of the trainable weights pruned from the update (0.9: 10 % updated, z and g
    only for those). ``attention_heads`` maps an ``nn.MultiheadAttention`` module name to
    its heads, for its otherwise invisible attention matrix (default 1 head).
    """
    w_bytes, a_bytes, g_bytes = _ff_precision(precision, dtype_bytes)
    sparsity = _check_sparsity(sparsity)
    mask = _check_mask(mask)
    m = num_queries
    n_train = _trainable_numel(profile, trainable)
    largest = max(_unit_trainable(profile, trainable).values(), default=0)
    live = _ff_live(profile, attention_heads)
    return MemoryReport("ff", _parts(
        parameters=profile.num_parameters * w_bytes,
        activations=_scaled(max(live, default=0), profile.batch_size, batch_size) * a_bytes,
        perturbation=_kept(largest, sparsity) * g_bytes,
        gradient_buffers=_kept(n_train, sparsity) * g_bytes,
        sparse_mask=_mask_bytes(n_train, sparsity, mask),
        seeds_losses=(m * (SEED_BYTES + SIGN_BYTES) + 2 * LOSS_BYTES) if n_train else 0,
    ))


def bp_ff_compare_rule(profile: ModelProfile, *, batch_size: int, num_queries: int,
                       dtype_bytes: int, trainable: frozenset[str],
                       precision: str | None = None, sparsity: float = 0.0,
                       mask: str = "bitmap", attention_heads: Any = None) -> MemoryReport:
    """Back-propagation as QZO-FF Figures 3 / 4 compare it with forward gradients.

    - parameters: every parameter at the weight precision;
    - activations: what the backward needs stored, from the first trainable layer f on
      (:func:`_bp_saved`), for N samples at the activation precision;
    - activation_buffers: the working set on top of the stored tensors at the peak —
      the larger of the forward peak (max over layers j of the tensors stored before j
      + layer j's input/output/held buffers not among them) and the backward peak (max
      over j >= f of the tensors stored up to j + layer j's live elements as activation
      gradients at the gradient precision), minus the stored activations. For linear
      probing the frozen prefix's forward working set dominates. A held skip that is
      also stored counts twice (an upper bound);
    - gradient_buffers: one gradient per (kept) trainable weight at the gradient
      precision; sparse_mask as in :func:`ff_rule`. SGD: no optimizer state.

    ``precision``, ``sparsity``, ``mask`` and ``attention_heads`` as in :func:`ff_rule`
    (the BP gradient also takes the gradient precision: 1 B in 16w8a).
    """
    w_bytes, a_bytes, g_bytes = _ff_precision(precision, dtype_bytes)
    sparsity = _check_sparsity(sparsity)
    mask = _check_mask(mask)
    n_train = _trainable_numel(profile, trainable)
    owners = _parameter_owners(profile)
    trained = sorted({owners[name] for name in trainable if name in owners})
    live = _ff_live(profile, attention_heads)

    def scaled(numel: int) -> int:
        return _scaled(numel, profile.batch_size, batch_size)

    forward_peak = max((scaled(x) * a_bytes for x in live), default=0)
    if not trained:
        stored, peak = 0, forward_peak
    else:
        saved, overlap = _bp_saved(profile, trainable, trained[0], attention_heads)
        prefix = [0]
        for x in saved:
            prefix.append(prefix[-1] + scaled(x))
        stored = prefix[-1] * a_bytes
        forward = max((prefix[j] + scaled(live[j]) - scaled(overlap[j])) * a_bytes
                      for j in range(len(live)))
        backward = max(prefix[j + 1] * a_bytes + scaled(live[j]) * g_bytes
                       for j in range(trained[0], len(live)))
        peak = max(forward, backward)
    return MemoryReport("bp-ff-compare", _parts(
        parameters=profile.num_parameters * w_bytes,
        activations=stored,
        activation_buffers=peak - stored,
        gradient_buffers=_kept(n_train, sparsity) * g_bytes,
        sparse_mask=_mask_bytes(n_train, sparsity, mask),
    ))


def _ff_macs(profile: ModelProfile, *, batch_size: int, num_queries: int, **_: Any) -> int:
    # Algorithm 1: two forwards (w+εz, w-εz) per query, no clean forward.
    return 2 * num_queries * batch_size * profile.macs


register_rule("ff", ff_rule, dtype_bytes=2, macs=_ff_macs)
register_rule("bp-ff-compare", bp_ff_compare_rule, dtype_bytes=2, macs=_bp_macs)
