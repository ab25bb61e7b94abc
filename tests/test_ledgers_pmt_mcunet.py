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
    doc = copy.deepcopy(_document("pmt-quick.json"))   # a run with Fig. 7's rows
    doc["extra"].pop("ablations", None)                 # as files before the noise was kept
    table = [r for r in doc["rows"] if r["table"] == pmt.TABLE_ABL
             and r["metric"] == "final training loss"]
    wp = next(r["value"] for r in table if r["method"] == "layer-wise WP")
    for r in table:  # the 6 % run's tie: adaptive was the same run as layer-wise WP
        if r["method"] == "layer-wise adaptive (PMT)":
            r["value"] = wp
        elif r["method"] in pmt.ABLATIONS[3:] and r["method"] != "layer-wise WP":
            r["value"] = wp + 1.0
    claims = {c["id"]: c for c in pmt.ledger_from_result(doc)}
    assert claims["adaptive-best-estimator"]["holds"] == UNDECIDED
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
    # without per-image outcomes the one-seed noise is the binomial one over 2000 images
    # (about 2.6 points for the difference at these accuracies)
    for per in doc["extra"]["per_method"].values():
        for result in per.values():
            result.pop("outcomes", None)
            result.pop("start_outcomes", None)
    for d in mcunet.DATASETS:
        start = _accuracies(doc, d, mcunet.LABELS["head-init"])
        _set_accuracy(doc, d, label, start + 4.0)
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
    # a rise inside the test set's noise is no evidence that it trained
    for d in mcunet.DATASETS:
        start = _accuracies(doc, d, mcunet.LABELS["head-init"])
        _set_accuracy(doc, d, label, start + 1.5)
    claims = {c["id"]: c for c in mcunet.ledger_from_result(doc)}
    assert claims["int8-sparse-bp-trains-mnist"]["holds"] is False
    assert "2000 test images" in claims["int8-sparse-bp-trains-mnist"]["ours"]


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


def _without(document: dict, method_label: str, setting: str | None = None) -> dict:
    """``document`` as a partial report before ``method_label``'s runs (or one column) ended."""
    doc = copy.deepcopy(document)
    doc["rows"] = [r for r in doc["rows"] if not (
        r["method"] == method_label and (setting is None or r["setting"] == setting
                                         or r["setting"].startswith("mean of")))]
    doc["extra"]["partial"] = {"reason": "the full run is in progress: 2 of 3 runs"}
    return doc


def test_pmt_partial_report_leaves_claims_with_unfinished_rows_not_measured(pmt):
    """A partial report (bench pmt under $BPFREE_TASK_CACHE_REPORT) decides a claim only on
    every column it needs: one unfinished column makes its claims "not measured", with the
    report's reason, and leaves every other verdict as the complete file has it."""
    doc = _document("pmt.json")
    complete = _verdicts(pmt.ledger_from_result(doc))
    sparse_bp = pmt.LABELS["int8-sparse-bp"]
    claims = {c["id"]: c for c in pmt.ledger_from_result(_without(doc, sparse_bp,
                                                                  "impulse noise"))}
    for cid in ("bpfree-beats-mcutrain-noise", "bpfree-best-int8-noise"):
        assert claims[cid]["holds"] is None and claims[cid]["ours"] is None
        assert claims[cid]["note"] == "not measured: the full run is in progress: 2 of 3 runs"
        assert claims[cid]["paper"]  # the paper's side is shown all the same
    for cid, verdict in complete.items():
        if cid not in ("bpfree-beats-mcutrain-noise", "bpfree-best-int8-noise"):
            assert claims[cid]["holds"] == verdict, cid
    # A fixed block with no finished group is missing, not left out of Table 4's comparison.
    no_block = _without(doc, "fixed block 2")
    assert _verdicts(pmt.ledger_from_result(no_block))["adaptive-block-selection"] is None
    # MeZO unfinished: only Table 5's MeZO claim waits.
    no_mezo = _verdicts(pmt.ledger_from_result(_without(doc, pmt.LABELS["mezo"])))
    assert no_mezo["pmt-beats-mezo"] is None
    assert no_mezo["pmt-beats-deepzero"] == complete["pmt-beats-deepzero"]


