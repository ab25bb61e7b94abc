"""QZO-FF at MNIST scale: fixed-point forward gradients vs backprop for few-shot and OOD adaptation.

Analogues of Feng et al. (NeurIPS 2024, "Stepping Forward on the Last Mile") Tables 2 and 5,
Fig. 2 (bit width, m), Fig. 6 (loss landscape) and Fig. 3 (memory), on a small CNN
(``mnist-cnn``) pretrained with BP on MNIST from ../shared/data. (a) Few-shot: backbone
pretrained on digits 0-4, 5-way 5-shot test episodes (15 queries) from digits 5-9 and, cross
domain, from Fashion-MNIST; per episode zero-shot ProtoNet, BP / FF full fine-tuning (ProtoNet
on the adapted features) and linear probing (the prototype-initialised episode head), FF LP in
16w8a. (b) OOD: a backbone pretrained on all digits adapts its linear decoder ("LP 1 LN") on
1000 corrupted training images (``bpfree.data.corruptions``, severity 1 / 3 / 5 = easy /
medium / hard) and is tested on corrupted test images. (c) bit widths and (d) m on the hard
Gaussian-noise task, (e) loss landscape along the PCA plane of the BP / FF trajectories, and the
analytic scratch-vs-weights memory of ``bpfree.memory``. The paper column holds the paper's
numbers for the analogous cell (ViT tiny on CIFAR-10-C, VWW, ...): a different model and data
set, shown for the shape of the comparison.
"""

from __future__ import annotations

import concurrent.futures as cf
import statistics
import time
from pathlib import Path

import torch

from bpfree.plotting import pyplot, save_figure
from bpfree.bench.parallel import default_workers, spawn_pool

NAME = "qzo-ff"
DESCRIPTION = __doc__.split("\n\n")[0].replace("\n", " ")
SEED = 0

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "results" / "figures"

T_FEW = "Table 2 analogue: 5-way 5-shot accuracy (%), 100+ test episodes"
T_FEW_COST = "Few-shot cost per episode"
T_OOD = "Table 5 analogue: OOD adaptation, LP 1 LN, accuracy (%)"
T_BITS = "Fig. 2 / Fig. 6 analogue: bit width (hard Gaussian noise, LP)"
T_M = "Fig. 2 analogue: directions per step m (hard Gaussian noise, LP, equal steps)"
T_LAND = "Fig. 6 analogue: trajectories of the loss-landscape task"
T_MEM = "Fig. 3 analogue: analytic training memory (MB)"

SEVERITIES = {"easy": 1, "medium": 3, "hard": 5}
# Table 5, "LP 1 LN" block (ViT tiny pretrained on CIFAR-10, decoder tuned on CIFAR-10-C):
# mean (std over 5 runs) for easy / medium / hard.
PAPER_T5 = {
    "Zero-shot": ((82.48, 74.59, 62.40), None),
    "BP": ((83.75, 77.88, 70.03), (0.67, 0.85, 1.20)),
    "FF": ((83.37, 77.04, 68.65), (0.60, 0.66, 0.70)),
    "FF, Sparse (90%)": ((83.34, 77.11, 68.63), (0.59, 0.68, 0.95)),
    "FF, Quant (16w8a)": ((83.23, 76.73, 68.28), (0.57, 0.75, 0.87)),
}
OOD_VARIANTS = {
    "Zero-shot": {"method": "zero-shot"},
    "BP": {"method": "bp"},
    "FF": {"method": "ff", "precision": "fp32"},
    "FF, Sparse (90%)": {"method": "ff", "precision": "fp32", "sparse": "topk",
                         "sparsity": 0.9},
    "FF, Quant (16w8a)": {"method": "ff", "precision": "16w8a"},
}
# Bit widths at FF's rate. Paper: Fig. 2 (VWW, ViT tiny LP: 16w8a 87.30 %, 0.63 below BP
# fp16, hence BP fp16 87.93 %) and Fig. 6 (g) (8w8a LP test error 51.35 %: not converged).
BIT_VARIANTS = {
    "BP fp32": ({"method": "bp"}, None),
    "BP (paper: fp16)": None,  # placeholder so the paper's BP number sits in the table
    "FF fp32": ({"method": "ff", "precision": "fp32"}, None),
    "FF fp16": ({"method": "ff", "precision": "fp16"}, None),
    "FF 16w8a": ({"method": "ff", "precision": "16w8a"}, 87.30),
    "FF 16w8a, tight range (headroom 1)": ({"method": "ff", "precision": "16w8a",
                                            "w_headroom": 1.0}, None),
    "FF 8w8a": ({"method": "ff", "precision": "8w8a"}, 100 - 51.35),
    "FF 8w8a, tight range (headroom 1)": ({"method": "ff", "precision": "8w8a",
                                           "w_headroom": 1.0}, None),
}
BIT_VARIANTS.pop("BP (paper: fp16)")
PAPER_BP_FP16_LP = 87.30 + 0.63
M_VALUES = (1, 3, 10)
# Fig. 3 (ViT tiny, full fine-tuning): scratch MB.
PAPER_MEM = {("bp", "fp16", "FT"): 31.64, ("ff", "fp16", "FT"): 11.43,
             ("ff", "16w8a", "sparse"): 0.40}


