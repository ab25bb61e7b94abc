"""Projected CPU time of the full `bench pinn` run, from measured loss-evaluation times of its tasks, and the largest step budget that fits 3 wall hours at its and other point counts per step.

Every (kind, network, derivative backend) run of pinn's full configuration
(``pinn.planned_config``: HJB-20, 768-wide networks, ``pinn.FULL_POINTS`` interior +
terminal points per step, 3 seeds, ``pinn.FITTED_STEPS`` FO and ZO steps; TT-ZO §5.2 states no step count) is
built as `bench pinn` builds it (same networks, same backends, the full run's dtype: float64
since issue 32), and one step's work is timed on one thread as CPU seconds
(``time.process_time``: robust to other jobs sharing the machine), median over a few repeats
after one warm-up on a 2 + 2-point batch (it builds the sparse grid's plan and the TT
contraction plans without paying for a full step; at these sizes one step takes seconds, so
a few repeats suffice and the bench finishes in minutes):

* FO: one loss evaluation and its backward pass (Adam's own arithmetic is not counted);
* ZO: one loss evaluation without gradients, times the loss evaluations one ZO-signRGE step
  makes (measured from a real ``train_zo`` step: N + 1 with N = 10 queries).

A check row times real ``train_zo`` steps of the cheapest ZO task beside its projection, so
the reader sees what the projection leaves out. A task whose first timed call takes
``ONE_CALL_SECONDS`` or more is timed once. Projected hours = seconds per step x steps x
the task's runs: its seeds, plus (full mode) its search's candidates on seed 0 for
``pinn.SEARCH_FRACTION`` of the steps each, plus for ZO TT-3 SG the ``zo_investigation``'s
ablation runs (one per ``pinn.ABLATION_MUS``). `bench pinn` trains its runs one after the
other in one process (torch's intra-op threads use both cores), so the wall projection on 2
cores assumes perfect 2-thread scaling: a lower bound. ``largest_fitting_steps`` is the
largest FO = ZO step count whose projection fits ``TARGET_WALL_HOURS`` (``pinn.FITTED_STEPS``
is chosen from these, see its comment). ``--quick`` times the same tasks with one repeat (a smoke run of the script).

Since issue 32 the tasks are also timed at ``POINT_OPTIONS`` residual + terminal points
(``extra.budgets``: each one's largest fitting steps and the float32 run's 250 steps'
projection), the networks evaluate every Stein / FD node through
``SineMLP.forward_shifted`` (shared first layer), SE computes its values in
``pinn.SE_DTYPE``, and rows measure what that float32 costs SE in rounding beside its
sampling noise (``extra.se_rounding``).
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


def project(per_step: dict, steps: dict, runs) -> dict:
    """Task -> projected CPU hours: seconds per step x its kind's steps x its runs (a number
    for every task, or task -> run-equivalents as :func:`runs_per_task` counts them)."""
    def count(task):
        return runs[task] if isinstance(runs, dict) else runs

    return {task: count(task) * steps[task[0]] * seconds / 3600
            for task, seconds in per_step.items()}


def runs_per_task(pinn, cfg: dict, task) -> float:
    """Full-length run-equivalents `bench pinn` trains for ``task``: one per seed, the
    search's candidates at ``SEARCH_FRACTION`` of the steps each (when ``cfg`` searches),
    and for ZO TT-3 SG the zo_investigation's ablation runs."""
    kind = task[0]
    n = float(len(cfg["seeds"]))
    if cfg.get("search"):
        n += len(pinn.search_candidates(kind, cfg)) * pinn.SEARCH_FRACTION
    if task == ("ZO", "TT-3", "SG"):
        n += len(pinn.ABLATION_MUS)
    return n


def wall_hours(hours: dict, cores: int = CORES) -> float:
    """Wall hours of the runs one after another, each on ``cores`` threads scaling perfectly."""
    return sum(hours.values()) / cores


