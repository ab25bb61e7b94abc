"""The pmt-seeds ledger: verdicts follow the rows (mean over seeds), both ways."""

from __future__ import annotations

import pytest

from bpfree.bench.runner import load_module


@pytest.fixture(scope="module")
def bench():
    return load_module("pmt_seeds"), load_module("pmt")


def _noise_means(pmt_sparse, sparse_bp, int8_noqas=(40.0, 42.0), fp32=(80.0, 82.0),
                 int8_qas=(60.0, 61.0)):
    methods = {"pmt-sparse": pmt_sparse, "int8-sparse-bp": sparse_bp,
               "int8-bp-noqas": int8_noqas, "fp32-bp": fp32, "int8-bp": int8_qas,
               "no-adaptation": (20.0, 21.0)}
    return {m: dict(enumerate(v)) for m, v in methods.items()}


def test_ledger_verdicts_follow_the_mean_over_seeds(bench):
    seeds, pmt = bench
    P = pmt._settings(True)["protocol"]
    noise = ("gaussian_noise", "impulse_noise")
    ahead = {c["id"]: c for c in seeds.ledger(_noise_means((70.0, 66.0), (65.0, 67.0)), noise, P,
                                                pmt.PAPER_TABLE7)}
    assert ahead["seeds-bpfree-beats-mcutrain-noise"]["holds"] is True   # 68 > 66
    assert "1/2 seeds" in ahead["seeds-bpfree-beats-mcutrain-noise"]["ours"]
    assert ahead["seeds-bpfree-best-int8-noise"]["holds"] is True
    assert ahead["seeds-int8-fulltrain-drop"]["holds"] is True           # 41 < 81 - 5
    assert "Below the paper's budget" in ahead["seeds-bpfree-beats-mcutrain-noise"]["note"]
    behind = {c["id"]: c for c in seeds.ledger(
        _noise_means((60.0, 62.0), (65.0, 67.0), int8_noqas=(79.0, 80.0)), noise, P,
        pmt.PAPER_TABLE7)}
    assert behind["seeds-bpfree-beats-mcutrain-noise"]["holds"] is False
    assert behind["seeds-bpfree-best-int8-noise"]["holds"] is False
    assert "int8-bp-noqas" in behind["seeds-bpfree-best-int8-noise"]["ours"]
    assert behind["seeds-int8-fulltrain-drop"]["holds"] is False         # 79.5 > 81 - 5
    # The paper column is the mean of Table 7 over the corruptions run.
    assert ahead["seeds-bpfree-beats-mcutrain-noise"]["paper"] == "63.89 vs 58.66 %"
