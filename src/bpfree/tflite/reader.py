"""Read a full-integer ``.tflite`` file into a :class:`~bpfree.quant.ptq.QuantizedModel`.

The flatbuffer is parsed with the ``tflite`` package's generated schema classes. The graph is
checked completely (file identifier, one subgraph, every operator supported, int8 activations,
int8 weights, int32 biases, a chain of one-input stages with residual ADDs) before any layer is
built; every error is a :class:`~bpfree.tflite.schema.TFLiteFormatError` naming the operator,
its index and its tensor, and nothing is returned half-built.

The model is rebuilt from bpfree's own layers (:mod:`bpfree.quant`) in NCHW layout:

* CONV_2D / DEPTHWISE_CONV_2D -> :class:`~bpfree.quant.layers.QConv2d` (SAME padding that is
  symmetric, or a PAD just before a VALID convolution, becomes the convolution's padding;
  asymmetric SAME padding becomes a :class:`~bpfree.tflite.stages.QPad` stage before it);
* FULLY_CONNECTED -> :func:`~bpfree.tflite.stages.litert_linear` (after a RESHAPE of a 4-D tensor
  its weight columns are permuted from NHWC to NCHW flattening order);
* a tensor consumed twice and joined again by ADD -> :class:`~bpfree.quant.ptq.QInvertedResidual`
  (the branch's layers and a :class:`~bpfree.quant.layers.QAdd`), the stage structure
  :class:`bpfree.pmt.PMTTrainer` trains;
* MEAN over H, W -> :class:`~bpfree.quant.layers.QGlobalAvgPool2d` with LiteRT's rule;
  AVERAGE_POOL_2D / MAX_POOL_2D -> :class:`~bpfree.quant.layers.QAvgPool2d` /
  :class:`~bpfree.quant.ptq.QMaxPool2d`;
  RESHAPE to (N, features) -> :class:`~bpfree.quant.layers.QFlatten`;
* SOFTMAX of (N, classes) -> :class:`~bpfree.tflite.softmax.QSoftmax` (int8, inference only);
* QUANTIZE of a float input / DEQUANTIZE of the output at the edges: the loaded model's
  ``input_quant`` / ``output_quant`` (``QuantizedModel.forward`` quantizes float inputs itself).

The loaded model's ``input_shape`` is one sample's NCHW shape; the file's NHWC input ``x`` is
``x.permute(0, 3, 1, 2)`` for it.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..io import check_input_file
from ..quant.layers import QAdd, QAvgPool2d, QConv2d, QFlatten, QGlobalAvgPool2d, QLinear
from ..quant.params import TensorQuant, WeightQuant
from ..quant.stages import QInvertedResidual, QMaxPool2d, QuantizedModel, stage_output_quant
from .checks import check_model
from .schema import (ACTIVATIONS, FILE_IDENTIFIER, SUPPORTED_OPS, TFLiteFormatError, op_name,
                     tflite, type_name)
from .source import TFLiteSource
from .softmax import OUTPUT_QUANT, QSoftmax
from .stages import QPad, litert_linear

_BO = tflite.BuiltinOperator
#: Largest file read: a 2 GB flatbuffer is the format's own limit, and MCU models are < 10 MB.
MAX_FILE_BYTES = 1 << 30
_TT = tflite.TensorType
_NUMPY = {_TT.INT8: "<i1", _TT.INT32: "<i4", _TT.INT64: "<i8", _TT.FLOAT32: "<f4"}


@dataclass
class _Op:
    index: int
    code: int
    name: str
    inputs: list[int]
    outputs: list[int]
    raw: object  # tflite.Operator

    def fail(self, reader: _Reader, message: str, tensor: int | None = None) -> TFLiteFormatError:
        t = self.inputs[0] if tensor is None and self.inputs else tensor
        where = "" if t is None or t < 0 else f" on tensor {t} {reader.tensor_name(t)!r}"
        return TFLiteFormatError(f"operator {self.index} ({self.name}){where}: {message}")


class _Reader:
    def __init__(self, data: bytes) -> None:
        if len(data) < 8 or not tflite.Model.ModelBufferHasIdentifier(data, 0):
            raise TFLiteFormatError(f"not a .tflite file: the file identifier is not "
                                    f"{FILE_IDENTIFIER.decode()} (truncated or corrupt?)")
        self.data = data
        self.model = tflite.Model.GetRootAsModel(data, 0)
        if self.model.SubgraphsLength() != 1:
            raise TFLiteFormatError(f"the file has {self.model.SubgraphsLength()} subgraphs; "
                                    "bpfree loads models with exactly one")
        self.graph = self.model.Subgraphs(0)
        self.tensors = [self.graph.Tensors(i) for i in range(self.graph.TensorsLength())]
        self._shapes: dict[int, tuple[int, ...]] = {}
        codes = []
        for i in range(self.model.OperatorCodesLength()):
            oc = self.model.OperatorCodes(i)
            codes.append(max(int(oc.BuiltinCode()), int(oc.DeprecatedBuiltinCode())))
        self.ops = []
        for i in range(self.graph.OperatorsLength()):
            op = self.graph.Operators(i)
            idx = op.OpcodeIndex()
            if idx >= len(codes):
                raise TFLiteFormatError(f"operator {i}: opcode index {idx} is out of range")
            code = codes[idx]
            self.ops.append(_Op(i, code, op_name(code), [int(v) for v in op.InputsAsNumpy()],
                                [int(v) for v in op.OutputsAsNumpy()], op))
        for op in self.ops:  # (negative indices, bar an absent bias: checks.check_model)
            for t in op.inputs + op.outputs:
                if t >= len(self.tensors):
                    raise TFLiteFormatError(f"operator {op.index} ({op.name}): tensor index {t} "
                                            f"is out of range ({len(self.tensors)} tensors)")

    # ------------------------------------------------------------------------ tensors

    def tensor_name(self, t: int) -> str:
        name = self.tensors[t].Name()
        return name.decode("utf-8", "replace") if name is not None else f"#{t}"

    def shape(self, t: int) -> tuple[int, ...]:
        if t not in self._shapes:  # cached: the checks and the builder ask many times
            self._shapes[t] = tuple(int(s) for s in self.tensors[t].ShapeAsNumpy()) \
                if self.tensors[t].ShapeLength() else ()
        return self._shapes[t]

    def ttype(self, t: int) -> int:
        return int(self.tensors[t].Type())

    def array(self, t: int, op: _Op) -> np.ndarray:
        tensor = self.tensors[t]
        buf = self.model.Buffers(tensor.Buffer())
        dtype = _NUMPY.get(self.ttype(t))
        if dtype is None:
            raise op.fail(self, f"constant of type {type_name(self.ttype(t))} is not supported", t)
        if buf is None or buf.DataLength() == 0:
            if buf is not None and buf.Offset():  # data stored after the flatbuffer (>2 GB files)
                start, size = int(buf.Offset()), int(buf.Size())
                raw = self.data[start:start + size]
            else:
                raise op.fail(self, "this input must be a constant with data in the file", t)
        else:
            raw = buf.DataAsNumpy().tobytes()
        shape = self.shape(t)
        count = int(np.prod(shape)) if shape else 1
        if len(raw) != count * np.dtype(dtype).itemsize:
            raise op.fail(self, f"constant holds {len(raw)} bytes, its shape {shape} needs "
                          f"{count * np.dtype(dtype).itemsize}", t)
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()

    def quant(self, t: int) -> tuple[list[float], list[int], int]:
        q = self.tensors[t].Quantization()
        if q is None or q.ScaleLength() == 0:
            return [], [], 0
        return ([float(s) for s in q.ScaleAsNumpy()], [int(z) for z in q.ZeroPointAsNumpy()],
                int(q.QuantizedDimension()))

    def activation_quant(self, t: int, op: _Op) -> TensorQuant:
        kind = self.ttype(t)
        if kind == _TT.FLOAT32:
            raise op.fail(self, "float activations: bpfree loads full-integer models (convert "
                          "with int8 quantization of every operator)", t)
        if kind != _TT.INT8:
            raise op.fail(self, f"{type_name(kind)} activations are not supported (int8 only)", t)
        scales, zeros, _ = self.quant(t)
        if len(scales) != 1 or len(zeros) != 1:
            raise op.fail(self, f"an activation needs one scale and zero point, got {len(scales)}"
                          f" scales", t)
        try:
            return TensorQuant(scales[0], zeros[0])
        except ValueError as err:
            raise op.fail(self, str(err), t) from None

    def options(self, op: _Op, cls):
        table = op.raw.BuiltinOptions()
        if table is None:
            raise op.fail(self, f"missing {cls.__name__}")
        opts = cls()
        opts.Init(table.Bytes, table.Pos)
        return opts

    def activation(self, op: _Op, opts) -> str | None:
        code = int(opts.FusedActivationFunction())
        if code not in ACTIVATIONS:
            raise op.fail(self, f"fused activation {code} is not supported (NONE, RELU, RELU6)")
        return ACTIVATIONS[code]


def _output_quant(stage: nn.Module, q: TensorQuant) -> TensorQuant:
    return stage.output_quant if isinstance(stage, QSoftmax) else stage_output_quant(stage, q)


def _nchw(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[0], shape[3], shape[1], shape[2]) if len(shape) == 4 else shape


def _same_padding(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    out = -(-size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


class _Builder:
    """Turns the checked operator list into stages (an op at a time, following the chain)."""

    def __init__(self, r: _Reader) -> None:
        self.r = r
        self.consumers: dict[int, int] = {}
        for op in r.ops:
            for t in op.inputs:
                self.consumers[t] = self.consumers.get(t, 0) + 1
        self.pending_pad: tuple[int, int, int, int] | None = None
        self.flatten_from: tuple[int, ...] | None = None  # NHWC shape of a flattened tensor

    def padding(self, op: _Op, opts, x_shape, w_hw, stride, dilation) -> tuple[int, int, int, int]:
        if int(opts.Padding()) == tflite.Padding.VALID:
            return (0, 0, 0, 0)
        th, bh = _same_padding(x_shape[1], w_hw[0], stride[0], dilation[0])
        tw, bw = _same_padding(x_shape[2], w_hw[1], stride[1], dilation[1])
        return (th, bh, tw, bw)

    def affine(self, op: _Op, q_in: TensorQuant) -> list[nn.Module]:
        r = self.r
        x, w_t = op.inputs[0], op.inputs[1]
        b_t = op.inputs[2] if len(op.inputs) > 2 else -1
        if r.ttype(w_t) != _TT.INT8:
            raise op.fail(r, f"weights of type {type_name(r.ttype(w_t))} (int8 only)", w_t)
        w = r.array(w_t, op).astype(np.int64)
        scales, zeros, axis = r.quant(w_t)
        if not scales or any(zeros):
            raise op.fail(r, "weights must be symmetric int8 (zero point 0) with scales", w_t)
        bias = None
        if b_t >= 0:
            if r.ttype(b_t) != _TT.INT32:
                raise op.fail(r, f"bias of type {type_name(r.ttype(b_t))} (int32 only)", b_t)
            bias = torch.from_numpy(r.array(b_t, op).astype(np.int64))
        y = op.outputs[0]
        q_out = r.activation_quant(y, op)
        common = dict(weight_scale=WeightQuant(scales), input_quant=q_in, output_quant=q_out)
        if op.code == _BO.FULLY_CONNECTED:
            opts = r.options(op, tflite.FullyConnectedOptions)
            if int(opts.WeightsFormat()) != 0:
                raise op.fail(r, "shuffled FULLY_CONNECTED weights are not supported", w_t)
            if len(scales) > 1 and axis != 0:
                raise op.fail(r, f"per-channel weights along axis {axis} (0 expected)", w_t)
            hwc = None
            if self.flatten_from is not None and len(self.flatten_from) == 4:
                _, h, wd, c = self.flatten_from
                w = w.reshape(-1, h, wd, c).transpose(0, 3, 1, 2).reshape(w.shape[0], -1)
                hwc = (h, wd, c)
            self.flatten_from = None
            linear = litert_linear(QLinear(torch.from_numpy(w), bias,
                                           activation=r.activation(op, opts), **common))
            linear.tflite_source = TFLiteSource(w_t, b_t, "fc", hwc)  # for save: patch.py
            return [linear]
        x_shape = r.shape(x)
        if len(x_shape) != 4:
            raise op.fail(r, f"input must be 4-D NHWC, got shape {x_shape}", x)
        depthwise = op.code == _BO.DEPTHWISE_CONV_2D
        if depthwise:
            opts = r.options(op, tflite.DepthwiseConv2DOptions)
            if len(scales) > 1 and axis != 3:
                raise op.fail(r, f"per-channel weights along axis {axis} (3 expected)", w_t)
            weight = torch.from_numpy(w.transpose(3, 0, 1, 2).copy())  # [1,KH,KW,O] -> [O,1,KH,KW]
            groups = x_shape[3]
            if weight.shape[0] % groups:
                raise op.fail(r, f"{weight.shape[0]} output channels for {groups} input channels",
                              w_t)
        else:
            opts = r.options(op, tflite.Conv2DOptions)
            if len(scales) > 1 and axis != 0:
                raise op.fail(r, f"per-channel weights along axis {axis} (0 expected)", w_t)
            weight = torch.from_numpy(w.transpose(0, 3, 1, 2).copy())  # [O,KH,KW,I] -> [O,I,KH,KW]
            groups = x_shape[3] // weight.shape[1]
        stride = (int(opts.StrideH()), int(opts.StrideW()))
        dilation = (int(opts.DilationHFactor()), int(opts.DilationWFactor()))
        pads = self.padding(op, opts, x_shape, weight.shape[2:], stride, dilation)
        stages: list[nn.Module] = []
        if self.pending_pad is not None:  # PAD just before: merge when the result is symmetric
            if pads != (0, 0, 0, 0):
                stages.append(QPad(self.pending_pad, q_in))
            else:
                pads = self.pending_pad
            self.pending_pad = None
        if pads[0] != pads[1] or pads[2] != pads[3]:
            stages.append(QPad(pads, q_in))
            pads = (0, 0, 0, 0)
        stages.append(QConv2d(weight, bias, stride=stride, padding=(pads[0], pads[2]),
                              dilation=dilation, groups=groups,
                              activation=r.activation(op, opts), **common))
        stages[-1].tflite_source = TFLiteSource(w_t, b_t, "depthwise" if depthwise else "conv")
        return stages

    def stage(self, op: _Op, q_in: TensorQuant) -> list[nn.Module]:
        """The bpfree stages of one single-input operator (ADD is handled by :meth:`build`)."""
        r = self.r
        if self.pending_pad is not None and op.code not in (_BO.CONV_2D, _BO.DEPTHWISE_CONV_2D):
            stages = [QPad(self.pending_pad, q_in)]
            self.pending_pad = None
            return stages + self.stage(op, q_in)
        y = op.outputs[0]
        if op.code in (_BO.CONV_2D, _BO.DEPTHWISE_CONV_2D, _BO.FULLY_CONNECTED):
            return self.affine(op, q_in)
        q_out = r.activation_quant(y, op)
        same_quant = q_out == q_in
        if op.code == _BO.MEAN:
            axes = sorted(int(a) % 4 for a in r.array(op.inputs[1], op).reshape(-1))
            if len(r.shape(op.inputs[0])) != 4 or axes != [1, 2]:
                raise op.fail(r, f"MEAN over axes {axes} (only H and W, [1, 2], of a 4-D tensor)")
            keep = bool(r.options(op, tflite.ReducerOptions).KeepDims())
            return [QGlobalAvgPool2d(q_in, q_out, keepdim=keep, rule="litert")]
        if op.code in (_BO.AVERAGE_POOL_2D, _BO.MAX_POOL_2D):
            if not same_quant:
                raise op.fail(r, "pooling must keep the input's scale and zero point", y)
            opts = r.options(op, tflite.Pool2DOptions)
            kernel = (int(opts.FilterHeight()), int(opts.FilterWidth()))
            stride = (int(opts.StrideH()), int(opts.StrideW()))
            pads = self.padding(op, opts, r.shape(op.inputs[0]), kernel, stride, (1, 1))
            if pads[0] != pads[1] or pads[2] != pads[3]:
                raise op.fail(r, f"asymmetric SAME padding {pads} of a pooling is not supported")
            act = r.activation(op, opts)
            if op.code == _BO.MAX_POOL_2D:
                if act is not None:
                    raise op.fail(r, f"MAX_POOL_2D with a fused {act} is not supported")
                return [QMaxPool2d(kernel, stride, (pads[0], pads[2]))]
            return [QAvgPool2d(kernel, stride, (pads[0], pads[2]), quant=q_in, activation=act)]
        if op.code == _BO.RESHAPE:
            if not same_quant:
                raise op.fail(r, "RESHAPE must keep the input's scale and zero point", y)
            in_shape, out_shape = r.shape(op.inputs[0]), r.shape(y)
            if len(out_shape) != 2 or len(in_shape) not in (2, 4):
                raise op.fail(r, f"RESHAPE {in_shape} -> {out_shape}: only flattening to "
                              "(N, features) is supported")
            if len(in_shape) == 4 and in_shape[1] * in_shape[2] > 1:
                self.flatten_from = in_shape
            return [QFlatten()]
        if op.code == _BO.PAD:
            if not same_quant:
                raise op.fail(r, "PAD must keep the input's scale and zero point", y)
            if len(op.inputs) > 2:
                raise op.fail(r, "PAD with an explicit constant value (PADV2) is not supported")
            p = r.array(op.inputs[1], op).reshape(-1, 2)
            if p.shape != (4, 2) or p[0].any() or p[3].any() or (p < 0).any():
                raise op.fail(r, f"paddings {p.tolist()}: only H and W of a 4-D tensor")
            self.pending_pad = (int(p[1, 0]), int(p[1, 1]), int(p[2, 0]), int(p[2, 1]))
            if self.consumers.get(y, 0) != 1:
                stages = [QPad(self.pending_pad, q_in)]
                self.pending_pad = None
                return stages
            return []
        if op.code == _BO.SOFTMAX:
            if len(r.shape(op.inputs[0])) != 2:
                raise op.fail(r, f"SOFTMAX of a {len(r.shape(op.inputs[0]))}-D tensor (only "
                              "(N, classes))")
            if q_out != OUTPUT_QUANT:
                raise op.fail(r, f"SOFTMAX output must be quantized with scale 1/256 and zero "
                              f"point -128, got {q_out}", y)
            return [QSoftmax(q_in, float(r.options(op, tflite.SoftmaxOptions).Beta()))]
        raise op.fail(r, "operator not supported here")

    def build(self) -> QuantizedModel:
        r = self.r
        g = r.graph
        if g.InputsLength() != 1 or g.OutputsLength() != 1:
            raise TFLiteFormatError(f"the graph has {g.InputsLength()} inputs and "
                                    f"{g.OutputsLength()} outputs; bpfree loads one of each")
        ops = list(r.ops)
        for op in ops:  # everything checked before anything is built
            if op.code not in SUPPORTED_OPS:
                supported = ", ".join(SUPPORTED_OPS.values())
                raise op.fail(r, f"unsupported operator (supported: {supported})")
        check_model(r)  # indices, enums, shapes against each other, sizes (checks.py)
        for op in ops:
            for t in op.inputs + op.outputs:
                if t >= 0 and r.ttype(t) == _TT.INT16:
                    raise op.fail(r, "int16 activations are not supported (int8 only)", t)
        cur = int(g.InputsAsNumpy()[0])
        graph_output = int(g.OutputsAsNumpy()[0])
        if ops and ops[0].code == _BO.QUANTIZE and r.ttype(cur) == _TT.FLOAT32:
            cur = ops[0].outputs[0]
            ops = ops[1:]
        if ops and ops[-1].code == _BO.DEQUANTIZE and ops[-1].outputs[0] == graph_output:
            graph_output = ops[-1].inputs[0]
            ops = ops[:-1]
        first = ops[0] if ops else None
        if first is None:
            raise TFLiteFormatError("the graph has no operator to load")
        input_quant = r.activation_quant(cur, first)
        input_shape = _nchw(r.shape(cur))[1:]
        stages: list[nn.Module] = []
        q = input_quant
        i = 0
        while i < len(ops):
            op = ops[i]
            if op.code in (_BO.QUANTIZE, _BO.DEQUANTIZE):
                raise op.fail(r, "QUANTIZE / DEQUANTIZE only at the input and output edges")
            if op.inputs[0] != cur:
                raise op.fail(r, "the graph is not a chain of stages: this operator does not "
                              "read the previous one's output")
            if self.consumers.get(cur, 0) == 2:  # a residual branch starts here
                block_in, q_block, body = cur, q, []
                while True:
                    if i >= len(ops):
                        raise TFLiteFormatError(f"tensor {block_in} {r.tensor_name(block_in)!r} "
                                                "is used twice but never joined by an ADD")
                    op = ops[i]
                    if op.code == _BO.ADD:
                        if sorted(op.inputs) != sorted([block_in, cur]) or cur == block_in:
                            raise op.fail(r, "ADD must join a branch with its input")
                        add_opts = r.options(op, tflite.AddOptions)
                        try:
                            add = QAdd(q_block, q, r.activation_quant(op.outputs[0], op),
                                       activation=r.activation(op, add_opts))
                        except ValueError as err:
                            raise op.fail(r, str(err)) from None
                        break
                    if op.inputs[0] != cur:
                        raise op.fail(r, "a residual branch must be a chain of operators")
                    body += self._checked(op, q)
                    q, cur, i = _output_quant(body[-1], q) if body else q, op.outputs[0], i + 1
                stages.append(QInvertedResidual(nn.Sequential(*body), add))
                q, cur, i = add.output_quant, op.outputs[0], i + 1
                continue
            if self.consumers.get(cur, 0) > 2:
                raise op.fail(r, f"tensor is used {self.consumers[cur]} times (at most twice: "
                              "a residual branch)", cur)
            new = self._checked(op, q)
            stages += new
            for s in new:
                q = _output_quant(s, q)
            cur, i = op.outputs[0], i + 1
        if cur != graph_output:
            raise TFLiteFormatError(f"the graph output {graph_output} is not the last "
                                    f"operator's output {cur}")
        if not stages:
            raise TFLiteFormatError("the graph has no operator to load")
        quants, qq = [], input_quant
        for s in stages:
            qq = _output_quant(s, qq)
            quants.append(qq)
        model = QuantizedModel(nn.Sequential(*stages), input_quant, quants)
        model.input_shape = input_shape
        return model

    def _checked(self, op: _Op, q: TensorQuant) -> list[nn.Module]:
        try:
            return self.stage(op, q)
        except TFLiteFormatError:
            raise
        except (ValueError, ArithmeticError, IndexError, RuntimeError) as err:
            # a check missed above still names the operator, never a bare ZeroDivisionError
            raise op.fail(self.r, f"{type(err).__name__}: {err}") from None


def from_bytes(data: bytes) -> QuantizedModel:
    """:func:`load` of a ``.tflite`` file's bytes."""
    try:
        model = _Builder(_Reader(bytes(data))).build()
        model.tflite_file = bytes(data)  # what save() patches (bpfree.tflite.patch)
        return model
    except TFLiteFormatError:
        raise
    except (struct.error, IndexError, TypeError, UnicodeDecodeError, ValueError,
            OverflowError, AttributeError) as err:
        raise TFLiteFormatError(f"corrupt or truncated .tflite file ({type(err).__name__}: "
                                f"{err})") from None


def load(path: str | os.PathLike) -> QuantizedModel:
    """The real-quantized model of a full-integer ``.tflite`` file (module docstring).

    Returns a :class:`~bpfree.quant.ptq.QuantizedModel` on the CPU taking NCHW int8 input (or
    float input, quantized with the file's input parameters) and returning the file's output;
    ``model.input_shape`` is one sample's NCHW shape. Raises
    :class:`~bpfree.tflite.schema.TFLiteFormatError` (a ValueError) for an unsupported operator,
    a float or int16 model, or a truncated or corrupt file, and FileNotFoundError.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file: {path}")
    try:
        check_input_file(path, "model")
    except ValueError as err:
        raise TFLiteFormatError(str(err)) from None
    size = os.path.getsize(path)
    if size > MAX_FILE_BYTES:
        raise TFLiteFormatError(f"{path} is {size / 2**20:.0f} MiB; bpfree loads .tflite files "
                                f"of at most {MAX_FILE_BYTES >> 20} MiB (MCU models are far "
                                "smaller)")
    with open(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    return from_bytes(data)
