"""Fixed-point requantization primitives of the TFLite int8 specification (gemmlowp rounding).

A real-quantized layer (PMT §2.1, Eq. 1) computes an int32 accumulator and must rescale it by a
real factor ``M = s_in * s_w / s_out`` without floating point. TFLite, TFLite Micro, CMSIS-NN and
TinyEngine all do it the same way, and this module reproduces their reference semantics bit for
bit:

* :func:`quantize_multiplier` turns ``M`` into an int32 ``multiplier`` in ``[2**30, 2**31)`` and a
  power-of-two ``shift`` with ``M ~= multiplier * 2**(shift - 31)``
  (``tensorflow/lite/kernels/internal/quantization_util.cc: QuantizeMultiplier``).
* :func:`multiply_by_quantized_multiplier` applies it to int32 values
  (``tensorflow/lite/kernels/internal/common.h: MultiplyByQuantizedMultiplier``), built from
  gemmlowp's ``SaturatingRoundingDoublingHighMul`` and ``RoundingDivideByPOT``
  (``gemmlowp/fixedpoint/fixedpoint.h``), exposed here as
  :func:`saturating_rounding_doubling_high_mul` and :func:`rounding_divide_by_pot`.
* :func:`requantize` is the epilogue every int8 conv / fully-connected kernel runs on its
  accumulator: add the int32 bias, multiply by the per-channel quantized multiplier, add the
  output zero point, clamp to the activation range, cast to int8.
* :func:`rounding_integer_divide` is the ``(acc +- count/2) / count`` average of TFLite's integer
  pooling and mean kernels.

Everything is vectorised torch int64 arithmetic (exact on every device); on CPU,
:func:`requantize` and :func:`requantized_add` can instead run a fused numba kernel with the same
integer operations in one pass. ``bpfree.quant.reference`` holds the literal scalar transcriptions
of the C++ code that the tests compare against.

Two places where the C++ reference has undefined behaviour, and what we do instead
----------------------------------------------------------------------------------
* ``x * (1 << left_shift)`` in ``MultiplyByQuantizedMultiplier`` is an int32 product that can
  overflow when ``shift > 0`` (a real multiplier >= 1). Signed overflow is undefined in C++;
  compiled code usually wraps, which turns a huge accumulator into an arbitrary value. We compute
  the product in int64 and **saturate** it to int32, like gemmlowp's
  ``SaturatingRoundingMultiplyByPOT``: a value too large to represent stays the most extreme
  int32 value and the int8 output saturates at the matching rail. For every input where the C++
  product does not overflow, results are identical.
* ``acc += bias`` in the conv / fully-connected kernels can overflow int32 for an absurd bias;
  :func:`requantize` saturates ``acc + bias`` to int32 for the same reason.
"""

from __future__ import annotations

import math
import numbers

import numba
import numpy as np
import torch

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
INT8_MIN = -128
INT8_MAX = 127
MIN_SHIFT = -31  # RoundingDivideByPOT supports exponents 0..31 (gemmlowp asserts it).
MAX_SHIFT = 31  # x * 2**31 of an int32 still fits int64 before saturation.

_BACKENDS = ("auto", "torch", "numba")


# --------------------------------------------------------------------------------------------
# quantize_multiplier
# --------------------------------------------------------------------------------------------


def _round_half_away(value: float) -> int:
    """``std::round`` (half away from zero) of a double, exactly (``round`` is half-even)."""
    floor = math.floor(value)
    frac = value - floor  # exact: value and floor are doubles of the same binade or smaller
    return floor + 1 if frac >= 0.5 else floor


