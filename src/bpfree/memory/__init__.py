"""Memory accounting: how many bytes a training method needs, as named parts.

Two views of the same question:

- analytic — :func:`analytic` applies a method's rule (PMT Table 3, made per-layer) to a
  :func:`profile_model` of the network; :func:`register_rule` lets each method add its own
  (built in: inference, bp, zo_* in :mod:`.rules`; the int8 MCU methods pmt, pmt-sparse,
  mezo, cge, bp-int8, sparse-bp in :mod:`.mcu`; QZO-FF's ff and bp-ff-compare in
  :mod:`.ff`; ``tinyfoa`` is registered by :mod:`bpfree.tinyfoa.accounting` when
  :mod:`bpfree.tinyfoa` is imported); :func:`macs_per_iteration`
  gives a method's compute per step, :func:`pmt_modes` PMT's WP/NP choice per layer and
  :func:`layer_memory` the per-layer bytes (BP's saved activations, PMT's peak and
  gradient buffer) behind the totals;
- measured — :func:`measure_peak` runs one step and reports the peak tensor storage it
  allocated; :func:`peak_extra_bytes` compares a training step with plain inference;
- QZO-FF Figures 3 / 4 — :func:`scratch_vs_weights` splits BP and forward-gradient
  training into scratch and weight bytes (fp16 / 16w8a, FT / LP / sparse) and
  :func:`plot_scratch_vs_weights` draws the stacked bars.

Both produce numbers a :class:`MemoryReport` can hold (parameters, trainable_copy,
activations, gradient_buffers, optimizer_state, seeds_losses, plus extras).
"""

from .rules import (
    BIAS_BYTES,
    GRAD_BYTES,
    LOSS_BYTES,
    NONLINEAR_LAYER_TYPES,
    SEED_BYTES,
    analytic,
    macs_per_iteration,
    method_defaults,
    register_rule,
    registered_rules,
)
from .mcu import LayerMemory, layer_memory, pmt_modes
from .ff import FF_PRECISIONS, SIGN_BYTES, SPARSE_MASKS
from .scratch import (
    FF_METHODS,
    FF_MODES,
    attention_heads,
    default_head,
    plot_scratch_vs_weights,
    scratch_vs_weights,
)
from .measure import MeasuredMemory, PeakMemoryTracker, measure_peak, peak_extra_bytes
from .profile import LayerProfile, ModelProfile, profile_model
from .report import CANONICAL_PARTS, MemoryReport, format_bytes

__all__ = [
    "BIAS_BYTES",
    "FF_METHODS",
    "FF_MODES",
    "FF_PRECISIONS",
    "SPARSE_MASKS",
    "CANONICAL_PARTS",
    "GRAD_BYTES",
    "LOSS_BYTES",
    "NONLINEAR_LAYER_TYPES",
    "SEED_BYTES",
    "LayerMemory",
    "LayerProfile",
    "MeasuredMemory",
    "MemoryReport",
    "ModelProfile",
    "PeakMemoryTracker",
    "analytic",
    "attention_heads",
    "default_head",
    "format_bytes",
    "layer_memory",
    "macs_per_iteration",
    "measure_peak",
    "method_defaults",
    "peak_extra_bytes",
    "plot_scratch_vs_weights",
    "pmt_modes",
    "profile_model",
    "register_rule",
    "registered_rules",
    "scratch_vs_weights",
]
