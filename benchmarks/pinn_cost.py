"""Projected CPU time of the planned full `bench pinn` run (3000 steps at 64 + 128 points), from measured loss-evaluation times of its tasks.

Every (kind, network, derivative backend) run of pinn's planned full configuration
(``pinn.planned_config``: HJB-20, 768-wide networks, batch 64 interior + 128 terminal points,
3 seeds, ``fo_steps`` / ``zo_steps`` steps; TT-ZO §5.2 states no step count, 3000 is ours;
the full run itself trains ``pinn.FITTED_STEPS`` steps) is built as `bench pinn` builds it (same
networks, same backends, the full run's dtype: float64 since issue 32), and one step's work is timed on one thread as CPU seconds
(``time.process_time``: robust to other jobs sharing the machine), median over repeats after
one warm-up:

* FO: one loss evaluation and its backward pass (Adam's own arithmetic is not counted);
* ZO: one loss evaluation without gradients, times the loss evaluations one ZO-signRGE step
  makes (measured from a real ``train_zo`` step: N + 1 with N = 10 queries).

A check row times real ``train_zo`` steps of the cheapest ZO task beside its projection, so
the reader sees what the projection leaves out. Projected hours = seconds per step x steps x
seeds. `bench pinn` trains its runs one after the other in one process (torch's intra-op
threads use both cores), so the wall projection on 2 cores assumes perfect 2-thread scaling:
a lower bound. ``--quick`` times the same tasks with one repeat (a smoke run of the script).
"""

from __future__ import annotations

import statistics
import time

import torch

from bpfree.tt.layers import TTLinear, best_plan, plan_cost

NAME = "pinn-cost"
DESCRIPTION = __doc__.split("\n\n")[0].replace("\n", " ")
SEED = 0

TABLE = "per-step CPU time of the full pinn tasks (1 thread)"
PROJ = "projected CPU hours of the full pinn run"
CORES = 2
#: Issue 32: the full run's step budget is the largest that fits about 3 hours of wall time
#: on 2 cores (across resumptions), in the full run's float64 (issue 16 asked 2.5 h).
TARGET_WALL_HOURS = 3.0


def full_tasks(cfg: dict, models) -> list[tuple[str, str, str]]:
    """``(kind, network, backend)`` of every run `bench pinn` trains, each once (its ``train``
    caches a run that two tables share): Tables 4-5 on the dense and TT networks, Table 6's
    FO-AD and ZO-SG on every network of ``models``."""
    nets = ["FC-3 768", "TT-3"] if cfg["full_mlp"] else ["TT-3"]
    tasks = []
    for net in nets:
        tasks += [("FO", net, b) for b in ("AD", "FD", "SE", "SG")]
        tasks += [("ZO", net, b) for b in ("FD", "SE", "SG")]
    for net in models:
        tasks += [("FO", net, "AD"), ("ZO", net, "SG")]
    return list(dict.fromkeys(tasks))


def project(per_step: dict, steps: dict, seeds: int) -> dict:
    """Task -> projected CPU hours of all ``seeds``: seconds per step x its kind's steps."""
    return {task: seeds * steps[task[0]] * seconds / 3600 for task, seconds in per_step.items()}


def wall_hours(hours: dict, cores: int = CORES) -> float:
    """Wall hours of the runs one after another, each on ``cores`` threads scaling perfectly."""
    return sum(hours.values()) / cores


