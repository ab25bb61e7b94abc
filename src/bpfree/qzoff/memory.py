"""QZO-FF (Feng et al., NeurIPS 2024) App. B, Figures 3 / 4: memory rules ``ff`` and
``bp-ff-compare`` — scratch vs weight memory of forward-gradient (sign-m-SPSA) training and of
back-propagation, in fp16 and 16w8a, full fine-tuning, linear probing and sparse update.

Registered with :func:`~bpfree.memory.rules.register_rule` on import.
"""

from __future__ import annotations

from typing import Any

from ..memory.profile import LayerProfile, ModelProfile
from ..memory.report import MemoryReport
from ..memory.rules import register_rule
from ..memory.terms import (LOSS_BYTES, NONLINEAR_LAYER_TYPES, SEED_BYTES, bp_macs,
                            canonical_parts, layer_trainable_numel, layer_trainable_weight_numel,
                            scaled, trainable_numel)

__all__ = ["FF_PRECISIONS", "SIGN_BYTES", "SPARSE_MASKS", "bp_ff_compare_rule", "ff_rule"]


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
        keeps = (layer_trainable_weight_numel(layer, trainable) or j in owns_trainable
                 or layer.type in NONLINEAR_LAYER_TYPES or layer.type in _NORM_TYPES
                 or layer.type in _PRODUCT_OPS
                 or (layer.type in _ELEMENTWISE_PRODUCTS and len(layer.input_shapes) >= 2))
        numel = 0
        if keeps:
            output = layer.type in _SAVES_OUTPUT and not layer_trainable_numel(layer, trainable)
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
    n_train = trainable_numel(profile, trainable)
    largest = max(_unit_trainable(profile, trainable).values(), default=0)
    live = _ff_live(profile, attention_heads)
    return MemoryReport("ff", canonical_parts(
        parameters=profile.num_parameters * w_bytes,
        activations=scaled(max(live, default=0), profile.batch_size, batch_size) * a_bytes,
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
    n_train = trainable_numel(profile, trainable)
    owners = _parameter_owners(profile)
    trained = sorted({owners[name] for name in trainable if name in owners})
    live = _ff_live(profile, attention_heads)

    def at_batch(numel: int) -> int:
        return scaled(numel, profile.batch_size, batch_size)

    forward_peak = max((at_batch(x) * a_bytes for x in live), default=0)
    if not trained:
        stored, peak = 0, forward_peak
    else:
        saved, overlap = _bp_saved(profile, trainable, trained[0], attention_heads)
        prefix = [0]
        for x in saved:
            prefix.append(prefix[-1] + at_batch(x))
        stored = prefix[-1] * a_bytes
        forward = max((prefix[j] + at_batch(live[j]) - at_batch(overlap[j])) * a_bytes
                      for j in range(len(live)))
        backward = max(prefix[j + 1] * a_bytes + at_batch(live[j]) * g_bytes
                       for j in range(trained[0], len(live)))
        peak = max(forward, backward)
    return MemoryReport("bp-ff-compare", canonical_parts(
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
register_rule("bp-ff-compare", bp_ff_compare_rule, dtype_bytes=2, macs=bp_macs)
