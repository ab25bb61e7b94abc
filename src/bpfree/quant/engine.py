"""The fast path of the integer graph: channels-last stages on the fused int8 kernels.

:class:`FastStages` runs a :class:`~bpfree.quant.stages.QuantizedModel`'s stages on the C
kernels of ``c/int8_kernels.c`` (NHWC activations, the requantization fused into each
convolution's epilogue) instead of the reference layers (NCHW float convolutions, then a
requantization pass). Both compute the same integer arithmetic, so they give the same bits
(``tests/test_engine.py`` compares every stage type, node offsets and saturating weights
included); the reference layers stay the definition. The requantization and the residual add
are those of ``c/bpf_int8.h``, the int8 kernel set that :mod:`bpfree.device` also copies into
its generated programs: one kernel source for both.

Why: a forward-only trainer spends its time in partial forwards of small int8 layers (PMT's
step on the MNIST MobileNet's block 1 is 200 forwards of 100 images per step). Those layers
do 8 to 32 multiply-accumulates per output, so the reference's separate passes over memory,
not arithmetic, bound it.

The kernels are compiled once per machine with the system C compiler (``cc``, ``-O3
-march=native``) into a cache folder (``BPFREE_KERNEL_CACHE``, default
``~/.cache/bpfree/kernels``) and loaded with ctypes. Without a compiler, or with
``BPFREE_ENGINE=reference``, :func:`fast_stages` returns None and callers use the reference
layers: slower, same bits. Stages the kernels do not cover (pooling other than global
average, grouped convolutions, the float-rule layers of MCUNet's importer, anything custom)
run their own module on an NCHW view, so any model works.

Weights are packed lazily and repacked whenever a layer's weight or bias tensor changes
(tracked by the tensors' in-place version counters), so in-place perturbation and updates
(PMT's WP queries, Eq. 6, and the update of Eq. 8) need no notification.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .layers import QAdd, QConv2d, QGlobalAvgPool2d, QLinear, QReLU, accumulator_bound
from .layers.elementwise import QFlatten
from .stages import QInvertedResidual

__all__ = ["BlockOp", "FastStages", "fast_stages", "kernel_library", "ENGINES"]

log = logging.getLogger(__name__)

ENGINES = ("auto", "fast", "reference")
INT32_MAX = 2**31 - 1
_SOURCE = "int8_kernels.c"
#: The kernel set int8_kernels.c builds on, shared with the generated device programs.
_HEADER = "bpf_int8.h"
_FLAGS = ("-O3", "-march=native", "-fno-strict-aliasing", "-shared", "-fPIC", "-std=c99")
_library_state: dict = {}


class _AddParams(ctypes.Structure):
    """bpf_int8.h's bpf_add_params: QAdd's constants in its order."""

    _fields_ = [(name, ctypes.c_int32) for name in (
        "input1_offset", "input2_offset", "left_shift", "input1_multiplier", "input1_shift",
        "input2_multiplier", "input2_shift", "output_multiplier", "output_shift",
        "output_offset")]


class _Epilogue(ctypes.Structure):
    _fields_ = [("bias", ctypes.c_void_p), ("mult", ctypes.c_void_p), ("left", ctypes.c_void_p),
                ("right", ctypes.c_void_p), ("zero_point", ctypes.c_int32),
                ("qmin", ctypes.c_int32), ("qmax", ctypes.c_int32),
                ("vector_ok", ctypes.c_int32)]


def _cache_dir() -> Path:
    root = os.environ.get("BPFREE_KERNEL_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "bpfree" / "kernels"


def _cpu_signature() -> str:
    """What -march=native depends on: the machine and its CPU flags."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return platform.machine() + flags


