"""Tests for bpfree.quant: TFLite-exact fixed-point primitives and integer layers.

Everything is compared with bpfree.quant.reference, an independent scalar / int64 transcription
of the TFLite and gemmlowp C++ code (no floats in integer arithmetic).
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
import torch

from bpfree.quant import (
    INT32_MAX,
    INT32_MIN,
    ActivationRange,
    AddRequantization,
    QAdd,
    QAvgPool2d,
    QConv2d,
    QFlatten,
    QGlobalAvgPool2d,
    QLinear,
    QReLU,
    Requantization,
    TensorQuant,
    WeightQuant,
    float32_chunk,
    multiply_by_quantized_multiplier,
    quantize_multiplier,
    requantize,
    rounding_divide_by_pot,
    saturating_rounding_doubling_high_mul,
)
from bpfree.quant import reference as ref

BACKENDS = ("numba", "torch")


def int32_samples(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    edges = [INT32_MIN, INT32_MIN + 1, -(2**30), -1, 0, 1, 2**30, INT32_MAX - 1, INT32_MAX]
    small = [rng.randint(-1000, 1000) for _ in range(n // 4)]
    return edges + small + [rng.randint(INT32_MIN, INT32_MAX) for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# quantize_multiplier
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("real, expected", [
    (0.0, (0, 0)),
    (0.5, (2**30, 0)),
    (1.0, (2**30, 1)),
    (0.25, (2**30, -1)),
    (0.75, (3 * 2**29, 0)),
    (2.0**-31, (2**30, -30)),
    (2.0**-32, (2**30, -31)),  # smallest shift kept
    (2.0**-33, (0, 0)),  # shift -32 flushes to zero
    (1e-12, (0, 0)),
    ((2**31 - 1) / 2**31, (2**31 - 1, 0)),
    (1 - 2.0**-40, (2**30, 1)),  # rounds up to 2**31: halved, shift + 1
    ((2**31 + 1) / 2**32, (2**30 + 1, 0)),  # exact tie: half away from zero, not half-even
    ((2**31 + 3) / 2**32, (2**30 + 2, 0)),
    (3.0, (3 * 2**29, 2)),
])
def test_quantize_multiplier_known_values(real, expected):
    assert quantize_multiplier(real) == expected


def test_quantize_multiplier_matches_reference_and_round_trips():
    rng = random.Random(0)
    reals = [2.0 ** rng.uniform(-34, 30) for _ in range(3000)]
    # Exact ties of fraction * 2**31 in every binade we use.
    reals += [(2 * rng.randint(2**30, 2**31 - 1) + 1) / 2**32 * 2.0**rng.randint(-20, 5)
              for _ in range(300)]
    for real in reals:
        m, s = quantize_multiplier(real)
        assert (m, s) == ref.quantize_multiplier(real)
        if m:
            assert 2**30 <= m < 2**31
            approx = Fraction(m) * Fraction(2) ** (s - 31)
            assert abs(approx - Fraction(real)) <= Fraction(real) * Fraction(1, 2**31)
        else:
            assert real < 2.0**-32


@pytest.mark.parametrize("bad", [-1.0, -1e-30, float("nan"), float("inf"), "0.5", True, None])
def test_quantize_multiplier_rejects(bad):
    with pytest.raises(ValueError, match=r"real must be a finite float >= 0"):
        quantize_multiplier(bad)


# ---------------------------------------------------------------------------------------------
# multiply_by_quantized_multiplier and the gemmlowp primitives
# ---------------------------------------------------------------------------------------------


def test_srdhm_and_rdbpot_match_reference():
    xs = int32_samples(4000, 1)
    rng = random.Random(2)
    a = torch.tensor(xs, dtype=torch.int64)
    for b in [INT32_MIN, INT32_MAX, 0, 1, -1, 2**30] + [rng.randint(INT32_MIN, INT32_MAX)
                                                         for _ in range(20)]:
        got = saturating_rounding_doubling_high_mul(a, b).tolist()
        assert got == [ref.saturating_rounding_doubling_high_mul(x, b) for x in xs]
    assert saturating_rounding_doubling_high_mul(
        torch.tensor([INT32_MIN]), INT32_MIN).item() == INT32_MAX
    for e in range(32):
        got = rounding_divide_by_pot(a, e).tolist()
        assert got == [ref.rounding_divide_by_pot(x, e) for x in xs], e
    exps = torch.tensor([rng.randint(0, 31) for _ in xs])
    got = rounding_divide_by_pot(a, exps).tolist()
    assert got == [ref.rounding_divide_by_pot(x, int(e)) for x, e in zip(xs, exps)]


def test_mbqm_matches_scalar_reference():
    xs = int32_samples(3000, 3)
    x = torch.tensor(xs, dtype=torch.int32)
    rng = random.Random(4)
    cases = [(2**30, 0), (2**30, 1), (INT32_MAX, -31), (INT32_MAX, 31), (0, 5), (INT32_MIN, 0),
             (1, 0), (2**30, -31)]
    cases += [(rng.randint(0, INT32_MAX), rng.randint(-31, 31)) for _ in range(60)]
    for m, s in cases:
        got = multiply_by_quantized_multiplier(x, m, s)
        assert got.dtype == torch.int32
        assert got.tolist() == [ref.multiply_by_quantized_multiplier(v, m, s) for v in xs], (m, s)


def test_mbqm_per_channel_axis_numpy_and_int():
    rng = np.random.default_rng(5)
    x = rng.integers(INT32_MIN, INT32_MAX, size=(3, 4, 5), endpoint=True).astype(np.int32)
    m = rng.integers(2**30, 2**31, size=4)
    s = rng.integers(-31, 4, size=4)
    got = multiply_by_quantized_multiplier(torch.from_numpy(x), torch.from_numpy(m),
                                           torch.from_numpy(s), axis=1)
    want = np.empty_like(x)
    for idx in np.ndindex(x.shape):
        c = idx[1]
        want[idx] = ref.multiply_by_quantized_multiplier(int(x[idx]), int(m[c]), int(s[c]))
    assert np.array_equal(got.numpy(), want)
    got_np = multiply_by_quantized_multiplier(x, torch.from_numpy(m), torch.from_numpy(s),
                                              axis=1)
    assert isinstance(got_np, np.ndarray) and np.array_equal(got_np, want)
    assert multiply_by_quantized_multiplier(12345, 2**30, -3) == \
        ref.multiply_by_quantized_multiplier(12345, 2**30, -3)


def test_mbqm_against_exact_rationals():
    rng = random.Random(6)
    for _ in range(4000):
        x = rng.randint(INT32_MIN, INT32_MAX)
        m = rng.randint(2**30, INT32_MAX)
        s = rng.randint(-31, 0)
        exact = ref.exact_product(x, m, s)
        got = multiply_by_quantized_multiplier(x, m, s)
        # Two roundings (gemmlowp): |error| <= 1/2 + 2**(s-1).
        assert abs(got - exact) <= Fraction(1, 2) + Fraction(2) ** (s - 1)
        if s == 0:  # a single rounding, half up
            assert got == ref.round_half_up(exact)
    for _ in range(2000):  # left shifts without overflow: single rounding of the exact value
        s = rng.randint(1, 10)
        x = rng.randint(-(2**31 >> s), (2**31 >> s) - 1)
        m = rng.randint(2**30, INT32_MAX)
        got = multiply_by_quantized_multiplier(x, m, s)
        assert got == ref.round_half_up(ref.exact_product(x, m, s))


def test_mbqm_left_shift_saturates_instead_of_wrapping():
    # C++ computes x * (1 << 1) in int32: INT32_MAX would wrap to -2 (undefined behaviour).
    x = torch.tensor([INT32_MAX, INT32_MIN, 2**30, -(2**30) - 1], dtype=torch.int32)
    got = multiply_by_quantized_multiplier(x, 2**30, 1).tolist()
    assert got == [2**30, -(2**30), 2**30, -(2**30)]
    big = multiply_by_quantized_multiplier(x, INT32_MAX, 31).tolist()
    assert big == [ref.multiply_by_quantized_multiplier(v, INT32_MAX, 31) for v in x.tolist()]
    assert big[0] == INT32_MAX - 1 and big[1] == -(INT32_MAX - 1) - 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(x=torch.tensor([2**31]), multiplier=2**30, shift=0), "x must lie in"),
    (dict(x=torch.tensor([1.0]), multiplier=2**30, shift=0), "x must be an integer"),
    (dict(x=torch.tensor([1]), multiplier=2**31, shift=0), "multiplier must lie in"),
    (dict(x=torch.tensor([1]), multiplier=2**30, shift=32), r"shift must lie in \[-31, 31\]"),
    (dict(x=torch.tensor([1]), multiplier=2**30, shift=-32), r"shift must lie in \[-31, 31\]"),
    (dict(x=torch.tensor([1]), multiplier=0.5, shift=0), "multiplier must be an int"),
    (dict(x=torch.zeros(2, 3, dtype=torch.int32), multiplier=torch.tensor([1, 2]), shift=0,
          axis=1), "multiplier must be a scalar or have x.shape"),
    (dict(x=torch.zeros(2, 3, dtype=torch.int32), multiplier=1, shift=0, axis=2), "axis"),
    (dict(x=torch.zeros(2, 3, dtype=torch.int32), multiplier=torch.tensor([1, 2]), shift=0),
     "broadcast"),
])
def test_mbqm_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        multiply_by_quantized_multiplier(**kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_requantize_epilogue_matches_reference(backend):
    g = torch.Generator().manual_seed(7)
    acc = torch.randint(-(2**24), 2**24, (3, 5, 7), generator=g, dtype=torch.int64)
    acc[0, 0, :2] = torch.tensor([INT32_MAX, INT32_MIN])
    bias = torch.randint(-(2**31), 2**31, (5,), generator=g, dtype=torch.int64).to(torch.int32)
    mult = torch.tensor([2**30, INT32_MAX, 1500000000, 0, 2**30], dtype=torch.int32)
    shift = torch.tensor([-31, -10, 0, 3, 2], dtype=torch.int32)
    for a in (acc, acc.to(torch.float64)):
        got = requantize(a, bias, mult, shift, -3, -100, 90, axis=1, backend=backend)
        want = ref._requantize_all(acc, bias.tolist(), mult.tolist(), shift.tolist(), -3, -100,
                                   90, channel_axis=1)
        assert torch.equal(got, want)
    # acc + bias overflows int32 here: it saturates (C++ would overflow), then M = 2**-30.
    edge = torch.tensor([[INT32_MAX, INT32_MIN, 2**31 - 2**20]], dtype=torch.int64)
    got = requantize(edge, torch.tensor([INT32_MAX, INT32_MIN, 2**21], dtype=torch.int32),
                     torch.full((3,), 2**30, dtype=torch.int32),
                     torch.full((3,), -29, dtype=torch.int32), 0, axis=-1, backend=backend)
    assert got.tolist() == [[2, -2, 2]]
    last = requantize(acc.transpose(1, 2).contiguous(), bias, mult, shift, 5, axis=-1,
                      backend=backend)
    assert torch.equal(last, ref._requantize_all(acc.transpose(1, 2), bias.tolist(),
                                                 mult.tolist(), shift.tolist(), 5, -128, 127,
                                                 channel_axis=2))


# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [0.0, -0.1, float("nan"), float("inf"), 1e-50, 1e40, "1"])
def test_tensor_quant_rejects_bad_scale(scale):
    with pytest.raises(ValueError, match="scale"):
        TensorQuant(scale, 0)


@pytest.mark.parametrize("zp", [128, -129, 0.5, True])
def test_tensor_quant_rejects_bad_zero_point(zp):
    with pytest.raises(ValueError, match=r"zero_point must be an int in \[-128, 127\]"):
        TensorQuant(0.1, zp)


def test_tensor_quant_quantize_rounds_half_away_and_saturates():
    q = TensorQuant(0.5, 3)
    x = torch.tensor([0.25, -0.25, 0.75, -0.75, 0.2499999, 1e6, -1e6, 0.0])
    # x / 0.5 = 0.5, -0.5, 1.5, -1.5 -> 1, -1, 2, -2 (half away from zero), then + 3.
    assert q.quantize(x).tolist() == [4, 2, 5, 1, 3, 127, -128, 3]
    assert torch.allclose(q.dequantize(torch.tensor([5], dtype=torch.int8)), torch.tensor([1.0]))


def test_activation_range_matches_reference():
    rng = random.Random(8)
    for _ in range(300):
        scale = 2.0 ** rng.uniform(-8, 0)
        zp = rng.randint(-128, 127)
        for kind in (None, "relu", "relu6"):
            r = ActivationRange.from_activation(kind, TensorQuant(scale, zp))
            assert (r.qmin, r.qmax) == ref.activation_range(kind, TensorQuant(scale, zp).scale, zp)
    with pytest.raises(ValueError, match="activation must be one of"):
        ActivationRange.from_activation("gelu", TensorQuant(0.1, 0))
    with pytest.raises(ValueError, match="qmin must be <= qmax"):
        ActivationRange(10, 5)


def test_weight_quant_and_requantization_validation():
    assert WeightQuant(0.5).broadcast(3).scales == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match=r"weight_scale must have 1 or 4 entries"):
        WeightQuant([0.1, 0.2]).broadcast(4)
    with pytest.raises(ValueError, match=r"weight_scale\[1\]"):
        WeightQuant([0.1, -0.2])
    with pytest.raises(ValueError, match="non-empty"):
        WeightQuant([])
    with pytest.raises(ValueError, match=r"multiplier\[0\] must be an int in \[0, 2147483647\]"):
        Requantization((2**31,), (0,))
    with pytest.raises(ValueError, match="too large"):
        Requantization.from_real([2.0**40])
    r = Requantization.for_affine(TensorQuant(0.02, 1), WeightQuant([0.003, 0.5]),
                                  TensorQuant(0.1, 0))
    ms, ss = ref.effective_multipliers(0.02, [0.003, 0.5], 0.1)
    assert list(r.multipliers) == ms and list(r.shifts) == ss


# ---------------------------------------------------------------------------------------------
# Layers against the int64 reference
# ---------------------------------------------------------------------------------------------


def _rand_int8(g, *shape):
    return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)


def _affine_case(g, out_ch, w_shape, *, act, in_zp, out_zp, out_scale=0.05):
    w = torch.randint(-128, 128, w_shape, generator=g)
    b = torch.randint(-20000, 20000, (out_ch,), generator=g)
    ws = (torch.rand(out_ch, generator=g) * 0.01 + 1e-4).tolist()
    iq, oq = TensorQuant(0.02, in_zp), TensorQuant(out_scale, out_zp)
    ms, ss = ref.effective_multipliers(iq.scale, ws, oq.scale)
    lo, hi = ref.activation_range(act, oq.scale, oq.zero_point)
    return w, b, ws, iq, oq, ms, ss, lo, hi


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("accumulate", ["auto", "float64"])
def test_qlinear_matches_reference(backend, accumulate):
    g = torch.Generator().manual_seed(10)
    saw_low = saw_high = False
    for trial in range(6):
        k, n = [(5, 3), (37, 11), (300, 7), (600, 5), (1100, 4), (1, 1)][trial]
        act = [None, "relu", "relu6"][trial % 3]
        w, b, ws, iq, oq, ms, ss, lo, hi = _affine_case(
            g, n, (n, k), act=act, in_zp=int(torch.randint(-128, 128, (1,), generator=g)),
            out_zp=int(torch.randint(-50, 50, (1,), generator=g)), out_scale=0.02)
        layer = QLinear(w, b, weight_scale=ws, input_quant=iq, output_quant=oq, activation=act,
                        accumulate=accumulate, backend=backend)
        x = _rand_int8(g, 9, k)
        y = layer(x)
        assert y.dtype == torch.int8 and y.shape == (9, n)
        assert torch.equal(y, ref.linear(x, w, b, iq.zero_point, ms, ss, oq.zero_point, lo, hi))
        saw_low |= bool((y == -128).any())
        saw_high |= bool((y == 127).any())
    assert saw_low and saw_high  # saturation at both rails was exercised


CONV_CASES = [
    # cin, cout, k, stride, padding, dilation, groups
    (3, 5, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (4, 6, (3, 2), (2, 1), (1, 0), (1, 1), 2),
    (6, 6, (3, 3), (2, 2), (1, 1), (1, 1), 6),  # depthwise
    (4, 8, (3, 3), (1, 1), (2, 2), (2, 2), 4),  # depthwise, multiplier 2, dilated
    (8, 4, (1, 1), (1, 1), (0, 0), (1, 1), 1),  # pointwise
    (80, 3, (3, 3), (1, 1), (1, 1), (1, 1), 1),  # K = 720: chunked float32 route
    (130, 4, (3, 3), (2, 2), (0, 1), (1, 1), 2),  # K = 585 per group: chunked, grouped
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("accumulate", ["auto", "float64"])
def test_qconv2d_matches_reference(backend, accumulate):
    g = torch.Generator().manual_seed(11)
    for i, (cin, cout, k, stride, padding, dilation, groups) in enumerate(CONV_CASES):
        act = [None, "relu", "relu6"][i % 3]
        w, b, ws, iq, oq, ms, ss, lo, hi = _affine_case(
            g, cout, (cout, cin // groups, *k), act=act, in_zp=[-128, 0, 17, -5][i % 4],
            out_zp=[3, -128, 0, 100][i % 4], out_scale=[0.05, 0.5, 0.01, 0.2][i % 4])
        layer = QConv2d(w, b, weight_scale=ws, input_quant=iq, output_quant=oq, stride=stride,
                        padding=padding, dilation=dilation, groups=groups, activation=act,
                        accumulate=accumulate, backend=backend)
        x = _rand_int8(g, 2, cin, 7, 6)
        want = ref.conv2d(x, w, b, iq.zero_point, ms, ss, oq.zero_point, lo, hi, stride,
                          padding, dilation, groups)
        assert torch.equal(layer(x), want), (i, CONV_CASES[i])


def test_float32_chunking_is_exact_at_large_partial_sums():
    # All products positive and near their maximum with odd low bits: partial sums pass 2**24
    # without chunking, which float32 cannot hold exactly. Bias cancels all but a small rest,
    # and M ~ 0.9 keeps every unit of accumulator error visible in the int8 output.
    assert float32_chunk(-128) == 514 and float32_chunk(0) == 1024 and float32_chunk(-128, 9) == 57
    g = torch.Generator().manual_seed(12)
    for k in (514, 1100, 2600):
        w = -128 + torch.randint(0, 2, (4, k), generator=g)
        x = (127 - torch.randint(0, 2, (1, k), generator=g)).to(torch.int8)
        exact = (w.to(torch.int64) * (x.to(torch.int64) + 128)).sum(1)
        bias = (-exact + torch.tensor([-40, -3, 0, 50])).to(torch.int32)
        iq, oq = TensorQuant(0.9, -128), TensorQuant(1.0, 0)
        for accumulate in ("auto", "float64"):
            layer = QLinear(w, bias, weight_scale=1.0, input_quant=iq, output_quant=oq,
                            accumulate=accumulate)
            assert layer(x).tolist() == [[-36, -3, 0, 45]], (k, accumulate)
    # The same for a chunked convolution (K = 9 * 80 per output).
    w = -128 + torch.randint(0, 2, (2, 80, 3, 3), generator=g)
    x = (127 - torch.randint(0, 2, (1, 80, 3, 3), generator=g)).to(torch.int8)
    exact = (w.to(torch.int64) * (x.to(torch.int64) + 128)).sum((1, 2, 3))
    layer = QConv2d(w, (-exact + torch.tensor([7, -9])).to(torch.int32), weight_scale=1.0,
                    input_quant=TensorQuant(0.9, -128), output_quant=TensorQuant(1.0, 0))
    assert layer(x).reshape(-1).tolist() == [6, -8]


def test_results_do_not_depend_on_batch_size():
    g = torch.Generator().manual_seed(13)
    w, b, ws, iq, oq, *_ = _affine_case(g, 6, (6, 3, 3, 3), act="relu6", in_zp=-128, out_zp=-128)
    conv = QConv2d(w, b, weight_scale=ws, input_quant=iq, output_quant=oq, stride=2, padding=1,
                   activation="relu6")
    w2, b2, ws2, _, oq2, *_ = _affine_case(g, 5, (5, 6 * 4 * 4), act=None, in_zp=-128, out_zp=0)
    lin = QLinear(w2, b2, weight_scale=ws2, input_quant=oq, output_quant=oq2)
    model = torch.nn.Sequential(conv, QFlatten(), lin)
    x = _rand_int8(g, 7, 3, 8, 8)
    full = model(x)
    for i in range(7):
        assert torch.equal(model(x[i:i + 1]), full[i:i + 1])


def test_random_shapes_match_reference_at_every_batch_size():
    """Seeded random layer shapes (dense, grouped, depthwise convs; linears up to the chunked
    route), scales, zero points and activations: bit-exact with the int64 reference, and each
    sample's output is the same computed alone or inside the batch. Saturation at both int8
    rails must occur somewhere in the sweep."""
    g = torch.Generator().manual_seed(21)
    rng = random.Random(21)
    saw_low = saw_high = False
    for trial in range(30):
        kind = ["dense", "grouped", "depthwise", "linear"][trial % 4]
        act = rng.choice([None, "relu", "relu6"])
        iq = TensorQuant(2.0 ** rng.uniform(-8, -2), rng.randint(-128, 127))
        oq = TensorQuant(2.0 ** rng.uniform(-6, 0), rng.randint(-128, 127))
        batch = rng.randint(1, 5)
        if kind == "linear":
            k, n = rng.choice([rng.randint(1, 64), rng.randint(515, 1200)]), rng.randint(1, 9)
            w = torch.randint(-128, 128, (n, k), generator=g)
            b = torch.randint(-2**20, 2**20, (n,), generator=g)
            ws = [2.0 ** rng.uniform(-10, -4) for _ in range(n)]
            layer = QLinear(w, b, weight_scale=ws, input_quant=iq, output_quant=oq,
                            activation=act)
            x = _rand_int8(g, batch, k)
            ms, ss = ref.effective_multipliers(iq.scale, ws, oq.scale)
            lo, hi = ref.activation_range(act, oq.scale, oq.zero_point)
            want = ref.linear(x, w, b, iq.zero_point, ms, ss, oq.zero_point, lo, hi)
        else:
            cin = rng.choice([1, 2, 4, 6, 8, 70])
            if kind == "depthwise":
                groups, cout = cin, cin * rng.choice([1, 2])
            elif kind == "grouped" and cin % 2 == 0:
                groups, cout = 2, 2 * rng.randint(1, 4)
            else:
                groups, cout = 1, rng.randint(1, 9)
            kh, kw = rng.randint(1, 4), rng.randint(1, 4)
            stride = (rng.randint(1, 3), rng.randint(1, 3))
            padding = (rng.randint(0, kh // 2), rng.randint(0, kw // 2))
            dilation = (rng.randint(1, 2), rng.randint(1, 2))
            h, wd = rng.randint(kh * dilation[0], 10), rng.randint(kw * dilation[1], 10)
            w = torch.randint(-128, 128, (cout, cin // groups, kh, kw), generator=g)
            b = torch.randint(-2**20, 2**20, (cout,), generator=g)
            ws = [2.0 ** rng.uniform(-10, -4) for _ in range(cout)]
            layer = QConv2d(w, b, weight_scale=ws, input_quant=iq, output_quant=oq,
                            stride=stride, padding=padding, dilation=dilation, groups=groups,
                            activation=act)
            x = _rand_int8(g, batch, cin, h, wd)
            ms, ss = ref.effective_multipliers(iq.scale, ws, oq.scale)
            lo, hi = ref.activation_range(act, oq.scale, oq.zero_point)
            want = ref.conv2d(x, w, b, iq.zero_point, ms, ss, oq.zero_point, lo, hi, stride,
                              padding, dilation, groups)
        got = layer(x)
        assert torch.equal(got, want), (trial, kind)
        singles = torch.cat([layer(x[i:i + 1]) for i in range(batch)])
        assert torch.equal(singles, want), (trial, kind)
        saw_low |= bool((got == -128).any())
        saw_high |= bool((got == 127).any())
    assert saw_low and saw_high


def test_in_place_weight_updates_are_seen():
    # A zeroth-order trainer perturbs the int8 buffers in place (PMT §3.1): nothing may be cached.
    g = torch.Generator().manual_seed(14)
    w, b, ws, iq, oq, ms, ss, lo, hi = _affine_case(g, 4, (4, 2, 3, 3), act=None, in_zp=0,
                                                    out_zp=0, out_scale=0.01)
    layer = QConv2d(w, b, weight_scale=ws, input_quant=iq, output_quant=oq, padding=1)
    x = _rand_int8(g, 1, 2, 5, 5)
    before = layer(x)
    layer.weight.numpy()[0, 0, 1, 1] ^= 1  # through numpy: torch's version counter is not bumped
    layer.bias[1] += 500
    after = layer(x)
    assert not torch.equal(before, after)
    assert torch.equal(after, ref.conv2d(x, layer.weight, layer.bias, 0, ms, ss, 0, lo, hi,
                                         (1, 1), (1, 1), (1, 1), 1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_qadd_matches_reference(backend):
    g = torch.Generator().manual_seed(15)
    rng = random.Random(15)
    for trial in range(12):
        s1, s2 = 2.0 ** rng.uniform(-8, 0), 2.0 ** rng.uniform(-8, 0)
        so = (s1 + s2) * 2.0 ** rng.uniform(-3, 1)
        zps = [rng.randint(-128, 127) for _ in range(3)]
        act = [None, "relu", "relu6"][trial % 3]
        q1, q2, qo = TensorQuant(s1, zps[0]), TensorQuant(s2, zps[1]), TensorQuant(so, zps[2])
        layer = QAdd(q1, q2, qo, activation=act, backend=backend)
        a, b = _rand_int8(g, 3, 4, 5), _rand_int8(g, 3, 4, 5)
        left_shift, m1, m2, mo = ref.add_params(s1, s2, so)
        lo, hi = ref.activation_range(act, qo.scale, qo.zero_point)
        want = ref.add(a, b, q1.zero_point, q2.zero_point, qo.zero_point, left_shift, m1, m2, mo,
                       lo, hi)
        assert torch.equal(layer(a, b), want), trial
    p = AddRequantization.from_quant(TensorQuant(0.1), TensorQuant(0.1), TensorQuant(0.1))
    assert p.left_shift == 20 and p.input1_shift <= 0 and p.output_shift <= 0
    with pytest.raises(ValueError, match="output real multiplier"):
        QAdd(TensorQuant(1.0), TensorQuant(1.0), TensorQuant(1e-7))
    with pytest.raises(ValueError, match="same shape"):
        QAdd(TensorQuant(0.1), TensorQuant(0.1), TensorQuant(0.1))(
            torch.zeros(2, 3, dtype=torch.int8), torch.zeros(3, 2, dtype=torch.int8))


def test_qavgpool_matches_reference():
    g = torch.Generator().manual_seed(16)
    for kernel, stride, padding, act in [((2, 2), (2, 2), (0, 0), None),
                                         ((3, 3), (2, 2), (1, 1), "relu"),
                                         ((3, 2), (1, 2), (1, 1), None),
                                         ((4, 4), (3, 3), (2, 1), "relu6")]:
        quant = TensorQuant(0.05, -7)
        layer = QAvgPool2d(kernel, stride, padding, quant=quant, activation=act)
        x = _rand_int8(g, 2, 3, 7, 8)
        lo, hi = ref.activation_range(act, quant.scale, quant.zero_point)
        assert torch.equal(layer(x), ref.avg_pool2d(x, kernel, stride, padding, lo, hi))
    # Ties: sums of +-1 over 2 elements round away from zero like TFLite, not to even.
    x = torch.tensor([[[[1, 0], [-1, 0]]]], dtype=torch.int8)
    assert QAvgPool2d((1, 2))(x).reshape(-1).tolist() == [1, -1]


def test_qglobal_avgpool_matches_reference():
    g = torch.Generator().manual_seed(17)
    for s_in, s_out, zi, zo, keep in [(0.05, 0.05, -128, -128, False), (0.05, 0.02, 10, -3, True),
                                      (0.1, 0.9, 0, 5, False), (0.02, 0.003, -20, 0, False)]:
        layer = QGlobalAvgPool2d(TensorQuant(s_in, zi), TensorQuant(s_out, zo), keepdim=keep)
        x = _rand_int8(g, 3, 4, 5, 6)
        m, s = ref.quantize_multiplier(TensorQuant(s_in).scale / TensorQuant(s_out).scale)
        want = ref.global_avg_pool(x, zi, m, s, zo)
        got = layer(x)
        assert torch.equal(got.reshape(3, 4), want)
        assert got.shape == ((3, 4, 1, 1) if keep else (3, 4))


def test_qrelu_and_qflatten():
    q = TensorQuant(6 / 255, -100)
    x = torch.arange(-128, 128, dtype=torch.int8)
    assert QReLU(q)(x).min().item() == -100 and QReLU(q)(x).max().item() == 127
    lo, hi = ref.activation_range("relu6", q.scale, q.zero_point)
    assert (QReLU(q, six=True)(x).min().item(), QReLU(q, six=True)(x).max().item()) == (lo, hi)
    assert QFlatten()(torch.zeros(2, 3, 4, dtype=torch.int8)).shape == (2, 12)
    with pytest.raises(ValueError, match="int8 tensor"):
        QFlatten()(torch.zeros(2, 3))


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------

IQ, OQ = TensorQuant(0.1, 0), TensorQuant(0.1, 0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(weight=torch.full((2, 3), 128)), r"weight values must lie in \[-128, 127\]"),
    (dict(weight=torch.full((2, 3), -129, dtype=torch.int16)), r"weight values must lie in"),
    (dict(weight=torch.full((2, 3), 0.5)), "weight must hold integers"),
    (dict(weight=torch.full((2, 3), float("nan"))), "weight must hold integers"),
    (dict(weight=[[1, 2]]), "weight must be a 2-D tensor"),
    (dict(weight=torch.ones(2, 3, 1)), "weight must be a 2-D tensor"),
    (dict(bias=torch.ones(3, dtype=torch.int32)), r"bias must have shape \(2,\)"),
    (dict(bias=torch.tensor([2**31, 0])), r"bias values must lie in \[-2147483648"),
    (dict(weight_scale=[0.1, 0.1, 0.1]), "weight_scale must have 1 or 2 entries"),
    (dict(weight_scale=0.0), "weight_scale"),
    (dict(weight_scale=float("inf")), "weight_scale"),
    (dict(input_quant=0.1), "input_quant must be a bpfree.quant.TensorQuant"),
    (dict(activation="gelu"), "activation must be one of"),
    (dict(accumulate="float32"), "accumulate must be one of"),
    (dict(backend="cuda"), "backend must be one of"),
])
def test_qlinear_rejects_bad_construction(kwargs, match):
    args = dict(weight=torch.ones(2, 3, dtype=torch.int8), bias=None, weight_scale=0.1,
                input_quant=IQ, output_quant=OQ)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        QLinear(args.pop("weight"), args.pop("bias"), **args)


@pytest.mark.parametrize("kwargs, match", [
    (dict(groups=3), r"out_channels \(4\) must be divisible by groups \(3\)"),
    (dict(groups=0), "groups must be an int >= 1"),
    (dict(stride=0), "stride must be >= 1"),
    (dict(padding=(1, 2, 3)), "padding must be an int or a pair"),
    (dict(dilation=-1), "dilation must be >= 1"),
])
def test_qconv2d_rejects_bad_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        QConv2d(torch.ones(4, 2, 3, 3, dtype=torch.int8), weight_scale=0.1, input_quant=IQ,
                output_quant=OQ, **kwargs)


def test_layers_reject_bad_inputs():
    lin = QLinear(torch.ones(2, 3, dtype=torch.int8), weight_scale=0.1, input_quant=IQ,
                  output_quant=OQ)
    with pytest.raises(ValueError, match="input must be an int8 tensor"):
        lin(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"input must have shape \(\.\.\., 3\)"):
        lin(torch.zeros(1, 4, dtype=torch.int8))
    conv = QConv2d(torch.ones(4, 1, 3, 3, dtype=torch.int8), weight_scale=0.1, input_quant=IQ,
                   output_quant=OQ, groups=2)
    with pytest.raises(ValueError, match=r"input must have shape \(N, 2, H, W\)"):
        conv(torch.zeros(1, 3, 5, 5, dtype=torch.int8))
    lin.weight = lin.weight.to(torch.int16)
    with pytest.raises(ValueError, match="weight must stay int8"):
        lin(torch.zeros(1, 3, dtype=torch.int8))
    with pytest.raises(ValueError, match="quant .* is required for a fused activation"):
        QAvgPool2d(2, activation="relu")
    with pytest.raises(ValueError, match="padding must be at most half"):
        QAvgPool2d(2, padding=2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_and_cuda_agree():
    g = torch.Generator().manual_seed(18)
    w, b, ws, iq, oq, *_ = _affine_case(g, 8, (8, 80, 3, 3), act="relu", in_zp=-128, out_zp=0)
    conv = QConv2d(w, b, weight_scale=ws, input_quant=iq, output_quant=oq, padding=1)
    dw, db, dws, _, oq2, *_ = _affine_case(g, 8, (8, 1, 3, 3), act="relu6", in_zp=0, out_zp=-128)
    dwc = QConv2d(dw, db, weight_scale=dws, input_quant=oq, output_quant=oq2, groups=8)
    model = torch.nn.Sequential(conv, dwc, QAvgPool2d(2), QGlobalAvgPool2d(oq2))
    x = _rand_int8(g, 5, 80, 9, 9)
    assert torch.equal(model(x), model.cuda()(x.cuda()).cpu())
    add = QAdd(TensorQuant(0.1, 3), TensorQuant(0.03, -9), TensorQuant(0.2, 1))
    a, c = _rand_int8(g, 50), _rand_int8(g, 50)
    assert torch.equal(add(a, c), add(a.cuda(), c.cuda()).cpu())
    assert math.isfinite(float(model(x).float().mean()))
