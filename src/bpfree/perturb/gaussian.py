"""Torch-generator directions: Gaussian, torch Rademacher and QZO-FF's quantized Gaussian.

Each function seeds a fresh ``torch.Generator`` on the target device, so the same
``(seed, shape, dtype, device type)`` always regenerates the same tensor; this is how
zeroth-order estimators re-create a perturbation from its seed instead of storing it. Streams
differ between device types (CPU and CUDA generators are different algorithms).

``quantized_gaussian`` follows QZO-FF §3.3 (Eqs. 5-6): z ~ N(0, I) is quantized symmetrically
with a static range ``z_max``: ``dz = z_max / (2**(b-1) - 1)``, ``z_q = clamp(round(z / dz),
-(2**(b-1) - 1), 2**(b-1) - 1)``, and the quantized 1.0 is ``1_q = round(1 / dz)``. With
``z_max = 3.5``, ``b = 8`` the paper quotes ``dz = 0.0276`` and ``1_q = 36``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from ._validation import (
    SIGNED_INT_DTYPES,
    check_finite_real,
    check_float_dtype,
    check_int,
    check_int_dtype,
    check_seed64,
    check_shape,
)


def _generator(seed: int, device) -> torch.Generator:
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(seed)
    return g


def gaussian(seed: int, shape, *, dtype: torch.dtype = torch.float32,
             device="cpu") -> torch.Tensor:
    """Standard normal directions from a seeded ``torch.Generator`` (``torch.randn``).

    Args:
        seed: int in [0, 2**64 - 1].
        shape: int or sequence of non-negative ints.
        dtype: floating dtype.
        device: device of the result (and of the generator).
    """
    seed = check_seed64(seed)
    dims = check_shape(shape)
    check_float_dtype(dtype)
    return torch.randn(dims, generator=_generator(seed, device), dtype=dtype, device=device)


def rademacher_torch(seed: int, shape, *, dtype: torch.dtype = torch.float32,
                     device="cpu") -> torch.Tensor:
    """Rademacher signs from ``torch.randint`` (bit 1 -> -1, the PMT Appendix F convention).

    The baseline the fast counter generator is benchmarked against; any floating or signed
    integer ``dtype``.
    """
    seed = check_seed64(seed)
    dims = check_shape(shape)
    if not isinstance(dtype, torch.dtype) or not (
            dtype.is_floating_point or dtype in SIGNED_INT_DTYPES):
        raise ValueError(f"dtype must be a floating or signed integer torch.dtype, got {dtype!r}")
    bits = torch.randint(0, 2, dims, generator=_generator(seed, device), dtype=torch.int8,
                         device=device)
    return (1 - 2 * bits).to(dtype)


def _check_bits(bits: object) -> int:
    return check_int(bits, "bits", 2, 16)


def _check_z_max(z_max: object) -> float:
    z_max = check_finite_real(z_max, "z_max")
    if z_max <= 0:
        raise ValueError(f"z_max must be a finite real number > 0, got {z_max}")
    return z_max


def quantization_scale(bits: int = 8, z_max: float = 3.5) -> float:
    """``dz = z_max / (2**(bits-1) - 1)`` (QZO-FF §3.3); 0.02756 for the defaults."""
    return _check_z_max(z_max) / (2 ** (_check_bits(bits) - 1) - 1)


def quantized_one(bits: int = 8, z_max: float = 3.5) -> int:
    """``1_q = round(1 / dz)``, the quantized 1.0 of QZO-FF Eq. 6 (36 for the defaults)."""
    return round(1.0 / quantization_scale(bits, z_max))


@dataclass(frozen=True)
class QuantizedSample:
    """Integer codes and scale of a quantized Gaussian draw (QZO-FF §3.3).

    Attributes:
        codes: ``z_q``, int8 for ``bits <= 8`` else int16, within ``[-qmax, qmax]``.
        scale: ``dz = z_max / qmax``.
        bits: bit width b.
        z_max: static clipping range.
    """

    codes: torch.Tensor
    scale: float
    bits: int
    z_max: float

    @property
    def qmax(self) -> int:
        """Largest code magnitude, ``2**(bits-1) - 1``."""
        return 2 ** (self.bits - 1) - 1

    @property
    def one_q(self) -> int:
        """``1_q = round(1 / dz)`` (QZO-FF Eq. 6)."""
        return round(1.0 / self.scale)

    def values(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float directions ``z_q * dz``."""
        return dequantize(self.codes, self.scale, dtype=dtype)


