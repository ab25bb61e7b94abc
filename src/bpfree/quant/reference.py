"""Slow, obviously-correct reference of the int8 engine, for tests only.

Literal transcriptions of the TFLite / gemmlowp C++ code with Python integers (arbitrary
precision, so ``&`` and ``>>`` on negative values behave as on two's-complement int32) and
int64 tensors with explicit loops for the layers. Nothing here uses floating point for integer
arithmetic and nothing imports :mod:`bpfree.quant.fixed_point` or :mod:`bpfree.quant.layers`, so
the tests compare two independent implementations.

Sources: ``tensorflow/lite/kernels/internal/quantization_util.cc`` (QuantizeMultiplier),
``tensorflow/lite/kernels/internal/common.h`` (MultiplyByQuantizedMultiplier),
``gemmlowp/fixedpoint/fixedpoint.h`` (SaturatingRoundingDoublingHighMul, RoundingDivideByPOT),
``tensorflow/lite/kernels/internal/reference/integer_ops/{conv,depthwise_conv,fully_connected,
add,pooling,mean}.h``. The one deliberate deviation (saturating ``x * 2**left_shift`` instead of
int32 overflow) is marked where it happens.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

import torch

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


def saturate_int32(v: int) -> int:
    return min(max(v, INT32_MIN), INT32_MAX)


def trunc_div(a: int, b: int) -> int:
    """C / C++ integer division: the quotient truncated toward zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


# ---------------------------------------------------------------------------------------------
# Fixed-point scalars
# ---------------------------------------------------------------------------------------------


def quantize_multiplier(real: float) -> tuple[int, int]:
    """QuantizeMultiplier with std::round done in decimal (half away from zero, exact)."""
    if real == 0.0:
        return 0, 0
    q, shift = math.frexp(real)
    # Decimal(float) is exact; ROUND_HALF_UP in decimal means half away from zero.
    q_fixed = int((Decimal(q) * (1 << 31)).quantize(Decimal(1), rounding=ROUND_HALF_UP))
    assert q_fixed <= 1 << 31
    if q_fixed == 1 << 31:
        q_fixed //= 2
        shift += 1
    if shift < -31:
        shift = 0
        q_fixed = 0
    return q_fixed, shift


def saturating_rounding_doubling_high_mul(a: int, b: int) -> int:
    overflow = a == b and a == INT32_MIN
    ab_64 = a * b
    nudge = (1 << 30) if ab_64 >= 0 else (1 - (1 << 30))
    ab_x2_high32 = trunc_div(ab_64 + nudge, 1 << 31)
    return INT32_MAX if overflow else ab_x2_high32


def rounding_divide_by_pot(x: int, exponent: int) -> int:
    assert 0 <= exponent <= 31
    mask = (1 << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if remainder > threshold else 0)


def multiply_by_quantized_multiplier(x: int, multiplier: int, shift: int) -> int:
    left_shift = shift if shift > 0 else 0
    right_shift = 0 if shift > 0 else -shift
    # Deviation: C++ computes x * (1 << left_shift) in int32 (overflow is undefined); we saturate.
    shifted = saturate_int32(x * (1 << left_shift))
    return rounding_divide_by_pot(
        saturating_rounding_doubling_high_mul(shifted, multiplier), right_shift)


def exact_product(x: int, multiplier: int, shift: int) -> Fraction:
    """The real number the fixed-point product approximates: x * multiplier * 2**(shift - 31)."""
    return Fraction(x * multiplier) * Fraction(2) ** (shift - 31)


def round_half_up(value: Fraction) -> int:
    return math.floor(value + Fraction(1, 2))


def effective_multipliers(input_scale: float, weight_scales, output_scale: float):
    """PopulateConvolutionQuantizationParams: float32 scales, product and quotient in double."""
    s_in = float(torch.tensor(input_scale, dtype=torch.float32))
    s_out = float(torch.tensor(output_scale, dtype=torch.float32))
    ws = torch.as_tensor(weight_scales, dtype=torch.float32).reshape(-1).tolist()
    pairs = [quantize_multiplier(s_in * w / s_out) for w in ws]
    return [m for m, _ in pairs], [s for _, s in pairs]


