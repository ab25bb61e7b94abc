"""Integer arithmetic of QZO-FF (Feng et al. 2024, §3.3, Algorithm 1, Appendix A).

Pure functions on integer tensors; every float that enters is a *static* scale computed once
(``Δw``, ``Δz``, ``Δη``) and every re-quantization is TFLite's multiply-and-shift
(:func:`bpfree.quant.fixed_point.multiply_by_quantized_multiplier` with the multiplier from
:func:`~bpfree.quant.fixed_point.quantize_multiplier`), i.e. Appendix A's Eq. 10
``(acc · m) >> k`` with ``m / 2**k ≈`` the real factor. No second requantization is written here.

Rounding choices (each one is a choice the paper leaves open):

* weights (Eq. 5) and ``ε_q = ⌊ε/Δw⌉``: ``torch.round`` / Python ``round``, half to even. These
  run once, offline, in float; ties have probability ~0 for real data.
* perturbation re-quantization (Eq. 6) and the update ``w̄_q`` (Eq. 8): gemmlowp's two roundings,
  ``SaturatingRoundingDoublingHighMul`` (half up) then ``RoundingDivideByPOT`` (half away from
  zero), bit-exact with TFLite.
* results are saturated to the signed ``b_w``-bit range ``[-(2**(b-1)-1), 2**(b-1)-1]``
  (symmetric, the most negative code unused, as in Eq. 5).
"""

from __future__ import annotations

import math
import numbers
import warnings

import torch

from ..quant.fixed_point import (
    INT32_MAX,
    multiply_by_quantized_multiplier,
    quantize_multiplier,
)
from ..updates.fixed_point import fixed_point_update as quantized_update
from ..updates.fixed_point import qmax, saturate, update_multiplier

__all__ = [
    "EpsilonUnderflowWarning",
    "accumulate_gradient",
    "check_accumulator",
    "displaced_weights",
    "perturbation_multiplier",
    "perturbed_weights",
    "qmax",
    "quantize_epsilon",
    "quantize_weights",
    "quantized_update",
    "saturate",
    "update_multiplier",
]


class EpsilonUnderflowWarning(UserWarning):
    """``ε`` quantizes to 0 at the weight scale: perturbations and updates cannot move.

    This is the paper's explanation of why 8-bit weights (8w8a) do not converge (§4.2,
    Appendix E): "the small perturbation of ε is quantized using the scaling factor of weights
    (Δw). It requires higher bits to be properly represented".
    """


def _channel_view(scale: torch.Tensor, ndim: int) -> torch.Tensor:
    """Per-channel scales ``[C]`` as ``[C, 1, ...]`` to broadcast against an ``ndim`` tensor."""
    return scale.reshape(scale.shape + (1,) * (ndim - scale.dim()))


