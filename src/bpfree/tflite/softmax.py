"""Int8 SOFTMAX of LiteRT's reference kernel (``reference_ops::Softmax``, gemmlowp fixed point).

Inference only: the probabilities are the file's output, but bpfree trains on the logits before
it (``bpfree adapt`` drops a trailing softmax while training and keeps it in the saved file).

The arithmetic, on int64 tensors holding int32 values (``tensorflow/lite/kernels/internal/
reference/softmax.h`` and gemmlowp's ``fixedpoint.h``):

* ``PreprocessSoftmaxScaling``: ``beta * s_in * 2**26`` (capped at ``2**31 - 1``) as a
  multiplier and a left shift (``QuantizeMultiplierGreaterThanOne``); ``diff_min =
  -floor(31 * 2**26 / 2**left_shift)``;
* per row: ``d = x - max(x)``; for ``d >= diff_min``, ``e = exp_on_negative_values(
  SRDHM(d * 2**left_shift, multiplier))`` with 5 integer bits in, 0 out; the sum of
  ``RoundingDivideByPOT(e, 12)`` (12 integer bits); its reciprocal ``GetReciprocal`` (Newton-
  Raphson ``one_over_one_plus_x_for_x_in_0_1``); ``out = RoundingDivideByPOT(SRDHM(recip, e),
  num_bits_over_unit + 23) - 128``, clamped; ``d < diff_min`` gives -128.

The output quantization is fixed by LiteRT: scale 1/256, zero point -128.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ..quant.fixed_point import (
    INT32_MAX,
    INT32_MIN,
    quantize_multiplier,
    rounding_divide_by_pot,
    saturating_rounding_doubling_high_mul as srdhm,
)
from ..quant.layers import _check_int8_input
from ..quant.params import TensorQuant

#: LiteRT's int8 SOFTMAX output quantization.
OUTPUT_QUANT = TensorQuant(1.0 / 256.0, -128)
_SCALED_DIFF_INTEGER_BITS = 5
_ACCUMULATION_INTEGER_BITS = 12


def _shift_left_saturating(x: torch.Tensor, bits: int) -> torch.Tensor:
    """gemmlowp ``SaturatingRoundingMultiplyByPOT<bits>`` for ``bits > 0``."""
    return (x * (1 << bits)).clamp_(INT32_MIN, INT32_MAX)


def _exp_on_interval_between_negative_one_quarter_and_0_excl(a: torch.Tensor) -> torch.Tensor:
    constant_term = 1895147668
    constant_1_over_3 = 715827883
    x = a + (1 << 28)  # a + 1/8 (0 integer bits)
    x2 = srdhm(x, x)
    x3 = srdhm(x2, x)
    x4 = srdhm(x2, x2)
    x4_over_4 = rounding_divide_by_pot(x4, 2)
    poly = rounding_divide_by_pot(srdhm(x4_over_4 + x3, constant_1_over_3) + x2, 1)
    return constant_term + srdhm(torch.full_like(x, constant_term), x + poly)


#: gemmlowp's barrel shifter of exp_on_negative_values: exp(-2**k) in Q0.31 for k = -2 .. 4.
_EXP_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308),
               (2, 39332535), (3, 720401), (4, 242))


def exp_on_negative_values(a: torch.Tensor) -> torch.Tensor:
    """gemmlowp ``exp_on_negative_values``: Q5.26 input <= 0 to Q0.31 output."""
    fractional = 31 - _SCALED_DIFF_INTEGER_BITS
    quarter = 1 << (fractional - 2)
    a_mod_quarter_minus_quarter = (a & (quarter - 1)) - quarter
    result = _exp_on_interval_between_negative_one_quarter_and_0_excl(
        _shift_left_saturating(a_mod_quarter_minus_quarter, _SCALED_DIFF_INTEGER_BITS))
    remainder = a_mod_quarter_minus_quarter - a
    for exponent, multiplier in _EXP_BARREL:
        if _SCALED_DIFF_INTEGER_BITS > exponent:
            bit = (remainder & (1 << (fractional + exponent))) != 0
            result = torch.where(bit, srdhm(result, multiplier), result)
    return torch.where(a == 0, torch.full_like(result, INT32_MAX), result)


def _one_over_one_plus_x_for_x_in_0_1(a: torch.Tensor) -> torch.Tensor:
    total = a + INT32_MAX  # RoundingHalfSum(a, One): (sum + sign) / 2, truncating
    sign = torch.where(total >= 0, 1, -1)
    half_denominator = torch.div(total + sign, 2, rounding_mode="trunc")
    x = 1515870810 + srdhm(half_denominator, -1010580540)  # 48/17 - 32/17 d, Q2.29
    one = 1 << 29
    for _ in range(3):
        one_minus = one - srdhm(half_denominator, x)
        x = x + _shift_left_saturating(srdhm(x, one_minus), 2)
    return _shift_left_saturating(x, 1)


def get_reciprocal(x: torch.Tensor, integer_digits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """TFLite's ``GetReciprocal``: (Q0.31 reciprocal scale, num_bits_over_unit) of ``x > 0``."""
    # CountLeadingZeros of a positive int32: 31 - floor(log2(x)); x < 2**31.
    headroom_plus_one = 31 - torch.floor(torch.log2(x.to(torch.float64))).to(torch.int64)
    # log2 in float64 is exact enough for int32, but fix any off-by-one at powers of two.
    top = torch.bitwise_left_shift(torch.ones_like(x), 31 - headroom_plus_one)
    headroom_plus_one = torch.where(top > x, headroom_plus_one + 1, headroom_plus_one)
    headroom_plus_one = torch.where(top * 2 <= x, headroom_plus_one - 1, headroom_plus_one)
    shifted = torch.bitwise_left_shift(x, headroom_plus_one) & 0xFFFFFFFF
    shifted_minus_one = shifted - (1 << 31)  # as uint32, then reinterpreted as int32
    shifted_minus_one = torch.where(shifted_minus_one >= 2**31, shifted_minus_one - 2**32,
                                    shifted_minus_one)
    return (_one_over_one_plus_x_for_x_in_0_1(shifted_minus_one),
            integer_digits - headroom_plus_one)


