"""Verdicts with a tolerance from the seed spread (bench.claims), the headline's one verdict
per claim with counts per paper (bench.docs), and re-deriving ledgers from committed rows
(bench.reledger)."""

from __future__ import annotations

import json
import math
import textwrap

import pytest

from bpfree.bench import claims, docs, reledger
from bpfree.bench.claims import UNDECIDED


# ----------------------------------------------------------------------------- tolerances


def test_a_tie_is_not_decided_at_any_tolerance():
    for tol in (0.0, 0.5, 3.0):
        assert claims.order(0.5611791414211317, 0.5611791414211317, tol) == UNDECIDED
        assert claims.order(2.0, 2.0, tol, lower_is_better=True) == UNDECIDED


def test_an_ordering_inside_two_standard_errors_is_not_decided():
    a, b = [67.3, 62.1, 72.8], [65.4, 64.7, 66.5]       # tt-zo r=6 vs r=10 ZO-RGE
    (ma, sa), (mb, sb) = claims.mean_se(a), claims.mean_se(b)
    tol = claims.tolerance(sa, sb)
    assert tol == pytest.approx(2 * math.sqrt(sa ** 2 + sb ** 2))
    assert 0 < ma - mb < tol
    assert claims.order(ma, mb, tol) == UNDECIDED
    assert claims.order(ma, mb, 0.0) is True            # the old strict rule said "holds"
    assert claims.order(ma + tol + 1e-9, mb, tol) is True
    assert claims.order(mb, ma + tol + 1e-9, tol) is False


def test_mean_se_matches_the_sample_formula_and_one_seed_has_no_spread():
    mean, se = claims.mean_se([1.0, 2.0, 4.0])
    assert mean == pytest.approx(7 / 3)
    assert se == pytest.approx(math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2)
                                         / 2 / 3))
    assert claims.mean_se([5.0]) == (5.0, 0.0)
    assert claims.se_from_std(3.0, 9) == pytest.approx(1.0)
    assert claims.se_from_std(3.0, 1) == 0.0
    with pytest.raises(ValueError, match="at least one value"):
        claims.mean_se([])


@pytest.mark.parametrize(("value", "threshold", "tol", "expected"), [
    (3.0, 1.0, 1.0, True), (1.0, 3.0, 1.0, False), (2.0, 1.5, 1.0, UNDECIDED),
    (1.0, 1.0, 0.0, UNDECIDED), (1.0 + 1e-12, 1.0, 0.0, True)])
def test_exceeds_has_three_outcomes(value, threshold, tol, expected):
    assert claims.exceeds(value, threshold, tol) == expected


def test_within_a_bound_is_decided_only_outside_the_noise():
    assert claims.within(0.5, 2.0, 1.0) is True          # |0.5| + 1 < 2
    assert claims.within(-3.5, 2.0, 1.0) is False        # |-3.5| - 1 > 2
    assert claims.within(1.9, 2.0, 0.5) == UNDECIDED
    with pytest.raises(ValueError, match="tolerance"):
        claims.within(1.0, 2.0, -1.0)


def test_all_hold_and_chain_combine_verdicts():
    assert claims.all_hold([True, True]) is True
    assert claims.all_hold([True, UNDECIDED, None]) == UNDECIDED
    assert claims.all_hold([UNDECIDED, False]) is False
    assert claims.all_hold([True, None]) is None
    assert claims.all_hold([]) is None
    assert claims.chain([3.0, 2.0, 1.0], [0.1, 0.1, 0.1]) is True
    assert claims.chain([3.0, 2.9, 1.0], [0.1, 0.1, 0.1]) == UNDECIDED
    assert claims.chain([3.0, 4.0, 1.0], [0.1, 0.1, 0.1]) is False
    with pytest.raises(ValueError, match="at least two"):
        claims.chain([1.0], [0.1])


