"""Lower a real-quantized model to the flat operator list the C runtime interprets.

Each stage of :class:`~bpfree.quant.QuantizedModel` becomes one or more operators on int8
tensors (an inverted-residual block: its convolutions, then the residual add). Tensors carry
their per-sample shape; every operator names its input and output tensors, so the arena
planner (:mod:`.plan`) sees the liveness of every buffer. An unsupported layer raises a
``ValueError`` that names it and the supported kinds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from ..quant.layers import (
    QAdd,
    QAvgPool2d,
    QConv2d,
    QFlatten,
    QGlobalAvgPool2d,
    QLinear,
    QReLU,
)
from ..quant.stages import QInvertedResidual, QMaxPool2d
from ..tflite.stages import QPad

#: The most terms a convolution output may sum: the C accumulates w (x - z_x), each at most
#: 128 * 255 in magnitude, in int32 (65792 * 32640 < 2**31).
MAX_REDUCTION = 65792
#: The kernel classes of bpfree_runtime.c's kernel_class(), in its enum's order.
KERNEL_CLASSES = ("conv", "pointwise", "depthwise", "linear", "pool", "add", "other")
KINDS = {"affine": 0, "add": 1, "maxpool": 2, "avgpool": 3, "gap": 4, "clamp": 5, "copy": 6,
         "pad": 7}
SUPPORTED = ("QConv2d (any stride / padding / dilation / groups, incl. depthwise and 1x1)",
             "QLinear (fixed point, or a .tflite's float-scale FULLY_CONNECTED)",
             "QInvertedResidual (with QAdd)", "QMaxPool2d", "QAvgPool2d",
             "QGlobalAvgPool2d", "QReLU", "QFlatten", "QPad", "Identity")


@dataclass
class Tensor:
    """An int8 activation: per-sample (C, H, W) and the ops that define and read it."""

    c: int
    h: int
    w: int
    producer: int = -1
    consumers: list[int] = field(default_factory=list)

    @property
    def numel(self) -> int:
        return self.c * self.h * self.w


@dataclass
class Op:
    kind: str
    inputs: list[int]
    output: int
    stage: int
    module: nn.Module | None = None
    name: str = ""
    params: dict = field(default_factory=dict)


@dataclass
class Graph:
    tensors: list[Tensor]
    ops: list[Op]
    stage_first_op: list[int]

    def affine_ops(self) -> list[Op]:
        return [op for op in self.ops if op.kind == "affine"]


def _unsupported(name: str, module: nn.Module, why: str = "") -> ValueError:
    return ValueError(f"layer {name!r} ({type(module).__name__}) is not supported by the device "
                      f"exporter{': ' + why if why else ''}; supported: {', '.join(SUPPORTED)}")


def _pool_out(size: int, k: int, s: int, p: int, d: int = 1) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


class _Builder:
    def __init__(self, sample_shape: tuple[int, ...]) -> None:
        c, h, w = (sample_shape[0], 1, 1) if len(sample_shape) == 1 else sample_shape
        self.tensors = [Tensor(c, h, w)]
        self.ops: list[Op] = []

    def add(self, kind, inputs, shape, stage, module=None, name="", **params) -> int:
        self.tensors.append(Tensor(*shape))
        out = len(self.tensors) - 1
        index = len(self.ops)
        for t in inputs:
            self.tensors[t].consumers.append(index)
        self.tensors[out].producer = index
        self.ops.append(Op(kind, list(inputs), out, stage, module, name, params))
        return out

    def affine(self, module, x: int, stage: int, name: str) -> int:
        t = self.tensors[x]
        weight = module.weight
        if hasattr(module, "effective_scale") and not isinstance(module, QLinear):
            raise _unsupported(name, module, "the float-scale epilogue is implemented for "
                               "fully connected layers only")
        if weight.numel() // weight.shape[0] > MAX_REDUCTION:
            raise _unsupported(name, module, f"an output sums {weight.numel() // weight.shape[0]} "
                               f"products, more than the {MAX_REDUCTION} an int32 accumulator "
                               "holds exactly")
        if isinstance(module, QLinear):
            if t.h != 1 or t.w != 1 or t.c != module.in_features:
                raise _unsupported(name, module, f"its input must be a flat vector of "
                                   f"{module.in_features} features per sample, got "
                                   f"({t.c}, {t.h}, {t.w})")
            shape = (module.out_features, 1, 1)
        else:
            kh, kw = module.kernel_size
            (sh, sw), (ph, pw), (dh, dw) = module.stride, module.padding, module.dilation
            shape = (module.out_channels, _pool_out(t.h, kh, sh, ph, dh),
                     _pool_out(t.w, kw, sw, pw, dw))
        return self.add("affine", [x], shape, stage, module, name)

    def stage(self, module: nn.Module, x: int, k: int, name: str) -> int:
        t = self.tensors[x]
        if isinstance(module, (QConv2d, QLinear)):
            return self.affine(module, x, k, name)
        if isinstance(module, QInvertedResidual):
            h = x
            for i, conv in enumerate(module.body):
                if not isinstance(conv, QConv2d):
                    raise _unsupported(f"{name}.body.{i}", conv)
                h = self.affine(conv, h, k, f"{name}.body.{i}")
            if module.add is None:
                return h
            return self.add("add", [x, h], (t.c, t.h, t.w), k, module.add, f"{name}.add")
        if isinstance(module, QMaxPool2d):
            (kh, kw), (sh, sw), (ph, pw) = (_pair(module.kernel_size), _pair(module.stride),
                                            _pair(module.padding))
            if _pair(module.dilation) != (1, 1) or module.ceil_mode:
                raise _unsupported(name, module, "dilation must be 1 and ceil_mode False")
            shape = (t.c, _pool_out(t.h, kh, sh, ph), _pool_out(t.w, kw, sw, pw))
            return self.add("maxpool", [x], shape, k, module, name, kernel=(kh, kw),
                            stride=(sh, sw), padding=(ph, pw), qmin=-128, qmax=127)
        if isinstance(module, QAvgPool2d):
            (kh, kw), (sh, sw), (ph, pw) = module.kernel_size, module.stride, module.padding
            shape = (t.c, _pool_out(t.h, kh, sh, ph), _pool_out(t.w, kw, sw, pw))
            return self.add("avgpool", [x], shape, k, module, name, kernel=(kh, kw),
                            stride=(sh, sw), padding=(ph, pw), qmin=module.range.qmin,
                            qmax=module.range.qmax)
        if isinstance(module, QPad):
            top, bottom, left, right = module.pads
            return self.add("pad", [x], (t.c, t.h + top + bottom, t.w + left + right), k,
                            module, name, pads=module.pads, value=module.quant.zero_point)
        if isinstance(module, QGlobalAvgPool2d):
            return self.add("gap", [x], (t.c, 1, 1), k, module, name)
        if isinstance(module, QReLU):
            return self.add("clamp", [x], (t.c, t.h, t.w), k, module, name,
                            qmin=module.range.qmin, qmax=module.range.qmax)
        if isinstance(module, (QFlatten, nn.Flatten)):
            if module.start_dim != 1 or module.end_dim != -1:
                raise _unsupported(name, module, "only Flatten(1, -1) is supported")
            return self.add("copy", [x], (t.numel, 1, 1), k, module, name)
        if isinstance(module, nn.Identity):
            return self.add("copy", [x], (t.c, t.h, t.w), k, module, name)
        raise _unsupported(name, module)


def lower(model: nn.Module, sample_shape: tuple[int, ...]) -> Graph:
    """The operator list of ``model.body`` for inputs of per-sample shape ``sample_shape``."""
    if len(sample_shape) not in (1, 3):
        raise ValueError(f"sample shape must be (features,) or (C, H, W), got {sample_shape}")
    b = _Builder(tuple(sample_shape))
    h = 0
    first = []
    for k, stage in enumerate(model.body):
        first.append(len(b.ops))
        h = b.stage(stage, h, k, f"body.{k}")
        if len(b.ops) == first[-1]:
            raise _unsupported(f"body.{k}", stage, "a stage must produce at least one op")
    out = b.tensors[h]
    if out.h != 1 or out.w != 1:
        raise ValueError(f"the model must end in flat logits, got per-sample shape "
                         f"({out.c}, {out.h}, {out.w})")
    return Graph(b.tensors, b.ops, first)


def add_constants(add: QAdd) -> list[int]:
    p = add.params
    return [p.input1_offset, p.input2_offset, p.left_shift, p.input1_multiplier, p.input1_shift,
            p.input2_multiplier, p.input2_shift, p.output_multiplier, p.output_shift,
            p.output_offset]


def gap_constants(gap: QGlobalAvgPool2d, count: int) -> list[int]:
    """(in zp, out zp, multiplier, shift, litert?) with LiteRT's 1/count folded in."""
    if gap.rule == "litert":
        k = min(count.bit_length() - 1, 32, 31 + gap.shift)
        return [gap.input_quant.zero_point, gap.output_quant.zero_point,
                (gap.multiplier << k) // count, gap.shift - k, 1]
    return [gap.input_quant.zero_point, gap.output_quant.zero_point, gap.multiplier, gap.shift, 0]


def kernel_class(graph: Graph, op: Op) -> str:
    """The runtime's kernel for ``op`` (one of :data:`KERNEL_CLASSES`), as the C dispatches."""
    if op.kind == "add":
        return "add"
    if op.kind in ("maxpool", "avgpool", "gap"):
        return "pool"
    if op.kind != "affine":
        return "other"
    m = op.module
    if isinstance(m, QLinear):
        return "linear"
    groups, cin, cout = m.groups, m.in_channels, m.out_channels
    if groups > 1 and groups == cin == cout:
        return "depthwise"
    if (groups > 1 or tuple(m.kernel_size) != (1, 1) or tuple(m.stride) != (1, 1)
            or tuple(m.padding) != (0, 0)):
        return "conv"
    t = graph.tensors[op.inputs[0]]
    return "linear" if t.h * t.w == 1 else "pointwise"


def macs_by_kernel(graph: Graph) -> dict[str, int]:
    """Multiply-accumulates per sample of one forward, per kernel class."""
    out = dict.fromkeys(KERNEL_CLASSES, 0)
    for op in graph.affine_ops():
        w = op.module.weight
        out[kernel_class(graph, op)] += graph.tensors[op.output].numel * (w.numel() // w.shape[0])
    return out