def _compile(source: Path) -> Path | None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        log.warning("bpfree: no C compiler found; the integer graph runs on the reference "
                    "layers (same results, slower)")
        return None
    text = source.read_bytes() + (source.parent / _HEADER).read_bytes()
    key = hashlib.sha256(text + compiler.encode() + " ".join(_FLAGS).encode()
                         + _cpu_signature().encode()).hexdigest()[:16]
    target = _cache_dir() / f"int8_kernels-{key}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Compile to a unique name, then rename: concurrent workers never load a partial file.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run([compiler, *_FLAGS, f"-I{source.parent}", str(source), "-o",
                                 tmp], capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            log.warning("bpfree: compiling the int8 kernels failed (%s); using the reference "
                        "layers. %s", compiler, result.stderr.strip()[:500])
            return None
        os.replace(tmp, target)
        return target
    except (OSError, subprocess.SubprocessError) as err:
        log.warning("bpfree: compiling the int8 kernels failed (%s); using the reference "
                    "layers", err)
        return None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def kernel_library():
    """The loaded kernel library (ctypes), compiled on first use; None where unavailable."""
    if "lib" not in _library_state:
        lib = None
        with resources.as_file(resources.files(__package__) / "c") as folder:
            path = _compile(Path(folder) / _SOURCE)
        if path is not None:
            lib = ctypes.CDLL(str(path))
            p, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
            lib.bpf_dense.argtypes = [p, i64, i32, i32, p, i32, i32, p, p, p, p]
            lib.bpf_conv.argtypes = [p, *[i32] * 5, p, *[i32] * 12, p, p, p, p]
            lib.bpf_depthwise.argtypes = [p, *[i32] * 5, p, *[i32] * 10, p, p, p]
            lib.bpf_add.argtypes = [p, p, i64, p, i32, i32, p]
            lib.bpf_global_avg_pool.argtypes = [p, i32, i32, i32, i32, i64, i32, i32, i32, p, p]
            for fn in (lib.bpf_dense, lib.bpf_conv, lib.bpf_depthwise, lib.bpf_add,
                       lib.bpf_global_avg_pool):
                fn.restype = None
        _library_state["lib"] = lib
    return _library_state["lib"]


def _ptr(t: torch.Tensor | np.ndarray | None):
    if t is None:
        return None
    return t.data_ptr() if isinstance(t, torch.Tensor) else t.ctypes.data


# ------------------------------------------------------------------------------------------
# Packed affine layers
# ------------------------------------------------------------------------------------------


