"""The fixed-point update rule of QZO-FF (Feng et al. 2024, Eq. 8, Algorithm 1 lines 13-16).

The real factor ``Δη·Δz / (m·Δw)`` becomes a TFLite ``(multiplier, shift)`` pair once per
tensor (or per channel), and the update is one multiply-and-shift of the int32 gradient
accumulator (:func:`bpfree.quant.fixed_point.multiply_by_quantized_multiplier`, gemmlowp's two
roundings), then saturation to the symmetric ``b``-bit range.
"""

from __future__ import annotations

import math
import numbers

import torch

from ..quant.fixed_point import multiply_by_quantized_multiplier, quantize_multiplier


def qmax(bits: int) -> int:
    """Largest code of a symmetric signed ``bits``-bit integer, ``2**(bits-1) - 1``.

    ``bits`` up to 32: an int32 bias (QZO-FF on a .tflite, :mod:`bpfree.qzoff.integer`)
    saturates to ``±(2**31 - 1)``."""
    if isinstance(bits, bool) or not isinstance(bits, numbers.Integral) or not 2 <= bits <= 32:
        raise ValueError(f"bits must be an int in [2, 32], got {bits!r}")
    return 2 ** (int(bits) - 1) - 1


def saturate(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Clamp integer ``x`` to ``[-qmax(bits), qmax(bits)]``."""
    q = qmax(bits)
    return x.clamp(-q, q)


def update_multiplier(lr: float, z_scale: float, w_scale: torch.Tensor, m: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 8's real factor ``Δη·Δz / (m·Δw)`` as TFLite ``(multiplier, shift)`` int64 tensors
    (0-d per tensor, ``[C]`` per channel). ``Δη = η`` quantizes the learning rate to ``1``
    (§3.3) and ``1/m`` is Algorithm 1 line 13's average. A factor below ``2**-32`` flushes to
    ``(0, 0)`` (no update), as TFLite does."""
    if not (math.isfinite(lr) and lr >= 0):
        raise ValueError(f"lr must be a finite number >= 0, got {lr}")
    return quantize_multipliers(float(lr) * float(z_scale) / (m * w_scale.to(torch.float64)))


def quantize_multipliers(reals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """TFLite ``(multiplier, shift)`` int64 tensors of ``reals``' shape, one
    :func:`~bpfree.quant.fixed_point.quantize_multiplier` per entry (each real taken as a
    double)."""
    pairs = [quantize_multiplier(float(r)) for r in reals.reshape(-1)]
    mult = torch.tensor([p[0] for p in pairs], dtype=torch.int64)
    shift = torch.tensor([p[1] for p in pairs], dtype=torch.int64)
    return mult.reshape(reals.shape), shift.reshape(reals.shape)


def subtract_and_saturate(w_q: torch.Tensor, step: torch.Tensor, bits: int,
                          mask: torch.Tensor | None = None) -> torch.Tensor:
    """Algorithm 1 line 16, ``w_q ← sat_b(w_q − w̄_q)``, for an integer-valued step ``w̄_q``
    (integer, or a float tensor already rounded); ``mask`` zeroes the step outside the
    trainable subset. Returns int32."""
    if mask is not None:
        step = step * mask.to(step.dtype)
    return saturate(w_q.to(torch.int64) - step.to(torch.int64), bits).to(torch.int32)


def fixed_point_update(w_q: torch.Tensor, g_acc: torch.Tensor, multiplier, shift, bits: int,
                     mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """QZO-FF Eq. 8 / Algorithm 1 lines 15-16: ``w̄_q = MBQM(g_q^a, m, k)`` with
    ``m·2**(k-31) ≈ Δη·Δz/(m·Δw)`` (from :func:`update_multiplier`), then
    ``w_q ← sat_b(w_q − w̄_q)``.

    ``multiplier``/``shift``: 0-d (per tensor) or ``[C]`` (per channel along dim 0). ``mask``
    (bool, exactly ``w_q``'s shape: a broadcastable mask is refused, ValueError) zeroes
    ``w̄_q`` outside the trainable subset (sparse update). Returns ``(new w_q, w̄_q)`` as
    int32.
    """
    if tuple(g_acc.shape) != tuple(w_q.shape):
        raise ValueError(f"gradient accumulator has shape {tuple(g_acc.shape)}, but the weights "
                         f"have shape {tuple(w_q.shape)}")
    if mask is not None and (not isinstance(mask, torch.Tensor)
                             or tuple(mask.shape) != tuple(w_q.shape)):
        got = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"sparse-update mask has shape {got}, but the weights have shape "
                         f"{tuple(w_q.shape)}; a mask must match its weight tensor exactly")
    mult = torch.as_tensor(multiplier, dtype=torch.int64)
    sh = torch.as_tensor(shift, dtype=torch.int64)
    if mult.dim() == 1 and w_q.dim() >= 1:
        step = multiply_by_quantized_multiplier(g_acc, mult, sh, axis=0)
    else:
        step = multiply_by_quantized_multiplier(g_acc, int(mult), int(sh))
    if mask is not None:
        step = step * mask.to(step.dtype)
    return subtract_and_saturate(w_q, step, bits), step.to(torch.int32)
