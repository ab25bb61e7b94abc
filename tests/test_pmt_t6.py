"""bench pmt-t6 (PMT Table 6 on PMT's selected block): budgets, rate search, the ledger."""

from __future__ import annotations

import math

import pytest
import torch

from bpfree.bench import claims
from bpfree.bench.runner import load_module


@pytest.fixture(scope="module")
def t6():
    return load_module("pmt_t6")


@pytest.fixture(scope="module")
def experiment():
    load_module("pmt")  # puts the benchmarks folder's helpers on the path
    import _pmt_experiment

    return _pmt_experiment


def _extra(tests: dict, *, no_adaptation=(17.0, 18.0), loss_drop=0.5, quick=True) -> dict:
    """A result's ``extra`` with per-seed test accuracies ``tests[method]``."""
    methods = {}
    for m, acc in tests.items():
        n = len(acc)
        methods[m] = {"test": list(acc), "train_loss_before": [2.0] * n,
                      "train_loss_after": [2.0 - loss_drop + 0.01 * i for i in range(n)],
                      "forwards": [4.0e5 if m != "deepzero-0" else 3.0e6] * n}
    return {"seeds": list(range(len(no_adaptation))), "methods": methods,
            "no_adaptation": list(no_adaptation),
            "protocol": {"queries": 10 if quick else 100, "zo_epochs": 1 if quick else 50},
            "paper_protocol": {"queries": 100, "zo_epochs": 50, "batch_size": 100,
                               "train_images": 1000},
            "train_images": 400 if quick else 1000}


def _by_id(entries):
    return {c["id"]: c for c in claims.validate_claims(entries)}


def test_table6_verdict_holds_fails_or_is_not_decided_by_the_seed_spread(t6):
    ahead = _by_id(t6.ledger(_extra({"pmt": (70.0, 72.0), "mezo": (40.0, 42.0),
                                     "deepzero-0": (60.0, 61.0),
                                     "deepzero-0.9": (54.0, 55.0)}), True))
    main = ahead["pmt-t6-same-selection"]
    assert main["holds"] is True
    assert "PMT 71.00 ± 1.41" in main["ours"] and "3 seeds" not in main["ours"]
    assert "below the paper's budget" in main["note"]
    assert main["paper"] == "PMT 66.78 vs MeZO 40.56, DeepZero-0 60.67, DeepZero-0.9 54.33 %"
    # DeepZero-0 ahead of PMT by more than 2 SE: the claim fails.
    behind = _by_id(t6.ledger(_extra({"pmt": (70.0, 72.0), "mezo": (40.0, 42.0),
                                      "deepzero-0": (80.0, 81.0),
                                      "deepzero-0.9": (54.0, 55.0)}), True))
    assert behind["pmt-t6-same-selection"]["holds"] is False
    # PMT 71 +- 1 (SE) vs DeepZero-0.9 70 +- 1: a gap of 1 inside 2 sqrt(2) points.
    close = _by_id(t6.ledger(_extra({"pmt": (70.0, 72.0), "mezo": (40.0, 42.0),
                                     "deepzero-0": (60.0, 61.0),
                                     "deepzero-0.9": (69.0, 71.0)}), True))
    assert close["pmt-t6-same-selection"]["holds"] == claims.UNDECIDED
    assert "inside the noise" in close["pmt-t6-same-selection"]["ours"]
    full = _by_id(t6.ledger(_extra({"pmt": (70.0, 72.0), "mezo": (40.0, 42.0),
                                    "deepzero-0": (60.0, 61.0), "deepzero-0.9": (54.0, 55.0)},
                                   quick=False), False))
    assert "below the paper's budget" not in full["pmt-t6-same-selection"]["note"]
    assert "DeepZero-0 3e+06 (7.5x)" in full["pmt-t6-same-selection"]["note"]


def test_every_baseline_gets_a_sanity_claim_that_can_fail(t6):
    tests = {"pmt": (70.0, 72.0), "mezo": (17.5, 17.6), "deepzero-0": (60.0, 61.0),
             "deepzero-0.9": (54.0, 55.0)}
    got = _by_id(t6.ledger(_extra(tests), True))
    assert {f"pmt-t6-{m}-trains" for m in t6.BASELINES} <= set(got)
    assert got["pmt-t6-deepzero-0-trains"]["holds"] is True
    assert got["pmt-t6-deepzero-0-trains"]["kind"] == "sanity"
    assert got["pmt-t6-mezo-trains"]["holds"] is False         # accuracy did not move
    assert "MeZO did not pass" in got["pmt-t6-same-selection"]["note"]
    flat = _by_id(t6.ledger(_extra({**tests, "mezo": (40.0, 42.0)}, loss_drop=0.0), True))
    assert flat["pmt-t6-mezo-trains"]["holds"] is False         # loss did not fall
    assert claims.claim_paper("pmt-t6", got["pmt-t6-same-selection"]) == "PMT"
    assert claims.claim_paper("pmt-t6", got["pmt-t6-mezo-trains"]) == "PMT"


