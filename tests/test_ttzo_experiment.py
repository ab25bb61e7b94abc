"""Smoke tests of the TT-ZO MNIST experiment: the library's models and trainers by name
(bpfree.ttzo.models / .methods) and the tasks of the benchmark driver
benchmarks/_ttzo_experiment.py."""

from __future__ import annotations

import pickle

import time

import pytest
import torch
from _ttzo_experiment import log_record, run_task

from bpfree.bench.runner import load_module
from bpfree.data import mnist_files
from bpfree.data.paths import require_data_root
from bpfree.tt import tt_mlp_num_parameters
from bpfree.ttzo import (DENSE_PARAMS, compression_ratio, make_method, make_model,
                         queries_to_accuracy)

MNIST_FILES = mnist_files("train") + mnist_files("test")
TINY = dict(n_train=256, n_val=128, n_test=128, epochs=2, max_steps_per_epoch=2, batch_size=32)


def test_paper_parameter_counts():
    assert tt_mlp_num_parameters(make_model("tt", rank=6)) == 3962
    assert tt_mlp_num_parameters(make_model("tt", rank=10)) == 8314
    assert tt_mlp_num_parameters(make_model("mlp")) == DENSE_PARAMS == 814_090
    assert tt_mlp_num_parameters(make_model("small-mlp")) == 7960
    assert compression_ratio(3962) == pytest.approx(0.00487, abs=1e-5)


def test_sp_model_has_target_count():
    torch.manual_seed(0)
    x, y = torch.rand(64, 784), torch.randint(0, 10, (64,))
    model = make_model("sp", sp_params=3962, prune_data=(x, y))
    assert tt_mlp_num_parameters(model) == 3962
    assert model(x).shape == (64, 10)


def test_unknown_names():
    with pytest.raises(ValueError, match="unknown model"):
        make_model("cnn")
    with pytest.raises(ValueError, match="unknown method"):
        make_method("adam", make_model("small-mlp"))
    with pytest.raises(ValueError, match="sp_params"):
        make_model("sp")


@pytest.mark.parametrize("model,method,kwargs", [
    ("tt", "fo", {}),
    ("tt", "sign_rge", {}),
    ("tt", "hybrid", dict(cge_coordinates=8, max_coarse_epochs=1)),
    ("sp", "rge", {}),
    ("small-mlp", "fa", {}),
])
def test_run_task_smoke(model, method, kwargs):
    require_data_root("mnist", MNIST_FILES)
    out = run_task(dict(TINY, model=model, method=method, rank=2, sp_params=2000,
                        method_kwargs=kwargs))
    pickle.dumps(out)
    log = out["log"]
    assert len(log["val_acc"]) == 2 and out["steps"] == 4
    # Scored on the 128 validation images (whole hits out of n_val), and keep_best restores
    # the first epoch of the best validation accuracy.
    assert all((a * TINY["n_val"] / 100).is_integer() for a in log["val_acc"]), log["val_acc"]
    assert log["best_epoch"] == log["val_acc"].index(max(log["val_acc"]))
    assert (out["test_acc"] * TINY["n_test"] / 100).is_integer()
    if method == "sign_rge":
        assert out["batch_forwards"] == 4 * 11 == log["batch_forwards"][-1]
    if method == "hybrid":
        assert out["history"]["switch_epoch"] == 1
        assert out["history"]["steps"] == {"sign_rge": 2, "cge": 2}
        assert out["batch_forwards"] == 2 * 11 + 2 * 9
        assert log["switch_epoch"] == 1
    if model == "sp":
        assert out["params"] == 2000


def test_queries_lower_bound_log():
    import types

    log = types.SimpleNamespace(val_acc=[50.0, 86.0], batch_forwards=[11, 22])
    assert queries_to_accuracy(log, 85.0) == 22
    assert queries_to_accuracy(log, 90.0) is None


def test_benchmark_task_plan():
    mod = load_module("tt_zo")
    assert mod.NAME == "tt-zo"
    for quick in (True, False):
        tasks = mod._tasks(mod._settings(quick), "cpu")
        assert ("tt6", "cge") in tasks and ("sp", "hybrid") in tasks
        assert {t["method"] for t in tasks.values()} >= {"fo", "rge", "sign_rge", "hybrid",
                                                          "fg-w", "fg-a", "fa", "dfa", "cge"}
        pickle.dumps(tasks)
    quick_tasks = mod._tasks(mod._settings(True), "cpu")
    assert quick_tasks[("tt6", "hybrid")]["method_kwargs"]["cge_coordinates"] == 64


