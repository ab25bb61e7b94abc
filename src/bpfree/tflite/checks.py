"""Structural checks of a parsed ``.tflite`` graph, run before any layer is built.

The flatbuffer schema types every field but bounds none: a single flipped bit turns a dilation
of 1 into 131072, a stride into 0 or a tensor index into -5, and the file still parses (issue 34
found 132 of 151,000 single-bit flips raising ``ZeroDivisionError``, others growing past 20 GB).
So every operator the reader will use is checked here against the schema (index ranges, enum
values, counts of inputs) and against its neighbours (each declared output shape must be the
one its operator computes from its input, weights and options; constants' shapes agree with
the weights' width), and every tensor's size is bounded. The first failure raises
:class:`~bpfree.tflite.schema.TFLiteFormatError` naming the operator and tensor.

The shapes follow the TFLite reference kernels (``tensorflow/lite/kernels/padding.h``):
SAME gives ``ceil(size / stride)``, VALID ``ceil((size - dilated kernel + 1) / stride)``.
"""

from __future__ import annotations

import math

import numpy as np

from .schema import SCHEMA_VERSION, TFLiteFormatError, tflite

_BO = tflite.BuiltinOperator
_TT = tflite.TensorType

#: Largest tensor bpfree builds, in elements per tensor (batch included): 16 M int8 values,
#: 60x MCUNet-in1's largest activation and far above any MCU model.
MAX_ELEMENTS = 1 << 24
#: Largest stride, dilation, kernel or padding accepted (MCU models use 1 to 7).
MAX_WINDOW = 1 << 12
#: Largest tensor rank accepted (the reader's operators use 1 to 4).
MAX_RANK = 6
#: How many inputs each operator may have, and at which positions -1 ("absent") is allowed.
ARITY = {_BO.CONV_2D: (2, 3), _BO.DEPTHWISE_CONV_2D: (2, 3), _BO.FULLY_CONNECTED: (2, 3),
         _BO.ADD: (2, 2), _BO.MEAN: (2, 2), _BO.AVERAGE_POOL_2D: (1, 1),
         _BO.MAX_POOL_2D: (1, 1), _BO.RESHAPE: (1, 2), _BO.PAD: (2, 3), _BO.SOFTMAX: (1, 1),
         _BO.QUANTIZE: (1, 1), _BO.DEQUANTIZE: (1, 1)}
OPTIONAL_INPUTS = {_BO.CONV_2D: {2}, _BO.DEPTHWISE_CONV_2D: {2}, _BO.FULLY_CONNECTED: {2}}
PADDINGS = {tflite.Padding.SAME: "SAME", tflite.Padding.VALID: "VALID"}


def check_model(r) -> None:
    """Check the file-level fields and every tensor and operator of reader ``r``."""
    version = int(r.model.Version())
    if version != SCHEMA_VERSION:
        raise TFLiteFormatError(f"schema version {version}: bpfree reads version "
                                f"{SCHEMA_VERSION} files (corrupt, or from another tool?)")
    n = len(r.tensors)
    g = r.graph
    for kind, count, get in (("input", g.InputsLength(), g.Inputs),
                             ("output", g.OutputsLength(), g.Outputs)):
        for i in range(count):
            t = int(get(i))
            if not 0 <= t < n:
                raise TFLiteFormatError(f"graph {kind} {i}: tensor index {t} is out of range "
                                        f"({n} tensors)")
    activations = {int(g.Inputs(i)) for i in range(g.InputsLength())}
    for op in r.ops:
        _check_indices(r, op, n)
        activations.update(op.outputs)
    seen = set()
    for op in r.ops:
        for t in op.inputs + op.outputs:
            if t >= 0 and t not in seen:
                seen.add(t)
                _check_tensor(r, op, t, is_activation=t in activations)
    for op in r.ops:
        check = _SHAPE_CHECKS.get(op.code)
        if check is not None:
            check(r, op)


def _check_indices(r, op, n: int) -> None:
    lo, hi = ARITY.get(op.code, (0, 1 << 30))
    if not lo <= len(op.inputs) <= hi:
        raise op.fail(r, f"has {len(op.inputs)} inputs, the operator takes "
                      f"{lo if lo == hi else f'{lo} to {hi}'}", -1)
    if len(op.outputs) != 1:
        raise op.fail(r, f"has {len(op.outputs)} outputs, bpfree's operators have one", -1)
    for pos, t in enumerate(op.inputs):
        if t == -1 and pos in OPTIONAL_INPUTS.get(op.code, ()):
            continue
        if not 0 <= t < n:
            raise op.fail(r, f"input {pos}: tensor index {t} is out of range ({n} tensors)", -1)
    for t in op.outputs:
        if not 0 <= t < n:
            raise op.fail(r, f"output tensor index {t} is out of range ({n} tensors)", -1)