def test_pmt_ledger_of_nothing_but_the_calibration_measures_only_the_regime(pmt):
    """Every claim's guard, at once: with no training run finished, only the two claims on
    the calibrated set-up are decided."""
    from types import SimpleNamespace

    doc = _document("pmt.json")
    acc = {m: {} for m in pmt.LABELS}
    for r in doc["rows"]:
        if r["table"] == pmt.TABLE_ACC and r["method"] == pmt.LABELS["no-adaptation"] \
                and r["setting"].replace(" ", "_") in pmt.CORRUPTIONS:
            acc["no-adaptation"][r["setting"].replace(" ", "_")] = r["value"]
    P = SimpleNamespace(**doc["extra"]["protocol"])
    claims = pmt.ledger(acc, {f"block {k}": {} for k in range(1, 5)} | {"adaptive": {}}, {},
                        {}, {}, doc["extra"]["calibration"], P, False, pending="nothing yet")
    measured = {c["id"] for c in claims if c["holds"] is not None}
    assert measured == {"pmt-regime", "pmt-regime-speckle"}
    assert len(claims) == len(pmt.ledger_from_result(doc))
    assert all(c["note"] == "not measured: nothing yet" for c in claims
               if c["id"] not in measured)


def test_pmt_partial_summary_projects_the_unfinished_runs_at_the_measured_pace(pmt):
    plan = {"per_step_seconds": {"PMT block 1": 2.0, "FP32 BP": 0.5},
            "steps": {"PMT block 1": 400, "FP32 BP": 80}}
    tasks = [("pmt", "fog", 1, 0), ("pmt", "fog", 1, 1), ("bp", "fog", "fp32-bp", 0),
             ("bp", "fog", "fp32-bp", 1), ("cosine", 0)]
    assert pmt.plan_task_seconds(tasks, plan) == {
        tasks[0]: 400.0, tasks[1]: 400.0, tasks[2]: 20.0, tasks[3]: 20.0, tasks[4]: 0.0}
    # The finished PMT run took twice its plan: the rest is projected at that pace.
    finished = {tasks[0]: {"task_seconds": 800.0}, tasks[4]: {"task_seconds": 1.0}}
    out = pmt.partial_summary(tasks, finished, 2, plan, "abc1234")
    assert out["finished"] == 2 and out["tasks"] == 5
    assert out["families"]["PMT block 1"] == {"finished": 1, "tasks": 2}
    assert out["families"]["cosine"] == {"finished": 1, "tasks": 1}
    assert out["projection"]["measured_over_plan"] == pytest.approx(2.0)
    assert out["projection"]["plan_wall_hours_left"] == pytest.approx(440 / 2 / 3600)
    assert out["projection"]["wall_hours_left"] == pytest.approx(880 / 2 / 3600)
    assert out["reason"] == ("the full run (abc1234) is in progress: 2 of 5 runs finished "
                             "(extra.partial)")
    assert out["progress"].startswith("2 of 5 training runs of revision abc1234 had finished")
    assert "0.1 wall hours on 2 workers" in out["progress"]
    done = pmt.partial_summary(tasks[:1], finished, 2, None, "abc1234")
    assert done["reason"] is None and done["projection"] is None
    assert "1 of 1 training runs" in done["progress"]


def test_pmt_partial_report_chooses_no_rate_from_part_of_a_grid():
    import sys

    sys.path.insert(0, str(RESULTS.parent / "benchmarks"))
    from _pmt_experiment import merge_grid

    def part(lr, acc):
        return {"lr": lr, "validation_accuracy": acc, "accuracy": acc, "grid_index": 0}

    results = {("pmt", "fog", 1, 0): part(0.1, 50.0), ("pmt", "fog", 1, 1): part(0.3, 60.0),
               ("pmt", "fog", 2, 0): part(0.1, 70.0), ("select", "fog"): {"chosen": 1}}
    is_part = lambda key: key[0] == "pmt"  # noqa: E731
    merged = merge_grid(results, is_part, grid_size=2)
    assert set(merged) == {("pmt", "fog", 1), ("select", "fog")}
    assert merged[("pmt", "fog", 1)]["chosen"] == 0.3
    assert set(merge_grid(results, is_part)) == {("pmt", "fog", 1), ("pmt", "fog", 2),
                                                 ("select", "fog")}