def test_full_mode_keeps_the_paper_learning_rate():
    mod = load_module("tt_zo")
    full = mod._tasks(mod._settings(False), "cpu")
    assert {t["lr"] for t in full.values()} == {1e-3}          # §5.1
    quick = mod._tasks(mod._settings(True), "cpu")
    assert quick[("tt6", "fo")]["lr"] == mod.QUICK_LR["fo"] > 1e-3
    # full mode: the paper's mu (the trainers' defaults 0.1 / CGE 0.01) and one lr for the
    # hybrid; quick mode: the fixed radius and CGE step scale
    for t in full.values():
        assert "mu" not in t.get("method_kwargs", {}) and "cge_lr_scale" not in \
            t.get("method_kwargs", {})
    for key in (("tt6", "rge"), ("tt6", "sign_rge"), ("sp", "sign_rge"), ("tt4", "hybrid")):
        assert quick[key]["method_kwargs"]["mu"] == mod.QUICK_ZO_MU == 0.01
    assert quick[("tt6", "hybrid")]["method_kwargs"]["cge_lr_scale"] == mod.QUICK_CGE_LR_SCALE
    assert quick[("tt6", "fo")]["method_kwargs"] == {}
    method = make_method("hybrid", make_model("tt", rank=2),
                         **quick[("tt6", "hybrid")]["method_kwargs"])
    assert method.coarse.estimator.mu == 0.01 and method.fine.estimator.mu == 0.01
    assert method.cge_lr_scale == mod.QUICK_CGE_LR_SCALE


def test_train_can_stop_on_divergence_and_keep_the_log():
    from bpfree.ttzo import train

    class Diverging:
        def __init__(self):
            self.model = torch.nn.Linear(2, 2)
            self.forwards = 0

        def step(self, x, y, lr):
            self.forwards += x.shape[0]
            return {"loss": 1.0 if self.forwards <= 8 else float("nan")}

    x, y = torch.zeros(8, 2), torch.zeros(8, dtype=torch.long)
    with pytest.raises(FloatingPointError, match="non-finite loss at epoch 1, step 0"):
        train(Diverging(), x, y, epochs=3, batch_size=4)
    log = train(Diverging(), x, y, epochs=3, batch_size=4, x_val=x, y_val=y,
                on_nonfinite="stop")
    assert log.diverged == "non-finite loss at epoch 1, step 0"
    assert len(log.val_acc) == 2 and log.loss == [1.0, 1.0]   # epoch 1 logged, then stop
    # the results JSON keeps its keys: per-epoch lr / forwards (the diverged step ran: 8 + 4),
    # the per-step loss as step_loss
    record = log_record(log)
    assert list(record) == ["epoch_loss", "val_acc", "lr", "forwards", "batch_forwards",
                            "phase", "step_loss", "switch_epoch", "diverged", "best_epoch",
                            "seconds"]
    assert record["forwards"] == [8, 12] and record["lr"] == [1e-3, 1e-3]
    assert record["step_loss"] == [1.0, 1.0] and record["diverged"] == log.diverged
    with pytest.raises(ValueError, match="on_nonfinite must be"):
        train(Diverging(), x, y, epochs=1, on_nonfinite="ignore")


def test_cost_projection_counts_each_phase_and_the_earliest_switch():
    cost = load_module("tt_zo_cost")
    # patience p: the first epoch sets the best loss, p more stall it, CGE from the next
    assert cost.earliest_switch(3) == 4 and cost.earliest_switch(1) == 2
    per_step = {("h", "sign_rge"): 0.01, ("h", "cge"): 0.5, ("f", "fo"): 0.002}
    steps = {"h": (8, 900), "f": (8, 900)}
    hours = cost.project(per_step, steps, switch=4)
    assert hours["h"] == pytest.approx((4 * 900 * 0.01 + 4 * 900 * 0.5) / 3600)
    assert hours["f"] == pytest.approx(8 * 900 * 0.002 / 3600)
    assert cost.project(per_step, steps, None)["h"] == pytest.approx(8 * 900 * 0.01 / 3600)
    assert cost.project(per_step, steps, 20)["h"] == pytest.approx(8 * 900 * 0.01 / 3600)
    assert cost.wall_hours(hours, 3) == pytest.approx(3 * sum(hours.values()) / cost.WORKERS)
    assert cost.wall_hours({"a": 5.0, "b": 0.1}, 1) == 5.0          # the longest task
    assert cost.wall_hours({"a": 1.0, "b": 2.0}, 2, workers=1) == 6.0  # one GPU worker


def test_cost_steps_are_timed_in_cpu_time_on_the_cpu():
    """CPU steps in process time (other jobs do not count); a CUDA step in synchronized wall
    time, which this CPU-only machine cannot run."""
    cost = load_module("tt_zo_cost")
    assert cost._clock(torch.device("cpu")) is time.process_time


