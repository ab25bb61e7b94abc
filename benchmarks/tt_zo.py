"""TT-ZO on MNIST (Zhao et al., §5.1): Tables 1-3, signRGE vs CGE queries to 85%, Fig. 1 curves.

MLP 784-1024-10 against its TT-compressed twin (784 = 7x4x4x7, 1024 = 8x4x4x8, 10 = 1x5x2x1,
TT-ranks [1, r, r, r, 1]; r = 6 gives the paper's 3,962 parameters, r = 10 its 8,314), a small
784-10-10 MLP and a GraSP-pruned SP-MLP with the TT-MLP's parameter count, each trained with FO
SGD, ZO-RGE, ZO-signRGE and the hybrid ZO (signRGE until the training loss stalls, then CGE with
momentum), plus the BP-free baselines of Table 3 (FG-W, FG-A, FA, DFA) on the dense MLP.
Hyper-parameters of §5.1: batch 64, lr 1e-3 x 0.9 every 10 epochs, N = 10, mu = 0.1; CGE
mu = 0.01, momentum 0.9. ``--quick`` trains on a 10k / 2k subset for a few hundred steps per run
(minutes on 2 CPU cores; the hybrid's CGE uses a random coordinate subset per step) with
pilot-chosen learning rates, RGE / signRGE mu = 0.01 and a larger CGE step in the hybrid (see
QUICK_LR, QUICK_ZO_MU, QUICK_CGE_LR_SCALE); the full mode uses the paper's settings (all of
MNIST, 100 epochs, full CGE) and runs for hours to days.
"""

from __future__ import annotations

import math
import time
import types
from pathlib import Path

from bpfree.plotting import pyplot, save_figure
from bpfree.bench.parallel import default_workers, pool_device, run_keyed

NAME = "tt-zo"
DESCRIPTION = __doc__.split("\n\n")[0].replace("\n", " ")
SEED = 0

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "results" / "figures"

T1 = "Table 1: validation accuracy (%) of MLPs, TT-MLP and SP-MLP"
T2 = "Table 2: TT-MLP compression ratios, validation accuracy (%)"
T3 = "Table 3: BP-free optimizers on MNIST"
TQ = "Fig. 1 text: mini-batch loss evaluations to reach 85% validation accuracy (TT-MLP r=6)"
TP = "TT-MLP parameter counts (the paper's convention: TT cores + dense biases)"

# Paper numbers (Tables 1-3; None = "no convergence" / not reported).
PAPER_T1 = {  # network -> (params, FO, ZO-signRGE, hybrid)
    "mlp": (814090, 97.43, None, None),
    "small-mlp": (7940, 93.69, 61.51, 86.47),
    "tt6": (3962, 97.16, 88.48, 96.64),
    "sp": (4089, 86.36, 83.39, 92.24),
}
PAPER_T2 = {  # rank -> (ratio, params, FO-AD, ZO-RGE, ZO-signRGE, hybrid)
    10: (0.01, 8314, 97.33, 85.14, 87.87, 96.77),
    6: (0.005, 3962, 97.16, 87.72, 88.48, 96.64),
    4: (0.003, 2698, 96.47, 89.67, 89.01, 95.83),  # the paper's 2,698 is not 60r^2+128r+1034
}
PAPER_T3 = {  # label -> (params, loss evals per iteration, best accuracy)
    "HZO": (814e3, 814e3, 83.58),
    "TT-HZO (proposed)": (4e3, 4e3, 96.64),
    "SP-HZO": (4e3, 4e3, 92.24),
    "FG-W": (429e3, None, 91.44),
    "FG-A": (429e3, None, 97.45),  # the paper's LG-FG-A (with local losses)
    "FA": (784e3, None, 97.90),
    "DFA": (1.26e6, None, 98.30),
}
PAPER_QUERIES = {"sign_rge": 340e3, "cge": 11e6}
LABELS = {"mlp": "MLP 784-1024-10", "small-mlp": "small MLP 784-10-10",
          "tt6": "TT-MLP r=6", "sp": "SP-MLP (GraSP)"}


# Quick mode only: the paper's lr 1e-3 is for 100 epochs; in the quick budget (< 1 epoch) it
# leaves every method near chance (FO SGD on the TT-MLP: 22% after 600 steps). These rates
# come from 600-step pilots on the quick subset over a x3 grid (FO / FA / DFA 0.03-0.3, ZO
# 1e-3-3e-2; ZO-RGE (mu = 0.1) diverges at 1e-2, FG-W at 1e-2 and 1e-1, FG-A is erratic at 1e-1, so
# both forward-gradient rows keep 1e-3; signRGE at 1e-2 peaks at 56% and falls back).
# Full CGE (10 steps from scratch): 0.03 reaches 33%, 0.01 only 16%.
QUICK_LR = {"fo": 0.1, "fa": 0.1, "dfa": 0.1, "fg-w": 1e-3, "fg-a": 1e-3,
            "rge": 3e-3, "sign_rge": 3e-3, "hybrid": 3e-3, "cge": 3e-2}
