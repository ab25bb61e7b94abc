"""Directions per second of one zeroth-order step, against a MeZO-style reference loop.

Weight perturbation (one-sided RGE, PMT Eq. 4) and layer-wise node perturbation (PMT Eq. 9–10)
in bpfree's lean and batched modes, on the 784–1024–10 MLP and a small CNN, batch 64, one
CPU thread. The reference loop is MeZO's (Malladi et al. 2023): per direction, perturb with
``torch.randn`` regenerated from its seed, forward, negate, forward, restore, update: four
regenerations and two forwards. Each step includes the parameter update.

"Directions" are perturbation directions evaluated (Q per step for weight perturbation,
Q per layer for layer-wise node perturbation). Useful GFLOP/s counts 2·MACs of the layer
work each method needs at batch 64 (Q+1 full forwards for weight perturbation, 2Q for the
MeZO loop, prefix once plus Q+1 suffixes per layer for node perturbation on a Sequential),
divided by the step's wall time, next to the machine's measured fp32 GEMM rate.

The PMT step rows (``_pmt_step_cost``) time one step of PMT's Algorithm 1 on the MNIST
MobileNet (blocks 1 and 4, the whole model; Q = 50, batch 100) and MCUNet-in1 block 3 (Q = 50,
batch 1) on the fast integer engine and on the reference layers, alternately in this process,
with the step's MACs as fractions of the fp32 GEMM and ``torch._int_mm`` rates, and where the
fast step's time goes (each C kernel's time summed over its calls, and the rest).
"""

from __future__ import annotations

import torch
from torch import nn

from bpfree.bench.environment import gemm_peak_flops, median_seconds
from bpfree.estimators import node_perturbation, rge
from bpfree.models import mnist_cnn, mnist_mlp
from bpfree.objective import Objective
from bpfree.optim import ZOOptimizer
from bpfree.perturb import get_distribution

import _pmt_step_cost as pmt_step_cost

NAME = "throughput"
DESCRIPTION = __doc__.split("\n\n")[0]
SEED = 0
BATCH = 64


