"""Property-based tests (hypothesis): the bit-exact pieces checked on generated inputs.

Each property compares a fast path with an independent, obviously-correct one: the TFLite
fixed-point primitives with the int64 transcription in ``bpfree.quant.reference`` (extremes
included: hypothesis tries INT32_MIN / INT32_MAX first), XORShift32 with its recurrence typed
out in Python, in-place perturbation with the value it started from, and checkpoints with
the objects saved. ``max_examples`` stays modest so the default suite stays fast.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_checkpoint import assert_same

from bpfree.checkpoint import load_checkpoint, save_checkpoint
from bpfree.perturb import list_distributions, perturb_, restore_
from bpfree.perturb.xorshift import rademacher_xorshift, xorshift32
from bpfree.quant import fixed_point
from bpfree.quant import reference as ref

# database=None: no .hypothesis/ folder in the checkout; a failure prints its own reproducer.
FAST = settings(max_examples=60, deadline=None, database=None)
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
int32 = st.integers(INT32_MIN, INT32_MAX)
int32_lists = st.lists(int32, min_size=1, max_size=32)


# --- TFLite requantization primitives vs the int64 reference ---------------------------------


@FAST
@given(a=int32_lists, b=int32)
@example(a=[INT32_MIN, INT32_MAX, 0, -1], b=INT32_MIN)
def test_saturating_rounding_doubling_high_mul_matches_reference(a, b):
    got = fixed_point.saturating_rounding_doubling_high_mul(torch.tensor(a, dtype=torch.int64), b)
    assert got.tolist() == [ref.saturating_rounding_doubling_high_mul(v, b) for v in a]


@FAST
@given(x=int32_lists, exponent=st.integers(0, 31))
@example(x=[INT32_MIN, INT32_MAX, -1, 1, -3, 3], exponent=1)
def test_rounding_divide_by_pot_matches_reference(x, exponent):
    got = fixed_point.rounding_divide_by_pot(torch.tensor(x, dtype=torch.int64), exponent)
    assert got.tolist() == [ref.rounding_divide_by_pot(v, exponent) for v in x]


@FAST
@given(x=int32_lists, multiplier=st.one_of(st.just(0), st.integers(2**30, INT32_MAX)),
       shift=st.integers(-31, 31))
@example(x=[INT32_MIN, INT32_MAX], multiplier=INT32_MAX, shift=31)
def test_multiply_by_quantized_multiplier_matches_reference(x, multiplier, shift):
    got = fixed_point.multiply_by_quantized_multiplier(torch.tensor(x, dtype=torch.int64),
                                                       multiplier, shift)
    assert got.tolist() == [ref.multiply_by_quantized_multiplier(v, multiplier, shift) for v in x]


@FAST
@given(real=st.floats(min_value=0.0, max_value=2.0**31, allow_subnormal=True))
def test_quantize_multiplier_matches_reference(real):
    assert fixed_point.quantize_multiplier(real) == ref.quantize_multiplier(real)


# --- XORShift32: the generator against its recurrence -----------------------------------------


def _xorshift32_python(seed: int, n: int) -> list[int]:
    """PMT Appendix F's xor_rand(), on Python ints masked to 32 bits."""
    out, s = [], seed
    for _ in range(n):
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        out.append(s)
    return out


@FAST
@given(seed=st.integers(1, 2**32 - 1), n=st.integers(0, 300), cut=st.integers(0, 300))
@example(seed=2**32 - 1, n=5, cut=2)
def test_xorshift32_matches_the_recurrence_and_resumes_from_any_state(seed, n, cut):
    stream = xorshift32(seed, n)
    assert stream.dtype == np.uint32 and stream.tolist() == _xorshift32_python(seed, n)
    # Jumping to element `cut` = restarting from the state before it (device parity).
    cut = min(cut, n)
    if 0 < cut < n:
        assert xorshift32(int(stream[cut - 1]), n - cut).tolist() == stream[cut:].tolist()
    signs = rademacher_xorshift(seed, (n,)).tolist()
    assert signs == [-1 if v & 1 else 1 for v in stream.tolist()]


# --- perturb / restore bit-exactness ----------------------------------------------------------

_FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@FAST
@given(shape=st.lists(st.integers(1, 6), min_size=0, max_size=3),
       dtype=st.sampled_from(_FLOAT_DTYPES), dist=st.sampled_from(list_distributions()),
       seed=st.integers(1, 2**32 - 1), data_seed=st.integers(0, 2**31),
       alpha=st.floats(min_value=-1e3, max_value=1e3, allow_nan=False).filter(bool),
       magnitude=st.sampled_from([1e-6, 1.0, 1e4]))
def test_perturb_then_restore_is_bit_exact(shape, dtype, dist, seed, data_seed, alpha, magnitude):
    gen = torch.Generator().manual_seed(data_seed)
    t = (torch.randn(shape, generator=gen, dtype=torch.float64) * magnitude).to(dtype)
    before = t.clone()
    repair = perturb_(t, dist, seed, alpha)
    restore_(t, dist, seed, alpha, repair)
    assert_same(t, before)


@FAST
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       dtype=st.sampled_from([torch.int8, torch.int32]),
       dist=st.sampled_from(["rademacher", "rademacher_xorshift", "quantized_gaussian"]),
       seed=st.integers(1, 2**32 - 1), alpha=st.integers(-3, 3))
def test_integer_perturb_then_restore_is_bit_exact(shape, dtype, dist, seed, alpha):
    """Exact round trip, or (int8 under the quantized Gaussian's +-127 units) an
    OverflowError that leaves the tensor as it was."""
    t = torch.randint(-50, 50, shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    before = t.clone()
    try:
        repair = perturb_(t, dist, seed, alpha)
    except OverflowError:
        assert dtype == torch.int8
    else:
        restore_(t, dist, seed, alpha, repair)
    assert_same(t, before)


# --- checkpoint round trips -------------------------------------------------------------------

_TENSOR_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                  torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool]


@st.composite
def tensors(draw):
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    dtype = draw(st.sampled_from(_TENSOR_DTYPES))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    return (torch.randn(shape, generator=gen) * 100).to(dtype)


_leaves = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.text(max_size=8),
                    st.floats(allow_nan=True, allow_infinity=True), tensors())
_values = st.recursive(
    _leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner, inner),
                            st.dictionaries(st.one_of(st.text(max_size=5), st.integers(-5, 5)),
                                            inner, max_size=3)),
    max_leaves=12)


@settings(max_examples=25, deadline=None, database=None)
@given(model_state=st.dictionaries(st.text(min_size=1, max_size=6), tensors(), max_size=4),
       extra=st.dictionaries(st.one_of(st.text(max_size=6), st.integers(-3, 3)), _values,
                             max_size=4))
def test_checkpoint_round_trip_is_exact(model_state, extra):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ck.safetensors"
        save_checkpoint(path, model_state=model_state, extra=extra)
        loaded = load_checkpoint(path)
    assert_same(dict(loaded.model_state), model_state, "model_state")
    assert_same(loaded.extra, extra, "extra")