# Quick mode only: the RGE / signRGE radius. With Gaussian directions on every one of the
# TT-MLP's 3,962 parameters (TT-core entries have std 0.16-0.32 at initialisation), mu = 0.1
# perturbs each core by 30-60% of its scale: the finite differences leave the linear regime
# and the cosine between the signRGE step and the true gradient is 0.007 instead of the
# 0.035-0.040 reached at mu = 0.01 or 0.001 (ideal for N = 10: sqrt(2N / (pi d)) = 0.040).
# 600 signRGE steps at lr 3e-3 on TT-MLP r=6: 30% (mu = 0.1) vs 63% (mu = 0.01).
QUICK_ZO_MU = 0.01
# Quick mode only: the hybrid's CGE step is lr x this (a sign step moves every coordinate by
# lr, a CGE step by lr*|g_i| ~ lr*1e-2, and the 64-coordinate subset touches each coordinate
# in 1.6% of the steps). TT-MLP r=6, 300 signRGE + 300 CGE steps: x1 52%, x10 66%, x30 72%,
# x100 diverges.
QUICK_CGE_LR_SCALE = 30.0


def _settings(quick: bool) -> dict:
    if quick:
        # "epochs" are chunks of `chunk` steps (validation after each); decay every 10 real
        # epochs of full MNIST = 9,380 steps, i.e. never within the quick budget.
        chunk = 100
        return dict(quick=True, n_train=10000, n_val=2000, chunk=chunk, chunks=6,
                    mlp_zo_chunks=2, mlp_zo_chunk=60, decay_every=math.ceil(9380 / chunk),
                    cge_coordinates=64, zo_mu=QUICK_ZO_MU,
                    hybrid=dict(patience=1, max_coarse_epochs=3, mu=QUICK_ZO_MU,
                                cge_lr_scale=QUICK_CGE_LR_SCALE),
                    cge_steps=10, ranks=(10, 6, 4), fa_chunks=6)
    return dict(quick=False, n_train=None, n_val=None, chunk=None, chunks=100,
                mlp_zo_chunks=100, mlp_zo_chunk=None, decay_every=10, cge_coordinates=None,
                zo_mu=None, hybrid=dict(patience=3), cge_steps=None, cge_epochs=5,
                ranks=(10, 6, 4), fa_chunks=100)


def _lr(method: str, quick: bool) -> float:
    return QUICK_LR[method] if quick else 1e-3


def _tasks(cfg: dict, device: str) -> dict:
    """Every run as a picklable task dict for :func:`bpfree.ttzo.experiment.run_task`."""
    base = dict(n_train=cfg["n_train"], n_val=cfg["n_val"], seed=SEED, lr=1e-3, gamma=0.9,
                decay_every=cfg["decay_every"], batch_size=64, device=device,
                epochs=cfg["chunks"], max_steps_per_epoch=cfg["chunk"], sp_params=3962)
    hyb = dict(cfg["hybrid"], cge_coordinates=cfg["cge_coordinates"])
    tasks = {}
    quick = cfg["quick"]
    zo = {} if cfg["zo_mu"] is None else {"mu": cfg["zo_mu"]}

    def kwargs(m):
        return hyb if m == "hybrid" else dict(zo) if m in ("rge", "sign_rge") else {}

    for r in cfg["ranks"]:
        for m in ("fo", "rge", "sign_rge", "hybrid"):
            tasks[(f"tt{r}", m)] = dict(base, model="tt", rank=r, method=m, lr=_lr(m, quick),
                                        method_kwargs=kwargs(m))
    for net in ("mlp", "small-mlp", "sp"):
        for m in ("fo", "sign_rge", "hybrid"):
            t = dict(base, model=net, method=m, lr=_lr(m, quick), method_kwargs=kwargs(m))
            if net == "mlp" and m != "fo":   # 814K-dim ZO: ~0.5 s per step on one CPU thread
                t.update(epochs=cfg["mlp_zo_chunks"], max_steps_per_epoch=cfg["mlp_zo_chunk"])
                if m == "hybrid":
                    # switch after one chunk in quick mode; full mode caps CGE at the TT-MLP's
                    # d = 3,962 random coordinates per step (814K + 1 evaluations are
                    # out of reach).
                    t["method_kwargs"] = (dict(hyb, max_coarse_epochs=1) if cfg["quick"]
                                          else dict(hyb, cge_coordinates=3962))
            tasks[(net, m)] = t
    for m in ("fg-w", "fg-a", "fa", "dfa"):
        tasks[("mlp", m)] = dict(base, model="mlp", method=m, lr=_lr(m, quick),
                                 epochs=cfg["fa_chunks"])
    # Full-coordinate CGE from scratch for the queries-to-85% comparison.
    if cfg["quick"]:
        tasks[("tt6", "cge")] = dict(base, model="tt", rank=6, method="cge", lr=_lr("cge", True),
                                     epochs=cfg["cge_steps"], max_steps_per_epoch=1,
                                     decay_every=10**6)
    else:
        tasks[("tt6", "cge")] = dict(base, model="tt", rank=6, method="cge",
                                     epochs=cfg["cge_epochs"])
    return tasks


