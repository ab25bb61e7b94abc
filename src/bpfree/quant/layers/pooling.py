"""Integer pooling: :class:`QAvgPool2d` (TFLite ``AveragePool``) and
:class:`QGlobalAvgPool2d` (``Mean`` over H and W), int8 in and out."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..fixed_point import (INT8_MAX, INT8_MIN, INT32_MAX, _mbqm_int64, quantize_multiplier,
                           rounding_integer_divide)
from ..params import ActivationRange, TensorQuant

from .arith import _check_choice, _check_int8_input, _check_quant, _pair

__all__ = ["QAvgPool2d", "QGlobalAvgPool2d"]


class QAvgPool2d(nn.Module):
    """Int8 average pooling (TFLite ``AveragePool``): input and output share one quantization.

    Per window, the raw int8 values inside the input are summed (padding is excluded from both
    sum and count, TFLite's behaviour) and divided with
    :func:`~bpfree.quant.fixed_point.rounding_integer_divide`. The sums come from float32
    ``avg_pool2d(divisor_override=1)``: at most ``kh * kw * 128 <= 2**24`` in magnitude, exact.
    ``quant`` is needed only for a fused ``activation``.
    """

    def __init__(self, kernel_size, stride=None, padding=0, *, quant: TensorQuant | None = None,
                 activation: str | None = None) -> None:
        super().__init__()
        self.kernel_size = _pair(kernel_size, "kernel_size", 1)
        self.stride = self.kernel_size if stride is None else _pair(stride, "stride", 1)
        self.padding = _pair(padding, "padding", 0)
        if any(2 * p > k for p, k in zip(self.padding, self.kernel_size)):
            raise ValueError(f"padding must be at most half the kernel size {self.kernel_size}, "
                             f"got {self.padding}")
        if self.kernel_size[0] * self.kernel_size[1] * 128 > 2**24:
            raise ValueError(f"kernel_size {self.kernel_size} is too large (area must be "
                             "<= 131072)")
        if activation is not None and quant is None:
            raise ValueError("quant (the TensorQuant of input and output) is required for a "
                             f"fused activation, got activation={activation!r} and quant=None")
        self.quant = None if quant is None else _check_quant(quant, "quant")
        self.activation = activation
        self.range = (ActivationRange() if activation is None
                      else ActivationRange.from_activation(activation, self.quant))
        self._counts: dict = {}

    def _count(self, height: int, width: int, device: torch.device) -> torch.Tensor:
        key = (height, width, device)
        if key not in self._counts:
            ones = torch.ones(1, 1, height, width, dtype=torch.float32, device=device)
            c = F.avg_pool2d(ones, self.kernel_size, self.stride, self.padding,
                             divisor_override=1)
            self._counts[key] = c.to(torch.int64)[0, 0]
        return self._counts[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_int8_input(x)
        if x.dim() != 4:
            raise ValueError(f"input must have shape (N, C, H, W), got {tuple(x.shape)}")
        sums = F.avg_pool2d(x.to(torch.float32), self.kernel_size, self.stride, self.padding,
                            divisor_override=1)
        avg = rounding_integer_divide(sums.to(torch.int64), self._count(*x.shape[2:], x.device))
        return avg.clamp_(self.range.qmin, self.range.qmax).to(torch.int8)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"activation={self.activation}")


class QGlobalAvgPool2d(nn.Module):
    """Int8 global average pooling (TFLite ``MEAN`` over H and W, ``reference_integer_ops::Mean``).

    Two integer rules (``rule=``), which differ by one unit on about 1% of the outputs:

    * ``"reference"`` (``reference_integer_ops::Mean``, TFLite Micro and TFLite before LiteRT):
      ``out = clamp(z_out + round_div(MBQM(sum(x - z_in), M), H*W))`` with ``M = s_in / s_out``
      as a quantized multiplier;
    * ``"litert"`` (LiteRT's ``reference_ops::QuantizedMeanOrSum``, what its interpreter runs for
      int8 MEAN): ``1 / (H*W)`` folded into the multiplier, ``M' = (M << k) // (H*W)`` with
      ``k = min(floor(log2(H*W)), 32, 31 + shift)`` and shift ``shift - k``, then
      ``out = clamp(z_out + MBQM(sum(x - z_in), M', shift - k))``.

    Returns (N, C), or (N, C, 1, 1) with ``keepdim=True`` (``nn.AdaptiveAvgPool2d(1)``'s shape).
    """

    RULES = ("reference", "litert")

    def __init__(self, input_quant: TensorQuant, output_quant: TensorQuant | None = None, *,
                 keepdim: bool = False, rule: str = "reference") -> None:
        super().__init__()
        self.rule = _check_choice(rule, "rule", self.RULES)
        self.input_quant = _check_quant(input_quant, "input_quant")
        self.output_quant = (self.input_quant if output_quant is None
                             else _check_quant(output_quant, "output_quant"))
        self.keepdim = bool(keepdim)
        real = self.input_quant.scale / self.output_quant.scale
        self.multiplier, self.shift = quantize_multiplier(real)
        if self.shift > 31:
            raise ValueError(f"input_quant.scale / output_quant.scale = {real!r} must be < 2**31")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_int8_input(x)
        if x.dim() != 4:
            raise ValueError(f"input must have shape (N, C, H, W), got {tuple(x.shape)}")
        out = self.from_sums(x.sum(dim=(2, 3), dtype=torch.int64), x.shape[2] * x.shape[3])
        return out[:, :, None, None] if self.keepdim else out

    def from_sums(self, sums: torch.Tensor, count: int) -> torch.Tensor:
        """(N, C) int8 means from the int64 sums of the raw int8 values over ``count`` positions
        (the fast channels-last path sums over its own axes and shares this arithmetic)."""
        if count == 0 or count * 255 > INT32_MAX:
            raise ValueError(f"H*W must be in [1, {INT32_MAX // 255}], got {count}")
        acc = sums - self.input_quant.zero_point * count
        if self.rule == "litert":
            k = min(count.bit_length() - 1, 32, 31 + self.shift)
            out = _mbqm_int64(acc, (self.multiplier << k) // count, self.shift - k)
            out = out.add_(self.output_quant.zero_point)
        else:
            acc = _mbqm_int64(acc, self.multiplier, self.shift)
            out = rounding_integer_divide(acc, count).add_(self.output_quant.zero_point)
        return out.clamp_(INT8_MIN, INT8_MAX).to(torch.int8)

    def extra_repr(self) -> str:
        return (f"input={self.input_quant}, output={self.output_quant}, keepdim={self.keepdim}, "
                f"rule={self.rule!r}")
