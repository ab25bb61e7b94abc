"""Per-sample test outcomes in result files (bpfree.bench.outcomes) and the paired standard
error built on them (bpfree.bench.claims.paired_se), including the text a result file
carries: round trips, exact numbers and fuzzed input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bpfree.bench import claims
from bpfree.bench.outcomes import pack_outcomes, unpack_outcomes
from bpfree.harness import accuracy, correct


@given(st.lists(st.booleans(), min_size=1, max_size=300))
def test_outcomes_round_trip(flags):
    text = pack_outcomes(np.array(flags, dtype=bool))
    assert text.isascii()
    assert unpack_outcomes(text, len(flags)).tolist() == flags
    assert pack_outcomes(torch.tensor(flags)) == text


@settings(max_examples=300)
@given(st.one_of(st.text(max_size=40), st.binary(max_size=40), st.integers(), st.none()),
       st.integers(min_value=-3, max_value=400))
def test_unpack_fuzzed_input_is_an_outcome_array_or_a_clear_error(text, n):
    try:
        out = unpack_outcomes(text, n)
    except ValueError as err:
        assert str(err)
    else:
        assert out.dtype == bool and out.shape == (n,)
        assert pack_outcomes(out) == text


def test_unpack_names_what_is_wrong():
    good = pack_outcomes(np.ones(10, dtype=bool))
    with pytest.raises(ValueError, match="hold 2 bytes; 17 samples need 3"):
        unpack_outcomes(good, 17)
    with pytest.raises(ValueError, match="past the last sample"):
        unpack_outcomes(good, 9)
    with pytest.raises(ValueError, match="not base64"):
        unpack_outcomes("??", 8)
    with pytest.raises(ValueError, match="positive number"):
        unpack_outcomes(good, True)
    with pytest.raises(ValueError, match="1-D boolean"):
        pack_outcomes(np.ones((2, 3), dtype=bool))
    with pytest.raises(ValueError, match="1-D boolean"):
        pack_outcomes(np.ones(4))


def test_paired_se_counts_only_the_samples_the_two_disagree_on():
    # 100 samples: 10 only a gets right, 4 only b, the rest agree. The differences are
    # 10 x (+1), 4 x (-1), 86 x 0: mean 0.06, sample variance (14 - 100 * 0.06^2) / 99.
    a = np.zeros(100, dtype=bool)
    b = np.zeros(100, dtype=bool)
    a[:10] = True
    b[10:14] = True
    a[50:], b[50:] = True, True
    expect = 100 * math.sqrt((14 - 100 * 0.06 ** 2) / 99 / 100)
    assert claims.paired_se(a, b) == pytest.approx(expect, rel=1e-12)
    assert claims.paired_se(a, a) == 0.0
    # the unpaired binomial noise of the same two accuracies is about twice as large
    unpaired = math.hypot(claims.binomial_se(60.0, 100), claims.binomial_se(54.0, 100))
    assert unpaired > 1.8 * claims.paired_se(a, b)
    with pytest.raises(ValueError, match="equal-length"):
        claims.paired_se(a, b[:50])


def test_sanity_claim_with_one_seed_uses_the_test_set_noise():
    # 74.5 -> 74.6 % on 2000 images: inside the binomial noise, and inside a paired noise
    # of 0.2 points; a paired 1.7-point rise with a paired SE of 0.3 moves.
    flat = claims.sanity_claim("s", "FP32 BP", accuracy_start=74.5, accuracy_end=74.6,
                               loss_start=0.62, loss_end=0.53, n_test=2000)
    assert flat["holds"] is False and "2000 test images" in flat["ours"]
    assert "test-set noise" in flat["statement"]
    rise = claims.sanity_claim("s", "INT8 BP", accuracy_start=74.8, accuracy_end=76.5,
                               loss_start=0.56, loss_end=0.49, n_test=2000,
                               difference_se=0.3)
    assert rise["holds"] is True and "needs > 0.60 points" in rise["ours"]
    assert claims.sanity_claim("s", "INT8 BP", accuracy_start=74.8, accuracy_end=76.5,
                               n_test=2000)["holds"] is False        # unpaired: 2.7 points
    seeds = claims.sanity_claim("s", "x", accuracy_start=[10.0, 10.0], accuracy_end=[50, 52],
                                n_test=10, difference_se=100.0)     # seeds' spread decides
    assert seeds["holds"] is True and "2 seeds" in seeds["ours"]


def test_correct_is_per_sample_and_agrees_with_accuracy():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(250, 4), torch.randint(0, 3, (250,))
    hits = correct(model, x, y, batch_size=64)
    with torch.no_grad():
        expect = model(x).argmax(1) == y
    assert hits.dtype == torch.bool and torch.equal(hits, expect)
    assert accuracy(model, x, y, batch_size=64) == 100.0 * int(expect.sum()) / 250
    with pytest.raises(ValueError):
        correct(model, x[:0], y[:0])