def test_pmt_comparisons_say_which_side_chose_a_rate_at_its_grid_edge(pmt):
    """A comparison decided where a method's validation picked the end of its rate grid
    says so (issue 30: such a grid should have been widened), counted from the rows."""
    doc = copy.deepcopy(_document("pmt.json"))
    doc["extra"].pop("widening", None)  # as a file from before grids were widened
    label = pmt.LABELS["int8-sparse-bp"]
    for r in doc["rows"]:
        if r["table"] == pmt.TABLE_RATES and r["metric"] == "chosen rate at a grid edge":
            r["value"] = float(r["method"] == label and r["setting"] in ("gaussian noise",
                                                                       "shot noise"))
    claims = {c["id"]: c for c in pmt.ledger_from_result(doc)}
    note = claims["bpfree-beats-mcutrain-noise"].get("note") or ""
    assert "grid edge" in note and "sparse INT8 BP 2/4 columns" in note
    assert "PMT sparse" not in note.split("grid edge")[1]
    assert "grid edge" not in (claims["pmt-beats-mezo"].get("note") or "")
    assert "grid edge" not in (claims["bpfree-near-fp32"].get("note") or "")
    assert "was not widened in this run" in note
    doc["extra"]["widening"] = {"most_past_edge": 2, "added": {}}
    doc["extra"].pop("partial", None)
    widened = {c["id"]: c for c in pmt.ledger_from_result(doc)}
    note = widened["bpfree-beats-mcutrain-noise"].get("note") or ""
    assert "still, after widening the grid by up to 2 rates past that edge" in note
    assert "widening still to run" not in note


def test_pmt_partial_report_counts_the_edge_choices_whose_widening_is_unfinished(pmt):
    """In a partial report, an edge choice whose grid got fewer than the most rates past its
    edge is counted as unfinished widening, from the rows "rates added past a grid edge";
    a file without those rows keeps the old blanket wording."""
    doc = copy.deepcopy(_document("pmt.json"))
    label = pmt.LABELS["int8-sparse-bp"]
    noise = ("gaussian noise", "shot noise")
    for r in doc["rows"]:
        if r["table"] != pmt.TABLE_RATES or r["method"] != label and r["metric"] != (
                "chosen rate at a grid edge"):
            continue
        if r["metric"] == "chosen rate at a grid edge":
            r["value"] = float(r["method"] == label and r["setting"] in noise)
        elif r["metric"] == "rates added past a grid edge":
            r["value"] = 2.0 if r["setting"] == "gaussian noise" else 0.0
    doc["extra"]["widening"] = {"most_past_edge": 2, "added": {}}
    doc["extra"]["partial"] = {"reason": "run in progress: 1 of 2 runs finished"}
    note = {c["id"]: c for c in pmt.ledger_from_result(doc)}[
        "bpfree-beats-mcutrain-noise"].get("note") or ""
    assert "sparse INT8 BP 2/4 columns (1 of them with their widening unfinished)" in note
    assert "widening still to run" not in note
    doc["extra"].pop("partial")
    note = {c["id"]: c for c in pmt.ledger_from_result(doc)}[
        "bpfree-beats-mcutrain-noise"].get("note") or ""
    assert "sparse INT8 BP 2/4 columns" in note and "unfinished" not in note
    doc["extra"]["partial"] = {"reason": "run in progress: 1 of 2 runs finished"}
    doc["rows"] = [r for r in doc["rows"] if r["metric"] != "rates added past a grid edge"]
    note = {c["id"]: c for c in pmt.ledger_from_result(doc)}[
        "bpfree-beats-mcutrain-noise"].get("note") or ""
    assert "or with the widening still to run" in note and "unfinished" not in note


def test_pmt_fig7_claims_say_which_ablation_chose_a_rate_at_its_grid_edge(pmt):
    """Fig. 7's ablations are sweeps widened like the others; their rows "chosen rate at a
    grid edge" / "rates added past a grid edge" put the edge into the Fig. 7 claims' notes,
    and a file without them (before 2026-11-27) has no such note."""
    doc = copy.deepcopy(_document("pmt-quick.json"))   # a run with Fig. 7's rows
    claims = {c["id"]: c for c in pmt.ledger_from_result(doc)}
    assert "grid edge" not in (claims["adaptive-best-estimator"].get("note") or "")
    assert "grid edge" not in (claims["gns-qas-needed"].get("note") or "")
    doc["extra"]["widening"] = {"most_past_edge": 2, "added": {}}
    for r in [r for r in doc["rows"] if r["table"] == pmt.TABLE_ABL
              and r["metric"] == "final training loss"]:
        for metric, value in (("chosen rate at a grid edge", r["method"] == "layer-wise WP"),
                              ("rates added past a grid edge", 2)):
            doc["rows"].append({**r, "metric": metric, "value": float(value)})
    claims = {c["id"]: c for c in pmt.ledger_from_result(doc)}
    note = claims["adaptive-best-estimator"]["note"]
    assert "chosen rate at a grid edge (still, after widening the grid by up to 2" in note
    assert "layer-wise WP 1/1 columns" in note and "unfinished" not in note
    assert "grid edge" not in (claims["gns-qas-needed"].get("note") or "")
