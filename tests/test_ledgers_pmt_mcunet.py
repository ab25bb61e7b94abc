"""The claim ledgers of ``bench mcunet`` and ``bench pmt`` rebuilt from result documents
(issue 31): a baseline that did not train fails its sanity claim, comparisons carry a noise
tolerance, memory and compute verdicts live on the linked program (bench device), and the
paper's claims without rows read "not measured" with the reason."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bpfree.bench.claims import UNDECIDED, binomial_se, validate_claims
from bpfree.bench.runner import load_module

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _document(name: str) -> dict:
    path = RESULTS / name
    if not path.is_file():
        pytest.skip(f"{name} not committed")
    return json.loads(path.read_text())


def _verdicts(claims: list[dict]) -> dict:
    return {c["id"]: c["holds"] for c in validate_claims(claims)}


@pytest.fixture(scope="module")
def mcunet():
    return load_module("mcunet")


@pytest.fixture(scope="module")
def pmt():
    return load_module("pmt")


def test_binomial_se_is_the_test_sets_sampling_noise():
    assert binomial_se(50.0, 100) == pytest.approx(5.0)
    assert binomial_se(100.0, 10) == 0.0 and binomial_se(0.0, 10) == 0.0
    with pytest.raises(ValueError, match="n >= 1"):
        binomial_se(50.0, 0)


def _set_accuracy(document: dict, dataset: str, label: str, value: float) -> None:
    for row in document["rows"]:
        if (row["method"] == label and row["metric"] == "accuracy (%)"
                and row["setting"].startswith(f"{dataset}, ")):
            row["value"] = value


def test_mcunet_fp32_baseline_that_does_not_move_fails_its_sanity(mcunet):
    doc = _document("mcunet.json")
    fp = mcunet.LABELS["fp32-bp"]
    flat = copy.deepcopy(doc)
    fx = flat["extra"]["per_method"]["mnist"]["fp32-bp"]
    _set_accuracy(flat, "mnist", fp, fx["start_accuracy"])
    claims = {c["id"]: c for c in mcunet.ledger_from_result(flat)}
    assert claims["fp32-bp-trains-mnist"]["holds"] is False
    # A file written before the fix (no "parameters" record) says why it did not train.
    for d in mcunet.DATASETS:
        flat["extra"]["per_method"][d]["fp32-bp"].pop("parameters", None)
    claims = {c["id"]: c for c in mcunet.ledger_from_result(flat)}
    assert claims["fp32-bp-trains-mnist"]["holds"] is False
    assert "predates bpfree.quant.twin.to_float_units" in claims["fp32-bp-trains-mnist"]["note"]
    # Table 10's comparison with FP32 BP is not made against a baseline that did not train.
    assert claims["t10-bpfree-near-fullbp"]["holds"] is None
    trained = copy.deepcopy(doc)
    for d in mcunet.DATASETS:
        fx = trained["extra"]["per_method"][d]["fp32-bp"]
        fx.update(parameters="float units", train_loss_before=0.7, train_loss_after=0.3)
        _set_accuracy(trained, d, fp, fx["start_accuracy"] + 10)
        _set_accuracy(trained, d, mcunet.LABELS["pmt-dense"], fx["start_accuracy"] + 9.5)
    claims = {c["id"]: c for c in mcunet.ledger_from_result(trained)}
    assert claims["fp32-bp-trains-mnist"]["holds"] is True
    assert "note" not in claims["fp32-bp-trains-mnist"]
    assert claims["t10-bpfree-near-fullbp"]["holds"] in (True, UNDECIDED)


def test_mcunet_orderings_carry_the_test_noise(mcunet):
    doc = copy.deepcopy(_document("mcunet.json"))
    cls, sparse = mcunet.LABELS["classifier-only"], mcunet.LABELS["pmt-sparse"]
    for d in mcunet.DATASETS:
        _set_accuracy(doc, d, cls, 80.0)
        _set_accuracy(doc, d, sparse, 81.0)  # inside 2 binomial SE of 2000 test images
    assert _verdicts(mcunet.ledger_from_result(doc))["t11-clsonly-below-bpfree"] == UNDECIDED
    for d in mcunet.DATASETS:
        _set_accuracy(doc, d, sparse, 86.0)
    assert _verdicts(mcunet.ledger_from_result(doc))["t11-clsonly-below-bpfree"] is True
    for d in mcunet.DATASETS:
        _set_accuracy(doc, d, sparse, 74.0)
    assert _verdicts(mcunet.ledger_from_result(doc))["t11-clsonly-below-bpfree"] is False


def test_mcunet_leaves_memory_and_compute_verdicts_to_the_linked_program(mcunet):
    ids = set(_verdicts(mcunet.ledger_from_result(_document("mcunet.json"))))
    assert not ids & {"t8-fits-h7b3", "t9-sparse-fits-f746", "t8-compute"}
    assert {"t8-bpfree-memory", "t8-bp-exceeds-h7b3"} <= ids


def test_pmt_estimator_tie_is_not_decided_and_recorded_noise_decides(pmt):
    doc = _document("pmt.json")
    claims = {c["id"]: c for c in pmt.ledger_from_result(doc)}
    best = claims["adaptive-best-estimator"]
    table = [r for r in doc["rows"] if r["table"] == pmt.TABLE_ABL]
    losses = {r["method"]: r["value"] for r in table if r["metric"] == "final training loss"}
    if losses["layer-wise adaptive (PMT)"] == losses["layer-wise WP"]:
        assert best["holds"] == UNDECIDED
    # Table 6 moved to bench pmt-t6 (one verdict per claim): bench pmt no longer carries it.
    assert "pmt-t6-same-selection" not in claims
    # With each loss's noise recorded (extra.ablations), a clear gap is decided.
    recorded = copy.deepcopy(doc)
    recorded["extra"]["ablations"] = {
        label: {"lr": 0.1, "last_loss": 0.2 if label == "layer-wise adaptive (PMT)" else 0.5,
                "loss_se": 0.01, "modes": None} for label in pmt.ABLATIONS}
    again = {c["id"]: c for c in pmt.ledger_from_result(recorded)}
    assert again["adaptive-best-estimator"]["holds"] is True
    assert "not measured" not in again["adaptive-best-estimator"]["note"]
    close = copy.deepcopy(recorded)
    close["extra"]["ablations"]["layer-wise WP"]["last_loss"] = 0.21
    assert _verdicts(pmt.ledger_from_result(close))["adaptive-best-estimator"] == UNDECIDED


def test_pmt_hook_reads_every_row_format_it_wrote(pmt):
    """Older files name DeepZero differently; the hook maps both labels to one method."""
    for name in ("pmt.json", "pmt-quick.json"):
        doc = _document(name)
        verdicts = _verdicts(pmt.ledger_from_result(doc))
        assert {"pmt-beats-mezo", "pmt-beats-deepzero", "adaptive-block-selection"} <= set(
            verdicts)


def test_pmt_ablation_summary_keeps_the_final_losss_noise(pmt):
    from bpfree.bench.claims import mean_se

    curve = [3.0, 2.0, 1.0, 0.9, 0.8, 0.85, 0.75, 0.8, 0.7]
    run = {"lr": 0.03, "last_loss": 0.7, "loss": curve, "curve_forwards": list(range(9)),
           "modes": {"a": "wp", "b": "np"}, "validation_accuracy": 80.0}
    summary = pmt.ablation_summary(run)
    assert summary == {"lr": 0.03, "last_loss": 0.7, "loss_se": mean_se(curve[-6:])[1],
                       "modes": {"a": "wp", "b": "np"}}
    json.dumps(summary)  # it goes to extra.ablations
    assert pmt.ablation_summary(dict(run, loss=[]))["loss_se"] == 0.0


def test_mcunet_int8_sparse_bp_that_rounded_its_updates_away_fails_and_says_why(mcunet):
    doc = copy.deepcopy(_document("mcunet.json"))
    label = mcunet.LABELS["int8-sparse-bp"]
    for d in mcunet.DATASETS:
        start = _accuracies(doc, d, mcunet.LABELS["head-init"])
        _set_accuracy(doc, d, label, start - 0.1)
        ix = doc["extra"]["per_method"][d]["int8-sparse-bp"]
        ix.pop("weights", None)
        ix.pop("train_loss_before", None)
        ix.pop("train_loss_after", None)
    claims = {c["id"]: c for c in mcunet.ledger_from_result(doc)}
    assert claims["int8-sparse-bp-trains-mnist"]["holds"] is False
    assert "predates SparseBP(latent_weights=True)" in claims["int8-sparse-bp-trains-mnist"]["note"]
    for d in mcunet.DATASETS:
        start = _accuracies(doc, d, mcunet.LABELS["head-init"])
        _set_accuracy(doc, d, label, start + 2.0)
        doc["extra"]["per_method"][d]["int8-sparse-bp"].update(
            weights="latent copy (MCUTrain)", train_loss_before=0.5, train_loss_after=0.6)
    claims = {c["id"]: c for c in mcunet.ledger_from_result(doc)}
    # accuracy rose but the training loss did not fall: not a baseline that trained
    assert claims["int8-sparse-bp-trains-mnist"]["holds"] is False
    for d in mcunet.DATASETS:
        doc["extra"]["per_method"][d]["int8-sparse-bp"]["train_loss_after"] = 0.4
    claims = {c["id"]: c for c in mcunet.ledger_from_result(doc)}
    assert claims["int8-sparse-bp-trains-mnist"]["holds"] is True
    assert "predates" not in claims["int8-sparse-bp-trains-mnist"]["note"]


def _accuracies(document: dict, dataset: str, label: str) -> float:
    return next(r["value"] for r in document["rows"] if r["method"] == label
                and r["metric"] == "accuracy (%)" and r["setting"].startswith(f"{dataset}, "))


def _ratios_document(sram_kib: float | None, bp_int8_kb: float, rss_kib: float) -> dict:
    linked = ({"error": "RuntimeError: arm-none-eabi-gcc not found"} if sram_kib is None
              else {"sram_bytes": int(sram_kib * 1024)})
    return {"rows": [], "extra": {"linked": linked, "pytorch": {"maxrss_kib": rss_kib},
                                  "rules": {"bp-int8": bp_int8_kb, "bp": 2 * bp_int8_kb,
                                            "accounting": 668.0}}}


def test_pmt_ratios_decide_on_the_linked_program_and_say_when_it_is_missing():
    ratios = load_module("pmt_ratios")
    verdicts = _verdicts(ratios.ledger_from_result(_ratios_document(668.0, 3650.0, 300e3)))
    assert verdicts == {"pmt-fig1-quantized-bp-5.46x": True, "pmt-fig1-pytorch-400x": True}
    # The same rule figure over a larger linked program: 3650 / 900 = 4.06x < 4.91x.
    verdicts = _verdicts(ratios.ledger_from_result(_ratios_document(900.0, 3650.0, 300e3)))
    assert verdicts == {"pmt-fig1-quantized-bp-5.46x": False, "pmt-fig1-pytorch-400x": False}
    claims = ratios.ledger_from_result(_ratios_document(None, 3650.0, 300e3))
    assert all(c["holds"] is None and "not linked" in c["note"] for c in claims)


def test_pmt_q_budget_is_comparable_only_within_the_seed_noise():
    budget = load_module("pmt_q_budget")

    def verdict(by_seed):
        doc = {"rows": [], "extra": {"test_by_seed": by_seed}}
        return _verdicts(budget.ledger_from_result(doc))["pmt-fig9-q-comparable-at-budget"]

    assert verdict({"2": [88.0, 90.0, 89.0], "32": [89.5, 88.5, 90.5]}) is True
    assert verdict({"2": [88.0, 88.2, 88.1], "32": [90.0, 90.1, 90.2]}) is False