def dequantize(codes: torch.Tensor, scale: float, *, dtype: torch.dtype = torch.float32
               ) -> torch.Tensor:
    """``codes * scale`` in ``dtype`` (the scale is rounded to ``dtype`` first)."""
    check_float_dtype(dtype)
    return codes.to(dtype) * torch.tensor(scale, dtype=dtype, device=codes.device)


def _code_dtype(bits: int) -> torch.dtype:
    return torch.int8 if bits <= 8 else torch.int16


def quantized_gaussian(seed: int, shape, bits: int = 8, z_max: float = 3.5, *,
                       device="cpu") -> QuantizedSample:
    """Quantized Gaussian perturbation of QZO-FF §3.3 (Eq. 5 applied to z ~ N(0, I)).

    The underlying Gaussian is ``gaussian(seed, shape, dtype=float32, device=device)``, so the
    codes regenerate from the seed like every other direction.

    Args:
        seed: int in [0, 2**64 - 1].
        shape: int or sequence of non-negative ints.
        bits: bit width b, an int in [2, 16].
        z_max: static range, a finite real > 0 (3.5 in the paper).
        device: device of the codes.

    Returns:
        :class:`QuantizedSample` with ``codes`` (``z_q``) and ``scale`` (``dz``).
    """
    bits = _check_bits(bits)
    z_max = _check_z_max(z_max)
    scale = z_max / (2 ** (bits - 1) - 1)
    qmax = 2 ** (bits - 1) - 1
    z = gaussian(seed, shape, dtype=torch.float32, device=device)
    codes = torch.round(z / scale).clamp_(-qmax, qmax).to(_code_dtype(bits))
    return QuantizedSample(codes=codes, scale=scale, bits=bits, z_max=z_max)


def quantized_gaussian_codes(seed: int, shape, bits: int = 8, z_max: float = 3.5, *,
                             dtype: torch.dtype | None = None, device="cpu") -> torch.Tensor:
    """Only the integer codes ``z_q`` of :func:`quantized_gaussian`, optionally cast to a wider
    signed integer ``dtype``."""
    codes = quantized_gaussian(seed, shape, bits, z_max, device=device).codes
    if dtype is None:
        return codes
    check_int_dtype(dtype)
    if torch.iinfo(dtype).max < 2 ** (bits - 1) - 1:
        raise ValueError(f"dtype {dtype} cannot hold {bits}-bit codes; use a wider integer dtype")
    return codes.to(dtype)


@lru_cache(maxsize=64)
def quantized_second_moment(bits: int = 8, z_max: float = 3.5) -> float:
    """``E[(z_q * dz)**2]`` for z ~ N(0, 1), computed exactly from the normal CDF.

    Rounding adds about ``dz**2 / 12`` and clipping at ``z_max`` removes the tail mass, so this
    differs slightly from 1; estimators divide by it to stay unbiased.
    """
    bits = _check_bits(bits)
    z_max = _check_z_max(z_max)
    scale = z_max / (2 ** (bits - 1) - 1)
    qmax = 2 ** (bits - 1) - 1
    k = torch.arange(1, qmax + 1, dtype=torch.float64)
    upper = torch.where(k < qmax, torch.special.ndtr((k + 0.5) * scale), 1.0)
    prob = upper - torch.special.ndtr((k - 0.5) * scale)  # P(z_q = k); k = qmax takes the tail
    return float(2.0 * torch.sum(prob * k * k) * scale * scale)