def quantize_multiplier(real: float) -> tuple[int, int]:
    """TFLite's ``QuantizeMultiplier``: ``real ~= multiplier * 2**(shift - 31)``.

    ``frexp`` splits ``real`` into ``fraction * 2**shift`` with ``fraction`` in [0.5, 1);
    ``multiplier = round(fraction * 2**31)``, rounding half away from zero like TFLite's
    ``std::round`` (Python's built-in ``round`` would round half to even and disagree on
    exact ties). If rounding reaches ``2**31`` the multiplier is halved and ``shift``
    incremented, so ``multiplier`` is in ``[2**30, 2**31)``. A ``shift < -31`` (``real``
    below about ``2**-32``) flushes to ``(0, 0)``, as TFLite does, because every bit would be
    shifted out. ``real == 0`` gives ``(0, 0)``.

    ``real`` is taken as a double, like TFLite, which computes effective scales in double from
    float32 tensor scales (``PopulateConvolutionQuantizationParams``).

    Raises ``ValueError`` for negative, NaN or infinite ``real`` (our layers only ever need
    non-negative multipliers; TFLite accepts negative ones, we do not).
    """
    if isinstance(real, bool) or not isinstance(real, numbers.Real):
        raise ValueError(f"real must be a finite float >= 0, got {real!r}")
    value = float(real)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"real must be a finite float >= 0, got {real!r}")
    if value == 0.0:
        return 0, 0
    fraction, shift = math.frexp(value)
    # fraction * 2**31 is exact (a power-of-two scaling of a double), so the rounding below is
    # the only one, as in the C++ code.
    q = _round_half_away(fraction * 2.0**31)
    if q == 2**31:
        q //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    return int(q), int(shift)


# --------------------------------------------------------------------------------------------
# Vectorised primitives (torch int64)
# --------------------------------------------------------------------------------------------