def softmax_params(beta: float, input_scale: float) -> tuple[int, int, int]:
    """(input multiplier, input left shift, diff_min) of LiteRT's int8 SOFTMAX Prepare."""
    real = min(float(np.float32(beta)) * float(np.float32(input_scale))
               * (1 << (31 - _SCALED_DIFF_INTEGER_BITS)), float(2**31 - 1))
    multiplier, shift = quantize_multiplier(real)
    if shift < 0:
        raise ValueError(f"beta * input scale * 2**26 = {real!r} must be >= 1 (LiteRT's "
                         "QuantizeMultiplierGreaterThanOne)")
    radius = ((1 << _SCALED_DIFF_INTEGER_BITS) - 1) * (1 << (31 - _SCALED_DIFF_INTEGER_BITS)) \
        / (1 << shift)
    return multiplier, shift, -int(math.floor(radius))


class QSoftmax(nn.Module):
    """Int8 softmax over the last axis of a 2-D tensor, LiteRT's reference kernel (module
    docstring); output quantization :data:`OUTPUT_QUANT`."""

    def __init__(self, input_quant: TensorQuant, beta: float = 1.0) -> None:
        super().__init__()
        self.input_quant = input_quant
        self.output_quant = OUTPUT_QUANT
        self.beta = float(np.float32(beta))
        self.multiplier, self.left_shift, self.diff_min = softmax_params(beta, input_quant.scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_int8_input(x)
        if x.dim() != 2:
            raise ValueError(f"QSoftmax takes (N, classes), got shape {tuple(x.shape)}")
        xi = x.to(torch.int64)
        diff = xi - xi.amax(dim=-1, keepdim=True)
        valid = diff >= self.diff_min
        scaled = srdhm(diff * (1 << self.left_shift), self.multiplier)
        exp = exp_on_negative_values(scaled)
        terms = torch.where(valid, rounding_divide_by_pot(exp, _ACCUMULATION_INTEGER_BITS), 0)
        recip, bits_over_unit = get_reciprocal(terms.sum(dim=-1, keepdim=True),
                                               _ACCUMULATION_INTEGER_BITS)
        out = rounding_divide_by_pot(srdhm(recip, exp), bits_over_unit + 31 - 8) - 128
        out = torch.where(valid, out.clamp_(-128, 127), -128)
        return out.to(torch.int8)

    def extra_repr(self) -> str:
        return f"input={self.input_quant}, beta={self.beta}"
