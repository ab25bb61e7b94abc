"""``bpfree demo``: adapt a deployed classifier to corrupted inputs with forward passes only.

The story a user of an inference-only device lives through, at laptop scale, in about a
minute on two CPU cores and with no network:

1. pretrain a small MLP on scikit-learn's bundled digits with ordinary back-propagation
   (this happens "in the factory");
2. the deployed sensor drifts: inputs lose contrast, gain a brightness offset and Gaussian
   noise, and accuracy drops;
3. adapt on the device, BP-free: layer-wise node perturbation (PMT Eq. 9–10) with
   gradient-norm scaling (PMT Eq. 8), in the memory-lean mode (directions regenerated from
   seeds, layer inputs computed once, only the suffix after the perturbed layer re-run);
4. report accuracy before and after, forward passes used, and the measured peak extra
   memory of a training step over plain inference.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch import nn

from .estimators import get_estimator
from .models import digits_mlp
from .objective import Objective
from .optim import ZOOptimizer
from .transforms import gradient_norm_scaling

DEFAULTS = dict(seed=0, epochs=20, batch_size=64, queries=16, mu=1e-2, lr=0.3,
                estimator="node_perturbation", noise=0.2, contrast=0.5, brightness=0.3,
                mode="lean")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n")[0].strip("`")
    parser.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="run seed (data split, init, directions)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--epochs", type=int, default=DEFAULTS["epochs"], help="BP-free adaptation epochs")
    parser.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"], help="mini-batch size N")
    parser.add_argument("--queries", type=int, default=DEFAULTS["queries"], help="queries Q per layer and step")
    parser.add_argument("--mu", type=float, default=DEFAULTS["mu"], help="perturbation radius μ")
    parser.add_argument("--lr", type=float, default=DEFAULTS["lr"], help="learning rate η (before GNS)")
    parser.add_argument("--estimator", default=DEFAULTS["estimator"],
                        choices=["node_perturbation", "rge", "spsa", "sign_spsa"],
                        help="forward-only gradient estimator")
    parser.add_argument("--noise", type=float, default=DEFAULTS["noise"],
                        help="std of the Gaussian noise added to pixels in [0, 1]")
    parser.add_argument("--contrast", type=float, default=DEFAULTS["contrast"],
                        help="contrast factor of the sensor drift (1 = unchanged)")
    parser.add_argument("--brightness", type=float, default=DEFAULTS["brightness"],
                        help="brightness offset of the sensor drift (0 = unchanged)")
    parser.add_argument("--mode", default=DEFAULTS["mode"], choices=["lean", "batched"],
                        help="lean: perturb in place, O(Q) extra memory; batched: stacked forwards")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def corrupt(x: torch.Tensor, *, noise: float, contrast: float, brightness: float, seed: int) -> torch.Tensor:
    """Deterministic sensor drift: lower contrast, a brightness offset and Gaussian noise.

    ``x' = clip(contrast·x + brightness + noise·ε, 0, 1)`` with ``ε ~ N(0, 1)`` drawn from ``seed``.
    """
    if not (noise >= 0 and noise < float("inf")):
        raise ValueError(f"noise must be a finite number >= 0, got {noise}")
    if not 0 < contrast <= 1:
        raise ValueError(f"contrast must be in (0, 1], got {contrast}")
    if not -1 <= brightness <= 1:
        raise ValueError(f"brightness must be in [-1, 1], got {brightness}")
    gen = torch.Generator().manual_seed(seed)
    y = contrast * x + brightness
    return (y + noise * torch.randn(x.shape, generator=gen)).clamp(0.0, 1.0)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def pretrain(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, seed: int, epochs: int = 60) -> None:
    """Ordinary BP training on clean data: the factory model the device ships with."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()