def quantize_weights(w: torch.Tensor, bits: int = 16, per_channel: bool = False, *,
                     w_max: float | torch.Tensor | None = None, headroom: float = 1.0
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric quantization of QZO-FF Eq. 5: ``w_q = ⌊w / Δw⌉``, ``Δw = w_max / (2**(b-1)-1)``.

    Args:
        w: float tensor.
        bits: weight bit width ``b_w`` (16 in the paper; 2..24, so codes stay exact in float32).
        per_channel: one scale per output channel (dim 0) instead of one per tensor (§3.3:
            "per-channel quantization can be similarly derived").
        w_max: range override (scalar, or ``[C]`` per channel); default ``max|w|`` (the "TF"
            min/max method). A zero range (an all-zero tensor or channel, e.g. a fresh bias)
            falls back to ``w_max = 1`` so the tensor can still be trained.
        headroom: factor ``>= 1`` applied to the default range. The range is static, so
            weights that grow past ``w_max`` saturate at ``±(2**(b-1)-1)``; 1.0 is the paper's
            ``max|w|``, a larger value trades resolution for room to move.

    Returns:
        ``(w_q, scale)``: int32 codes of ``w``'s shape and float64 ``Δw`` (0-d, or ``[C]``).
    """
    if not isinstance(w, torch.Tensor) or not w.dtype.is_floating_point:
        raise ValueError("w must be a floating-point tensor")
    if not 2 <= bits <= 24:
        raise ValueError(f"weight bits must be in [2, 24], got {bits}")
    if not (isinstance(headroom, numbers.Real) and math.isfinite(headroom) and headroom >= 1):
        raise ValueError(f"headroom must be a finite number >= 1, got {headroom!r}")
    q = qmax(bits)
    wd = w.detach().to(torch.float64)
    if w_max is None:
        if per_channel and wd.dim() >= 1:
            w_max = wd.abs().reshape(wd.shape[0], -1).amax(dim=1)
        else:
            w_max = wd.abs().max() if wd.numel() else torch.tensor(0.0, dtype=torch.float64)
        w_max = w_max * float(headroom)
    w_max = torch.as_tensor(w_max, dtype=torch.float64)
    if not bool(torch.isfinite(w_max).all()) or bool((w_max < 0).any()):
        raise ValueError("w_max must be finite and >= 0")
    w_max = torch.where(w_max > 0, w_max, torch.ones_like(w_max))
    scale = w_max / q
    codes = torch.round(wd / _channel_view(scale, wd.dim())).clamp_(-q, q).to(torch.int32)
    return codes, scale


def quantize_epsilon(eps: float, scale: torch.Tensor, *, warn: bool = True) -> torch.Tensor:
    """``ε_q = ⌊ε / Δw⌉`` (QZO-FF §3.3), per tensor or per channel (int64, the shape of ``scale``).

    Warns :class:`EpsilonUnderflowWarning` when any ``ε_q`` is 0: such a tensor (channel) is
    never perturbed, every loss difference is 0 and training cannot move — the paper's reason
    8-bit weights fail (ε = 1e-3 against ``Δw = w_max/127``).
    """
    if not (isinstance(eps, numbers.Real) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
    eps_q = torch.round(float(eps) / scale.to(torch.float64)).to(torch.int64)
    if warn and bool((eps_q == 0).any()):
        smallest = float(scale.max())
        warnings.warn(
            f"eps={eps} quantizes to 0 at the weight scale (Δw up to {smallest:.3g}, so "
            f"ε/Δw < 0.5): the perturbation vanishes in the quantized space and training "
            f"cannot move. This is why 8-bit weights fail in QZO-FF (§4.2, App. E); use "
            f"16-bit weights or a larger eps.", EpsilonUnderflowWarning, stacklevel=2)
    return eps_q


def perturbation_multiplier(z_scale: float) -> tuple[int, int]:
    """Appendix A's ``(m, k)`` with ``m / 2**k ≈ Δz``, as TFLite's ``(multiplier, shift)``."""
    return quantize_multiplier(float(z_scale))


def check_accumulator(w_bits: int, z_bits: int, one_q: int, eps_q: torch.Tensor | int,
                      m: int = 1) -> None:
    """Raise ValueError unless ``|w_q·1_q| + |ε_q·z_q|`` and ``m·qmax(z)`` fit the int32
    accumulator of Eq. 6 / Algorithm 1 line 10."""
    worst = qmax(w_bits) * int(one_q) + int(torch.as_tensor(eps_q).abs().max()) * qmax(z_bits)
    if worst > INT32_MAX:
        raise ValueError(f"w_q·1_q ± ε_q·z_q can reach {worst}, which overflows the 32-bit "
                         f"accumulator (w_bits={w_bits}, z_bits={z_bits}, 1_q={one_q}, "
                         f"max ε_q={int(torch.as_tensor(eps_q).abs().max())})")
    if m * qmax(z_bits) > INT32_MAX:
        raise ValueError(f"m={m} directions of {z_bits}-bit codes overflow int32")


def _radius_times_codes(radius_q, z_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
    """``r_q·z_q`` in int64, ``r_q`` an int or per channel ``[C]`` (dim 0 of ``w_q``)."""
    r = torch.as_tensor(radius_q, dtype=torch.int64, device=w_q.device)
    if r.dim() == 1:
        r = _channel_view(r, w_q.dim())
    return r * z_q.to(torch.int64)


def perturbed_weights(w_q: torch.Tensor, z_q: torch.Tensor, eps_q, one_q: int,
                      multiplier: int, shift: int, bits: int) -> torch.Tensor:
    """QZO-FF Eq. 6 / Algorithm 1 ``PerturbParameters`` / Appendix A Eq. 10.

    ``w_q± = sat_b( MBQM(w_q·1_q + ε_q·z_q, m, k) )`` where the accumulator is int32 and
    ``MBQM`` is TFLite's multiply-and-shift by ``m·2**(k-31) ≈ Δz``, so the result is in units of
    ``Δw`` again. Pass ``-ε_q`` for the negative side. ``eps_q`` is an int or a per-channel
    ``[C]`` tensor (dim 0 of ``w_q``).

    Note ``Δz·1_q ≠ 1`` (36 · 3.5/127 = 0.99213 for the defaults), so even ``z_q = 0`` maps
    ``w_q`` to ``≈ 0.992·w_q``; callers recompute ``w_q±`` from the unperturbed ``w_q`` each time
    instead of chaining the in-place perturb / reset of Algorithm 1 lines 7, 8 and 11, which
    would shrink the weights by that factor on every call.
    """
    acc = w_q.to(torch.int64) * int(one_q) + _radius_times_codes(eps_q, z_q, w_q)
    if bool((acc.abs() > INT32_MAX).any()):
        raise OverflowError("Eq. 6 accumulator overflows int32; see check_accumulator")
    out = multiply_by_quantized_multiplier(acc, multiplier, shift)
    return saturate(out, bits).to(torch.int32)


def displaced_weights(w_q: torch.Tensor, z_q: torch.Tensor, rho_q, multiplier: int,
                      shift: int, bits: int) -> torch.Tensor:
    """``sat_b(w_q + MBQM(ρ_q·z_q, m, k))``: the weights moved by ``ρ·z`` in weight codes, with
    ``m/2**k ≈ Δz`` (Eq. 6's multiplier) applied to the displacement only.

    This is the sharpness-aware centre of §3.4 in the quantized space. It is *not* Eq. 6
    (:func:`perturbed_weights`): Eq. 6 re-quantizes ``w_q·1_q`` as well, which maps ``w_q`` to
    ``≈ Δz·1_q·w_q`` (0.992·w_q for the defaults); the ε-probes then go through Eq. 6 from
    this centre, and a centre that had been through Eq. 6 already would be shrunk twice
    (0.992² ≈ 0.984·w_q) while the plain probes see 0.992·w_q. Here the centre keeps ``w_q``
    exactly and moves by ``⌊ρ_q·z_q·Δz⌉ ≈ ρ·z/Δw`` codes, the float centre ``w + ρz``.
    ``rho_q``: an int or a per-channel ``[C]`` tensor (dim 0 of ``w_q``), like ``eps_q``.
    """
    acc = _radius_times_codes(rho_q, z_q, w_q)
    if bool((acc.abs() > INT32_MAX).any()):
        raise OverflowError("ρ_q·z_q overflows the int32 accumulator")
    step = multiply_by_quantized_multiplier(acc, multiplier, shift)
    return saturate(w_q.to(torch.int64) + step.to(torch.int64), bits).to(torch.int32)


def accumulate_gradient(signs, codes) -> torch.Tensor:
    """Algorithm 1 line 10: ``g_q^a = Σ_i sign(l+ − l−)_i · z_q,i`` as an int32 tensor.

    ``signs``: iterable of -1/0/+1; ``codes``: iterable of integer tensors of one shape.
    The average ``g_q = g_q^a / m`` (line 13) is folded into the update multiplier
    (:func:`update_multiplier`), so it costs no extra rounding.
    """
    total = None
    for s, z in zip(signs, codes, strict=True):
        s = int(s)
        if s not in (-1, 0, 1):
            raise ValueError(f"signs must be -1, 0 or 1, got {s}")
        term = z.to(torch.int32) * s
        total = term if total is None else total + term
    if total is None:
        raise ValueError("need at least one direction")
    return total