def test_rate_grid_widens_past_the_edge_the_choice_sits_on(t6):
    grid = [0.01, 0.03, 0.1]
    assert t6.widened(grid, 0.1) == pytest.approx(1 / 3 * 1.0, rel=1e-5)
    assert t6.widened(grid, 0.01) == pytest.approx(0.01 / 3, rel=1e-5)
    assert t6.widened(grid, 0.03) is None
    assert t6.widened([0.01, 0.1], 0.1) is None          # two rates: no edge to trust
    runs = {0.01: [{"validation_accuracy": 50.0}, {"validation_accuracy": 60.0}],
            0.03: [{"validation_accuracy": 58.0}, {"validation_accuracy": 52.0}],
            0.1: [{"validation_accuracy": -1.0}, {"validation_accuracy": 90.0}]}
    assert t6.choose_rate(runs) == 0.01                    # tie at 55 goes to the smaller
    runs[0.03][0]["validation_accuracy"] = 60.0
    assert t6.choose_rate(runs) == 0.03


def test_budgets_are_the_papers_rule(t6, experiment):
    P = experiment.Protocol(queries=100, zo_epochs=50)
    # Table 6: PMT spends 400 forwards a step for 50 epochs; MeZO 2 a step, 10,000 epochs.
    assert experiment.same_selection_epochs("mezo", P, 4) == round(50 * 401 / 2)
    for m in ("pmt", "deepzero-0", "deepzero-0.9"):
        assert experiment.same_selection_epochs(m, P, 5) == 50
    with pytest.raises(ValueError, match="unknown Table 6 method 'sgd'"):
        experiment.same_selection_epochs("sgd", P, 4)
    steps = t6.full_run_steps(5)
    assert steps["pmt"] == 50 * 8 and steps["mezo"] == round(50 * 501 / 2) * 8
    assert t6.full_run_counts() == {"seeds": 3, "rates": 4, "widenings": 2}


def test_each_method_trains_only_the_block_at_its_forward_cost(experiment):
    """One step of each method on a tiny model: the forwards per step are Table 6's
    (MeZO 2, DeepZero-0 d + 1, DeepZero-0.9 ceil(0.1 d) + 1, PMT 1 + L Q) and only the
    block's weights can change."""
    from bpfree.models import mnist_mobilenet
    from bpfree.pmt import find_layers
    from bpfree.quant import quantize_model

    torch.manual_seed(0)
    x, y = torch.rand(40, 1, 28, 28), torch.randint(0, 10, (40,))
    q = quantize_model(mnist_mobilenet().eval(), x, input_range=(0.0, 1.0))
    P = experiment.Protocol(queries=2, zo_epochs=1, batch_size=32)
    block = experiment.blocks_of(q, x[:2], P)[0]
    d = sum(layer.d_w for layer in find_layers(q, x[:2]) if layer.name in block)
    expected = {"mezo": 2, "deepzero-0": d + 1, "deepzero-0.9": math.ceil(0.1 * d) + 1,
                "pmt": 1 + len(block) * 2}
    layers = [layer for layer in find_layers(q, x[:2]) if layer.name in block]
    in_block = d + sum(layer.module.bias.numel() for layer in layers
                       if getattr(layer.module, "bias", None) is not None)
    for m, per_step in expected.items():
        r = experiment.run_task(("same-selection", dict(
            method=m, qmodel=q, train=(x[:35], y[:35]), test=(x[35:], y[35:]), protocol=P,
            block=block, lr=3.0)))
        assert r["forwards_per_step"] == per_step, m
        assert r["epochs"] == experiment.same_selection_epochs(m, P, len(block))
        assert r["train_loss_before"] > 0 and math.isfinite(r["train_loss_after"])
        assert r["changed_values"] <= in_block, m      # nothing outside the block moved
    with pytest.raises(ValueError, match="selected block"):
        experiment.task_same_selection("pmt", q, (x, y), (x, y), P, [], 0.1)


@pytest.mark.slow  # the whole quick run: minutes on 2 cores (dense CGE on a 3,744-weight block)
def test_quick_run_writes_table6_rows_and_a_computed_ledger(t6, monkeypatch):
    from bpfree.data import mnist_files, require_data_root

    require_data_root("mnist", mnist_files("train") + mnist_files("test"))
    monkeypatch.delenv("BPFREE_TASK_CACHE", raising=False)
    rows, extra = t6.run(True)
    table = {(r["method"], r["metric"]): r for r in rows if r["table"] == t6.TABLE}
    for m in t6.METHODS:
        assert table[(t6.LABELS[m], "epochs")]["value"] >= 1
        assert table[(t6.LABELS[m], "test accuracy mean over seeds (%)")]["paper"] == \
            t6.PAPER_TABLE6[m][3]
        assert len(extra["methods"][m]["grid"]) >= 3
    got = _by_id(extra["claims"])
    assert got["pmt-t6-same-selection"]["holds"] in (True, False, claims.UNDECIDED)
    assert got == _by_id(t6.ledger_from_result({"extra": extra, "quick": True}))
