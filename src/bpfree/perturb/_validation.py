"""Argument checks shared by the perturbation generators.

Every check raises ``ValueError`` naming the parameter and the allowed values, because these
functions sit on the user-facing path (seeds, shapes, bit widths come from configs) and
``assert`` vanishes under ``python -O``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np
import torch

UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1


def check_int(value: object, name: str, low: int, high: int) -> int:
    """Return ``value`` as a Python int, or raise ``ValueError`` unless it is an integer in
    ``[low, high]``. ``bool`` is rejected: ``True`` as a seed is almost always a bug."""
    # a plain int in range needs no abc checks (~1 us each): a ZO step validates hundreds of
    # seeds and shape entries (issue 32); bool and other types take the full check below
    if type(value) is int and low <= value <= high:
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(
            f"{name} must be an int in [{low}, {high}], got {value!r} "
            f"of type {type(value).__name__}"
        )
    value = int(value)
    if not low <= value <= high:
        raise ValueError(f"{name} must be an int in [{low}, {high}], got {value}")
    return value


def check_seed64(seed: object, name: str = "seed") -> int:
    """Seeds of the counter-based and torch generators: any int in [0, 2**64 - 1]."""
    return check_int(seed, name, 0, UINT64_MAX)


def check_seed32_nonzero(seed: object, name: str = "seed") -> int:
    """XORShift32 seeds: [1, 2**32 - 1]; 0 is the generator's fixed point (PMT Appendix F)."""
    return check_int(seed, name, 1, UINT32_MAX)


def check_shape(shape: object, name: str = "shape") -> tuple[int, ...]:
    """Normalise an int, ``torch.Size`` or sequence of non-negative ints to a tuple."""
    if type(shape) is torch.Size:
        return tuple(check_int(d, f"{name}[{i}]", 0, 2**62) for i, d in enumerate(shape))
    if isinstance(shape, numbers.Integral) and not isinstance(shape, (bool, np.bool_)):
        shape = (shape,)
    if not isinstance(shape, (Sequence, torch.Size)) or isinstance(shape, (str, bytes)):
        raise ValueError(
            f"{name} must be a non-negative int or a sequence of non-negative ints, got {shape!r}"
        )
    dims = tuple(check_int(d, f"{name}[{i}]", 0, 2**62) for i, d in enumerate(shape))
    return dims


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def check_finite_real(value: object, name: str) -> float:
    """A finite real number (int or float, not bool)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite real number, got {value}")
    return value


def check_float_dtype(dtype: object, name: str = "dtype") -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(
            f"{name} must be a floating torch.dtype (e.g. torch.float32, torch.float64, "
            f"torch.float16, torch.bfloat16), got {dtype!r}"
        )
    return dtype


SIGNED_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64)


def check_int_dtype(dtype: object, name: str = "dtype") -> torch.dtype:
    if dtype not in SIGNED_INT_DTYPES:
        raise ValueError(
            f"{name} must be one of torch.int8, torch.int16, torch.int32, torch.int64, "
            f"got {dtype!r}"
        )
    return dtype  # type: ignore[return-value]
