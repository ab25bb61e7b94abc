"""Order-free sums of float64 loss differences: fixed point in int64.

Floating-point addition is not associative, so W partial sums added by an ``all_reduce`` do not
round like one sum over the whole batch. Integer addition is: each per-sample loss difference
is rounded once to a multiple of ``2**-FRACTION_BITS`` and summed in int64, which gives the
same total for any sharding and any reduction order. That is what makes W workers end bit
for bit where one process over the whole batch ends (for the integer PMT update, whose only
float inputs are these scalars).
"""

from __future__ import annotations

import torch

#: Resolution 2**-36 ~ 1.5e-11 of a loss difference: far below the loss changes a ±1 LSB
#: perturbation of an int8 layer causes, far above float64 noise at losses of order 1.
FRACTION_BITS = 36
#: Bound on |fixed-point values| and their sums: int64 wraps silently, so it is checked.
_LIMIT = float(2**62)


def _largest(t: torch.Tensor) -> float:
    return float(t.abs().max()) if t.numel() else 0.0


def to_fixed(values: torch.Tensor) -> torch.Tensor:
    """Round float64 ``values`` to int64 fixed point (``round(v * 2**FRACTION_BITS)``)."""
    scaled = values.to(torch.float64) * float(2**FRACTION_BITS)
    if not bool(torch.isfinite(scaled).all()) or _largest(scaled) >= _LIMIT:
        raise OverflowError("a loss difference is not finite or too large for int64 fixed "
                            f"point at 2**-{FRACTION_BITS}; the step is refused")
    return scaled.round().to(torch.int64)


def fixed_sum(values: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Exact int64 sum of the fixed-point ``values`` along ``dim`` (overflow refused)."""
    fixed = to_fixed(values)
    total = fixed.sum(dim)
    # int64 wraps silently: recompute in float64 and refuse when the exact sum cannot fit.
    if _largest(fixed.to(torch.float64).abs().sum(dim)) >= _LIMIT:
        raise OverflowError("the fixed-point sum of loss differences would overflow int64")
    return total


def from_fixed(total: torch.Tensor, count: int) -> torch.Tensor:
    """The mean ``total / count`` back in float64 units of the loss."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    return total.to(torch.float64) * 2.0**-FRACTION_BITS / count
