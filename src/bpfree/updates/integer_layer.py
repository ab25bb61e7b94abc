"""PMT's integer parameter update of an int8 layer: Eq. 8 with GNS and QAS, rounded and
clipped (Eq. 11).

A composition of shared pieces: the GNS and QAS factors of :mod:`bpfree.transforms.scaling`
and the :func:`~bpfree.updates.integer_update_` rule (the one a ``round_and_clip`` parameter
group of :class:`~bpfree.optim.ZOOptimizer` goes through), applied with the per-output-channel
scales of a ``QConv2d`` / ``QLinear`` and in the estimate's own buffer. PMT, its distributed
variant and the integer baselines (MeZO, DeepZero CGE, FullTrain INT8) all update through
:func:`apply_update` (it moved here from ``bpfree.pmt.update``, which re-exports it).

``W <- clip(round(W - eta_t * GNS * QAS * g), -128, 127)`` for int8 weights and the int32 range
for biases, where

* GNS (gradient-norm scaling, §3.1.2) is ``NQ / (NQ + d - 1)`` with ``NQ`` the number of
  independent directions averaged and ``d`` the perturbed dimension (:class:`LayerEstimate`);
* QAS (quantization-aware scaling, §3.1.2 and Appendix B, Eq. 12) is ``1 / s^2`` per output
  channel, ``s = s_w[c]`` for weights and ``s = s_in s_w[c]`` for the int32 bias, so the integer
  update follows the float update ``theta - eta * grad`` at the parameter's own scale.

Rounding is round-half-to-even (``torch.round``); the paper's Eq. 11 only says "rounded".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..quant.fixed_point import INT32_MAX, INT32_MIN
from ..transforms.scaling import gradient_norm_factor, quantization_aware_factor
from .integer import integer_update_

__all__ = ["INT32_MAX", "INT32_MIN", "LayerEstimate", "apply_update", "quantization_aware_scales"]

@dataclass
class LayerEstimate:
    """The estimate for one layer, in integer units, and what GNS needs (Eq. 8).

    ``directions`` is the number of independent perturbation directions averaged (Q for WP
    shared across the batch, N*Q for per-sample NP) and ``dimension`` the perturbed dimension
    (d_w for WP, d_a for NP), so GNS scales the learning rate by
    ``directions / (directions + dimension - 1)``.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None
    directions: int
    dimension: int

    def add_(self, other: LayerEstimate, weight: float = 1.0) -> LayerEstimate:
        """Accumulate another micro-batch's estimate (gradient accumulation, §3.4.1)."""
        self.weight.add_(other.weight, alpha=weight)
        if self.bias is not None and other.bias is not None:
            self.bias.add_(other.bias, alpha=weight)
        self.directions += other.directions
        return self


def quantization_aware_scales(layer: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(1/s_w^2, 1/(s_in s_w)^2) per output channel, float64 (Appendix B)."""
    s_w = torch.tensor(layer.weight_quant.scales, dtype=torch.float64)
    s_b = s_w * layer.input_quant.scale
    return quantization_aware_factor(s_w), quantization_aware_factor(s_b)


def _all_finite(t: torch.Tensor) -> bool:
    """True when every entry is finite, without a mask the size of ``t``.

    A NaN or an infinity makes the sum NaN or infinite; ``torch.isfinite(t).all()`` would
    allocate a bool mask as large as the gradient buffer, the one layer-sized buffer PMT
    allows itself (§3.2.2). Finite entries whose sum overflows are refused too: such a step
    would saturate every weight anyway.
    """
    return math.isfinite(float(t.sum(dtype=torch.float64)))


@torch.no_grad()
def apply_update(layer: torch.nn.Module, estimate: LayerEstimate, lr: float, *,
                 gns: bool = True, qas: bool = True) -> dict[str, float]:
    """Update ``layer.weight`` (int8) and ``layer.bias`` (int32) in place by Eq. 8.

    ``estimate`` is consumed: its tensors are overwritten (they are the gradient buffer).

    Returns statistics: the GNS factor and the fraction of weights that changed (rounding
    swallows updates below half an LSB, the failure mode QAS exists to prevent).
    """
    if not math.isfinite(lr) or lr < 0:
        raise ValueError(f"learning rate must be a finite number >= 0, got {lr}")
    if not _all_finite(estimate.weight) or (
            estimate.bias is not None and not _all_finite(estimate.bias)):
        raise FloatingPointError(f"non-finite gradient estimate; {type(layer).__name__} "
                                 "left unchanged")
    factor = gradient_norm_factor(estimate.directions, estimate.dimension) if gns else 1.0
    step = lr * factor
    qw, qb = quantization_aware_scales(layer) if qas else (None, None)
    # The estimate is consumed in place: the gradient buffer becomes the new weights, so the
    # update needs no second buffer of the layer's size (PMT §3.2.2: in-place swap).
    w_new = integer_update_(estimate.weight, layer.weight, step, -128, 127, qw)
    changed = float((w_new != layer.weight).sum()) / max(w_new.numel(), 1)
    layer.weight.copy_(w_new)
    if estimate.bias is not None:
        b_new = integer_update_(estimate.bias, layer.bias, step, INT32_MIN, INT32_MAX, qb)
        layer.bias.copy_(b_new.to(torch.int32))
    return {"gns": factor, "changed": changed}