def _check_tensor(r, op, t: int, *, is_activation: bool) -> None:
    tensor = r.tensors[t]
    rank = tensor.ShapeLength()
    if rank > MAX_RANK:
        raise op.fail(r, f"tensor of rank {rank} (at most {MAX_RANK})", t)
    shape = r.shape(t)
    if any(d < 1 for d in shape):
        raise op.fail(r, f"declared shape {shape} has a dimension below 1", t)
    if math.prod(shape) > MAX_ELEMENTS:
        raise op.fail(r, f"declared shape {shape} has {math.prod(shape)} elements, more than "
                      f"the {MAX_ELEMENTS} bpfree accepts", t)
    buffer = int(tensor.Buffer())
    if not 0 <= buffer < r.model.BuffersLength():
        raise op.fail(r, f"buffer index {buffer} is out of range ({r.model.BuffersLength()} "
                      "buffers)", t)
    if is_activation:
        buf = r.model.Buffers(buffer)
        if buf is not None and (buf.DataLength() or buf.Offset()):
            raise op.fail(r, "an activation (an operator's output or the graph input) must not "
                          "hold constant data", t)
    q = tensor.Quantization()
    if q is not None and q.ScaleLength():
        scales = q.ScaleAsNumpy().astype(np.float64)
        if not (np.isfinite(scales).all() and (scales > 0).all()):
            raise op.fail(r, f"quantization scales must be finite and > 0, got "
                          f"{scales[:8].tolist()}", t)
        if q.ZeroPointLength() not in (0, q.ScaleLength()):
            raise op.fail(r, f"{q.ZeroPointLength()} zero points for {q.ScaleLength()} scales", t)
        dim = int(q.QuantizedDimension())
        if q.ScaleLength() > 1 and not (0 <= dim < len(shape)
                                        and shape[dim] == q.ScaleLength()):
            raise op.fail(r, f"{q.ScaleLength()} per-channel scales along axis {dim} of shape "
                          f"{shape}", t)


def _window(r, op, name: str, value: int) -> int:
    if not 1 <= value <= MAX_WINDOW:
        raise op.fail(r, f"{name} {value} must lie in [1, {MAX_WINDOW}]")
    return value