def test_claims_accept_not_decided_and_a_kind_and_refuse_other_values():
    entry = claims.claim("x", "Table 2", "r=4 > r=6", paper=None, ours="…", holds=UNDECIDED,
                         kind="paper")
    assert entry["holds"] == UNDECIDED and claims.verdict_text(entry["holds"]) == "not decided"
    with pytest.raises(claims.ClaimError, match="'holds' must be True, False, 'not decided'"):
        claims.claim("x", "T", "s", paper=None, ours=None, holds="undecided")
    with pytest.raises(claims.ClaimError, match="'kind' must be one of"):
        claims.claim("x", "T", "s", paper=None, ours=None, holds=True, kind="vibes")


def test_sanity_claim_needs_the_loss_to_fall_and_the_accuracy_to_move():
    flat = claims.sanity_claim("s", "FP32 BP", accuracy_start=75.8, accuracy_end=75.8,
                               loss_start=0.7111, loss_end=0.7092)
    assert flat["holds"] is False and flat["kind"] == "sanity"     # issue 31's fp32-bp-trains
    rising = claims.sanity_claim("s", "SP-MLP FO", accuracy_start=10.0,
                                 accuracy_end=[30.0, 40.0, 33.0])
    assert rising["holds"] is True and "not recorded" in rising["note"]
    noisy = claims.sanity_claim("s", "x", accuracy_start=[10.0, 10.0, 10.0],
                                accuracy_end=[9.0, 30.0, 11.0])
    assert noisy["holds"] is False                                  # inside 2 SE: not trained
    worse_loss = claims.sanity_claim("s", "x", accuracy_start=10, accuracy_end=50,
                                     loss_start=[1.0, 1.1], loss_end=[1.2, 1.3])
    assert worse_loss["holds"] is False


@pytest.mark.parametrize(("benchmark", "ref", "kind", "paper"), [
    ("device", "issue 17, Done when", "engineering", None),
    ("device", "issue 17; PMT §1, §4.4 (STM32H7B3)", "paper", "PMT"),
    ("mcunet", "baseline sanity (issue 14)", "sanity", "PMT"),
    ("fleet", "issue 19 (FedKSeed, DeComFL)", "engineering", None),
    ("tt-zo", "Table 1", "paper", "TT-ZO"),
    ("pinn", "Table 4 (TT-MLP)", "paper", "BP-free PINN"),
])
def test_kind_and_paper_are_read_from_old_claims(benchmark, ref, kind, paper):
    entry = {"id": "c", "paper_ref": ref, "statement": "s", "paper": None, "ours": None,
             "holds": True}
    assert claims.claim_kind(entry) == kind
    assert claims.claim_paper(benchmark, entry) == paper


# ----------------------------------------------------------------------------- headline


def _doc(name, quick, entries):
    return {"benchmark": name, "quick": quick, "device": "cpu", "seconds": 1.0,
            "versions": {}, "git_revision": "abc1234", "rows": [], "claims": entries}


def _c(cid, holds, ref="Table 1", kind=None):
    return claims.claim(cid, ref, "s", paper=None, ours=None, holds=holds, kind=kind)


