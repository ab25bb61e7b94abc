"""Projected CPU time of the full `bench tt-zo` run, from measured per-step times of its tasks.

Every (network, method) task of tt_zo's full configuration (the paper's §5.1 budget: all of
MNIST's training split less 5,000 validation images, 100 epochs of batch 64, N = 10, full
CGE) is built exactly as `bench tt-zo` builds it (same models, same trainers from
``bpfree.ttzo.make_method``), and its optimizer step is timed on one thread as CPU seconds
(``time.process_time``: robust to other jobs sharing the machine), median over repeats after
one warm-up step. The hybrid's two phases are timed apart. Projected hours = seconds per step
x the run's steps; per-epoch validation and the final test evaluation are not included.

The hybrid switches to CGE when its training loss stalls, which only the run decides; the
projection is given for an assumed switch epoch (HYBRID_SWITCH_EPOCHS) and for the earliest
switch the stall test allows (patience 3: CGE from epoch 4), the slowest case.
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
#: Switch epochs of the hybrid the projection is given for (the run decides the real one).
HYBRID_SWITCH_EPOCHS = (30, 4)
WORKERS = 2


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
    rows, per_step, steps_of = [], {}, {}

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
        epochs = int(task["epochs"])
        steps_per_epoch = min(per_epoch, task.get("max_steps_per_epoch") or per_epoch)
        steps_of[name] = (epochs, steps_per_epoch)
        for phase in _phases(task):
            if phase == "cge" and task["method"] == "hybrid":
                method.phase = "cge"
            heavy = phase == "cge"
            repeats = (1 if heavy else 3) if quick else (3 if heavy else 15)
            seconds = _time_steps(method, x, y, repeats, gen)
            per_step[(name, phase)] = seconds
            row(TABLE, name, f"phase {phase}; {repeats} timed steps (median)",
                "CPU ms per step", 1e3 * seconds)

    extra = {"per_epoch_steps": per_epoch, "workers": WORKERS, "projection": {}}
    for switch in HYBRID_SWITCH_EPOCHS:
        total, longest = 0.0, 0.0
        for name, (epochs, spe) in steps_of.items():
            if (name, "sign_rge") in per_step and (name, "cge") in per_step:
                coarse = min(switch, epochs) * spe
                hours = (coarse * per_step[(name, "sign_rge")]
                         + (epochs * spe - coarse) * per_step[(name, "cge")]) / 3600
                row(PROJ, name, f"hybrid switch at epoch {switch}", "CPU hours per seed", hours)
            else:
                hours = sum(v for (n, _), v in per_step.items() if n == name) * epochs * spe / 3600
                if switch == HYBRID_SWITCH_EPOCHS[0]:
                    row(PROJ, name, f"{epochs} epochs x {spe} steps", "CPU hours per seed",
                        hours)
            total += hours
            longest = max(longest, hours)
        seeds = len(cfg["seeds"])
        wall = max(seeds * total / WORKERS, longest)
        setting = f"hybrid switch at epoch {switch}"
        row(PROJ, "all tasks, one seed", setting, "CPU hours on 1 core", total)
        row(PROJ, f"all tasks, {seeds} seeds", setting,
            f"wall hours on {WORKERS} workers (perfect packing)", wall)
        extra["projection"][str(switch)] = {"hours_per_seed": total, "wall_hours": wall}
    extra["notes"] = [
        "CPU seconds per optimizer step (time.process_time, 1 thread), median of the timed "
        "steps after one warm-up; the steps of a run are epochs x min(steps per epoch, the "
        "task's cap) as in tt_zo._tasks(_settings(False)). Validation and test evaluation "
        "are not included.",
        "The hybrid's switch epoch is decided by its stall test during the run; the "
        f"projection assumes epoch {HYBRID_SWITCH_EPOCHS[0]} and, as the slowest case, the "
        f"earliest switch (epoch {HYBRID_SWITCH_EPOCHS[1]}).",
    ]
    return rows, extra
