"""Projected CPU time of the full `bench tt-zo` run, from measured per-step times of its tasks.

Every (network, method) task of tt_zo's full configuration (the paper's §5.1 settings: all of
MNIST's training split less 5,000 validation images, batch 64, N = 10, full CGE, for
``tt_zo.FULL_EPOCHS`` of the paper's 100 epochs) is built exactly as `bench tt-zo` builds it
(same models, same trainers from ``bpfree.ttzo.make_method``), and its optimizer step is timed
on one thread as CPU seconds (``time.process_time``: robust to other jobs sharing the machine),
median over repeats after one warm-up step. The hybrid's two phases are timed apart. Projected
hours = seconds per step x the run's steps; per-epoch validation and the final test evaluation
are not included.

The hybrid switches to CGE when its training loss stalls, which only the run decides; the
projection is given for the earliest switch its stall test allows (patience 3: CGE from the
fifth epoch), the slowest case, and for no switch within the run (signRGE throughout), the
fastest. The same measured steps also give the conservative projection at the paper's 100
epochs and the largest epoch count whose conservative projection fits the issue's
TARGET_WALL_HOURS, the count ``FULL_EPOCHS`` is chosen by.
``--quick`` times the same tasks with fewer repeats (a smoke run of the script).
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from bpfree.ttzo import make_method, make_model

NAME = "tt-zo-cost"
DESCRIPTION = __doc__.split("\n\n")[0].replace("\n", " ")
SEED = 0

TABLE = "per-step CPU time of the full tt-zo tasks (1 thread)"
PROJ = "projected CPU hours of the full tt-zo run"
WORKERS = 2
#: Issue 16: each full run must finish in about 2.5 hours on 2 cores.
TARGET_WALL_HOURS = 2.5


def earliest_switch(patience: int) -> int:
    """SignRGE epochs before the earliest possible CGE phase of a hybrid with ``patience``: its
    own :class:`~bpfree.ttzo.hybrid.StallDetector` fed a loss that never improves."""
    from bpfree.ttzo.hybrid import StallDetector

    detector = StallDetector(patience)
    while not detector.end_epoch(1.0):
        pass
    return detector.stalled_at + 1


def _with_epochs(cfg: dict, epochs: int) -> dict:
    """``cfg`` with every run's epoch count set to ``epochs`` (the CGE-from-scratch run keeps
    its own)."""
    return dict(cfg, chunks=epochs, mlp_zo_chunks=epochs, fa_chunks=epochs)


def _steps_of(cfg: dict, per_epoch: int) -> dict:
    """Task name -> (epochs, steps per epoch) of the full run with ``cfg``."""
    import tt_zo

    return {"/".join(key): (int(t["epochs"]),
                            min(per_epoch, t.get("max_steps_per_epoch") or per_epoch))
            for key, t in tt_zo._tasks(cfg, "cpu", SEED).items()}


def project(per_step: dict, steps_of: dict, switch: int | None) -> dict:
    """Task name -> projected CPU hours of one seed; hybrids switch to CGE after ``switch``
    signRGE epochs (None: never)."""
    hours = {}
    for name, (epochs, spe) in steps_of.items():
        if (name, "sign_rge") in per_step and (name, "cge") in per_step:
            coarse = epochs if switch is None else min(switch, epochs)
            hours[name] = (coarse * spe * per_step[(name, "sign_rge")]
                           + (epochs - coarse) * spe * per_step[(name, "cge")]) / 3600
        else:
            hours[name] = sum(v for (n, _), v in per_step.items() if n == name) \
                * epochs * spe / 3600
    return hours


def wall_hours(hours: dict, seeds: int) -> float:
    """Wall hours of ``seeds`` seeds of every task on WORKERS workers, perfect packing (no
    worker idles while a task waits), never below the longest task."""
    return max(seeds * sum(hours.values()) / WORKERS, max(hours.values()))


def largest_fitting(wall_at, limit: float, most: int) -> int:
    """The largest epoch count in [0, ``most``] whose ``wall_at(epochs)`` is within ``limit``
    (``wall_at`` grows with the epochs)."""
    epochs = 0
    while epochs < most and wall_at(epochs + 1) <= limit:
        epochs += 1
    return epochs


def _phases(task: dict) -> list[str]:
    if task["method"] == "hybrid":
        return ["sign_rge", "cge"]
    return [task["method"]]


def _time_steps(method, x, y, steps: int, gen) -> float:
    """Median CPU seconds of one ``method.step`` over ``steps`` batches after a warm-up."""
    times = []
    for k in range(steps + 1):
        idx = torch.randint(0, x.shape[0], (64,), generator=gen)
        c0 = time.process_time()
        method.step(x[idx], y[idx], 1e-3)
        if k:
            times.append(time.process_time() - c0)
    return statistics.median(times)


def run(quick: bool) -> tuple[list[dict], dict]:
    import tt_zo
    from _ttzo_experiment import load_data

    torch.set_num_threads(1)
    cfg = tt_zo._settings(False)
    tasks = tt_zo._tasks(cfg, "cpu", SEED)
    x, y, *_ = load_data(cfg["n_train"], cfg["n_val"])
    per_epoch = math.ceil(x.shape[0] / 64)
    gen = torch.Generator().manual_seed(SEED)
    rows, per_step = [], {}

    def row(table, method, setting, metric, value):
        rows.append({"table": table, "method": method, "setting": setting, "metric": metric,
                     "value": float(value), "paper": None})

    for key, task in tasks.items():
        name = "/".join(key)
        prune = None
        if task["model"] == "sp":
            g = torch.Generator().manual_seed(SEED)
            idx = torch.randperm(x.shape[0], generator=g)[:640]
            prune = [(x[idx[i:i + 64]], y[idx[i:i + 64]]) for i in range(0, 640, 64)]
        model = make_model(task["model"], rank=int(task.get("rank", 6)), seed=SEED,
                           sp_params=task.get("sp_params"), prune_data=prune)
        method = make_method(task["method"], model, seed=SEED,
                             **dict(task.get("method_kwargs", {})))
        for phase in _phases(task):
            if phase == "cge" and task["method"] == "hybrid":
                method.phase = "cge"
            heavy = phase == "cge"
            repeats = (1 if heavy else 3) if quick else (3 if heavy else 15)
            seconds = _time_steps(method, x, y, repeats, gen)
            per_step[(name, phase)] = seconds
            row(TABLE, name, f"phase {phase}; {repeats} timed steps (median)",
                "CPU ms per step", 1e3 * seconds)

    steps_of = _steps_of(cfg, per_epoch)
    seeds = len(cfg["seeds"])
    full_epochs = int(cfg["chunks"])
    earliest = earliest_switch(int(cfg["hybrid"]["patience"]))
    extra = {"per_epoch_steps": per_epoch, "workers": WORKERS, "seeds": seeds,
             "full_epochs": full_epochs, "paper_epochs": tt_zo.PAPER_EPOCHS,
             "earliest_switch_epoch": earliest, "target_wall_hours": TARGET_WALL_HOURS,
             "projection": {}}
    hybrids = {n for (n, phase) in per_step if phase == "cge" and (n, "sign_rge") in per_step}
    cases = ((f"earliest switch (CGE after {earliest} signRGE epochs)", earliest,
              "earliest_switch"), ("no switch (signRGE throughout)", None, "no_switch"))
    for label, switch, tag in cases:
        hours = project(per_step, steps_of, switch)
        for name, h in hours.items():
            if switch is None and name not in hybrids:
                continue            # the same as in the first case
            epochs, spe = steps_of[name]
            row(PROJ, name, f"{epochs} epochs x {spe} steps; hybrid {label}",
                "CPU hours per seed", h)
        wall = wall_hours(hours, seeds)
        setting = f"{full_epochs} epochs; hybrid {label}"
        row(PROJ, "all tasks, one seed", setting, "CPU hours on 1 core", sum(hours.values()))
        row(PROJ, f"all tasks, {seeds} seeds", setting,
            f"wall hours on {WORKERS} workers (perfect packing)", wall)
        extra["projection"][tag] = {"switch_epoch": switch, "hours_per_seed": sum(hours.values()),
                                    "wall_hours": wall, "fits": wall <= TARGET_WALL_HOURS}

    def conservative(epochs):
        hours = project(per_step, _steps_of(_with_epochs(cfg, epochs), per_epoch), earliest)
        return wall_hours(hours, seeds)

    paper_wall = conservative(tt_zo.PAPER_EPOCHS)
    row(PROJ, f"all tasks, {seeds} seeds", f"the paper's {tt_zo.PAPER_EPOCHS} epochs; hybrid "
        f"{cases[0][0]}",
        f"wall hours on {WORKERS} workers (perfect packing)", paper_wall)
    fitting = largest_fitting(conservative, TARGET_WALL_HOURS, tt_zo.PAPER_EPOCHS)
    extra["paper_budget_wall_hours"] = paper_wall
    extra["largest_fitting_epochs"] = fitting
    extra["wall_hours_at"] = {str(e): conservative(e) for e in sorted({fitting, fitting + 1})
                              if e >= 1}
    extra["notes"] = [
        "CPU seconds per optimizer step (time.process_time, 1 thread), median of the timed "
        "steps after one warm-up; the steps of a run are epochs x min(steps per epoch, the "
        "task's cap) as in tt_zo._tasks(_settings(False)). Validation and test evaluation "
        "are not included.",
        "The hybrid's switch epoch is decided by its stall test during the run; the "
        f"projection gives the earliest switch its patience allows (CGE after {earliest} "
        "signRGE epochs, the slowest case) and no switch at all (the fastest).",
        f"The full run trains {full_epochs} of the paper's {tt_zo.PAPER_EPOCHS} epochs "
        f"(tt_zo.FULL_EPOCHS). largest_fitting_epochs: the most epochs whose slowest-case "
        f"wall time fits {TARGET_WALL_HOURS:g} h on {WORKERS} workers; wall_hours_at: that "
        "count's and the next one's.",
    ]
    return rows, extra