def _settings(quick: bool) -> dict:
    if quick:
        return dict(pre_a=dict(images=10000, epochs=2), pre_b=dict(images=20000, epochs=2),
                    episodes=100, chunk=25, fs_steps=10, corruptions=("gaussian_noise",
                                                                      "contrast"),
                    ood_epochs=10, seeds=(0, 1, 2), landscape_steps=21)
    return dict(pre_a=dict(images=30000, epochs=3), pre_b=dict(images=60000, epochs=3),
                episodes=600, chunk=50, fs_steps=30,
                corruptions=("gaussian_noise", "shot_noise", "contrast", "motion_blur",
                             "fog"),
                ood_epochs=30, seeds=(0, 1, 2, 3, 4), landscape_steps=31)


def _plot_curves(curves: dict, title: str, path: Path, xlabel="step") -> str:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for label, ys in curves.items():
        k = max(1, len(ys) // 25)
        smooth = [statistics.mean(ys[max(0, i - k + 1):i + 1]) for i in range(len(ys))]
        ax.plot(range(1, len(ys) + 1), smooth, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("training loss (running mean)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return str(save_figure(fig, path, ROOT))


def _memory_rows(batch_size: int, m: int):
    from bpfree.memory import scratch_vs_weights

    rows = []
    for model in ("mnist-cnn", "mnist-vit"):
        for r in scratch_vs_weights(model, batch_size=batch_size, num_queries=m):
            rows.append(dict(r, model=model))
    return rows


def run(quick: bool):
    from bpfree.fewshot import mean_confidence_interval
    from bpfree.memory import plot_scratch_vs_weights
    from bpfree.qzoff.experiment import FEWSHOT_METHODS, run_task

    cfg = _settings(quick)
    seed = int(torch.initial_seed()) % (2**31)  # SEED, or bpfree bench --seed
    mode = "quick" if quick else "full"
    t_start = time.perf_counter()
    workers = default_workers()
    timings = {}
    with spawn_pool(workers) as pool:
        # Stage 1: the two BP-pretrained backbones.
        fa = pool.submit(run_task, ("pretrain", dict(kind="mnist", classes=range(5), lr=3e-3,
                                                      seed=seed, **cfg["pre_a"])))
        fb = pool.submit(run_task, ("pretrain", dict(kind="mnist", classes=None, lr=3e-3,
                                                      seed=seed, **cfg["pre_b"])))
        pre_a, pre_b = fa.result(), fb.result()
        timings["pretrain"] = time.perf_counter() - t_start
        # Stage 2: everything else.
        tasks = {}
        hard = ("gaussian_noise", SEVERITIES["hard"])
        ablation = {k: v[0] for k, v in BIT_VARIANTS.items()}
        ablation.update({f"FF fp32, m={m}": {"method": "ff", "precision": "fp32", "m": m}
                         for m in M_VALUES if m != 3})
        share = {k: "FF fp32" for k in ablation if k.startswith("FF") and k != "FF fp32"}
        tasks[("ablation",)] = ("ood", dict(state=pre_b["state"], corruption=hard[0],
                                            severity=hard[1], variants=ablation,
                                            epochs=cfg["ood_epochs"], seeds=cfg["seeds"],
                                            data_seed=seed, select_lr=share))
        land_paths = {c: str(FIGURES / f"qzo-ff-{mode}-landscape-{c.split()[0].lower()}"
                                        f"{'-' + c.split()[1] if ' ' in c else ''}.png")
                      for c in ("BP", "FF fp32")}
        land_runs = {"BP": {"method": "bp", "lr": 3e-3},
                     "FF fp32": {"method": "ff", "precision": "fp32", "lr": 1e-2},
                     "FF 16w8a": {"method": "ff", "precision": "16w8a", "lr": 1e-2},
                     "FF 8w8a": {"method": "ff", "precision": "8w8a", "lr": 1e-2}}
        tasks[("landscape",)] = ("landscape", dict(
            state=pre_b["state"], corruption=hard[0], severity=hard[1], runs=land_runs,
            paths=land_paths, epochs=cfg["ood_epochs"], seed=seed, data_seed=seed,
            steps=cfg["landscape_steps"]))
        few_domains = {"MNIST digits 5-9": ("mnist", (5, 6, 7, 8, 9)),
                       "Fashion-MNIST (cross-domain)": ("fashion-mnist", tuple(range(10)))}
        for dom, (kind, classes) in few_domains.items():
            for lo in range(0, cfg["episodes"], cfg["chunk"]):
                tasks[("fewshot", dom, lo)] = ("fewshot", dict(
                    state=pre_a["state"], num_classes=5, kind=kind, classes=classes,
                    episodes=cfg["episodes"], lo=lo, hi=min(cfg["episodes"], lo + cfg["chunk"]),
                    steps=cfg["fs_steps"], lr_bp_ft=1e-3, lr_bp_lp=1e-3, lr_ff_ft=1e-3,
                    lr_ff_lp=1e-3, m=3, seed=seed))
        for c in cfg["corruptions"]:
            for level, sev in SEVERITIES.items():
                tasks[("ood", c, level)] = ("ood", dict(
                    state=pre_b["state"], corruption=c, severity=sev, variants=OOD_VARIANTS,
                    epochs=cfg["ood_epochs"], seeds=cfg["seeds"], data_seed=seed))
        t2 = time.perf_counter()
        futures = {pool.submit(run_task, task): key for key, task in tasks.items()}
        # Memory accounting runs here while the pool works.
        mem_rows = _memory_rows(batch_size=25, m=3)
        mem_png = plot_scratch_vs_weights(mem_rows, FIGURES / f"qzo-ff-{mode}-memory.png",
                                          title="Scratch vs weights, batch 25, m = 3")
        results = {}
        for fut in cf.as_completed(futures):
            results[futures[fut]] = fut.result()
        timings["stage2"] = time.perf_counter() - t2

    rows = []

    def row(table, method, setting, metric, value, paper=None):
        rows.append({"table": table, "method": method, "setting": setting, "metric": metric,
                     "value": float(value), "paper": None if paper is None else float(paper)})

    # (a) few-shot
    few = {}
    for dom in few_domains:
        chunks = sorted((k[2], v) for k, v in results.items() if k[0] == "fewshot" and k[1] == dom)
        accs = {mth: [a for _, ch in chunks for a in ch["accuracies"][mth]]
                for mth in FEWSHOT_METHODS}
        secs = {mth: sum(ch["seconds"][mth] for _, ch in chunks) for mth in FEWSHOT_METHODS}
        fws = chunks[0][1]["forwards"]
        few[dom] = {}
        for mth in FEWSHOT_METHODS:
            mean, hw = mean_confidence_interval(accs[mth])
            few[dom][mth] = (mean, hw)
            clf = "head" if "LP" in mth else "ProtoNet"
            row(T_FEW, mth, f"{dom}, {clf}", "accuracy (%)", mean)
            row(T_FEW, mth, f"{dom}, {clf}", "95% CI (±)", hw)
            if dom == next(iter(few_domains)):
                n_ep = len(accs[mth])
                row(T_FEW_COST, mth, f"{cfg['fs_steps']} steps on 25 support images",
                    "forward passes (per sample)", fws[mth])
                row(T_FEW_COST, mth, f"{cfg['fs_steps']} steps on 25 support images",
                    "seconds per episode", secs[mth] / n_ep)
    within5 = sum(abs(few[d][f"FF {k}"][0] - few[d][f"BP {k}"][0]) <= 5
                  for d in few for k in ("FT", "LP"))

    # (b) OOD
    ood_acc = {}
    for level, sev in SEVERITIES.items():
        for i_m, (label, _) in enumerate(OOD_VARIANTS.items()):
            per_c = [results[("ood", c, level)][label]["accuracy"] for c in cfg["corruptions"]]
            # mean over corruptions per seed, then mean / std over seeds
            n_seeds = len(per_c[0])
            per_seed = [statistics.mean(pc[s] for pc in per_c) for s in range(n_seeds)]
            mean = statistics.mean(per_seed)
            ood_acc[(label, level)] = mean
            li = list(SEVERITIES).index(level)
            pm, ps = PAPER_T5[label]
            setting = f"{level} (severity {sev}), mean of {len(cfg['corruptions'])} corruptions"
            row(T_OOD, label, setting, "accuracy (%)", mean, pm[li])
            if n_seeds > 1:
                row(T_OOD, label, setting, "std over seeds",
                    statistics.stdev(per_seed), None if ps is None else ps[li])
        for c in cfg["corruptions"]:
            for label in OOD_VARIANTS:
                row(T_OOD, label, f"{level}: {c.replace('_', ' ')}", "accuracy (%)",
                    statistics.mean(results[("ood", c, level)][label]["accuracy"]))

    # (c) bit widths, (d) m
    abl = results[("ablation",)]
    setting = (f"Gaussian noise sev. 5, {cfg['ood_epochs']} epochs, lr {abl['FF fp32']['lr']:g}"
               f" (FF), {len(cfg['seeds'])} seeds")
    for label, spec in BIT_VARIANTS.items():
        r = abl[label]
        paper = spec[1] if label != "BP fp32" else PAPER_BP_FP16_LP
        row(T_BITS, label, setting, "accuracy (%)", statistics.mean(r["accuracy"]), paper)
        row(T_BITS, label, setting, "final loss (seed 0)", statistics.mean(r["loss"][-10:]))
    for m in M_VALUES:
        r = abl["FF fp32" if m == 3 else f"FF fp32, m={m}"]
        row(T_M, f"FF fp32, m={m}", setting, "accuracy (%)", statistics.mean(r["accuracy"]))
        row(T_M, f"FF fp32, m={m}", setting, "std over seeds",
            statistics.stdev(r["accuracy"]) if len(r["accuracy"]) > 1 else 0.0)
        row(T_M, f"FF fp32, m={m}", setting, "forward passes (per sample)", r["forwards"])

    # (e) landscape
    land = results[("landscape",)]
    land_paper = {"BP": None, "FF fp32": None, "FF 16w8a": None, "FF 8w8a": 100 - 51.35}
    for label, r in land["runs"].items():
        s = f"Gaussian noise sev. 5, lr {r['lr']:g}"
        row(T_LAND, label, s, "test accuracy (%)", r["test_accuracy"], land_paper[label])
        row(T_LAND, label, s, "final training loss", r["final_train_loss"])
        row(T_LAND, label, s, "distance travelled", r["distance"])

    # memory
    for r in mem_rows:
        label = f"{r['method'].upper()} {r['precision']} {r['mode']}"
        paper = PAPER_MEM.get((r["method"], r["precision"], r["mode"])) \
            if r["model"] == "mnist-vit" else None
        row(T_MEM, label, r["model"], "scratch (MB)", r["scratch_bytes"] / 1e6, paper)
        row(T_MEM, label, r["model"], "weights (MB)", r["weight_bytes"] / 1e6)

    figures = [
        {"path": _plot_curves({k: abl[k]["loss"] for k in BIT_VARIANTS},
                              "FF bit widths vs BP, LP on hard Gaussian noise (seed 0)",
                              FIGURES / f"qzo-ff-{mode}-bitwidth.png"),
         "caption": "Training loss of the linear decoder: BP, FF fp32 / fp16 / 16w8a / 8w8a "
                    "(Fig. 2 / Fig. 6 analogue)"},
        {"path": _plot_curves({f"m={m}": abl["FF fp32" if m == 3 else f"FF fp32, m={m}"]["loss"]
                               for m in M_VALUES},
                              "FF fp32: directions per step m at equal steps (seed 0)",
                              FIGURES / f"qzo-ff-{mode}-m.png"),
         "caption": "Training loss for m = 1, 3, 10 at equal steps (m costs 2m forwards per "
                    "step)"},
    ]
    for centre, fig in land["figures"].items():
        figures.append({"path": str(Path(fig["path"]).relative_to(ROOT)),
                        "caption": f"Loss contours around the final {centre} decoder along the "
                                   f"PCA plane of the BP / FF / 16w8a / 8w8a trajectories "
                                   f"(Fig. 6 analogue)"})
    figures.append({"path": str(Path(mem_png).relative_to(ROOT)),
                    "caption": "Scratch vs weight memory of BP and FF (fp16 / 16w8a, FT / LP / "
                               "sparse) for mnist-cnn and mnist-vit, batch 25 (Fig. 3 analogue)"})

    underflow = sorted({w.split(":")[0] for k, v in abl.items() if isinstance(v, dict)
                        for w in v.get("eps_underflow", [])})
    notes = [
        f"backbone mnist-cnn pretrained with BP (AdamW, cosine): digits 0-4 on "
        f"{pre_a['images']} images x {pre_a['epochs']} epochs -> {pre_a['test_accuracy']:.2f}% "
        f"(test, 5 classes); all digits on {pre_b['images']} x {pre_b['epochs']} -> "
        f"{pre_b['test_accuracy']:.2f}% (first 2000 test images)",
        f"few-shot: {cfg['episodes']} test episodes per domain, 5-way 5-shot, 15 queries; "
        f"{cfg['fs_steps']} full-batch steps on the support set, AdamW (0.9, 0.95), lr 1e-3 for "
        "BP and FF alike (the paper's Table 6 uses the same hyper-parameters for FF and BP); "
        "FF = QZO-FF sign-m-SPSA with m = 3, eps 1e-3 in fp32 (the paper's FF rows are fp16), "
        "Quant = 16w8a (16-bit weights with 4x headroom over max|w|, 8-bit perturbations and "
        "activations); FT rows classify with ProtoNet on the adapted features, LP rows with the "
        "prototype-initialised episode head; intervals are 95% normal half-widths",
        f"paper (Table 2, no MNIST column): FF within 5% of BP on 26 of 30 tasks; here FF is "
        f"within 5 points of BP on {within5} of 4 (FT, LP x 2 domains)",
        "OOD: LP 1 LN = the pretrained 10-way linear decoder adapted on 1000 corrupted training "
        "images (last 1000 of the MNIST training split, unseen in pretraining) and tested on "
        "1000 corrupted test images; severities 1 / 3 / 5 of the MNIST-C table; every learning "
        "rate is chosen from {3e-4, 1e-3, 3e-3, 1e-2} on a held-out fifth of the adaptation "
        f"images; {cfg['ood_epochs']} epochs, batch 100, cosine; mean and std over seeds "
        f"{list(cfg['seeds'])} of the mean over corruptions {list(cfg['corruptions'])}",
        "the decoder trains on cached backbone features: with static activation ranges this is "
        "the same computation as full-network forwards (16w8a features are computed with 8-bit "
        "activations calibrated on the adaptation images, fp16 with float16 rounding)",
        "paper column of Table 5: ViT tiny / CIFAR-10-C, LP 1 LN block (mean and std over 5 "
        "runs); of the bit-width table: VWW / ViT tiny LP (Fig. 2: 16w8a 87.30%, BP fp16 = "
        "87.30 + 0.63; Fig. 6 (g): 8w8a LP test error 51.35%, 'not converged')",
        "bit widths and m share FF fp32's selected learning rate, so only the arithmetic "
        "(or m) differs; 'headroom' scales the weight range over the initial max|w| (4 by "
        "default here; 1 is the paper's tight range)"
        + (f"; eps underflow warnings: {underflow}" if underflow else ""),
        "paper on m (Fig. 2, D-VPT fp16): m = 3 instead of 1 gains 1.22 points; no absolute "
        "values in the text, so the m table has no paper column",
        "landscape: LP decoder (15,690 weights) on hard Gaussian noise, fixed rates (BP 3e-3, "
        "FF 1e-2), trajectories recorded every step; contours of the training loss around the "
        "named run's final weights (trajectory-PCA plane, Li et al. 2018 §7); paper Fig. 6 "
        "reports test errors BP D-VPT 7.02%, FF D-VPT 11.06%, 16w8a D-VPT 11.38%, 8w8a LP "
        "51.35% / D-VPT 52.98% (not converged)",
        "memory: bpfree.memory.scratch_vs_weights (analytic rules) at batch 25, m = 3 for the "
        "benchmark CNN and mnist-vit (TinyViT dim 64); paper column (Fig. 3, ViT tiny FT: BP "
        "fp16 31.64 MB, FF fp16 11.43 MB scratch; FF 16w8a sparse 0.40 MB) on the mnist-vit rows "
        "only -- a 5.5M-parameter model at 224x224 there, 0.1M at 28x28 here",
        "not reproduced: the audio Table 4 (no audio data), D-VPT and 3-layer decoders of "
        "Table 5, sharpness-aware / kernel-norm ablations of Fig. 2",
    ]
    extra = {
        "figures": figures,
        "notes": notes,
        "seed": seed,
        "workers": workers,
        "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.items()},
        "pretrain": {k: {kk: vv for kk, vv in p.items() if kk != "state"}
                     for k, p in (("digits 0-4", pre_a), ("all digits", pre_b))},
        "ood_learning_rates": {f"{k[1]} {k[2]}": {lab: v.get("lr") for lab, v in r.items()
                                                  if isinstance(v, dict) and lab != "_meta"}
                               for k, r in results.items() if k[0] == "ood"},
        "ood_seconds": {f"{k[1]} {k[2]}": r["wall_seconds"] for k, r in results.items()
                        if k[0] == "ood"},
        "ablation_learning_rates": {k: v.get("lr") for k, v in abl.items()
                                    if isinstance(v, dict) and k != "_meta"},
        "ablation_lr_scores": abl["FF fp32"]["lr_scores"],
        "ablation_seconds": abl["wall_seconds"],
        "landscape": {"runs": land["runs"],
                      "explained_variance": {k: v["explained_variance_ratio"]
                                             for k, v in land["figures"].items()},
                      "seconds": land["wall_seconds"]},
        "fewshot_seconds": {f"{k[1]} {k[2]}": r["wall_seconds"] for k, r in results.items()
                            if k[0] == "fewshot"},
        "timings": dict(timings, total=time.perf_counter() - t_start),
    }
    return rows, extra