# Rough cost on one CPU thread (s per step) to submit the longest tasks first.
_COST = {"fo": 0.015, "rge": 0.08, "sign_rge": 0.06, "hybrid": 0.12, "cge": 6.5,
         "fg-w": 0.05, "fg-a": 0.015, "fa": 0.008, "dfa": 0.008}


def _cost(task: dict) -> float:
    per = _COST[task["method"]] * (8.0 if task["model"] == "mlp" and task["method"] in
                                   ("sign_rge", "hybrid") else 1.0)
    return per * task["epochs"] * (task.get("max_steps_per_epoch") or 938)


def _run_all(tasks: dict, workers: int) -> dict:
    from bpfree.ttzo.experiment import run_task

    order = sorted(tasks, key=lambda k: -_cost(tasks[k]))
    return run_keyed(run_task, tasks, workers, order=order)


def _best(res: dict) -> float:
    acc = [a for a in res["log"]["val_acc"] if math.isfinite(a)]
    return max(acc) if acc else float("nan")


def _budget(res: dict) -> str:
    t = res["task"]
    steps = res["steps"]
    text = f"{steps} steps"
    if t["method"] == "hybrid":
        h = res["history"]["steps"]
        text = f"{steps} steps ({h['sign_rge']} signRGE + {h['cge']} CGE)"
    if res["log"].get("diverged"):
        # the best accuracy is then that of the epochs before the divergence
        text += f", DIVERGED ({res['log']['diverged']})"
    return text


