"""Integer arithmetic the int8 layers share: the bound on the int32 accumulator that makes
float accumulation exact (:func:`accumulator_bound`, :func:`float32_chunk`; the proof is in
:mod:`.affine`), the guard against inexact transform convolutions on CUDA, and the checks of
integer tensors, quantizations and arguments.
"""

from __future__ import annotations

import contextlib

import torch

from ..fixed_point import INT8_MAX, INT8_MIN
from ..params import TensorQuant

FLOAT32_EXACT = 2**24
FLOAT64_EXACT = 2**53
_ACCUMULATE = ("auto", "float64")
_BACKENDS = ("auto", "torch", "numba")


def _integer_tensor(value, name: str, lo: int, hi: int, dtype: torch.dtype) -> torch.Tensor:
    """An integer-valued tensor checked to lie in [lo, hi], converted to ``dtype``."""
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of integers in [{lo}, {hi}], "
                         f"got {type(value).__name__}")
    t = value.detach()
    if t.dtype == torch.bool or t.dtype.is_complex:
        raise ValueError(f"{name} must hold integers in [{lo}, {hi}], got dtype {t.dtype}")
    if t.dtype.is_floating_point:
        if not bool(torch.isfinite(t).all()) or not torch.equal(t, torch.round(t)):
            raise ValueError(f"{name} must hold integers in [{lo}, {hi}]; got a {t.dtype} tensor "
                             "with non-integer or non-finite values")
    if t.numel():
        t_min, t_max = t.min().item(), t.max().item()
        if t_min < lo or t_max > hi:
            raise ValueError(f"{name} values must lie in [{lo}, {hi}], got values in "
                             f"[{t_min:g}, {t_max:g}]")
    return t.to(dtype).clone().contiguous()


def _check_quant(value, name: str) -> TensorQuant:
    if not isinstance(value, TensorQuant):
        raise ValueError(f"{name} must be a bpfree.quant.TensorQuant(scale, zero_point), "
                         f"got {value!r}")
    return value


def _check_int8_input(x, name: str = "input") -> None:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.int8:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be an int8 tensor (quantize floats with "
                         f"TensorQuant.quantize), got {got}")


def _pair(value, name: str, minimum: int) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        pair = (value, value)
    elif (isinstance(value, (tuple, list)) and len(value) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        pair = (int(value[0]), int(value[1]))
    else:
        raise ValueError(f"{name} must be an int or a pair of ints >= {minimum}, got {value!r}")
    if min(pair) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return pair


def _check_choice(value, name: str, choices) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def accumulator_bound(k: int, input_zero_point: int) -> int:
    """Largest |partial sum| of ``sum_k w_k (x_k - z_x)`` over int8 weights and inputs."""
    deviation = max(INT8_MAX - input_zero_point, input_zero_point - INT8_MIN)
    return k * 128 * deviation


def float32_chunk(input_zero_point: int, unit: int = 1) -> int:
    """Most reduction units (of ``unit`` terms each) a float32 accumulator sums exactly; 0 if
    even one unit may exceed ``2**24``."""
    return FLOAT32_EXACT // accumulator_bound(unit, input_zero_point)


def _no_transform_algorithms(device: torch.device):
    """Disable cuDNN (which may pick FFT / Winograd, inexact on integers) on CUDA."""
    if device.type == "cuda":
        return torch.backends.cudnn.flags(enabled=False)
    return contextlib.nullcontext()