def test_cost_projection_uses_the_full_modes_epochs_and_search():
    tt_zo, cost = load_module("tt_zo"), load_module("tt_zo_cost")
    cfg = tt_zo._settings(False)
    steps = cost._steps_of(cfg, 860)
    assert steps.pop("tt6/cge") == (tt_zo.FULL_CGE_EPOCHS, 860)
    # issue 32: every run at the paper's epochs, so no separate FO reference
    assert set(steps.values()) == {(tt_zo.PAPER_EPOCHS, 860)} == {(tt_zo.FULL_EPOCHS, 860)}
    assert not any(k.endswith("/" + tt_zo.FO_REFERENCE) for k in steps)
    # the FO search: 6 networks x 6 candidates, FULL_SEARCH_EPOCHS epochs each, FO steps only
    per_step = {(k, t): 1e-3 for k in cost._steps_of(cfg, 860)
                for t in ("fo", "sign_rge", "cge", "rge", "fg-w", "fg-a", "fa", "dfa")}
    hours = cost.search_hours(per_step, cfg, 860)
    assert len(hours) == 6 * len(tt_zo.FULL_FO_FACTORS)
    assert hours == [pytest.approx(1e-3 * tt_zo.FULL_SEARCH_EPOCHS * 860 / 3600)] * len(hours)
    assert cost.search_hours(per_step, tt_zo._settings(True), 860)   # quick searches all


def test_cge_variants_switch_between_the_reference_and_the_batched_path():
    cost = load_module("tt_zo_cost")
    method = make_method("hybrid", make_model("tt", rank=2))
    variants = cost.cge_variants(method)
    assert list(variants) == ["reference", "batched"]
    variants["reference"]()
    assert method.fine.estimator.reference and method.fine.optimizer.estimator.reference
    variants["batched"]()
    assert not method.fine.optimizer.estimator.reference
    assert cost.cge_variants(make_method("hybrid", make_model("tt", rank=2),
                                         cge_mode="lean")) is None
    x, y = torch.rand(64, 784), torch.randint(0, 10, (64,))
    method.phase = "cge"
    times = cost._time_steps(method, x, y, 1, torch.Generator().manual_seed(0), variants)
    assert set(times) == {"reference", "batched"} and all(t > 0 for t in times.values())


def test_full_mode_searches_only_fo_over_a_grid_around_the_paper_rate():
    tt_zo = load_module("tt_zo")
    cfg = tt_zo._settings(False)
    search = tt_zo._search_tasks(tt_zo._tasks(cfg, "cpu"), cfg["search_fraction"],
                                 cfg["search_factors"], cfg["search_methods"])
    assert {t["method"] for t in search.values()} == {"fo"}
    assert {k[0] for k in search} == {"tt10", "tt6", "tt4", "mlp", "small-mlp", "sp"}
    assert {t["epochs"] for t in search.values()} == {tt_zo.FULL_SEARCH_EPOCHS}
    lrs = sorted({t["lr"] for t in search.values()})
    assert lrs == pytest.approx([1e-3 * f for f in tt_zo.FULL_FO_FACTORS])
    # Fig. 1 at the paper's evaluation budget: signRGE and CGE runs reach 340K / 11M
    budgets = tt_zo.fig1_budgets(cfg)
    assert all(budgets[m] >= tt_zo.PAPER_QUERIES[m] for m in ("sign_rge", "cge"))
    assert tt_zo.below_budget(cfg) == ""


@pytest.mark.slow
def test_full_mode_runs_end_to_end_on_a_tiny_budget(monkeypatch, tmp_path):
    """The full mode's own paths (every hybrid's forced switch, full-coordinate CGE, the
    dense MLP's capped CGE, the below-budget ledger, the figure) run end to end before a
    2.4-hour run finds a crash at its end: full settings with 256 training images and 2
    epochs."""
    require_data_root("mnist", MNIST_FILES)
    mod = load_module("tt_zo")
    full = mod._settings(False)
    tiny = dict(full, n_train=256, n_val=128, n_test=128, chunks=2, mlp_zo_chunks=2,
                fa_chunks=2, hybrid=mod.full_hybrid(2), cge_epochs=1, seeds=(0, 1))
    monkeypatch.setattr(mod, "_settings", lambda quick: tiny)
    monkeypatch.setattr(mod, "ROOT", tmp_path)          # the figure goes to tmp, not results/
    monkeypatch.setattr(mod, "FIGURES", tmp_path / "results" / "figures")
    rows, extra = mod.run(False)
    assert rows and all(r["value"] == r["value"] for r in rows)          # no NaN rows
    hybrids = [k for k in extra["runs"] if "/hybrid/" in k]
    assert hybrids and all(extra["runs"][k]["switch_epoch"] is not None for k in hybrids)
    assert extra["claims"] and not extra["paper_budget"]
    assert all("Below the paper's budget" in c["note"] for c in extra["claims"])
    refs = [r for r in rows if r["metric"] == mod.FO_REFERENCE_METRIC]
    assert {r["table"] for r in refs} == {mod.T1, mod.T2} and len(refs) == 1 + 3
    assert all(f"/{mod.FO_REFERENCE}/" not in k or extra["runs"][k]["steps"] == 100 * 4
               for k in extra["runs"])              # 100 epochs of 256 images, batch 64 -> 4