def _plot_fig1(results: dict, path: Path) -> str:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for key, label in ((("tt6", "rge"), "ZO-RGE"), (("tt6", "sign_rge"), "ZO-signRGE"),
                       (("tt6", "cge"), "ZO-CGE (momentum 0.9)"),
                       (("tt6", "hybrid"), "hybrid ZO")):
        log = results[key]["log"]
        # The hybrid shares signRGE's first stage: dashed, so the signRGE curve shows under it.
        style = "--" if label == "hybrid ZO" else "-"
        ax.plot([int(b) for b in log["batch_forwards"]], list(log["val_acc"]), style,
                marker="o", markersize=3, label=label)
    ax.axhline(85.0, color="grey", linestyle=":", linewidth=1, label="85% (the paper's target)")
    ax.set_xscale("log")
    ax.set_xlabel("mini-batch loss evaluations (batch forwards)")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title("TT-MLP r=6 on MNIST (Fig. 1)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return str(save_figure(fig, path, ROOT))


def run(quick: bool):
    import torch

    from bpfree.bench import describe_device
    from bpfree.tt import tt_mlp, tt_mlp_num_parameters
    from bpfree.ttzo import queries_to_accuracy
    from bpfree.ttzo.experiment import compression_ratio

    t_start = time.perf_counter()
    cfg = _settings(quick)
    use_cuda = (not quick) and torch.cuda.is_available()
    device = "cuda" if use_cuda else "cpu"
    workers = 1 if use_cuda else default_workers()
    tasks = _tasks(cfg, device)
    results = _run_all(tasks, workers)

    rows = []

    def row(table, method, setting, metric, value, paper=None):
        rows.append({"table": table, "method": method, "setting": setting, "metric": metric,
                     "value": float(value), "paper": None if paper is None else float(paper)})

    # Parameter counts (pure arithmetic, checked against the paper).
    for r, paper in ((6, 3962), (10, 8314)):
        row(TP, f"TT-MLP r={r}", "ranks [1, r, r, r, 1]", "parameters",
            tt_mlp_num_parameters(tt_mlp(r)), paper)

    # Table 1.
    for net in ("mlp", "small-mlp", "tt6", "sp"):
        p_params, p_fo, p_sign, p_hyb = PAPER_T1[net]
        fo, sign, hyb = (results[(net, m)] for m in ("fo", "sign_rge", "hybrid"))
        setting = f"FO {_budget(fo)}; ZO {_budget(sign)}"
        row(T1, LABELS[net], setting, "params", fo["params"], p_params)
        row(T1, LABELS[net], setting, "FO", _best(fo), p_fo)
        row(T1, LABELS[net], setting, "ZO-signRGE", _best(sign), p_sign)
        row(T1, LABELS[net], setting, "Hybrid ZO", _best(hyb), p_hyb)

    # Table 2.
    fo_dense = results[("mlp", "fo")]
    row(T2, "FC-1024", f"{_budget(fo_dense)}", "ratio", 1.0, 1.0)
    row(T2, "FC-1024", f"{_budget(fo_dense)}", "params", fo_dense["params"], 814090)
    row(T2, "FC-1024", f"{_budget(fo_dense)}", "FO-AD", _best(fo_dense), 97.43)
    for r in cfg["ranks"]:
        p_ratio, p_params, p_fo, p_rge, p_sign, p_hyb = PAPER_T2[r]
        res = {m: results[(f"tt{r}", m)] for m in ("fo", "rge", "sign_rge", "hybrid")}
        label, setting = f"TT-MLP r={r}", _budget(res["sign_rge"])
        row(T2, label, setting, "ratio", compression_ratio(res["fo"]["params"]), p_ratio)
        row(T2, label, setting, "params", res["fo"]["params"], p_params)
        row(T2, label, setting, "FO-AD", _best(res["fo"]), p_fo)
        row(T2, label, setting, "ZO-RGE", _best(res["rge"]), p_rge)
        row(T2, label, setting, "ZO-signRGE", _best(res["sign_rge"]), p_sign)
        row(T2, label, setting, "Hybrid ZO", _best(res["hybrid"]), p_hyb)

    # Table 3.
    t3 = {"HZO": ("mlp", "hybrid"), "TT-HZO (proposed)": ("tt6", "hybrid"),
          "SP-HZO": ("sp", "hybrid"), "FG-W": ("mlp", "fg-w"), "FG-A": ("mlp", "fg-a"),
          "FA": ("mlp", "fa"), "DFA": ("mlp", "dfa")}
    for label, key in t3.items():
        res = results[key]
        p_params, p_evals, p_acc = PAPER_T3[label]
        setting = _budget(res)
        row(T3, label, setting, "params", res["params"], p_params)
        if key[1] == "hybrid":
            # the paper's "# of loss eval." per iteration of the (full) CGE stage: d + 1
            row(T3, label, setting, "loss evals per CGE iteration (d + 1)", res["params"] + 1,
                p_evals)
        row(T3, label, setting, "best accuracy (%)", _best(res), p_acc)

    # Queries to 85% (and, in quick mode, to a lower target the quick budget can reach).
    targets = (85.0, 20.0) if quick else (85.0,)
    queries = {}
    for m, label in (("sign_rge", "ZO-signRGE"), ("cge", "ZO-CGE")):
        res = results[("tt6", m)]
        log = types.SimpleNamespace(**res["log"])
        for target in targets:
            q = queries_to_accuracy(log, target)
            paper = PAPER_QUERIES[m] if target == 85.0 else None
            queries[(m, target)] = q
            if q is not None:
                row(TQ, label, _budget(res), f"batch forwards to {target:g}%", q, paper)
            else:
                row(TQ, label, _budget(res),
                    f"batch forwards to {target:g}%: not reached, lower bound (= budget run)",
                    res["batch_forwards"], paper)

    mode = "quick" if quick else "full"
    figures = [{"path": _plot_fig1(results, FIGURES / f"tt-zo-{mode}-fig1.png"),
                "caption": "Validation accuracy vs mini-batch loss evaluations, TT-MLP r=6 "
                           "(Fig. 1)"}]
    run_info = {f"{k[0]}/{k[1]}": {"seconds": v["seconds"], "steps": v["steps"],
                                   "batch_forwards": v["batch_forwards"],
                                   "params": v["params"], "val_acc": v["log"]["val_acc"],
                                   "switch_epoch": v["log"]["switch_epoch"]}
                for k, v in sorted(results.items())}
    budget_note = (
        f"QUICK run, not the paper's budget: {cfg['n_train']} training / {cfg['n_val']} "
        f"validation images (first of MNIST train / test), {cfg['chunks']} x {cfg['chunk']} "
        f"steps of batch 64 per run (about {cfg['chunks'] * cfg['chunk'] / 938:.2f} epochs of "
        f"full MNIST); the dense MLP's ZO runs (814K-dim, ~0.5 s per signRGE step on one "
        f"thread) only {cfg['mlp_zo_chunks'] * cfg['mlp_zo_chunk']} steps; validation every {cfg['chunk']} steps; "
        "no learning-rate decay is reached. None of these rows is a full run; they are not "
        "expected to match the paper's converged 100-epoch numbers."
        if quick else
        "FULL run: the paper's settings (60k / 10k, 100 epochs of 938 steps, full CGE in the "
        "hybrid, stall patience 3 epochs)."
    )
    notes = [
        budget_note,
        ("lr 1e-3 (SGD for FO, sign step for signRGE, heavy-ball momentum 0.9 for CGE), x0.9 "
         "every 10 epochs; N = 10, mu = 0.1 for RGE / signRGE; mu = 0.01 for CGE (§5.1)."
         if not quick else
         "QUICK deviations from §5.1 (which is tuned for 100 epochs and leaves every method "
         "near chance in < 1 epoch), picked from 600-step pilots on the quick subset and "
         "validated on the same validation images, so quick accuracies are optimistic by "
         "the selection. (1) learning rates: "
         + ", ".join(f"{k} {v:g}" for k, v in QUICK_LR.items()) + " (full: 1e-3). "
         f"(2) RGE / signRGE radius mu = {QUICK_ZO_MU:g} instead of 0.1: with Gaussian "
         "directions on all TT-core entries (std 0.16-0.32 at init) mu = 0.1 leaves the "
         "linear regime (cosine of the signRGE step with the true gradient 0.007 vs 0.035 at "
         "mu = 0.01; TT-MLP r=6 after 600 signRGE steps: 30% vs 63%). (3) the hybrid's CGE "
         f"stage steps with lr x {QUICK_CGE_LR_SCALE:g} (a sign step moves every coordinate "
         "by lr, a CGE step by lr*|g_i|, and the coordinate subset touches each coordinate "
         "rarely). N = 10; CGE mu = 0.01 and momentum 0.9 as in §5.1."),
        "accuracy columns are the best validation accuracy over the evaluations of a run "
        "(MNIST test images as validation set, as the paper's 'validation accuracy').",
        ("hybrid ZO (quick): signRGE until the epoch-chunk training loss stalls (patience 1) or "
         f"after {cfg['hybrid'].get('max_coarse_epochs')} chunks, then CGE with momentum on a "
         f"random subset of {cfg['cge_coordinates']} coordinates per step (65 loss evaluations "
         "per step instead of d + 1), so that the CGE stage runs at all on 2 CPU cores."
         if quick else "hybrid ZO: full-coordinate CGE (d + 1 evaluations per step) after the stall."),
        "queries to 85%: batch forwards = mini-batch loss evaluations (N + 1 = 11 per signRGE "
        "step, d + 1 = 3,963 per CGE step), counted at the first validation reaching the "
        "target; when a run never reaches it the row's metric says 'lower bound' and the "
        "value is the budget it ran. The paper: 340K (signRGE) vs 11M (CGE)."
        + (f" Quick: full CGE ran {cfg['cge_steps']} steps (one step = 6-7 s on one thread)." if quick else ""),
        "SP-MLP: GraSP pruning at initialisation of the 784-1024-10 MLP to 3,962 trainable "
        "parameters in all (2,928 kept weights + 1,034 biases; the paper's SP-MLP has 4,089). "
        "Small MLP 784-10-10 has 7,960 parameters (the paper lists 7,940).",
        "Table 2's smallest model: r = 4 gives 2,506 parameters (ratio 0.0031); the paper's "
        "2,698 (ratio 0.003) is not reachable with uniform ranks [1, r, r, r, 1].",
        "Table 3: FG-A is activity-perturbed forward gradient without Ren et al.'s local "
        "losses (the paper's row is LG-FG-A, 429K params); FG-W, FG-A, FA and DFA run on our "
        "814K-parameter MLP (the paper's rows use 272K-1.26M-parameter models); the paper's "
        "FLOPS / STP / SZO-SCD rows are not reproduced.",
    ]
    extra = {
        "figures": figures,
        "notes": notes,
        "settings": {k: v for k, v in cfg.items()},
        "workers": workers,
        "runs": run_info,
        "queries_to_target": {f"{m}@{t:g}": q for (m, t), q in queries.items()},
        "total_seconds": time.perf_counter() - t_start,
        "full_run": not quick,
    }
    if not use_cuda:
        extra["device"] = pool_device(workers)
    else:
        extra["device"] = describe_device("cuda")
    return rows, extra
