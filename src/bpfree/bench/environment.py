"""What a benchmark ran on: device description, library versions, and timing helpers.

Every result file records these so that a number in docs/BENCHMARKS.md can be traced to the
machine and the software that produced it.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bpfree import __version__ as bpfree_version

# Libraries whose versions change benchmark numbers; reported even when not imported yet.
_VERSIONED_PACKAGES = ("torch", "numpy", "numba")


def cpu_model() -> str:
    """The processor's model name (from /proc/cpuinfo on Linux), or a best-effort fallback."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux: fall through to what the platform module knows
    return platform.processor() or platform.machine() or "unknown cpu"


def describe_device(device: str | torch.device | None = None) -> str:
    """A one-line description of the compute device.

    With ``device=None`` the CUDA device is described when one is available (benchmarks
    default to it), else the CPU. CPU descriptions carry the thread count because torch's
    CPU timings scale with it.
    """
    dev = torch.device(device) if device is not None else None
    if dev is None:
        dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return f"cuda: {torch.cuda.get_device_name(index)}"
    if dev.type == "cpu":
        return f"cpu: {cpu_model()}, {torch.get_num_threads()} threads"
    return str(dev)


def _package_version(name: str) -> str:
    """Installed version of a distribution, without importing it (numba imports slowly)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def library_versions() -> dict[str, str]:
    """Versions of the interpreter, the numeric libraries and bpfree, plus the platform."""
    versions = {"python": platform.python_version()}
    for name in _VERSIONED_PACKAGES:
        versions[name] = _package_version(name)
    # torch reports its build flavour (+cpu / +cu124) only through the module.
    versions["torch"] = torch.__version__
    if torch.cuda.is_available():
        versions["cuda"] = str(torch.version.cuda)
    versions["bpfree"] = bpfree_version
    versions["platform"] = platform.platform()
    return versions


#: Paths (from the checkout's top) that benchmark runs write: not code, never "dirty".
OUTPUT_PATHS = ("results", "docs/BENCHMARKS.md")


def git_state(path: str | os.PathLike | None = None) -> tuple[str | None, bool]:
    """``(short commit hash, dirty)`` of the checkout containing ``path``; ``(None, False)``
    outside a git checkout, without git, or before the first commit.

    Dirty means uncommitted changes to tracked files (untracked files do not count), other
    than the benchmarks' own outputs: ``results/`` and the generated ``docs/BENCHMARKS.md``
    (a run that writes its result must not make the next run's checkout dirty).
    """
    cwd = Path(path) if path is not None else Path.cwd()
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=cwd, capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        changes = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ":(top)",
             *(f":(top,exclude){p}" for p in OUTPUT_PATHS)],
            cwd=cwd, capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None, False
    return head, bool(changes)


def _synchronize(device: torch.device) -> None:
    """Wait for queued GPU work so that wall-clock timings measure the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(
    fn: Callable[[], object],
    *,
    repeats: int = 5,
    warmup: int = 1,
    device: str | torch.device | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` calls after ``warmup`` calls.

    Medians, not means: one descheduled repeat on a shared machine must not move the number.
    Pass ``device`` for CUDA work so that each call is synchronised before the clock stops.
    ``clock=time.thread_time`` counts this thread's CPU time instead, which other processes
    on a busy machine do not inflate (single-threaded CPU work only).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    for _ in range(warmup):
        fn()
    _synchronize(dev)
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        _synchronize(dev)
        times.append(clock() - start)
    return statistics.median(times)


def gemm_peak_flops(
    n: int = 1024,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    repeats: int = 5,
) -> float:
    """Measured FLOP/s of an ``n x n`` matrix product: a reference to express throughputs in.

    Reporting a kernel as a fraction of the machine's own GEMM rate makes numbers from
    different machines comparable with the paper's.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    dev = torch.device(device)
    a = torch.randn(n, n, dtype=dtype, device=dev)
    b = torch.randn(n, n, dtype=dtype, device=dev)
    seconds = median_seconds(lambda: a @ b, repeats=repeats, warmup=1, device=dev)
    return 2.0 * n**3 / seconds

