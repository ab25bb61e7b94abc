"""Memory accounting: how many bytes a training method needs, as named parts.

Two views of the same question:

- analytic — :func:`analytic` applies a method's rule (PMT Table 3, made per-layer) to a
  :func:`profile_model` of the network; :func:`register_rule` lets each method add its own;
- measured — :func:`measure_peak` runs one step and reports the peak tensor storage it
  allocated; :func:`peak_extra_bytes` compares a training step with plain inference.

Both produce numbers a :class:`MemoryReport` can hold (parameters, trainable_copy,
activations, gradient_buffers, optimizer_state, seeds_losses, plus extras).
"""

from .rules import (
    LOSS_BYTES,
    NONLINEAR_LAYER_TYPES,
    SEED_BYTES,
    analytic,
    register_rule,
    registered_rules,
)
from .measure import MeasuredMemory, PeakMemoryTracker, measure_peak, peak_extra_bytes
from .profile import LayerProfile, ModelProfile, profile_model
from .report import CANONICAL_PARTS, MemoryReport, format_bytes

__all__ = [
    "CANONICAL_PARTS",
    "LOSS_BYTES",
    "NONLINEAR_LAYER_TYPES",
    "SEED_BYTES",
    "LayerProfile",
    "MeasuredMemory",
    "MemoryReport",
    "ModelProfile",
    "PeakMemoryTracker",
    "analytic",
    "format_bytes",
    "measure_peak",
    "peak_extra_bytes",
    "profile_model",
    "register_rule",
    "registered_rules",
]