def layer_macs(model: nn.Module, x: torch.Tensor) -> list[int]:
    """MACs of each Linear/Conv2d layer in execution order, counted with hooks."""
    macs = []

    def hook(mod, inp, out):
        if isinstance(mod, nn.Linear):
            macs.append(out.numel() * mod.in_features)
        elif isinstance(mod, nn.Conv2d):
            macs.append(out.numel() * (mod.in_channels // mod.groups) * mod.kernel_size[0] * mod.kernel_size[1])

    hooks = [m.register_forward_hook(hook) for m in model.modules()]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return macs


def node_perturbation_flops(macs: list[int], q_count: int) -> int:
    """FLOPs layer-wise NP needs on a Sequential: per layer j, the prefix up to j once, then the
    suffix after j for the base and each of the Q queries (PMT Algorithm 1's schedule)."""
    total = 0
    for j in range(len(macs)):
        total += sum(macs[: j + 1]) + (q_count + 1) * sum(macs[j + 1:])
    return 2 * total


def mezo_step(model: nn.Module, obj: Objective, q_count: int, mu: float, lr: float, step: int) -> None:
    """MeZO-style reference: perturb, forward, negate, forward, restore, update (torch.randn)."""
    params = list(model.parameters())
    gen = torch.Generator()

    def add(seed, alpha):
        gen.manual_seed(seed)
        for p in params:
            p.data.add_(torch.randn(p.shape, generator=gen), alpha=alpha)

    with torch.no_grad():
        for q in range(q_count):
            seed = step * 100_003 + q
            add(seed, mu)
            lp = float(obj())
            add(seed, -2 * mu)
            lm = float(obj())
            add(seed, mu)
            add(seed, -lr * (lp - lm) / (2 * mu) / q_count)


def run(quick: bool) -> tuple[list[dict], dict]:
    torch.set_num_threads(1)
    repeats = 3 if quick else 7
    gen = torch.Generator().manual_seed(SEED)
    rows = []

    def row(table, method, setting, metric, value):
        rows.append({"table": table, "method": method, "setting": setting, "metric": metric,
                     "value": float(value), "paper": None})

    # Machine reference: fp32 GEMM rate on one thread.
    gemm_gflops = gemm_peak_flops(1024, repeats=repeats) / 1e9
    row("machine", "fp32 GEMM 1024x1024x1024", "1 thread", "GFLOP/s", gemm_gflops)

    cases = [("MLP 784-1024-10", mnist_mlp, (BATCH, 784), (16, 64))]
    cases.append(("CNN 2conv+fc", mnist_cnn, (BATCH, 1, 28, 28), (16,) if quick else (16, 64)))
    fast = get_distribution("rademacher")
    for label, build, shape, qs in cases:
        torch.manual_seed(SEED)
        model = build()
        x = torch.randn(*shape, generator=gen)
        y = torch.randint(0, 10, (BATCH,), generator=gen)
        obj = Objective(model, x, y)
        macs = layer_macs(model, x)
        flops_fwd = 2 * sum(macs)
        d = sum(p.numel() for p in model.parameters())
        n_layers = len(macs)

        t_fwd = median_seconds(lambda: obj(), repeats=repeats)
        t_dir = median_seconds(lambda: fast.sample(123, (d,)), repeats=repeats)
        t_randn = median_seconds(lambda: torch.randn(d, generator=gen), repeats=repeats)
        setting = f"{label}, d={d:,}, batch {BATCH}"
        row("one direction vs one forward", "forward pass", setting, "ms", t_fwd * 1e3)
        row("one direction vs one forward", "direction, bpfree fast Rademacher", setting, "ms", t_dir * 1e3)
        row("one direction vs one forward", "direction, torch.randn", setting, "ms", t_randn * 1e3)

        for q_count in qs:
            s = f"{label}, Q={q_count}, batch {BATCH}"
            counter = {"t": 0}

            def mezo():
                counter["t"] += 1
                mezo_step(model, obj, q_count, 1e-3, 1e-6, counter["t"])

            t_mezo = median_seconds(mezo, repeats=repeats)
            dirs_mezo = q_count / t_mezo
            row("ZO step throughput", "MeZO-style reference loop", s, "directions/s", dirs_mezo)
            row("ZO step throughput", "MeZO-style reference loop", s, "useful GFLOP/s",
                2 * q_count * flops_fwd / t_mezo / 1e9)
            wp_flops = (q_count + 1) * flops_fwd
            np_flops = node_perturbation_flops(macs, q_count)
            methods = [
                ("weight perturbation, lean", rge(q_count, 1e-3), "lean", q_count, wp_flops),
                ("weight perturbation, cached", rge(q_count, 1e-3), "cached", q_count, wp_flops),
                ("weight perturbation, batched", rge(q_count, 1e-3), "batched", q_count, wp_flops),
                ("node perturbation, lean", node_perturbation(q_count, 1e-3), "lean",
                 q_count * n_layers, np_flops),
                ("node perturbation, batched", node_perturbation(q_count, 1e-3), "batched",
                 q_count * n_layers, np_flops),
            ]
            for name, est, mode, ndirs, flops in methods:
                opt = ZOOptimizer(model.parameters(), lr=1e-6, estimator=est, mode=mode, seed=SEED)
                t = median_seconds(lambda: opt.step(obj), repeats=repeats)
                row("ZO step throughput", name, s, "directions/s", ndirs / t)
                row("ZO step throughput", name, s, "speedup vs MeZO-style loop", ndirs / t / dirs_mezo)
                row("ZO step throughput", name, s, "useful GFLOP/s", flops / t / 1e9)
    extra = {"threads": 1, "repeats": repeats, "statistic": "median seconds per step",
             "gemm_gflops": gemm_gflops}
    extra["pmt_step"] = pmt_step_cost.rows(quick, row, repeats=3 if quick else 5)
    return rows, extra