def _spatial_out(r, op, size: int, kernel: int, stride: int, dilation: int, padding: int,
                 axis: str) -> tuple[int, int]:
    """(output length, padded input length) along one axis."""
    extent = (kernel - 1) * dilation + 1
    if padding == tflite.Padding.SAME:
        out = -(-size // stride)
        return out, max((out - 1) * stride + extent, size)
    if extent > size:
        raise op.fail(r, f"{axis}: VALID kernel of {kernel} dilated by {dilation} spans "
                      f"{extent}, wider than the input's {size}")
    return (size - extent) // stride + 1, size


def _window_out(r, op, x, kernel, stride, dilation, padding) -> tuple[int, int]:
    """Output height and width of a convolution or pooling window over NHWC ``x``, after
    checking that the padded input stays within :data:`MAX_ELEMENTS`."""
    n, h, w, c = x
    oh, ph = _spatial_out(r, op, h, kernel[0], stride[0], dilation[0], padding, "height")
    ow, pw = _spatial_out(r, op, w, kernel[1], stride[1], dilation[1], padding, "width")
    if n * ph * pw * c > MAX_ELEMENTS:
        raise op.fail(r, f"a {kernel[0]}x{kernel[1]} kernel dilated by {tuple(dilation)} pads "
                      f"the {h}x{w} input to {ph}x{pw}, more than the {MAX_ELEMENTS} elements "
                      "bpfree accepts")
    return oh, ow


def _expect(r, op, got: tuple, want: tuple, what: str = "output") -> None:
    if tuple(got) != tuple(want):
        raise op.fail(r, f"declared {what} shape {tuple(got)}, but the operator computes "
                      f"{tuple(want)}", op.outputs[0] if what == "output" else None)


def _rank(r, op, t: int, ranks: tuple[int, ...], what: str) -> tuple[int, ...]:
    shape = r.shape(t)
    if len(shape) not in ranks:
        raise op.fail(r, f"{what} must be {' or '.join(f'{k}-D' for k in ranks)}, got shape "
                      f"{shape}", t)
    return shape


def _padding_code(r, op, opts) -> int:
    code = int(opts.Padding())
    if code not in PADDINGS:
        raise op.fail(r, f"padding code {code} is not SAME (0) or VALID (1)")
    return code


def _check_conv(r, op) -> None:
    depthwise = op.code == _BO.DEPTHWISE_CONV_2D
    x = _rank(r, op, op.inputs[0], (4,), "the input")
    w = _rank(r, op, op.inputs[1], (4,), "the weights")
    opts = r.options(op, tflite.DepthwiseConv2DOptions if depthwise else tflite.Conv2DOptions)
    n, h, wd, c = x
    if depthwise:
        if w[0] != 1 or w[3] % c:
            raise op.fail(r, f"depthwise weights {w} for {c} input channels (expected "
                          f"[1, KH, KW, a multiple of {c}])", op.inputs[1])
    elif c % w[3]:
        raise op.fail(r, f"weights {w} take {w[3]} input channels, which do not divide the "
                      f"input's {c}", op.inputs[1])
    elif w[0] % (c // w[3]):
        raise op.fail(r, f"{w[0]} output channels in {c // w[3]} groups", op.inputs[1])
    out_c = w[3] if depthwise else w[0]
    stride = [_window(r, op, f"stride {a}", int(v)) for a, v in
              (("H", opts.StrideH()), ("W", opts.StrideW()))]
    dilation = [_window(r, op, f"dilation {a}", int(v)) for a, v in
                (("H", opts.DilationHFactor()), ("W", opts.DilationWFactor()))]
    for k in w[1:3]:
        _window(r, op, "kernel size", k)
    padding = _padding_code(r, op, opts)
    oh, ow = _window_out(r, op, x, w[1:3], stride, dilation, padding)
    _check_bias(r, op, out_c)
    _expect(r, op, r.shape(op.outputs[0]), (n, oh, ow, out_c))


def _check_bias(r, op, out_c: int) -> None:
    if len(op.inputs) > 2 and op.inputs[2] >= 0 and r.shape(op.inputs[2]) != (out_c,):
        raise op.fail(r, f"bias of shape {r.shape(op.inputs[2])} for {out_c} output channels",
                      op.inputs[2])


def _check_fully_connected(r, op) -> None:
    x = _rank(r, op, op.inputs[0], (2,), "the input (a RESHAPE flattens a 4-D tensor first)")
    w = _rank(r, op, op.inputs[1], (2,), "the weights")
    y = _rank(r, op, op.outputs[0], (2,), "the output")
    if x[1] != w[1]:
        raise op.fail(r, f"weights {w} take rows of {w[1]} features, the input {x} has "
                      f"{x[1]}", op.inputs[1])
    _check_bias(r, op, w[0])
    _expect(r, op, y, (y[0], w[0]))


def _check_pool(r, op) -> None:
    n, h, wd, c = _rank(r, op, op.inputs[0], (4,), "the input")
    opts = r.options(op, tflite.Pool2DOptions)
    kernel = [_window(r, op, f"filter {a}", int(v)) for a, v in
              (("height", opts.FilterHeight()), ("width", opts.FilterWidth()))]
    stride = [_window(r, op, f"stride {a}", int(v)) for a, v in
              (("H", opts.StrideH()), ("W", opts.StrideW()))]
    padding = _padding_code(r, op, opts)
    oh, ow = _window_out(r, op, (n, h, wd, c), kernel, stride, (1, 1), padding)
    _expect(r, op, r.shape(op.outputs[0]), (n, oh, ow, c))


def _check_pad(r, op) -> None:
    x = _rank(r, op, op.inputs[0], (4,), "the input")
    p = r.shape(op.inputs[1])
    if p != (4, 2):
        raise op.fail(r, f"paddings of shape {p} (expected (4, 2))", op.inputs[1])
    pads = r.array(op.inputs[1], op).reshape(4, 2)
    if (pads < 0).any() or (pads > MAX_WINDOW).any():
        raise op.fail(r, f"paddings {pads.tolist()} must lie in [0, {MAX_WINDOW}]",
                      op.inputs[1])
    _expect(r, op, r.shape(op.outputs[0]), tuple(int(d + a + b) for d, (a, b) in zip(x, pads)))


def _check_same_shape(r, op) -> None:
    for t in op.inputs[:2 if op.code == _BO.ADD else 1]:
        _expect(r, op, r.shape(op.outputs[0]), r.shape(t))


def _check_softmax(r, op) -> None:
    _check_same_shape(r, op)
    beta = float(r.options(op, tflite.SoftmaxOptions).Beta())
    if not (math.isfinite(beta) and beta >= 0):  # (too small for LiteRT: softmax_params)
        raise op.fail(r, f"SOFTMAX beta {beta} must be a finite number >= 0")


def _check_reshape(r, op) -> None:
    x, y = r.shape(op.inputs[0]), r.shape(op.outputs[0])
    if math.prod(x) != math.prod(y):
        raise op.fail(r, f"RESHAPE {x} -> {y} changes the number of elements", op.outputs[0])


def _check_mean(r, op) -> None:
    n, _, _, c = _rank(r, op, op.inputs[0], (4,), "the input")
    if r.shape(op.outputs[0]) not in ((n, 1, 1, c), (n, c)):
        raise op.fail(r, f"declared output shape {r.shape(op.outputs[0])}, a MEAN over H and W "
                      f"gives {(n, 1, 1, c)} or {(n, c)}", op.outputs[0])


_SHAPE_CHECKS = {_BO.CONV_2D: _check_conv, _BO.DEPTHWISE_CONV_2D: _check_conv,
                 _BO.FULLY_CONNECTED: _check_fully_connected, _BO.AVERAGE_POOL_2D: _check_pool,
                 _BO.MAX_POOL_2D: _check_pool, _BO.PAD: _check_pad, _BO.ADD: _check_same_shape,
                 _BO.QUANTIZE: _check_same_shape, _BO.DEQUANTIZE: _check_same_shape,
                 _BO.SOFTMAX: _check_softmax, _BO.RESHAPE: _check_reshape,
                 _BO.MEAN: _check_mean}

__all__ = ["MAX_ELEMENTS", "check_model"]
