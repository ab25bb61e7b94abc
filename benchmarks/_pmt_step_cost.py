"""One PMT step (Algorithm 1) on the fast integer engine against the reference layers.

The rows ``bench throughput`` reports for issue 30: the time of one PMT step, the step's
multiply-accumulates (MACs, counted by hooks on the reference layers while it runs one step)
and the rate achieved, as a fraction of this machine's single-thread fp32 GEMM rate and of
``torch._int_mm`` (int8 x int8 -> int32, exact), both measured in the same run. The reference
and fast engines are timed alternately in one process (medians of thread CPU time, one
thread), and one step of each from the same state is compared bit for bit.
"""

from __future__ import annotations

import collections
import copy
import statistics
import time

import torch

from bpfree.bench.environment import median_seconds

from bpfree.pmt import PMTConfig, PMTTrainer
from bpfree.pmt.sparse import block, split_blocks
from bpfree.quant.layers import QConv2d, QLinear

ENGINES = ("reference", "fast")


def thread_seconds(fn, repeats: int, warmup: int = 0) -> float:
    """Median thread CPU seconds of ``fn()``: descheduling on a shared machine is not counted."""
    return median_seconds(fn, repeats=repeats, warmup=warmup, clock=time.thread_time)


def int_mm_macs_per_second(n: int = 1024, repeats: int = 5) -> float:
    """MAC/s of ``torch._int_mm`` on an n x n x n int8 product (the exact int8 GEMM)."""
    a = torch.randint(-128, 128, (n, n), dtype=torch.int8)
    b = torch.randint(-128, 128, (n, n), dtype=torch.int8)
    return n**3 / thread_seconds(lambda: torch._int_mm(a, b), repeats, warmup=1)


def fp32_macs_per_second(n: int = 1024, repeats: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    return n**3 / thread_seconds(lambda: a @ b, repeats, warmup=1)


def count_step_work(qmodel, config: PMTConfig, example, x, y, trainable) -> tuple[int, int]:
    """(MACs, int8 outputs) of one PMT step's affine layers, counted on the reference layers
    (every QConv2d / QLinear call)."""
    model = copy.deepcopy(qmodel)
    total = [0, 0]

    def hook(mod, args, out):
        if isinstance(mod, QConv2d):
            k = mod.weight.shape[1] * mod.kernel_size[0] * mod.kernel_size[1]
        else:
            k = mod.in_features
        total[0] += out.numel() * k
        total[1] += out.numel()

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (QConv2d, QLinear))]
    trainer = PMTTrainer(model, config, example=example, trainable=trainable, engine="reference")
    total[0] = total[1] = 0  # find_layers' shape probe is not part of the step
    trainer.step(x, y, lr=0.0)
    for h in handles:
        h.remove()
    return total[0], total[1]


def requantize_floor_seconds(repeats: int) -> float | None:
    """Seconds per int8 output of the fast engine's fused kernel when it has almost no
    multiply-accumulates to do (a 1x1 convolution with K = 2 inputs, 16 outputs per pixel):
    the cost of reading, requantizing and writing one output, which every affine output of
    a step pays whatever its K. None without the compiled kernels."""
    from bpfree.quant import TensorQuant
    from bpfree.quant.engine import FastStages, kernel_library

    lib = kernel_library()
    if lib is None:
        return None
    gen = torch.Generator().manual_seed(0)
    conv = QConv2d(torch.randint(-128, 128, (16, 2, 1, 1), dtype=torch.int8, generator=gen),
                   torch.randint(-2000, 2000, (16,), generator=gen),
                   weight_scale=[0.01] * 16, input_quant=TensorQuant(0.02, -128),
                   output_quant=TensorQuant(0.05, -128), activation="relu6")
    fast = FastStages([conv], lib)
    x = torch.randint(-128, 128, (100, 14, 14, 2), dtype=torch.int8, generator=gen)
    seconds = thread_seconds(lambda: fast.run_nhwc(0, x), repeats=max(repeats, 5), warmup=1)
    return seconds / (100 * 14 * 14 * 16)