def activation_range(kind: str | None, scale: float, zero_point: int) -> tuple[int, int]:
    """CalculateActivationRangeQuantized (int8): Quantize(f) = zp + round(f / scale), float32."""
    def quantize(f: float) -> int:
        v = torch.tensor(f, dtype=torch.float32) / torch.tensor(scale, dtype=torch.float32)
        d = Decimal(float(v)).quantize(Decimal(1), rounding=ROUND_HALF_UP)
        return zero_point + int(d)

    if kind is None:
        return -128, 127
    if kind == "relu":
        return max(-128, quantize(0.0)), 127
    if kind == "relu6":
        return max(-128, quantize(0.0)), min(127, quantize(6.0))
    raise ValueError(kind)


def _requantize_all(acc: torch.Tensor, bias, multipliers, shifts, output_zero_point, qmin, qmax,
                    channel_axis: int) -> torch.Tensor:
    """Per element: acc + bias[c] (saturated), MBQM, + zero point, clamp; scalar Python."""
    acc = acc.to(torch.int64)
    moved = acc.movedim(channel_axis, -1)
    flat = moved.reshape(-1, moved.shape[-1]).tolist()
    out = []
    for row in flat:
        out_row = []
        for c, v in enumerate(row):
            v = saturate_int32(v + int(bias[c]))
            v = multiply_by_quantized_multiplier(v, int(multipliers[c]), int(shifts[c]))
            v += output_zero_point
            out_row.append(min(max(v, qmin), qmax))
        out.append(out_row)
    res = torch.tensor(out, dtype=torch.int64).reshape(moved.shape).movedim(-1, channel_axis)
    return res.to(torch.int8)


# ---------------------------------------------------------------------------------------------
# Layers (int64 tensors, explicit loops over kernel taps)
# ---------------------------------------------------------------------------------------------


def linear(x, weight, bias, input_zero_point, multipliers, shifts, output_zero_point,
           qmin=-128, qmax=127) -> torch.Tensor:
    """reference_integer_ops::FullyConnected(PerChannel): x (B, K) int8, weight (N, K) int8."""
    xs = x.to(torch.int64) - input_zero_point
    w = weight.to(torch.int64)
    acc = (xs[:, None, :] * w[None, :, :]).sum(-1)
    b = bias.tolist() if bias is not None else [0] * w.shape[0]
    return _requantize_all(acc, b, multipliers, shifts, output_zero_point, qmin, qmax, 1)


def conv2d(x, weight, bias, input_zero_point, multipliers, shifts, output_zero_point,
           qmin=-128, qmax=127, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
           groups=1) -> torch.Tensor:
    """reference_integer_ops::ConvPerChannel / DepthwiseConvPerChannel in NCHW with groups.

    Padded positions are skipped by TFLite, i.e. they contribute filter * (x + input_offset) = 0:
    we pad the zero-point-shifted input with zeros.
    """
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    batch, cin, height, width = x.shape
    cout, cin_g, kh, kw = weight.shape
    cout_g = cout // groups
    xs = x.to(torch.int64) - input_zero_point
    xp = torch.zeros(batch, cin, height + 2 * ph, width + 2 * pw, dtype=torch.int64)
    xp[:, :, ph:ph + height, pw:pw + width] = xs
    ho = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    w = weight.to(torch.int64)
    acc = torch.zeros(batch, cout, ho, wo, dtype=torch.int64)
    for g in range(groups):
        xg = xp[:, g * cin_g:(g + 1) * cin_g]
        wg = w[g * cout_g:(g + 1) * cout_g]
        for ky in range(kh):
            for kx in range(kw):
                y0, x0 = ky * dh, kx * dw
                patch = xg[:, :, y0:y0 + sh * (ho - 1) + 1:sh, x0:x0 + sw * (wo - 1) + 1:sw]
                tap = wg[:, :, ky, kx]  # (cout_g, cin_g)
                acc[:, g * cout_g:(g + 1) * cout_g] += (
                    patch[:, None] * tap[None, :, :, None, None]).sum(2)
    b = bias.tolist() if bias is not None else [0] * cout
    return _requantize_all(acc, b, multipliers, shifts, output_zero_point, qmin, qmax, 1)


