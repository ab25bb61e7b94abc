"""``run_c``: compile a device program if needed, run K PMT steps, load the weights back.

On the ``host`` target the program is built as a shared library with the system C compiler
and driven through ``ctypes`` (no process per step, so parity tests stay fast). On
``cortex-m7`` it is cross-compiled and run under QEMU with semihosting (:mod:`.mcu`).

Batches are taken cyclically from ``(x, y)``: step ``t`` uses samples ``t*B .. t*B + B - 1``
modulo ``len(x)``, the same rule as ``main.c`` and :func:`cyclic_batches`.
"""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from ..io import temporary_name
from .export import DeviceProgram
from .mcu import infer_emulated, run_emulated
from .result import LOSS_SCALE, DeviceResult, load_weights

HOST_CFLAGS = ("-std=c99", "-O2", "-Wall", "-ffp-contract=off", "-fno-fast-math")


def cyclic_batches(n: int, steps: int, batch_size: int) -> list[np.ndarray]:
    """Sample indices of each step: ``(t * batch_size + i) % n``."""
    return [(np.arange(batch_size) + t * batch_size) % n for t in range(steps)]


def find_compiler() -> str:
    for cc in ("cc", "gcc", "clang"):
        path = shutil.which(cc)
        if path:
            return path
    raise RuntimeError("no C compiler found (looked for cc, gcc, clang); install one, e.g. "
                       "`apt-get install gcc`")


