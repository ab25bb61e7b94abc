"""Memory accounting: how many bytes a training method needs, as named parts.

Two views of the same question:

- analytic — :func:`analytic` applies a method's rule (PMT Table 3, made per-layer) to a
  :func:`profile_model` of the network; :func:`register_rule` lets each method add its own,
  built from the terms of :mod:`.terms`. Built in: inference, bp, zo_* (:mod:`.rules`).
  Each method registers its rules next to its code, and the registry imports that module on
  the first lookup of one of its names (:data:`.rules.PROVIDERS`;
  :func:`available_rules` lists every name): PMT's int8 MCU rules pmt,
  pmt-sparse, mezo, cge, bp-int8, sparse-bp in :mod:`bpfree.pmt.memory` (with
  :func:`bpfree.pmt.pmt_modes` and :func:`bpfree.pmt.layer_memory`), QZO-FF's ff and
  bp-ff-compare in :mod:`bpfree.qzoff.memory` (Figures 3 / 4:
  :func:`bpfree.qzoff.scratch_vs_weights`), ``tinyfoa`` in
  :mod:`bpfree.tinyfoa.accounting`. :func:`macs_per_iteration` gives a method's compute per
  step;
- measured — :func:`measure_peak` runs one step and reports the peak tensor storage it
  allocated; :func:`peak_extra_bytes` compares a training step with plain inference.

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
    available_rules,
    macs_per_iteration,
    method_defaults,
    register_rule,
    registered_rules,
)
from .measure import MeasuredMemory, PeakMemoryTracker, measure_peak, peak_extra_bytes
from .profile import LayerProfile, ModelProfile, profile_model
from .report import CANONICAL_PARTS, MemoryReport, format_bytes

__all__ = [
    "BIAS_BYTES",
    "CANONICAL_PARTS",
    "GRAD_BYTES",
    "LOSS_BYTES",
    "NONLINEAR_LAYER_TYPES",
    "SEED_BYTES",
    "LayerProfile",
    "MeasuredMemory",
    "MemoryReport",
    "ModelProfile",
    "PeakMemoryTracker",
    "analytic",
    "available_rules",
    "format_bytes",
    "macs_per_iteration",
    "measure_peak",
    "method_defaults",
    "peak_extra_bytes",
    "profile_model",
    "register_rule",
    "registered_rules",
]