class _TimedKernels:
    """The kernel library with each ``bpf_*`` call's thread CPU time summed per kernel."""

    def __init__(self, lib) -> None:
        self._lib = lib
        self.seconds: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()

    def __getattr__(self, name):
        fn = getattr(self._lib, name)
        if not name.startswith("bpf_"):
            return fn

        def timed(*args):
            start = time.thread_time()
            try:
                return fn(*args)
            finally:
                self.seconds[name] += time.thread_time() - start
                self.calls[name] += 1
        return timed


#: Steps :func:`step_parts` times (after one warm-up step).
PART_STEPS = 3


def step_parts(qmodel, example, x, y, *, trainable, queries: int,
               repeats: int = PART_STEPS) -> dict | None:
    """Where one fast-engine step's time goes: thread CPU seconds per step inside each C
    kernel (summed over its calls) and outside them (Python, the loss, the directions),
    from ``repeats`` steps of a trainer built on a timed kernel library. Timing each call
    adds a little to the outside share. None without the compiled kernels."""
    from bpfree.quant import engine

    lib = engine.kernel_library()
    if lib is None:
        return None
    timed = _TimedKernels(lib)
    engine._library_state["lib"] = timed  # the trainer's stages capture it when built
    try:
        trainer = PMTTrainer(copy.deepcopy(qmodel), PMTConfig(queries=queries, seed=0),
                             example=example, trainable=trainable, engine="fast")
        trainer.step(x, y, lr=0.0)
        timed.seconds.clear()
        timed.calls.clear()
        start = time.thread_time()
        for _ in range(repeats):
            trainer.step(x, y, lr=0.0)
        total = (time.thread_time() - start) / repeats
    finally:
        engine._library_state["lib"] = lib
    kernels = {k: v / repeats for k, v in timed.seconds.most_common()}
    return {"total": total, "kernels": kernels,
            "calls": {k: timed.calls[k] // repeats for k in kernels},
            "outside": total - sum(kernels.values())}


def step_case(qmodel, example, x, y, *, trainable, queries: int, repeats: int) -> dict:
    """Time one PMT step per engine (alternating), count its MACs, check bit-identity."""
    config = PMTConfig(queries=queries, seed=0)
    trainers = {e: PMTTrainer(copy.deepcopy(qmodel), config, example=example,
                              trainable=trainable, engine=e) for e in ENGINES}
    # Bit-identity: one step with a rate that changes weights, from the same state.
    states, losses = {}, {}
    for e, t in trainers.items():
        losses[e] = t.step(x, y, lr=0.5)["loss"]
        states[e] = {k: v.clone() for k, v in t.model.state_dict().items()}
    identical = losses["reference"] == losses["fast"] and all(
        torch.equal(states["reference"][k], states["fast"][k]) for k in states["reference"])
    times = {e: [] for e in ENGINES}
    for _ in range(repeats):  # alternate, so drifts of the machine hit both alike
        for e, t in trainers.items():
            times[e].append(thread_seconds(lambda: t.step(x, y, lr=0.0), 1))
    macs, outputs = count_step_work(qmodel, config, example, x, y, trainable)
    return {"seconds": {e: statistics.median(v) for e, v in times.items()}, "macs": macs,
            "outputs": outputs, "identical": identical, "forwards": trainers["fast"].forwards}


def cases(quick: bool):
    """(label, qmodel, example, x, y, trainable, queries) of the step rows."""
    from bpfree.models import mnist_mobilenet
    from bpfree.quant import quantize_model

    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x = torch.rand(100, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (100,), generator=gen)
    qmodel = quantize_model(mnist_mobilenet().eval(), x, input_range=(0.0, 1.0))
    layers = PMTTrainer(qmodel, PMTConfig(), example=x[:2]).layers
    blocks = split_blocks(layers, 4)
    q = 10 if quick else 50
    out = [(f"MNIST MobileNet block 1, Q={q}, batch 100", qmodel, x[:2], x, y, block(blocks, 1), q),
           (f"MNIST MobileNet block 4, Q={q}, batch 100", qmodel, x[:2], x, y, block(blocks, 4), q)]
    if quick:
        return out, None
    out.append((f"MNIST MobileNet whole model, Q={q}, batch 100", qmodel, x[:2], x, y, None, q))
    try:
        from bpfree.models.mcunet.quantized import mcunet_in1
        mc = mcunet_in1()
    except (OSError, ValueError, FileNotFoundError) as err:
        return out, f"MCUNet-in1 rows skipped: {err}"
    xm = torch.randint(-128, 128, (1, 3, 128, 128), dtype=torch.int8, generator=gen)
    ym = torch.tensor([281])
    mblocks = split_blocks(PMTTrainer(mc, PMTConfig(), example=xm).layers, 4)
    out.append((f"MCUNet-in1 block 3, Q={q}, batch 1", mc, xm, xm, ym, block(mblocks, 3), q))
    return out, None


T_PARTS = (f"PMT step on the fast engine: time per part (1 thread, {PART_STEPS} steps, kernels "
           "timed per call)")


def rows(quick: bool, row, repeats: int) -> dict:
    """Append the step rows through ``row(table, method, setting, metric, value)``."""
    fp32 = fp32_macs_per_second(repeats=repeats)
    int8 = int_mm_macs_per_second(repeats=repeats)
    table = "PMT step: fast integer engine vs reference layers (1 thread)"
    row("machine", "fp32 GEMM 1024^3 (thread CPU time)", "1 thread", "GMAC/s", fp32 / 1e9)
    row("machine", "torch._int_mm int8 1024^3 (thread CPU time)", "1 thread", "GMAC/s",
        int8 / 1e9)
    floor = requantize_floor_seconds(repeats)
    if floor is not None:
        row("machine", "fast engine, one requantized int8 output (1x1 conv, K=2)", "1 thread",
            "ns per output", floor * 1e9)
    todo, skipped = cases(quick)
    extra = {"fp32_gmacs": fp32 / 1e9, "int_mm_gmacs": int8 / 1e9, "skipped": skipped,
             "requantize_floor_ns": None if floor is None else floor * 1e9}
    if skipped:
        print(skipped)
    for label, qmodel, example, x, y, trainable, q in todo:
        r = step_case(qmodel, example, x, y, trainable=trainable, queries=q, repeats=repeats)
        macs = r["macs"]
        row(table, "step MACs", label, "GMAC", macs / 1e9)
        row(table, "fp32 GEMM bound of the step's MACs", label, "ms", macs / fp32 * 1e3)
        # Why the step stays above that bound: each output costs a requantization whatever
        # its K, and these layers do only 8 to 32 MACs per output.
        row(table, "step int8 outputs", label, "M", r["outputs"] / 1e6)
        row(table, "step int8 outputs", label, "MACs per output", macs / r["outputs"])
        if floor is not None:
            row(table, "requantization floor (outputs x ns per output)", label, "ms",
                r["outputs"] * floor * 1e3)
            row(table, "requantization floor (outputs x ns per output)", label,
                "floor / fp32 GEMM bound", r["outputs"] * floor * fp32 / macs)
        for e in ENGINES:
            s = r["seconds"][e]
            name = "fast engine" if e == "fast" else "reference layers"
            row(table, name, label, "ms per step", s * 1e3)
            row(table, name, label, "GMAC/s", macs / s / 1e9)
            row(table, name, label, "fraction of fp32 GEMM rate", macs / s / fp32)
            row(table, name, label, "fraction of _int_mm rate", macs / s / int8)
            row(table, name, label, "step time / fp32 GEMM bound", s * fp32 / macs)
        row(table, "fast engine", label, "speed-up over reference",
            r["seconds"]["reference"] / r["seconds"]["fast"])
        row(table, "fast engine", label, "bit-identical step (1 = yes)", float(r["identical"]))
        parts = step_parts(qmodel, example, x, y, trainable=trainable, queries=q)
        if parts is not None:
            for kernel, seconds in parts["kernels"].items():
                row(T_PARTS, f"inside {kernel} ({parts['calls'][kernel]} calls)", label,
                    "ms per step", seconds * 1e3)
            row(T_PARTS, "outside the kernels (Python, loss, directions)", label,
                "ms per step", parts["outside"] * 1e3)
            row(T_PARTS, "outside the kernels (Python, loss, directions)", label,
                "share of the step", parts["outside"] / parts["total"])
    return extra
