"""bench pmt's claim ledger: verdicts follow the rows, ties are not decided, budgets are named."""

from __future__ import annotations

import pytest

from bpfree.bench.claims import UNDECIDED
from bpfree.bench.runner import load_module


@pytest.fixture(scope="module")
def pmt():
    return load_module("pmt")


def _inputs(pmt, *, adaptive_loss, rival_loss, noise=0.0, mezo_forwards=1000, pmt_forwards=1000):
    acc = {m: {c: 50.0 for c in pmt.CORRUPTIONS} for m in pmt.LABELS}
    groups = {k: {g: 60.0 for g in pmt.GROUPS} for k in
              ("block 1", "block 2", "block 3", "block 4", "adaptive")}
    budget = {"pmt-sparse": {"accuracy": 70.0, "forwards": pmt_forwards},
              "mezo": {"accuracy": 60.0, "forwards": mezo_forwards},
              "deepzero": {"accuracy": 65.0, "forwards": pmt_forwards}}
    abl = {}
    for label in pmt.ABLATIONS:
        last = adaptive_loss if label == "layer-wise adaptive (PMT)" else (
            rival_loss if label == "layer-wise WP" else rival_loss + 1.0)
        curve = [last + noise * (-1) ** i for i in range(6)]
        # What the ledger reads of a Fig. 7 run: its summary (final loss, the loss's SE).
        abl[label] = pmt.ablation_summary({"last_loss": last, "loss": curve,
                                           "modes": {"a": "wp", "b": "np"}})
    cos = {s: {100: (0.1, 0.01)} for s in ("wp-layer", "wp-model", "np-layer", "np-model",
                                           "adaptive")}
    cal = {c: {"strength": 1.0, "trace": [(1.0, 50.0)]} for c in pmt.CORRUPTIONS}
    P = pmt._settings(False)["protocol"]
    return acc, groups, budget, abl, cos, cal, P, False


def _claims(pmt, **kw):
    return {c["id"]: c for c in pmt.ledger(*_inputs(pmt, **kw))}


def test_adaptive_estimator_verdict_follows_the_losses_with_a_tolerance(pmt):
    assert _claims(pmt, adaptive_loss=0.5, rival_loss=0.9)["adaptive-best-estimator"][
        "holds"] is True
    assert _claims(pmt, adaptive_loss=0.9, rival_loss=0.5)["adaptive-best-estimator"][
        "holds"] is False
    tie = _claims(pmt, adaptive_loss=0.56, rival_loss=0.56)["adaptive-best-estimator"]
    assert tie["holds"] == UNDECIDED  # the old rule called a tie "holds"
    noisy = _claims(pmt, adaptive_loss=0.50, rival_loss=0.52, noise=0.2)
    assert noisy["adaptive-best-estimator"]["holds"] == UNDECIDED


def test_budget_claims_name_unequal_budgets(pmt):
    same = _claims(pmt, adaptive_loss=0.5, rival_loss=0.9)
    assert "same forward budget" in same["pmt-beats-mezo"]["ours"]
    assert same["pmt-beats-mezo"]["holds"] is True
    unequal = _claims(pmt, adaptive_loss=0.5, rival_loss=0.9, mezo_forwards=800)
    assert "1,000 (PMT) vs 800" in unequal["pmt-beats-mezo"]["ours"]
    assert "same forward budget" not in unequal["pmt-beats-mezo"]["statement"]


def test_full_protocol_is_the_papers_budget(pmt):
    P = pmt._settings(False)["protocol"]
    assert (P.queries, P.zo_epochs, P.bp_epochs, P.batch_size) == (100, 50, 50, 100)
    assert min(len(P.zo_lrs), len(P.bp_lrs), len(P.noqas_lsb)) >= 3
    claims = _claims(pmt, adaptive_loss=0.5, rival_loss=0.9)
    assert "Below the paper's budget" not in (claims["bpfree-near-fp32"].get("note") or "")
    assert claims["pmt-regime"]["kind"] == "engineering"