def add_params(scale1: float, scale2: float, output_scale: float):
    """Prepare of TFLite's int8 ADD: left_shift 20 and three multipliers smaller than one."""
    f32 = lambda v: float(torch.tensor(v, dtype=torch.float32))  # noqa: E731
    s1, s2, so = f32(scale1), f32(scale2), f32(output_scale)
    twice_max = 2 * max(s1, s2)
    left_shift = 20
    m1 = quantize_multiplier(s1 / twice_max)
    m2 = quantize_multiplier(s2 / twice_max)
    mo = quantize_multiplier(twice_max / ((1 << left_shift) * so))
    return left_shift, m1, m2, mo


def add(a, b, zp1, zp2, zp_out, left_shift, m1, m2, mo, qmin=-128, qmax=127) -> torch.Tensor:
    """reference_integer_ops::AddFunc, element by element."""
    out = []
    for x, y in zip(a.reshape(-1).tolist(), b.reshape(-1).tolist()):
        v1 = (x - zp1) * (1 << left_shift)
        v2 = (y - zp2) * (1 << left_shift)
        s1 = multiply_by_quantized_multiplier(v1, *m1)
        s2 = multiply_by_quantized_multiplier(v2, *m2)
        raw = multiply_by_quantized_multiplier(s1 + s2, *mo) + zp_out
        out.append(min(max(raw, qmin), qmax))
    return torch.tensor(out, dtype=torch.int8).reshape(a.shape)


def avg_pool2d(x, kernel=(2, 2), stride=(2, 2), padding=(0, 0), qmin=-128,
               qmax=127) -> torch.Tensor:
    """reference_integer_ops::AveragePool: average of the raw int8 values inside the input."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    batch, ch, height, width = x.shape
    ho = (height + 2 * ph - kh) // sh + 1
    wo = (width + 2 * pw - kw) // sw + 1
    xv = x.tolist()
    out = torch.zeros(batch, ch, ho, wo, dtype=torch.int8)
    for n in range(batch):
        for c in range(ch):
            for oy in range(ho):
                for ox in range(wo):
                    y0, x0 = oy * sh - ph, ox * sw - pw
                    acc, count = 0, 0
                    for fy in range(max(0, -y0), min(kh, height - y0)):
                        for fx in range(max(0, -x0), min(kw, width - x0)):
                            acc += xv[n][c][y0 + fy][x0 + fx]
                            count += 1
                    acc = (trunc_div(acc + count // 2, count) if acc > 0
                           else trunc_div(acc - count // 2, count))
                    out[n, c, oy, ox] = min(max(acc, qmin), qmax)
    return out


def global_avg_pool(x, input_zero_point, multiplier, shift, output_zero_point, qmin=-128,
                    qmax=127) -> torch.Tensor:
    """reference_integer_ops::Mean over H and W -> (N, C)."""
    batch, ch, height, width = x.shape
    n_el = height * width
    xv = x.tolist()
    out = torch.zeros(batch, ch, dtype=torch.int8)
    for n in range(batch):
        for c in range(ch):
            acc = sum(v - input_zero_point for row in xv[n][c] for v in row)
            acc = multiply_by_quantized_multiplier(acc, multiplier, shift)
            acc = (trunc_div(acc + n_el // 2, n_el) if acc > 0
                   else trunc_div(acc - n_el // 2, n_el))
            acc += output_zero_point
            out[n, c] = min(max(acc, qmin), qmax)
    return out