def build_host_library(program: DeviceProgram) -> Path:
    """``libbpfree.so`` of the program, rebuilt when a source is newer than it."""
    lib = program.path / "build" / "libbpfree.so"
    sources = [program.path / n for n in ("model.c", "bpfree_runtime.c")]
    headers = [program.path / n for n in ("bpfree_runtime.h", "bpfree_model.h", "bpf_int8.h")]
    newest = max(p.stat().st_mtime for p in sources + headers)
    if lib.exists() and lib.stat().st_mtime >= newest:
        return lib
    lib.parent.mkdir(exist_ok=True)
    tmp = temporary_name(lib)  # unique: concurrent builds
    cmd = [find_compiler(), *HOST_CFLAGS, "-shared", "-fPIC", "-o", str(tmp),
           *map(str, sources), "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"compiling {program.path} failed:\n{proc.stderr[-4000:]}")
    tmp.replace(lib)
    return lib


def _load(lib_path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(lib_path))
    i8p, i32p = ctypes.POINTER(ctypes.c_int8), ctypes.POINTER(ctypes.c_int32)
    lib.bpfree_step.argtypes = [i8p, i32p, ctypes.c_int32, ctypes.c_double,
                                ctypes.POINTER(ctypes.c_int64)]
    lib.bpfree_infer.argtypes = [i8p, ctypes.c_int32, i8p]
    lib.bpfree_weight.restype = i8p
    lib.bpfree_bias.restype = i32p
    lib.bpfree_weight.argtypes = lib.bpfree_bias.argtypes = [ctypes.c_int32]
    lib.bpfree_weight_bytes.argtypes = lib.bpfree_bias_count.argtypes = [ctypes.c_int32]
    lib.bpfree_arena_bytes.restype = ctypes.c_int64
    return lib


def _as_int8(program: DeviceProgram, x: torch.Tensor) -> np.ndarray:
    xq = x if x.dtype == torch.int8 else program.model.input_quant.quantize(x)
    shape = tuple(program.meta["sample_shape"])
    if tuple(xq.shape[1:]) != shape:
        raise ValueError(f"samples must have per-sample shape {shape}, got {tuple(xq.shape[1:])}")
    return np.ascontiguousarray(xq.numpy().reshape(xq.shape[0], -1))


def _check_run_args(program: DeviceProgram, x, y, steps, batch_size, lr) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an int >= 0, got {steps!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
        raise ValueError(f"lr must be a finite number >= 0, got {lr!r}")
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(f"x and y must hold the same non-zero number of samples, got "
                         f"{len(x)} and {len(y)}")
    micro = program.meta["config"]["micro_batch"]
    if micro is None and batch_size > program.meta["max_batch"]:
        raise ValueError(f"batch_size {batch_size} exceeds the program's arena (max_batch "
                         f"{program.meta['max_batch']}); export with a larger max_batch")
    classes = program.meta["classes"]
    if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool or y.ndim != 1:
        raise ValueError(f"y must be a 1-D tensor of integer class labels, got dtype {y.dtype} "
                         f"and shape {tuple(y.shape)}")
    if int(y.min()) < 0 or int(y.max()) >= classes:
        raise ValueError(f"labels must lie in [0, {classes - 1}], got [{int(y.min())}, "
                         f"{int(y.max())}]")


def run_c(program, x: torch.Tensor, y: torch.Tensor, steps: int, batch_size: int,
          lr: float, *, count_instructions: bool = False) -> DeviceResult:
    """Run ``steps`` device-exact PMT steps of the exported ``program`` (a directory or a
    :class:`DeviceProgram`) from its exported weights, on cyclic batches of ``(x, y)``.

    ``count_instructions`` (cortex-m7 only): also return each step's executed instructions,
    counted by QEMU's ``-icount`` (:func:`~bpfree.device.mcu.run_emulated`).
    """
    if not isinstance(program, DeviceProgram):
        program = DeviceProgram.load(program)
    _check_run_args(program, x, y, steps, batch_size, lr)
    if count_instructions and program.target != "cortex-m7":
        raise ValueError("count_instructions needs a cortex-m7 program (QEMU counts the "
                         f"instructions); this one targets {program.target!r}")
    xs = _as_int8(program, x)
    ys = np.ascontiguousarray(y.numpy().astype(np.int32))
    if program.target == "cortex-m7":
        return run_emulated(program, xs, ys, steps, batch_size, float(lr),
                            count_instructions=count_instructions)
    lib = _load(build_host_library(program))
    lib.bpfree_init()
    sums = []
    loss = ctypes.c_int64()
    i8p, i32p = ctypes.POINTER(ctypes.c_int8), ctypes.POINTER(ctypes.c_int32)
    start = time.perf_counter()
    for idx in cyclic_batches(len(xs), steps, batch_size):
        bx, by = np.ascontiguousarray(xs[idx]), np.ascontiguousarray(ys[idx])
        rc = lib.bpfree_step(bx.ctypes.data_as(i8p), by.ctypes.data_as(i32p), batch_size,
                             float(lr), ctypes.byref(loss))
        if rc:
            raise RuntimeError(f"the device step failed (code {rc})")
        sums.append(int(loss.value))
    wall = time.perf_counter() - start
    weights = []
    for t in range(lib.bpfree_num_trainable()):
        nw, nb = lib.bpfree_weight_bytes(t), lib.bpfree_bias_count(t)
        w = np.ctypeslib.as_array(lib.bpfree_weight(t), (nw,)).copy()
        b = np.ctypeslib.as_array(lib.bpfree_bias(t), (nb,)).copy()
        weights.append((w, b))
    return DeviceResult([s / batch_size * LOSS_SCALE for s in sums],
                        load_weights(program, weights), sums, wall)


def infer_c(program, x: torch.Tensor) -> torch.Tensor:
    """Int8 logits of the program's exported weights (host target)."""
    if not isinstance(program, DeviceProgram):
        program = DeviceProgram.load(program)
    xs = _as_int8(program, x)
    if program.target == "cortex-m7":
        return infer_emulated(program, xs)[0]
    lib = _load(build_host_library(program))
    lib.bpfree_init()
    out = np.zeros((len(xs), program.meta["classes"]), dtype=np.int8)
    lib.bpfree_infer(xs.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)), len(xs),
                     out.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)))
    return torch.from_numpy(out)
