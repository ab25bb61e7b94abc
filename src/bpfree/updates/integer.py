"""The integer update rule of PMT: round and clip (Eq. 8 and Eq. 11)."""

from __future__ import annotations

from torch import Tensor


def round_and_clip_(step: Tensor, weight: Tensor, low: int, high: int) -> Tensor:
    """``clip(round(W + step), low, high)``, computed in ``step``'s buffer and returned.

    ``step`` is the already scaled update ``-eta * GNS * QAS * g`` (PMT Eq. 8); it is overwritten
    so that the update needs no second buffer of the layer's size (§3.2.2: the gradient buffer
    becomes the new weights). Rounding is round-half-to-even (``torch.round``): Eq. 11 only
    says "rounded". ``low``/``high``: the integer range, e.g. [-128, 127] for int8 weights.
    """
    if low > high:
        raise ValueError(f"clip range must have low <= high, got [{low}, {high}]")
    return step.add_(weight).round_().clamp_(low, high)