def _as_int64_tensor(value, name: str, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor, got dtype {value.dtype}")
        return value.to(device=device, dtype=torch.int64)
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu":
            raise ValueError(f"{name} must be an integer array, got dtype {value.dtype}")
        return torch.as_tensor(value.astype(np.int64), device=device)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int or an integer tensor, got {value!r}")
    return torch.tensor(int(value), dtype=torch.int64, device=device)


def _check_range(t: torch.Tensor, name: str, lo: int, hi: int) -> None:
    if t.numel() and (int(t.min()) < lo or int(t.max()) > hi):
        raise ValueError(
            f"{name} must lie in [{lo}, {hi}], got values in [{int(t.min())}, {int(t.max())}]"
        )


def _along(param: torch.Tensor, ndim: int, axis: int | None) -> torch.Tensor:
    """Reshape a 1-D per-channel parameter to broadcast along ``axis`` of an ndim tensor."""
    if axis is None or param.dim() == 0:
        return param
    shape = [1] * ndim
    shape[axis] = param.numel()
    return param.reshape(shape)


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2**exponent for a non-negative int64 tensor (exponent <= 62)."""
    return torch.bitwise_left_shift(torch.ones_like(exponent), exponent)


def saturating_rounding_doubling_high_mul(a: torch.Tensor, b) -> torch.Tensor:
    """gemmlowp ``SaturatingRoundingDoublingHighMul`` on int64 tensors holding int32 values.

    The C++ code returns ``(a*b + nudge) / 2**31`` with ``nudge = 2**30`` if ``a*b >= 0`` else
    ``1 - 2**30`` and division truncating toward zero, saturating the single overflow case
    ``a == b == INT32_MIN`` to ``INT32_MAX``. That expression equals
    ``floor((a*b + 2**30) / 2**31)`` for every integer ``a*b`` (for ``a*b < 0`` truncating
    ``(n + 1 - 2**31) / 2**31`` toward zero with ``n = a*b + 2**30`` gives
    ``-floor((2**31 - 1 - n) / 2**31) = ceil((n + 1) / 2**31) - 1 = floor(n / 2**31)``),
    so an arithmetic right shift computes it without a sign-dependent branch; the overflow case
    gives ``2**31`` there, and a clamp to ``INT32_MAX`` is exactly the saturation.
    ``a * b`` fits int64 because both factors are int32.
    """
    high = (a * b + (1 << 30)) >> 31
    return high.clamp_(max=INT32_MAX)


def rounding_divide_by_pot(x: torch.Tensor, exponent) -> torch.Tensor:
    """gemmlowp ``RoundingDivideByPOT``: ``x / 2**exponent`` rounded half away from zero.

    ``exponent`` (int or int64 tensor broadcastable to ``x``) must be in [0, 31]. The C++ form
    ``(x >> e) + ((x & mask) > (mask >> 1) + (x < 0))`` equals
    ``(x + 2**(e-1) - (x < 0)) >> e`` for ``e >= 1`` (both round half away from zero) and ``x``
    for ``e == 0``; the second form needs fewer tensor passes. ``x >> 63`` is -1 for negative
    int64 ``x`` and 0 otherwise.
    """
    if isinstance(exponent, torch.Tensor):
        half = _pow2(exponent) >> 1
        negative_fix = (x >> 63) & (exponent > 0).to(torch.int64).neg_()
        return (x + half + negative_fix) >> exponent
    exponent = int(exponent)
    if exponent == 0:
        return x.clone()
    return (x + (1 << (exponent - 1)) + (x >> 63)) >> exponent


def _mbqm_int64(x: torch.Tensor, multiplier, shift) -> torch.Tensor:
    """MultiplyByQuantizedMultiplier on int64 ``x`` holding int32 values; no validation.

    ``multiplier`` / ``shift`` are Python ints or int64 tensors already broadcastable to ``x``.
    """
    if isinstance(shift, torch.Tensor):
        left = shift.clamp(min=0)
        right = (-shift).clamp_(min=0)
        if bool((left > 0).any()):
            # A multiply, not <<: left-shifting negative values is not portable C++ (torch's
            # kernels), while the int64 product of an int32 and 2**31 cannot overflow.
            x = (x * _pow2(left)).clamp_(INT32_MIN, INT32_MAX)
    else:
        left, right = max(shift, 0), max(-shift, 0)
        if left:
            x = (x * (1 << left)).clamp_(INT32_MIN, INT32_MAX)
    high = saturating_rounding_doubling_high_mul(x, multiplier)
    return rounding_divide_by_pot(high, right)


def multiply_by_quantized_multiplier(x, multiplier, shift, axis: int | None = None):
    """TFLite's reference ``MultiplyByQuantizedMultiplier`` on int32 values, vectorised.

    ``RoundingDivideByPOT(SaturatingRoundingDoublingHighMul(x * 2**max(shift, 0), multiplier),
    max(-shift, 0))`` (``tensorflow/lite/kernels/internal/common.h``), i.e. ``x`` times
    ``multiplier * 2**(shift - 31)`` with gemmlowp's two rounding steps (PMT §2.1 notes the scale
    "could further be quantized to achieve only fixed-point multiplication").

    Args:
        x: integer torch tensor or numpy array with values in int32 range (an int64 tensor is
            accepted and range-checked), or a Python int.
        multiplier: int32 multiplier(s): a Python int or an integer tensor.
        shift: power-of-two exponent(s) in [-31, 31]: a Python int or an integer tensor.
        axis: when ``multiplier`` / ``shift`` are 1-D per-channel tensors, the axis of ``x``
            they run along (e.g. 1 for NCHW conv outputs); ``None`` uses plain broadcasting.

    Returns:
        int32 values of the same kind as ``x`` (torch tensor, numpy array or int).

    Deviation (documented in the module docstring): ``x * 2**left_shift`` is saturated to int32
    instead of overflowing (undefined behaviour in the C++ reference).
    """
    if isinstance(x, bool):
        raise ValueError(f"x must be an integer tensor, array or int, got {x!r}")
    if isinstance(x, torch.Tensor):
        kind = "torch"
    else:
        kind = "numpy" if isinstance(x, np.ndarray) else "int"
    device = x.device if kind == "torch" else torch.device("cpu")
    xt = _as_int64_tensor(x, "x", device)
    _check_range(xt, "x", INT32_MIN, INT32_MAX)
    m = _as_int64_tensor(multiplier, "multiplier", device)
    s = _as_int64_tensor(shift, "shift", device)
    _check_range(m, "multiplier", INT32_MIN, INT32_MAX)
    _check_range(s, "shift", MIN_SHIFT, MAX_SHIFT)
    if axis is not None:
        if not -xt.dim() <= axis < xt.dim():
            raise ValueError(f"axis must be in [{-xt.dim()}, {xt.dim() - 1}] for x of shape "
                             f"{tuple(xt.shape)}, got {axis}")
        axis %= xt.dim()
        for name, p in (("multiplier", m), ("shift", s)):
            if p.dim() > 1 or (p.dim() == 1 and p.numel() != xt.shape[axis]):
                raise ValueError(f"{name} must be a scalar or have x.shape[{axis}] = "
                                 f"{xt.shape[axis]} entries, got shape {tuple(p.shape)}")
        m, s = _along(m, xt.dim(), axis), _along(s, xt.dim(), axis)
    else:
        try:
            torch.broadcast_shapes(xt.shape, m.shape, s.shape)
        except RuntimeError as err:
            raise ValueError(f"multiplier {tuple(m.shape)} and shift {tuple(s.shape)} must "
                             f"broadcast to x {tuple(xt.shape)}; pass axis= for per-channel "
                             "values") from err
    m_arg = int(m) if m.dim() == 0 else m
    s_arg = int(s) if s.dim() == 0 else s
    out = _mbqm_int64(xt, m_arg, s_arg)
    if out.shape != xt.shape:
        out = out.expand(torch.broadcast_shapes(xt.shape, out.shape))
    out = out.to(torch.int32)
    if kind == "torch":
        return out
    if kind == "numpy":
        return out.numpy()
    return int(out)


def rounding_integer_divide(acc: torch.Tensor, count) -> torch.Tensor:
    """TFLite's integer average rounding: ``(acc + count/2) / count`` if ``acc > 0`` else
    ``(acc - count/2) / count``, C integer division (truncating toward zero) and ``count/2``
    floored (``reference_integer_ops::AveragePool`` and ``::Mean``). That is round half away
    from zero of ``acc / count`` for odd counts; for even counts a tie rounds away from zero too.

    ``acc``: int64 tensor; ``count``: positive int or int64 tensor broadcastable to ``acc``.
    """
    half = count // 2
    num = torch.where(acc > 0, acc + half, acc - half)
    return torch.div(num, count, rounding_mode="trunc")


# --------------------------------------------------------------------------------------------
# Requantization epilogue (bias, multiplier, zero point, clamp, int8)
# --------------------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True, inline="always")
def _requantize_one(a, b, pow_left, m, half, nfix, right, zero_point, qmin,
                    qmax):  # pragma: no cover
    # One accumulator value through the epilogue: the integer operations of the torch path
    # (saturate acc + bias, saturating left shift, SRDHM, RoundingDivideByPOT, offset, clamp).
    # Ternary clamps: LLVM vectorises them more readily than nested min/max calls.
    v = np.int64(a) + b
    v = INT32_MIN if v < INT32_MIN else v
    v = INT32_MAX if v > INT32_MAX else v
    v = v * pow_left
    v = INT32_MIN if v < INT32_MIN else v
    v = INT32_MAX if v > INT32_MAX else v
    h = (v * m + (np.int64(1) << 30)) >> 31
    h = INT32_MAX if h > INT32_MAX else h
    h = ((h + half + ((h >> 63) & nfix)) >> right) + zero_point
    h = qmin if h < qmin else h
    return qmax if h > qmax else h


@numba.njit(cache=True, nogil=True)
def _channel_constants(bias, mult, shift):  # pragma: no cover
    n = mult.shape[0]
    b = np.empty(n, np.int64)
    m = np.empty(n, np.int64)
    pow_left = np.empty(n, np.int64)
    right = np.empty(n, np.int64)
    half = np.empty(n, np.int64)
    nfix = np.empty(n, np.int64)
    for c in range(n):
        s = np.int64(shift[c])
        b[c] = bias[c]
        m[c] = mult[c]
        pow_left[c] = np.int64(1) << (s if s > 0 else 0)
        right[c] = -s if s < 0 else 0
        half[c] = (np.int64(1) << right[c]) >> 1
        nfix[c] = -1 if right[c] > 0 else 0
    return b, m, pow_left, right, half, nfix


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _requantize_kernel(acc, bias, mult, shift, zero_point, qmin, qmax, out):  # pragma: no cover
    # acc: (outer, C, inner) exact integers (float32/float64 or integer dtype); NCHW layout.
    b, m, pl, r, hf, nf = _channel_constants(bias, mult, shift)
    n_outer, n_ch, n_inner = acc.shape
    for o in range(n_outer):
        for c in range(n_ch):
            bc, mc, plc, rc, hc, nc = b[c], m[c], pl[c], r[c], hf[c], nf[c]
            for i in range(n_inner):
                out[o, c, i] = _requantize_one(acc[o, c, i], bc, plc, mc, hc, nc, rc,
                                               zero_point, qmin, qmax)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _requantize_last_kernel(acc, bias, mult, shift, zero_point, qmin, qmax,
                            out):  # pragma: no cover
    # acc: (outer, C) with channels last (fully-connected outputs): vectorises along C.
    b, m, pl, r, hf, nf = _channel_constants(bias, mult, shift)
    n_outer, n_ch = acc.shape
    for o in range(n_outer):
        for c in range(n_ch):
            out[o, c] = _requantize_one(acc[o, c], b[c], pl[c], m[c], hf[c], nf[c], r[c],
                                        zero_point, qmin, qmax)


def _use_numba(t: torch.Tensor, backend: str) -> bool:
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    if backend == "torch":
        return False
    if t.device.type != "cpu":
        if backend == "numba":
            raise ValueError(f"backend='numba' needs CPU tensors, got device {t.device}")
        return False
    return True


def requantize(
    acc: torch.Tensor,
    bias: torch.Tensor | None,
    multiplier: torch.Tensor,
    shift: torch.Tensor,
    output_zero_point: int,
    qmin: int = INT8_MIN,
    qmax: int = INT8_MAX,
    axis: int = 1,
    backend: str = "auto",
) -> torch.Tensor:
    """The int8 conv / fully-connected epilogue of ``reference_integer_ops::ConvPerChannel``::

        acc += bias[c]
        acc = MultiplyByQuantizedMultiplier(acc, multiplier[c], shift[c])
        out = int8(clamp(acc + output_zero_point, qmin, qmax))

    ``acc`` holds exact integer accumulator values (any integer dtype, or float32/float64 that
    the caller proved exact). ``bias`` (int32 values, or None), ``multiplier`` and ``shift`` are
    1-D with one entry per channel along ``axis``. ``acc + bias`` is saturated to int32 (see the
    module docstring). ``backend``: "auto" (numba kernel on CPU, torch elsewhere), "torch" or
    "numba"; both give identical results. No argument validation: layers validate once at
    construction.
    """
    axis %= acc.dim()
    channels = acc.shape[axis]
    if _use_numba(acc, backend):
        a = acc.contiguous()
        outer = math.prod(a.shape[:axis])
        inner = math.prod(a.shape[axis + 1:])
        out = torch.empty(a.shape, dtype=torch.int8)
        b = (bias if bias is not None else torch.zeros(channels, dtype=torch.int32))
        args = (b.contiguous().numpy(), multiplier.contiguous().numpy(),
                shift.contiguous().numpy(), int(output_zero_point), int(qmin), int(qmax))
        if inner == 1:
            _requantize_last_kernel(a.reshape(outer, channels).numpy(), *args,
                                    out.view(outer, channels).numpy())
        else:
            _requantize_kernel(a.reshape(outer, channels, inner).numpy(), *args,
                               out.view(outer, channels, inner).numpy())
        return out
    # Never modify the caller's accumulator in place (acc.to() returns acc itself if int64).
    v = acc.to(torch.int64, copy=True)
    if bias is not None:
        v = v.add_(_along(bias.to(torch.int64), v.dim(), axis))
    v = v.clamp_(INT32_MIN, INT32_MAX)
    m = _along(multiplier.to(torch.int64), v.dim(), axis)
    s = _along(shift.to(torch.int64), v.dim(), axis)
    v = _mbqm_int64(v, m, s)
    return v.add_(int(output_zero_point)).clamp_(qmin, qmax).to(torch.int8)


# --------------------------------------------------------------------------------------------
# Requantized residual add (reference_integer_ops::AddFunc)
# --------------------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _add_kernel(a, b, off1, off2, left_shift, m1, s1, m2, s2, mo, so, out_offset, qmin, qmax,
                out):  # pragma: no cover
    # s1, s2, so <= 0 (multipliers smaller than one), so every shift below is a right shift.
    half1 = (np.int64(1) << -s1) >> 1
    half2 = (np.int64(1) << -s2) >> 1
    halfo = (np.int64(1) << -so) >> 1
    fix1 = np.int64(-1) if s1 < 0 else np.int64(0)
    fix2 = np.int64(-1) if s2 < 0 else np.int64(0)
    fixo = np.int64(-1) if so < 0 else np.int64(0)
    r = np.int64(1) << 30
    scale = np.int64(1) << left_shift
    for i in range(a.shape[0]):
        x1 = (np.int64(a[i]) + off1) * scale
        x2 = (np.int64(b[i]) + off2) * scale
        h1 = (x1 * m1 + r) >> 31
        h1 = (h1 + half1 + ((h1 >> 63) & fix1)) >> -s1
        h2 = (x2 * m2 + r) >> 31
        h2 = (h2 + half2 + ((h2 >> 63) & fix2)) >> -s2
        t = h1 + h2
        ho = (t * mo + r) >> 31
        ho = (ho + halfo + ((ho >> 63) & fixo)) >> -so
        y = ho + out_offset
        out[i] = min(max(y, qmin), qmax)


def requantized_add(
    a: torch.Tensor,
    b: torch.Tensor,
    input1_offset: int,
    input2_offset: int,
    left_shift: int,
    input1_multiplier: int,
    input1_shift: int,
    input2_multiplier: int,
    input2_shift: int,
    output_multiplier: int,
    output_shift: int,
    output_offset: int,
    qmin: int = INT8_MIN,
    qmax: int = INT8_MAX,
    backend: str = "auto",
) -> torch.Tensor:
    """TFLite's ``reference_integer_ops::AddFunc`` elementwise on int8 tensors of equal shape.

    Each input is offset by minus its zero point, shifted left by ``left_shift`` (20 for int8)
    and rescaled by its own multiplier (shift <= 0, "SmallerThanOneExp"); the int32 sum is
    rescaled by the output multiplier, offset by the output zero point and clamped. No overflow
    is possible: ``|x + offset| <= 255`` and ``255 * 2**20 < 2**31``. No argument validation.
    """
    if _use_numba(a, backend):
        out = torch.empty(a.shape, dtype=torch.int8)
        _add_kernel(a.contiguous().view(-1).numpy(), b.contiguous().view(-1).numpy(),
                    input1_offset, input2_offset, left_shift, input1_multiplier, input1_shift,
                    input2_multiplier, input2_shift, output_multiplier, output_shift,
                    output_offset, qmin, qmax, out.view(-1).numpy())
        return out
    x1 = (a.to(torch.int64) + input1_offset) * (1 << left_shift)
    x2 = (b.to(torch.int64) + input2_offset) * (1 << left_shift)
    total = _mbqm_int64(x1, input1_multiplier, input1_shift)
    total += _mbqm_int64(x2, input2_multiplier, input2_shift)
    out = _mbqm_int64(total, output_multiplier, output_shift)
    return out.add_(output_offset).clamp_(qmin, qmax).to(torch.int8)
