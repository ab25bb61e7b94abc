"""Projected CPU time of the full `bench tt-zo` run, from measured per-step times of its tasks.

Every (network, method) task of tt_zo's full configuration (the paper's §5.1 settings: all of
MNIST's training split less 5,000 validation images, batch 64, N = 10, full CGE, for
``tt_zo.FULL_EPOCHS``, the paper's 100 epochs) is built exactly as `bench tt-zo` builds it
(same models, same trainers from ``bpfree.ttzo.make_method``), and its optimizer step is timed
on one thread as CPU seconds (``time.process_time``: robust to other jobs sharing the machine),
median over repeats after one warm-up step. The hybrid's two phases are timed apart. Projected
hours = seconds per step x the run's steps; per-epoch validation and the final test evaluation
are not included.

The hybrid switches to CGE when its training loss stalls, which only the run decides; the
projection is given for the earliest switch its stall test allows (patience 3: CGE from the
fifth epoch), the slowest case, and for no switch within the run (signRGE throughout), the
fastest. The full mode's FO-AD rate search (tt_zo.FULL_FO_FACTORS, run before the seeds) is projected
from the same FO step times, and so is the longest single run: the work a resumption of the
run under ``BPFREE_TASK_CACHE`` can lose.

The CGE step is also timed on the reference path of :func:`bpfree.ttzo.layerwise_losses`
(``reference=True``, the chunked evaluation before issue 32) beside the batched path the runs
use, alternating the two in this one process, each the median of its timed steps (the table
"CGE step: reference vs batched"). The reference step uses today's
:class:`~bpfree.estimators.CoordinateWise` bookkeeping, which issue 32 also made faster, so
the ratio understates the gain over the code before it.

On a machine with a CUDA GPU the full mode times the steps there instead, as `bench tt-zo`'s
full mode would run them (one worker on the GPU): wall seconds with the GPU synchronized
before and after each step, and projected GPU hours (the tables and rows say which clock).

``--quick`` times the same tasks with fewer repeats (a smoke run of the script).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

import torch

from bpfree.ttzo import make_method, make_model

NAME = "tt-zo-cost"
DESCRIPTION = __doc__.split("\n\n")[0].replace("\n", " ")
SEED = 0

TABLE = "per-step CPU time of the full tt-zo tasks (1 thread)"
TCGE = "CGE step: reference (chunked, before issue 32) vs batched layerwise path (1 thread)"
PROJ = "projected CPU hours of the full tt-zo run"
WORKERS = 2


def earliest_switch(patience: int) -> int:
    """SignRGE epochs before the earliest possible CGE phase of a hybrid with ``patience``: its
    own :class:`~bpfree.ttzo.hybrid.StallDetector` fed a loss that never improves."""
    from bpfree.ttzo.hybrid import StallDetector

    detector = StallDetector(patience)
    while not detector.end_epoch(1.0):
        pass
    return detector.stalled_at + 1


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


def wall_hours(hours: dict, seeds: int, workers: int = WORKERS) -> float:
    """Wall hours of ``seeds`` seeds of every task on ``workers`` workers, perfect packing (no
    worker idles while a task waits), never below the longest task."""
    return max(seeds * sum(hours.values()) / workers, max(hours.values()))


def _phases(task: dict) -> list[str]:
    if task["method"] == "hybrid":
        return ["sign_rge", "cge"]
    return [task["method"]]


def _clock(device: torch.device):
    """Seconds for timing steps on ``device``: CPU time on the CPU (robust to other jobs),
    wall time with the GPU synchronized on CUDA (a step's kernels run asynchronously)."""
    if device.type != "cuda":
        return time.process_time

    def synced() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()
    return synced


def _time_steps(method, x, y, steps: int, gen, variants: dict | None = None) -> dict:
    """Variant name -> median seconds (:func:`_clock` of ``x``'s device) of one
    ``method.step`` over ``steps`` batches after one warm-up step each. ``variants`` maps
    names to callables that switch ``method`` to that variant; the variants alternate step by
    step (so a change of the machine's load hits them alike). Default: the method as it is,
    named ``"step"``."""
    variants = variants or {"step": lambda: None}
    times: dict = {name: [] for name in variants}
    clock = _clock(x.device)
    for k in range(steps + 1):
        for name, switch in variants.items():
            switch()
            idx = torch.randint(0, x.shape[0], (64,), generator=gen).to(x.device)
            c0 = clock()
            method.step(x[idx], y[idx], 1e-3)
            if k:
                times[name].append(clock() - c0)
    return {name: statistics.median(t) for name, t in times.items()}


def cge_variants(method) -> dict | None:
    """``{"reference": ..., "batched": ...}`` switches of ``method``'s CGE estimator between
    the chunked reference path and the batched path of :func:`bpfree.ttzo.layerwise_losses`
    (the batched one last, so the method is left as it runs), or None when its CGE does not
    run layerwise (lean mode)."""
    from bpfree.ttzo import LayerwiseCGE

    trainer = getattr(method, "fine", method)
    est = trainer.estimator
    if not isinstance(est, LayerwiseCGE) or trainer.optimizer.mode != "batched":
        return None

    def use(reference: bool):
        def switch():
            chosen = dataclasses.replace(est, reference=reference)
            trainer.estimator = trainer.optimizer.estimator = chosen
        return switch

    return {"reference": use(True), "batched": use(False)}


def search_hours(per_step: dict, cfg: dict, per_epoch: int) -> list[float]:
    """CPU hours of each lr-search candidate of ``cfg`` (tt_zo._search_tasks), from the step
    times of its run (a hybrid's slower phase throughout); [] when ``cfg`` searches nothing."""
    import tt_zo

    if not cfg["search"]:
        return []
    tasks = tt_zo._search_tasks(tt_zo._tasks(cfg, "cpu", SEED), cfg["search_fraction"],
                                cfg.get("search_factors", tt_zo.LR_FACTORS),
                                cfg.get("search_methods"))
    def seconds(name):
        return max(v for (n, _), v in per_step.items() if n == name)

    return [seconds("/".join(key[:2])) * t["epochs"]
            * min(per_epoch, t.get("max_steps_per_epoch") or per_epoch) / 3600
            for key, t in tasks.items()]


def run(quick: bool) -> tuple[list[dict], dict]:
    import tt_zo
    from _ttzo_experiment import load_data

    torch.set_num_threads(1)
    cfg = tt_zo._settings(False)
    # Where bench tt-zo's full mode would run: one worker on a CUDA GPU when there is one.
    cuda = (not quick) and torch.cuda.is_available()
    device, workers = ("cuda", 1) if cuda else ("cpu", WORKERS)
    clock = "GPU wall" if cuda else "CPU"
    tables = {t: t.replace("CPU", "GPU").replace("(1 thread)", "(one GPU, wall clock)")
              if cuda else t for t in (TABLE, TCGE, PROJ)}
    tasks = tt_zo._tasks(cfg, device, SEED)
    x, y, *_ = load_data(cfg["n_train"], cfg["n_val"])
    # The timed batches come from the device's copy, made once (the CPU copy feeds GraSP's
    # pruning batches, which make_model takes before the model moves).
    xd, yd = x.to(device), y.to(device)
    per_epoch = math.ceil(x.shape[0] / 64)
    gen = torch.Generator().manual_seed(SEED)
    rows, per_step, cge_speedup = [], {}, {}

    def row(table, method, setting, metric, value):
        rows.append({"table": tables[table], "method": method, "setting": setting,
                     "metric": metric, "value": float(value), "paper": None})

    for key, task in tasks.items():
        name = "/".join(key)
        prune = None
        if task["model"] == "sp":
            g = torch.Generator().manual_seed(SEED)
            idx = torch.randperm(x.shape[0], generator=g)[:640]
            prune = [(x[idx[i:i + 64]], y[idx[i:i + 64]]) for i in range(0, 640, 64)]
        model = make_model(task["model"], rank=int(task.get("rank", 6)), seed=SEED,
                           sp_params=task.get("sp_params"), prune_data=prune).to(device)
        method = make_method(task["method"], model, seed=SEED,
                             **dict(task.get("method_kwargs", {})))
        for phase in _phases(task):
            if phase == "cge" and task["method"] == "hybrid":
                method.phase = "cge"
            heavy = phase == "cge"
            repeats = (1 if heavy else 3) if quick else (5 if heavy else 15)
            variants = cge_variants(method) if heavy else None
            seconds = _time_steps(method, xd, yd, repeats, gen, variants)
            per_step[(name, phase)] = seconds["batched" if variants else "step"]
            row(TABLE, name, f"phase {phase}; {repeats} timed steps (median)",
                f"{clock} ms per step", 1e3 * per_step[(name, phase)])
            if variants:
                setting = f"{repeats} timed steps each, alternating (median)"
                for label, value in (("reference path", seconds["reference"]),
                                     ("batched path", seconds["batched"])):
                    row(TCGE, name, setting, f"{clock} ms per CGE step, {label}", 1e3 * value)
                row(TCGE, name, setting, "speed-up (reference / batched)",
                    seconds["reference"] / seconds["batched"])
                cge_speedup[name] = seconds["reference"] / seconds["batched"]

    steps_of = _steps_of(cfg, per_epoch)
    seeds = len(cfg["seeds"])
    full_epochs = int(cfg["chunks"])
    earliest = earliest_switch(int(cfg["hybrid"]["patience"]))
    search = search_hours(per_step, cfg, per_epoch)
    search_wall = max(sum(search) / workers, max(search)) if search else 0.0
    extra = {"per_epoch_steps": per_epoch, "workers": workers, "seeds": seeds,
             "clock": clock,
             "full_epochs": full_epochs, "paper_epochs": tt_zo.PAPER_EPOCHS,
             "earliest_switch_epoch": earliest, "projection": {},
             "search_cpu_hours": sum(search), "search_wall_hours": search_wall,
             "cge_speedup": cge_speedup}
    if search:
        row(PROJ, f"FO-AD lr search ({len(search)} candidates, seed 0)",
            f"{cfg.get('search_methods') or 'every method'}; before the seeds",
            f"wall hours on {workers} workers (perfect packing)", search_wall)
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
                f"{clock} hours per seed", h)
        wall = search_wall + wall_hours(hours, seeds, workers)
        setting = f"{full_epochs} epochs; hybrid {label}"
        row(PROJ, "all tasks, one seed", setting,
            f"{clock} hours on 1 {'GPU' if cuda else 'core'}", sum(hours.values()))
        row(PROJ, f"all tasks, {seeds} seeds", setting + (", FO lr search included"
                                                          if search else ""),
            f"wall hours on {workers} workers (perfect packing)", wall)
        longest = max(hours, key=hours.get)
        row(PROJ, f"longest single run ({longest})", setting,
            f"{clock} hours (what an interrupted resumption can lose)", hours[longest])
        extra["projection"][tag] = {"switch_epoch": switch, "hours_per_seed": sum(hours.values()),
                                    "wall_hours": wall, "longest_run": longest,
                                    "longest_run_hours": hours[longest]}
    extra["notes"] = [
        ("GPU wall seconds per optimizer step (synchronized before and after), "
         if cuda else "CPU seconds per optimizer step (time.process_time, 1 thread), ") +
        "median of the timed "
        "steps after one warm-up; the steps of a run are epochs x min(steps per epoch, the "
        "task's cap) as in tt_zo._tasks(_settings(False)). Validation and test evaluation "
        "are not included.",
        "The hybrid's switch epoch is decided by its stall test during the run; the "
        f"projection gives the earliest switch its patience allows (CGE after {earliest} "
        "signRGE epochs, the slowest case) and no switch at all (the fastest).",
        f"The full run trains the paper's {full_epochs} epochs; the wall time on {workers} "
        "workers adds the FO-AD lr search (run first) to the seeds' runs, each packed "
        "perfectly and never shorter than its longest task. With BPFREE_TASK_CACHE the run "
        "resumes at the last finished task: an interruption loses at most the longest "
        "single run per worker.",
        "CGE step, reference vs batched: the same trainer's step with LayerwiseCGE("
        "reference=True) and with the batched path, alternating, median of each; the "
        "reference step already uses CoordinateWise's vectorised bookkeeping (issue 32), so "
        "the ratio understates the gain over the code before issue 32.",
    ]
    if cuda:
        from bpfree.bench import describe_device

        extra["device"] = describe_device("cuda")
    return rows, extra