def largest_fitting_steps(per_step: dict, runs, limit: float, most: int) -> int:
    """The largest step count in [0, ``most``], the same for FO and ZO runs, whose projected
    wall time is within ``limit`` hours (``runs`` as in :func:`project`)."""
    per = wall_hours(project(per_step, {"FO": 1, "ZO": 1}, runs))
    return most if per <= 0 else min(most, int(limit // per))


#: Residual + terminal points per step at which the budget is also projected (issue 32: the
#: float32 run took 250 steps at 8 + 32; the paper's terminal count is 128).
POINT_OPTIONS = ((64, 128), (16, 128), (8, 128))
#: The float32 full run's step count (results/pinn.json at 3f220be), for the comparison rows.
FLOAT32_RUN_STEPS = 250
TR = "SE's rounding against its sampling noise (network values in SE_DTYPE)"

#: CPU seconds from which one timed call of a task is enough: a step of seconds is timed to a
#: few per cent by process_time, and the SE / SG steps at 64 points take tens of seconds.
ONE_CALL_SECONDS = 2.0


def _cpu_median(fn, repeats: int, warmup=None) -> tuple[float, int]:
    """``(median CPU seconds, calls timed)`` of ``fn``: ``repeats`` calls after one call of
    ``warmup`` (default ``fn`` itself), or one when that one takes ONE_CALL_SECONDS or more."""
    (warmup or fn)()
    times = []
    for _ in range(repeats):
        c0 = time.process_time()
        fn()
        times.append(time.process_time() - c0)
        if times[0] >= ONE_CALL_SECONDS:
            break
    return statistics.median(times), len(times)


def _zo_forwards_per_step(pinn, cfg, problem, val) -> int:
    """Loss evaluations of one real ``train_zo`` step (what the projection multiplies by)."""
    from bpfree.pinn import train_zo

    net = pinn.network(cfg, "FC-3 78", problem, SEED)
    res = train_zo(net, problem, pinn._backend("FD", SEED), steps=1, lr=cfg["zo_lr"],
                   batch_size=cfg["batch"], n_initial=cfg["n_initial"], num_queries=10,
                   mu=0.1, seed=SEED, val_points=val, log_every=0)
    return res.loss_evaluations


def se_rounding(pinn, problem, dtype, seeds=(0, 1, 2, 3), points: int = 64) -> dict:
    """SE's rounding error beside its sampling noise on the untrained TT-3 (seed 0) at
    ``points`` residual points (draw 7, as bench pinn's derivative rows), the network in
    ``dtype``: ``rounding`` = ‖lap(values in SE_DTYPE) − lap(values in dtype)‖ / ‖lap‖ with the
    same directions; ``sampling`` = the RMS over direction draws (``seeds``) of
    ‖lap_s − mean lap‖ / ‖mean lap‖, values in ``dtype``; likewise for the gradient."""
    fn = pinn.network({**pinn.planned_config(), "dtype": str(dtype).removeprefix("torch.")},
                      "TT-3", problem, SEED).network_fn()
    x = problem.sample(points, 0, generator=torch.Generator().manual_seed(7),
                       dtype=dtype).interior
    dims = problem.laplacian_dims
    with torch.no_grad():
        exact = [pinn._backend("SE", s, se_dtype=None)(fn, x, laplacian_dims=dims) for s in seeds]
        low = pinn._backend("SE", seeds[0])(fn, x, laplacian_dims=dims)
    out = {}
    for i, what in enumerate(("gradient", "laplacian")):
        draws = torch.stack([e[i] for e in exact])
        mean = draws.mean(0)
        out[what] = {
            "rounding": float((low[i] - exact[0][i]).norm() / exact[0][i].norm()),
            "sampling": float(((draws - mean).flatten(1).norm(dim=1) ** 2).mean().sqrt()
                              / mean.norm())}
    return out


def time_tasks(pinn, cfg, problem, models, batch, small, repeats: int, forwards: int) -> dict:
    """``{task: (CPU seconds per step, how it was timed)}`` of every full task at ``batch``."""
    from bpfree.pinn import pinn_loss

    per_step = {}
    for kind, net_name, b in full_tasks(cfg, models):
        net = pinn.network(cfg, net_name, problem, SEED)
        backend = pinn._backend(b, SEED)

        def fo_step(points=batch):
            net.zero_grad(set_to_none=True)
            pinn_loss(net, problem, backend, points)["loss"].backward()

        def zo_loss(points=batch):
            with torch.no_grad():
                pinn_loss(net, problem, backend, points)

        if kind == "FO":
            seconds, timed = _cpu_median(fo_step, repeats, lambda: fo_step(small))
            how = f"1 loss + backward; median of {timed}"
        else:
            seconds, timed = _cpu_median(zo_loss, repeats, lambda: zo_loss(small))
            seconds *= forwards
            how = f"{forwards} loss evaluations; median of {timed}"
        per_step[(kind, net_name, b)] = (seconds, how)
    return per_step


def run(quick: bool) -> tuple[list[dict], dict]:
    import pinn

    from bpfree.pinn import HJB, train_zo

    torch.set_num_threads(1)
    cfg = pinn.planned_config()
    problem = HJB(20)
    dtype = getattr(torch, cfg.get("dtype", "float32"))
    val = pinn.eval_points(problem, cfg, pinn.VAL_SEED)
    models = pinn._models(cfg, SEED)
    forwards = _zo_forwards_per_step(pinn, cfg, problem, val)
    rows = []

    def row(table, method, setting, metric, value):
        rows.append({"table": table, "method": method, "setting": setting, "metric": metric,
                     "value": float(value), "paper": None})

    def sample(residual, terminal, seed):
        return problem.sample(residual, terminal, generator=torch.Generator().manual_seed(seed),
                              dtype=dtype)

    # a 2 + 2-point batch for the warm-up (plans and caches, not a full step's work)
    small = sample(2, 2, 98)
    repeats = 1 if quick else 3
    planned = (int(cfg["batch"]), int(cfg["n_initial"]))
    options = list(dict.fromkeys([planned, *POINT_OPTIONS]))
    timed = {pts: time_tasks(pinn, cfg, problem, models, sample(*pts, 99), small, repeats,
                             forwards) for pts in options}
    per_step = {task: sec for task, (sec, _) in timed[planned].items()}
    batch = sample(*planned, 99)
    for (kind, net_name, b), (seconds, how) in timed[planned].items():
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
    runs = {task: runs_per_task(pinn, cfg, task) for task in per_step}
    hours = project(per_step, steps, runs)
    for (kind, net_name, b), h in hours.items():
        row(PROJ, f"{kind}+{b}", f"{net_name}; {steps[kind]} steps x "
            f"{runs[(kind, net_name, b)]:g} runs ({seeds} seeds + search"
            + (" + ablation" if (kind, net_name, b) == ("ZO", "TT-3", "SG") else "") + ")",
            "CPU hours", h)
    wall = wall_hours(hours)
    setting = (f"FO {steps['FO']} / ZO {steps['ZO']} steps at {cfg['batch']} + "
               f"{cfg['n_initial']} points, {seeds} seeds, searches and ablation")
    row(PROJ, "all runs", setting, "CPU hours on 1 core", sum(hours.values()))
    row(PROJ, "all runs", setting, f"wall hours on {CORES} cores (perfect scaling)", wall)
    # the budget: wall hours are linear in the steps, so the largest fitting count is exact
    fitting = largest_fitting_steps(per_step, runs, TARGET_WALL_HOURS, 100_000)
    per_step_wall = wall_hours(project(per_step, {"FO": 1, "ZO": 1}, runs))
    budgets = []
    for pts in options:
        sec = {task: v for task, (v, _) in timed[pts].items()}
        steps_fit = largest_fitting_steps(sec, runs, TARGET_WALL_HOURS, 100_000)
        per = wall_hours(project(sec, {"FO": 1, "ZO": 1}, runs))
        budgets.append({"points": list(pts), "wall_hours_per_step": per,
                        "largest_fitting_steps": steps_fit,
                        "fitting_wall_hours": steps_fit * per,
                        "residual_point_steps": steps_fit * pts[0],
                        "float32_run_wall_hours": FLOAT32_RUN_STEPS * per})
        row(PROJ, "all runs", f"{pts[0]} + {pts[1]} points: FO = ZO = {steps_fit} steps (the "
            f"largest that fits {TARGET_WALL_HOURS:g} h)",
            f"wall hours on {CORES} cores (perfect scaling)", steps_fit * per)
        row(PROJ, "all runs", f"{pts[0]} + {pts[1]} points: FO = ZO = {FLOAT32_RUN_STEPS} "
            "steps (the float32 run's count)", f"wall hours on {CORES} cores (perfect scaling)",
            FLOAT32_RUN_STEPS * per)
    rounding = se_rounding(pinn, problem, dtype, seeds=(0, 1) if quick else (0, 1, 2, 3))
    for what, r in rounding.items():
        for part, v in r.items():
            row(TR, "SE", f"TT-3 {cfg['width']} untrained, 64 points, network in {cfg.get('dtype')}, "
                f"values in {pinn.SE_DTYPE}", f"relative {what} {part}", v)
    row(PROJ, "all runs", f"FO = ZO = {fitting} steps (the largest that fits "
        f"{TARGET_WALL_HOURS:g} h)", f"wall hours on {CORES} cores (perfect scaling)",
        fitting * per_step_wall)
    zo_share = sum(h for t, h in hours.items() if t[0] == "ZO") / sum(hours.values())
    extra = {"seeds": seeds, "steps": steps, "points": [cfg["batch"], cfg["n_initial"]],
             "runs_per_task": {" ".join(t): n for t, n in runs.items()},
             "zo_forwards_per_step": forwards,
             "target_wall_hours": TARGET_WALL_HOURS, "full_wall_hours": wall,
             "fits": wall <= TARGET_WALL_HOURS, "largest_fitting_steps": fitting,
             "wall_hours_per_step": per_step_wall,
             "fitting_wall_hours": fitting * per_step_wall,
             "zo_share_of_hours": zo_share,
             "budgets": budgets, "se_rounding": rounding, "se_dtype": pinn.SE_DTYPE,
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
                 "scaling, a lower bound. Each task counts its seeds, its search's "
                 "candidates (seed 0, SEARCH_FRACTION of the steps each) and, for ZO TT-3 "
                 "SG, the zo_investigation's ablation runs (runs_per_task); the "
                 "investigation's RGE-alignment draws, the per-seed loss timings, "
                 "validation logging and the Poisson-2D table are not included. "
                 "largest_fitting_steps: the most steps (the same for FO and ZO) whose wall "
                 f"projection fits {TARGET_WALL_HOURS:g} h (fitting_wall_hours).",
             ]}
    return rows, extra