class _PackedAffine:
    """A QConv2d / QLinear's weights in the kernels' layout and its epilogue constants,
    repacked when the module's weight or bias changes (their version counters)."""

    def __init__(self, module: nn.Module, depthwise: bool) -> None:
        self.module = module
        self.depthwise = depthwise
        self.key = None
        shift = module.shift.to(torch.int64)
        self.left = shift.clamp(min=0).to(torch.int32).contiguous()
        self.right = (-shift).clamp(min=0).to(torch.int32).contiguous()
        self.mult = module.multiplier.to(torch.int32).contiguous()
        if isinstance(module, QConv2d):
            k = module.weight.shape[1] * module.kernel_size[0] * module.kernel_size[1]
        else:
            k = module.in_features
        self.acc_bound = accumulator_bound(k, module.input_quant.zero_point)
        self.zero_point = module.input_quant.zero_point
        # Where the module keeps its weight and bias tensors: reading them from these dicts
        # skips nn.Module.__getattr__, which every forward's check would otherwise pay twice.
        self._holders = tuple(module._parameters if name in module._parameters
                              else module._buffers for name in ("weight", "bias"))

    def refresh(self) -> None:
        weights, biases = self._holders
        try:
            w, b = weights["weight"], biases["bias"]
        except KeyError:  # re-registered (a buffer turned parameter): look them up again
            m = self.module
            self._holders = tuple(m._parameters if name in m._parameters else m._buffers
                                  for name in ("weight", "bias"))
            w, b = m.weight, m.bias
        key = (w.data_ptr(), w._version, b.data_ptr(), b._version)
        if key == self.key:
            return
        m = self.module
        w = m.weight
        if self.depthwise:  # (C, 1, KH, KW) -> (KH, KW, C) int32
            self.w = w[:, 0].permute(1, 2, 0).to(torch.int32).contiguous()
        else:  # -> (K2, Cpad, 2) int16 pairs over the reduction (kh, kw, ci)
            co = w.shape[0]
            flat = (w.permute(0, 2, 3, 1).reshape(co, -1) if w.dim() == 4 else w)
            k = flat.shape[1]
            c_pad = -(-co // 8) * 8
            k_pad = k + (k % 2)
            packed = torch.zeros(k_pad, c_pad, dtype=torch.int16)
            packed[:k, :co] = flat.T.to(torch.int16)
            self.w = packed.view(k_pad // 2, 2, c_pad).transpose(1, 2).contiguous()
            self.c_pad = c_pad
            self.k = k
        self.bias = m.bias.to(torch.int32).contiguous()
        largest_bias = int(self.bias.abs().max()) if self.bias.numel() else 0
        vector_ok = bool((self.left == 0).all()) and self.acc_bound + largest_bias <= INT32_MAX
        self.epilogue = _Epilogue(self.bias.data_ptr(), self.mult.data_ptr(),
                                  self.left.data_ptr(), self.right.data_ptr(),
                                  m.output_quant.zero_point, m.range.qmin, m.range.qmax,
                                  int(vector_ok))
        self.key = key

    def offset(self, shape_nchw: tuple[int, ...]) -> torch.Tensor | None:
        """The node offset (Eq. 9) in the output's channels-last layout, as int16."""
        off = self.module.node_offset
        if off is None:
            return None
        off = off.expand(shape_nchw)
        if off.dim() == 4:
            off = off.permute(0, 2, 3, 1)
        # one pass: the int16 conversion and the channels-last copy together
        return torch.empty(off.shape, dtype=torch.int16).copy_(off)


def _dense_scratch(k: int) -> torch.Tensor:
    """bpf_dense's scratch: one row's K values as int16, rounded up to 8 (its row values
    are written eight lanes at a time)."""
    return torch.empty(-(-k // 8) * 4, dtype=torch.int32)


def _conv_op(lib, module: QConv2d):
    depthwise = (module.groups == module.in_channels == module.out_channels
                 and module.weight.shape[1] == 1)
    if module.groups != 1 and not depthwise:
        return None
    packed = _PackedAffine(module, depthwise)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = (module.kernel_size, module.stride, module.padding,
                                              module.dilation)
    pointwise = (kh, kw, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0) and not depthwise

    def run(x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()  # the kernels index raw memory: a no-op on the engine's own outputs
        n, h, w, c = x.shape
        if c != module.in_channels:
            raise ValueError(f"input must have {module.in_channels} channels, got {c}")
        packed.refresh()
        oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        co = module.out_channels
        out = torch.empty(n, oh, ow, co, dtype=torch.int8)
        off = packed.offset((n, co, oh, ow))
        epi = ctypes.byref(packed.epilogue)
        if depthwise:
            lib.bpf_depthwise(x.data_ptr(), n, h, w, c, packed.zero_point, packed.w.data_ptr(),
                              kh, kw, sh, sw, ph, pw, dh, dw, oh, ow, epi, _ptr(off),
                              out.data_ptr())
        elif pointwise:
            scratch = _dense_scratch(packed.k)
            lib.bpf_dense(x.data_ptr(), n * h * w, c, packed.zero_point, packed.w.data_ptr(),
                          co, packed.c_pad, epi, _ptr(off), out.data_ptr(), scratch.data_ptr())
        else:
            k = packed.k
            scratch = torch.empty((k + 1) // 2, dtype=torch.int32)
            lib.bpf_conv(x.data_ptr(), n, h, w, c, packed.zero_point, packed.w.data_ptr(),
                         kh, kw, co, packed.c_pad, sh, sw, ph, pw, dh, dw, oh, ow, epi,
                         _ptr(off), out.data_ptr(), scratch.data_ptr())
        return out

    return run


def _linear_op(lib, module: QLinear):
    packed = _PackedAffine(module, depthwise=False)

    def run(x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 4:  # an NCHW-flatten was expected: go through the reference
            raise _NeedsReference
        if x.shape[-1] != module.in_features:
            raise ValueError(f"input must have shape (..., {module.in_features}), "
                             f"got {tuple(x.shape)}")
        packed.refresh()
        rows = x.reshape(-1, module.in_features).contiguous()
        out = torch.empty(rows.shape[0], module.out_features, dtype=torch.int8)
        off = packed.offset(tuple(x.shape[:-1]) + (module.out_features,))
        scratch = _dense_scratch(packed.k)
        lib.bpf_dense(rows.data_ptr(), rows.shape[0], module.in_features, packed.zero_point,
                      packed.w.data_ptr(), module.out_features, packed.c_pad,
                      ctypes.byref(packed.epilogue), _ptr(off), out.data_ptr(),
                      scratch.data_ptr())
        return out.view(*x.shape[:-1], module.out_features)

    return run


class _NeedsReference(Exception):
    """Raised by an op that cannot run on its channels-last input (never escapes)."""


def _add_op(lib, module: QAdd):
    """TFLite's requantized ADD (the residual add) on any layout: element-wise."""
    p = module.params
    params = _AddParams(*(int(getattr(p, name)) for name, _ in _AddParams._fields_))
    args = (ctypes.byref(params), module.range.qmin, module.range.qmax)

    def run(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        QAdd.check_inputs(a, b)
        a, b = a.contiguous(), b.contiguous()
        out = torch.empty(a.shape, dtype=torch.int8)
        lib.bpf_add(a.data_ptr(), b.data_ptr(), a.numel(), *args, out.data_ptr())
        return out

    return run


def _global_pool_op(lib, module: QGlobalAvgPool2d):
    """TFLite's integer MEAN in one kernel call (from_sums' arithmetic, both rules)."""
    def constants(count: int) -> tuple[int, int, int]:
        if module.rule == "litert":  # 1 / count folded into the multiplier (from_sums)
            k = min(count.bit_length() - 1, 32, 31 + module.shift)
            return (module.multiplier << k) // count, module.shift - k, 0
        return module.multiplier, module.shift, 1

    def run(x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n, h, w, c = x.shape
        count = h * w
        if count == 0 or count * 255 > INT32_MAX:
            raise ValueError(f"H*W must be in [1, {INT32_MAX // 255}], got {count}")
        mult, shift, divide = constants(count)
        sums = torch.empty(c, dtype=torch.int32)
        out = torch.empty(n, c, dtype=torch.int8)
        lib.bpf_global_avg_pool(x.data_ptr(), n, count, c, module.input_quant.zero_point, mult,
                                shift, divide, module.output_quant.zero_point,
                                sums.data_ptr(), out.data_ptr())
        return out[:, None, None, :] if module.keepdim else out

    return run


def _flatten_op(module: QFlatten):
    def run(x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 4 and (module.start_dim, module.end_dim) == (1, -1) and \
                x.shape[1] == x.shape[2] == 1:
            return x.reshape(x.shape[0], -1)  # 1x1 spatial: NHWC and NCHW flatten agree
        raise _NeedsReference

    return run


def _reference_op(module: nn.Module):
    """Any other stage: its own module on an NCHW view (exact by definition)."""
    def run(x: torch.Tensor) -> torch.Tensor:
        out = module(to_nchw(x))
        return to_nhwc(out)

    return run


def to_nhwc(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 2, 3, 1).contiguous() if x.dim() == 4 else x


def to_nchw(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 3, 1, 2).contiguous() if x.dim() == 4 else x


def _compile_module(lib, module: nn.Module):
    kind = type(module)
    if kind is QConv2d:
        op = _conv_op(lib, module)
        if op is not None:
            return op
    elif kind is QLinear:
        return _with_fallback(_linear_op(lib, module), module)
    elif kind is QGlobalAvgPool2d:
        return _global_pool_op(lib, module)
    elif kind is QFlatten:
        return _with_fallback(_flatten_op(module), module)
    elif kind is QReLU:
        return module  # a clamp: layout does not matter
    elif kind is QInvertedResidual:
        add = None if module.add is None else (
            _add_op(lib, module.add) if type(module.add) is QAdd else module.add)
        return BlockOp([_compile_module(lib, m) for m in module.body], add)
    elif kind is nn.Sequential:
        return BlockOp([_compile_module(lib, m) for m in module], None)
    return _reference_op(module)


class BlockOp:
    """A stage that is a chain of ops with an optional residual add of its input (MobileNetV2's
    inverted residual, or a plain Sequential), enterable at any op of the chain. The ops are
    the compiled kernels here, or the reference modules themselves (``StagedModel``)."""

    def __init__(self, body: list, add) -> None:
        self.body = body
        self.add = add

    def prefix(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """The input of op ``i`` of the chain, from the stage input ``x``."""
        for op in self.body[:i]:
            x = op(x)
        return x

    def from_inner(self, i: int, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The stage output from ``h``, the input of op ``i``, and ``x``, the stage input."""
        for op in self.body[i:]:
            h = op(h)
        return h if self.add is None else self.add(x, h)  # element-wise: any layout

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.from_inner(0, x, x)


def _with_fallback(op, module):
    reference = _reference_op(module)

    def run(x: torch.Tensor) -> torch.Tensor:
        try:
            return op(x)
        except _NeedsReference:
            return reference(x)

    return run


class FastStages:
    """The stages of a quantized model's ``body`` compiled to the channels-last kernels.

    ``run(k, x)`` maps the NCHW int8 input of stage ``k`` through stages ``k .. end - 1`` and
    returns the result in NCHW (as the reference would); :meth:`run_nhwc` keeps channels-last
    activations between calls. Bit-identical to running the stages' modules.
    """

    def __init__(self, stages: list[nn.Module], lib) -> None:
        self.lib = lib
        self.ops = [_compile_module(lib, stage) for stage in stages]

    def run_nhwc(self, start: int, x: torch.Tensor, end: int | None = None) -> torch.Tensor:
        for op in self.ops[start:end]:
            x = op(x)
        return x

    def run(self, start: int, x: torch.Tensor, end: int | None = None) -> torch.Tensor:
        return to_nchw(self.run_nhwc(start, to_nhwc(x), end))

    def block(self, k: int) -> BlockOp | None:
        """Stage ``k``'s op when it can be entered inside its chain (:class:`BlockOp`)."""
        op = self.ops[k]
        return op if isinstance(op, BlockOp) else None


def fast_stages(stages: list[nn.Module], engine: str = "auto") -> FastStages | None:
    """:class:`FastStages` for ``stages``, or None for the reference layers.

    ``engine``: "auto" (fast where the kernels compile and ``BPFREE_ENGINE`` is not
    "reference"), "fast" (raise if the kernels are unavailable) or "reference".
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    env = os.environ.get("BPFREE_ENGINE", "auto")
    if env not in ENGINES:
        raise ValueError(f"BPFREE_ENGINE must be one of {ENGINES}, got {env!r}")
    if engine == "auto":
        engine = env
    if engine == "reference":
        return None
    lib = kernel_library()
    if lib is None:
        if engine == "fast":
            raise RuntimeError("engine='fast' needs the compiled int8 kernels, which are "
                               "unavailable (no working C compiler; see the log)")
        return None
    return FastStages(stages, lib)