def test_the_headline_counts_one_verdict_per_claim(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    full = [_c("a", True), _c("b", UNDECIDED), _c("e", True, ref="issue 19, Done when")]
    quick = [_c("a", False), _c("b", False), _c("q", None), _c("s", True, ref="baseline sanity")]
    (results / "tt-zo.json").write_text(json.dumps(_doc("tt-zo", False, full)))
    (results / "tt-zo-quick.json").write_text(json.dumps(_doc("tt-zo", True, quick)))
    entries = docs.load_results(results, docs.DocsReport(out=tmp_path / "x.md"))
    headline = docs.headline_claims(entries)
    assert [(run, c["id"], c["holds"]) for _, run, c in headline] == [
        ("full", "a", True), ("full", "b", UNDECIDED), ("full", "e", True),
        ("quick (no full run)", "q", None), ("quick (no full run)", "s", True)]
    tally = docs.claim_tally(headline)
    assert {k: len(v) for k, v in tally.items()} == {
        ("TT-ZO", "paper"): 3, ("TT-ZO", "sanity"): 1, (None, "engineering"): 1}
    out = tmp_path / "B.md"
    docs.generate_docs(results, out)
    text = out.read_text()
    status = text[text.index("## Claim status"):text.index("## Overview")]
    assert "**5 claims: 3 hold, 0 fail, 1 not decided, 1 not measured.**" in status
    assert "Paper-linked" in status and "**3 claims: 1 hold, 0 fail, 1 not decided, " \
                                           "1 not measured.**" in status
    assert "| TT-ZO | paper-linked | 3 | 1 | 0 | 1 | 1 |" in status
    assert "| bpfree (no paper) | bpfree engineering | 1 | 1 | 0 | 0 | 0 |" in status
    assert "| tt-zo | quick (no full run) | q |" in status
    assert status.count("| tt-zo | ") == 5


# ----------------------------------------------------------------------------- reledger


_MODULE = textwrap.dedent("""
    from bpfree.bench.claims import claim, order
    NAME = "toy"
    DESCRIPTION = "A benchmark whose rule changed."
    def run(quick):
        raise AssertionError("reledger must not train")
    def ledger_from_result(document):
        a, b = (r["value"] for r in document["rows"])
        return [claim("a-beats-b", "Table 1", "a beats b", paper=None, ours=f"{a} vs {b}",
                      holds=order(a, b, 1.0)),
                claim("new", "Table 2", "a new claim", paper=None, ours=None, holds=None)]
""")


def test_reledger_rewrites_claims_from_the_rows_and_reports_flips(tmp_path):
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "toy.py").write_text(_MODULE)
    results = tmp_path / "results"
    results.mkdir()
    rows = [{"table": "t", "method": m, "setting": "", "metric": "acc", "value": v,
             "paper": None} for m, v in (("a", 61.0), ("b", 60.5))]
    old = {**_doc("toy", False, [_c("a-beats-b", True), _c("gone", False)]), "rows": rows}
    (results / "toy.json").write_text(json.dumps(old))
    (results / "other.json").write_text(json.dumps(_doc("other", False, [_c("x", True)])))
    report = reledger.reledger_results(results, directory=bench)
    assert report.rewritten == ["results/toy.json"]
    assert report.without_rule == ["results/other.json"]
    assert [(f.claim, f.before, f.after) for f in report.flips] == [
        ("a-beats-b", "holds", "not decided"), ("new", "absent", "not measured"),
        ("gone", "fails", "absent")]
    written = json.loads((results / "toy.json").read_text())
    assert written["rows"] == rows and written["git_revision"] == "abc1234"
    assert [c["id"] for c in written["claims"]] == ["a-beats-b", "new"]
    assert "claims_revision" in written and written["claims_dirty"] is False
    again = reledger.reledger_results(results, directory=bench)
    assert again.rewritten == [] and again.flips == []


@pytest.mark.parametrize("stem, result", [
    ("tt_zo", "tt-zo.json"), ("tinyfoa", "tinyfoa.json"), ("qzo_ff", "qzo-ff.json"),
    ("pinn", "pinn.json"), ("device", "device.json"), ("mcunet", "mcunet.json"),
    ("pmt", "pmt.json"), ("pmt_ratios", "pmt-ratios.json"),
    ("pmt_q_budget", "pmt-q-budget.json"), ("pmt_t6", "pmt-t6.json"),
    ("pmt_t6", "pmt-t6-quick.json")])
def test_ledger_from_result_reads_the_committed_files(stem, result):
    """Each hook rebuilds a valid ledger from the schema its benchmark writes, without
    training; the committed claims are what the current rules say of the committed rows
    (`bpfree docs --reledger` keeps them so)."""
    from pathlib import Path

    from bpfree.bench.runner import load_module, validate_result

    path = Path(__file__).resolve().parents[1] / "results" / result
    if not path.is_file():
        pytest.skip(f"{result} not committed")
    document = validate_result(json.loads(path.read_text()), source=result)
    rebuilt = claims.validate_claims(load_module(stem).ledger_from_result(document))
    assert rebuilt == document["claims"]