def run(*, seed=0, epochs=20, batch_size=64, queries=16, mu=1e-2, lr=0.3,
        estimator="node_perturbation", noise=0.2, contrast=0.5, brightness=0.3,
        mode="lean", progress=True) -> dict:
    """Run the whole demo and return its results (see module docstring)."""
    from tqdm.auto import tqdm

    from .data import load_digits_split
    from .memory import analytic, measure_peak

    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch-size must be >= 1, got {epochs} and {batch_size}")
    start = time.perf_counter()
    torch.manual_seed(seed)
    x_tr, y_tr, x_te, y_te = (torch.as_tensor(a) for a in load_digits_split(seed=seed))
    model = digits_mlp()
    pretrain(model, x_tr, y_tr, seed=seed)
    clean_acc = accuracy(model, x_te, y_te)

    xc_tr = corrupt(x_tr, noise=noise, contrast=contrast, brightness=brightness, seed=seed + 1)
    xc_te = corrupt(x_te, noise=noise, contrast=contrast, brightness=brightness, seed=seed + 2)
    acc_before = accuracy(model, xc_te, y_te)

    est_options = {"num_queries": queries, "mu": mu}
    opt = ZOOptimizer(model.parameters(), lr=lr, estimator=get_estimator(estimator, **est_options),
                      transforms=[gradient_norm_scaling()], mode=mode, seed=seed)

    # Memory: one training step against plain inference on the same batch, measured.
    probe = Objective(model, xc_tr[:batch_size], y_tr[:batch_size])
    _, infer_mem = measure_peak(lambda: probe())
    gen = torch.Generator().manual_seed(seed + 3)
    losses = []
    total = epochs * ((len(xc_tr) + batch_size - 1) // batch_size)
    step_mem = None
    with tqdm(total=total, desc="BP-free adaptation", disable=not progress, unit="step",
              mininterval=0.5) as bar:
        for _ in range(epochs):
            for idx in torch.randperm(len(xc_tr), generator=gen).split(batch_size):
                obj = Objective(model, xc_tr[idx], y_tr[idx])
                if step_mem is None:
                    loss, step_mem = measure_peak(opt.step, obj)
                else:
                    loss = opt.step(obj)
                losses.append(loss)
                bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
                bar.update()
    acc_after = accuracy(model, xc_te, y_te)
    # The same figure from the analytic rules (PMT Table 3, per layer), for comparison.
    family = "zo_np" if estimator == "node_perturbation" else "zo_wp"
    example = xc_tr[:batch_size]
    rule = analytic(model, f"{family}_{mode}", example_input=example, num_queries=queries)
    base = analytic(model, "inference", example_input=example)
    return {
        "acc_clean": clean_acc,
        "acc_before": acc_before,
        "acc_after": acc_after,
        "forward_passes": opt.forward_passes,
        "peak_extra_bytes": max(0, int(step_mem.peak_bytes) - int(infer_mem.peak_bytes)),
        "train_step_peak_bytes": int(step_mem.peak_bytes),
        "inference_peak_bytes": int(infer_mem.peak_bytes),
        "analytic_extra_bytes": rule.total - base.total,
        "analytic_rule": rule.method,
        "steps": opt.step_count,
        "final_loss": losses[-1],
        "seconds": time.perf_counter() - start,
        "seed": seed,
        "config": {"estimator": estimator, "queries": queries, "mu": mu, "lr": lr, "epochs": epochs,
                   "batch_size": batch_size, "noise": noise, "contrast": contrast, "brightness": brightness,
                   "mode": mode, "transforms": ["gradient_norm_scaling"]},
    }


def format_table(r: dict) -> str:
    def kib(b):
        return f"{b / 1024:,.1f} KiB"

    rows = [
        ("accuracy on clean test digits (BP-pretrained)", f"{r['acc_clean']:.1%}"),
        ("accuracy on corrupted test digits, before", f"{r['acc_before']:.1%}"),
        ("accuracy on corrupted test digits, after BP-free", f"{r['acc_after']:.1%}"),
        ("gain", f"{(r['acc_after'] - r['acc_before']) * 100:+.1f} points"),
        ("forward passes used", f"{r['forward_passes']:,}"),
        ("peak memory, plain inference", kib(r["inference_peak_bytes"])),
        ("peak memory, one training step", kib(r["train_step_peak_bytes"])),
        ("peak extra memory of training over inference", kib(r["peak_extra_bytes"])),
        (f"  same, analytic ({r['analytic_rule']} rule, PMT Table 3)", kib(r["analytic_extra_bytes"])),
        ("wall time", f"{r['seconds']:.1f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    rule = "-" * len(max(lines, key=len))
    c = r["config"]
    head = (f"bpfree demo: {c['estimator']} (Q={c['queries']}, mu={c['mu']}, lr={c['lr']}, "
            f"{c['epochs']} epochs, batch {c['batch_size']}, mode {c['mode']}), seed {r['seed']}")
    return "\n".join([head, rule, *lines, rule])


def main(args: argparse.Namespace) -> int:
    result = run(seed=args.seed, epochs=args.epochs, batch_size=args.batch_size,
                 queries=args.queries, mu=args.mu, lr=args.lr, estimator=args.estimator,
                 noise=args.noise, contrast=args.contrast, brightness=args.brightness,
                 mode=args.mode, progress=not args.no_progress)
    print(format_table(result))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {path}")
    return 0
