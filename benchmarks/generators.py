"""Throughput of the perturbation generators in bpfree.perturb, single-threaded.

Targets: XORShift32 (PMT Appendix F, device parity) >= 2e7 values/s and the counter-based fast
Rademacher generator >= 1e9 values/s on one CPU core. The full setting uses
n = 814090 * 16 values (the 784-1024-10 MLP's parameter count times 16 queries).

Run directly (``python benchmarks/generators.py [--quick]``) to print the rows; the benchmark
runner imports ``NAME``, ``DESCRIPTION`` and ``run``.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch

NAME = "generators"
DESCRIPTION = (
    "Single-thread throughput (values/s, median of repeats) of the perturbation generators: "
    "XORShift32 states and Rademacher signs (PMT Appendix F), the counter-based fast Rademacher "
    "generator into a preallocated float32 buffer, the fused in-place perturb_/restore_ kernels, "
    "torch.randn, torch.randint signs and QZO-FF's quantized Gaussian."
)

MLP_PARAMS = 814_090  # 784-1024-10 MLP: 784*1024 + 1024 + 1024*10 + 10
FULL_N = MLP_PARAMS * 16
QUICK_N = MLP_PARAMS


def _median_seconds(fn: Callable[[int], object], repeats: int) -> float:
    fn(0)  # warm-up: numba compilation / cache load, first-touch page faults
    times = []
    for r in range(repeats):
        start = time.perf_counter()
        fn(r + 1)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(quick: bool) -> list[dict]:
    """Measure every generator; returns one row per method (values/s)."""
    import numba

    from bpfree.perturb import (
        derive_seed,
        fill_rademacher_,
        perturb_,
        quantized_gaussian,
        rademacher_torch,
        rademacher_xorshift,
        restore_,
        xorshift32,
    )

    n = QUICK_N if quick else FULL_N
    repeats = 5 if quick else 7
    old_torch_threads = torch.get_num_threads()
    old_numba_threads = numba.get_num_threads()
    torch.set_num_threads(1)
    numba.set_num_threads(1)  # the kernels are serial; this pins any parallel fallback too
    try:
        buf = torch.empty(n, dtype=torch.float32)

        def seed(r: int) -> int:
            return derive_seed(2024, r)

        def randn_into(r: int) -> None:
            torch.randn(n, out=buf, generator=torch.Generator().manual_seed(seed(r)))

        weights = torch.randn(n, generator=torch.Generator().manual_seed(0)) * 0.05
        repairs: dict[int, object] = {}

        def perturb(r: int) -> None:
            repairs[r] = perturb_(weights, "rademacher", seed(r), 1e-3)

        def restore(r: int) -> None:
            restore_(weights, "rademacher", seed(r), 1e-3, repairs.pop(r))

        # perturb_ and restore_ alternate so the weights stay at their original values; each
        # is timed on its own.
        perturb_times, restore_times = [], []
        for r in range(repeats + 1):
            t0 = time.perf_counter()
            perturb(r)
            t1 = time.perf_counter()
            restore(r)
            t2 = time.perf_counter()
            if r:  # r = 0 is the warm-up
                perturb_times.append(t1 - t0)
                restore_times.append(t2 - t1)

        measured = {
            "xorshift32 (uint32 states)": _median_seconds(lambda r: xorshift32(seed(r), n),
                                                          repeats),
            "rademacher_xorshift (int8)": _median_seconds(
                lambda r: rademacher_xorshift(seed(r), n), repeats),
            "rademacher_fast (float32, preallocated, numba)": _median_seconds(
                lambda r: fill_rademacher_(buf, seed(r)), repeats),
            "rademacher_fast (float32, preallocated, torch path)": _median_seconds(
                lambda r: fill_rademacher_(buf, seed(r), backend="torch"), repeats),
            "perturb_ (fused, rademacher, float32, alpha=1e-3)": statistics.median(perturb_times),
            "restore_ (fused, rademacher, float32, alpha=1e-3)": statistics.median(restore_times),
            "torch.randn (float32, preallocated)": _median_seconds(randn_into, repeats),
            "rademacher_torch (torch.randint)": _median_seconds(
                lambda r: rademacher_torch(seed(r), n), repeats),
            "quantized_gaussian (8 bit, z_max=3.5)": _median_seconds(
                lambda r: quantized_gaussian(seed(r), n), repeats),
        }
    finally:
        torch.set_num_threads(old_torch_threads)
        numba.set_num_threads(old_numba_threads)

    return [
        {
            "table": "generator throughput",
            "method": method,
            "setting": f"n={n}, 1 thread",
            "metric": "values/s",
            "value": float(n / seconds),
            "paper": None,
        }
        for method, seconds in measured.items()
    ]


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv[1:]):
        print(f"{row['method']:<55} {row['setting']:<22} {row['value']:.3e} {row['metric']}")