def largest_fitting_steps(per_step: dict, seeds: int, limit: float, most: int) -> int:
    """The largest step count in [0, ``most``], the same for FO and ZO runs, whose projected
    wall time is within ``limit`` hours."""
    per = wall_hours(project(per_step, {"FO": 1, "ZO": 1}, seeds))
    return most if per <= 0 else min(most, int(limit // per))


def _cpu_median(fn, repeats: int) -> float:
    fn()                                              # warm-up
    times = []
    for _ in range(repeats):
        c0 = time.process_time()
        fn()
        times.append(time.process_time() - c0)
    return statistics.median(times)


def _zo_forwards_per_step(pinn, cfg, problem, val) -> int:
    """Loss evaluations of one real ``train_zo`` step (what the projection multiplies by)."""
    from bpfree.pinn import train_zo

    net = pinn.network(cfg, "FC-3 78", problem, SEED)
    res = train_zo(net, problem, pinn._backend("FD", SEED), steps=1, lr=cfg["zo_lr"],
                   batch_size=cfg["batch"], n_initial=cfg["n_initial"], num_queries=10,
                   mu=0.1, seed=SEED, val_points=val, log_every=0)
    return res.loss_evaluations


def run(quick: bool) -> tuple[list[dict], dict]:
    import pinn

    from bpfree.pinn import HJB, pinn_loss, train_zo

    torch.set_num_threads(1)
    cfg = pinn.planned_config()
    problem = HJB(20)
    val = pinn.eval_points(problem, cfg, pinn.VAL_SEED)
    batch = problem.sample(cfg["batch"], cfg["n_initial"],
                           generator=torch.Generator().manual_seed(99),
                           dtype=getattr(torch, cfg.get("dtype", "float32")))
    models = pinn._models(cfg, SEED)
    forwards = _zo_forwards_per_step(pinn, cfg, problem, val)
    rows, per_step = [], {}

    def row(table, method, setting, metric, value):
        rows.append({"table": table, "method": method, "setting": setting, "metric": metric,
                     "value": float(value), "paper": None})

    for kind, net_name, b in full_tasks(cfg, models):
        net = pinn.network(cfg, net_name, problem, SEED)
        backend = pinn._backend(b, SEED)

        def fo_step():
            net.zero_grad(set_to_none=True)
            pinn_loss(net, problem, backend, batch)["loss"].backward()

        def zo_loss():
            with torch.no_grad():
                pinn_loss(net, problem, backend, batch)

        repeats = 1 if quick else 3
        if kind == "FO":
            seconds = _cpu_median(fo_step, repeats)
            how = f"1 loss + backward; median of {repeats}"
        else:
            seconds = forwards * _cpu_median(zo_loss, repeats)
            how = f"{forwards} loss evaluations; median of {repeats}"
        per_step[(kind, net_name, b)] = seconds
        row(TABLE, f"{kind}+{b}", f"{net_name}; {how}", "CPU s per step", seconds)

    # check: real train_zo steps of the cheapest ZO task against its projection
    check = ("ZO", "FC-3 78", "SG")
    k = 1 if quick else 3

    def real(steps):
        net = pinn.network(cfg, check[1], problem, SEED)
        c0 = time.process_time()
        train_zo(net, problem, pinn._backend(check[2], SEED), steps=steps, lr=cfg["zo_lr"],
                 batch_size=cfg["batch"], n_initial=cfg["n_initial"], num_queries=10, mu=0.1,
                 seed=SEED, val_points=val, log_every=0)
        return time.process_time() - c0

    measured = (real(1 + k) - real(1)) / k
    row(TABLE, "check: real train_zo steps", f"{check[1]}, {check[2]}; {k} steps",
        "CPU s per step (measured / projected)", measured / per_step[check])

    # TT saves parameters; does it save forward compute? multiply-adds per point of each
    # TT-3 layer at the ZO+SG batch, by the plan its forward uses, beside the dense layer's
    points = int(batch.interior.shape[0]) * pinn._backend("SG").evaluations(problem.input_dim)
    tt_layers = [m for m in models["TT-3"]().modules() if isinstance(m, TTLinear)]
    for i, layer in enumerate(tt_layers):
        plan = best_plan(layer.in_factors, layer.out_factors, layer.ranks, points)
        macs = plan_cost(layer.in_factors, layer.out_factors, layer.ranks, plan, points)
        row(TABLE, f"TT-3 layer {i + 1}", f"{layer.in_features} -> {layer.out_features}; "
            f"plan {plan} at {points} points (SG)", "multiply-adds per point (TT / dense)",
            macs / points / (layer.in_features * layer.out_features))

    seeds = len(cfg["seeds"])
    steps = {"FO": int(cfg["fo_steps"]), "ZO": int(cfg["zo_steps"])}
    hours = project(per_step, steps, seeds)
    for (kind, net_name, b), h in hours.items():
        row(PROJ, f"{kind}+{b}", f"{net_name}; {steps[kind]} steps x {seeds} seeds",
            "CPU hours", h)
    wall = wall_hours(hours)
    row(PROJ, "all runs", f"FO {steps['FO']} / ZO {steps['ZO']} steps x {seeds} seeds",
        "CPU hours on 1 core", sum(hours.values()))
    row(PROJ, "all runs", f"FO {steps['FO']} / ZO {steps['ZO']} steps x {seeds} seeds",
        f"wall hours on {CORES} cores (perfect scaling)", wall)
    fitting = largest_fitting_steps(per_step, seeds, TARGET_WALL_HOURS, max(steps.values()))
    zo_share = sum(h for t, h in hours.items() if t[0] == "ZO") / sum(hours.values())
    extra = {"seeds": seeds, "steps": steps, "zo_forwards_per_step": forwards,
             "target_wall_hours": TARGET_WALL_HOURS, "full_wall_hours": wall,
             "fits": wall <= TARGET_WALL_HOURS, "largest_fitting_steps": fitting,
             "zo_share_of_hours": zo_share,
             "heaviest": [f"{k_} {n} {b}: {h:.2f} h" for (k_, n, b), h in
                          sorted(hours.items(), key=lambda kv: -kv[1])[:5]],
             "notes": [
                 "CPU seconds per step (time.process_time, 1 thread), median after one "
                 "warm-up. FO: one loss evaluation with its backward pass; ZO: one loss "
                 "evaluation without gradients x the loss evaluations of a real train_zo "
                 "step. Validation logging, Adam's and the optimizer's arithmetic and the "
                 "Poisson-2D companion table are not included (the check row shows how far "
                 "real steps are from the projection on the cheapest ZO task).",
                 f"Wall hours: the runs one after another on {CORES} threads with perfect "
                 "scaling, a lower bound. largest_fitting_steps: the most steps (the same "
                 f"for FO and ZO) whose wall projection fits {TARGET_WALL_HOURS:g} h.",
             ]}
    return rows, extra
