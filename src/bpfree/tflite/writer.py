"""Write a :class:`~bpfree.quant.ptq.QuantizedModel` as a full-integer ``.tflite`` file.

The file holds the model's own integers: int8 weights (per output channel, zero point 0), int32
biases, and the same float32 scales and zero points, so LiteRT's reference kernels recompute
the same fixed-point multipliers (:class:`~bpfree.quant.params.Requantization`) and give the
same int8 outputs as bpfree's forward. Input and output are int8 tensors; 4-D activations are
NHWC as TFLite requires (bpfree's NCHW input ``x`` is the file's ``x.permute(0, 2, 3, 1)``).

Stage mapping (:data:`bpfree.tflite.schema.SUPPORTED_OPS`): ``QConv2d`` -> CONV_2D, or
DEPTHWISE_CONV_2D when ``groups == in_channels``; a symmetric padding that is not TFLite's SAME
(stride 2 on an even size) becomes PAD + VALID; ``QLinear`` -> FULLY_CONNECTED (after a
RESHAPE of a 4-D input, whose NHWC flattening order is compensated by permuting the weight
columns); ``QInvertedResidual`` -> its convolutions and ADD; ``QGlobalAvgPool2d`` -> MEAN over
H and W; ``QAvgPool2d`` / ``QMaxPool2d`` -> AVERAGE_POOL_2D / MAX_POOL_2D (VALID or SAME);
``QFlatten`` -> RESHAPE; ``QSoftmax`` -> SOFTMAX; ``QReLU`` after a layer with that
activation fused, and ``nn.Identity``, write nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import flatbuffers
import numpy as np
import torch
from torch import nn

from ..io import atomic_write_bytes
from ..progress import logger
from ..quant.layers import QAvgPool2d, QConv2d, QFlatten, QGlobalAvgPool2d, QLinear, QReLU
from ..quant.params import TensorQuant
from ..quant.stages import QInvertedResidual, QMaxPool2d, QuantizedModel
from .schema import ACTIVATION_CODES, FILE_IDENTIFIER, SCHEMA_VERSION, tflite
from .softmax import QSoftmax
from .patch import PatchError, patched_bytes
from .stages import QPad, is_litert_linear

_OPTIONS = tflite.BuiltinOptions
log = logger.getChild("tflite")


@dataclass
class _Tensor:
    shape: tuple[int, ...]
    ttype: int
    name: str
    data: bytes | None = None
    scales: tuple[float, ...] | None = None
    zero_points: tuple[int, ...] | None = None
    axis: int = 0


@dataclass
class _Op:
    code: int
    inputs: list[int]
    outputs: list[int]
    options_type: int = 0
    options: object = None  # _options(...): a callable(builder) -> offset of the table


@dataclass
class _Graph:
    tensors: list[_Tensor] = field(default_factory=list)
    ops: list[_Op] = field(default_factory=list)

    def tensor(self, t: _Tensor) -> int:
        self.tensors.append(t)
        return len(self.tensors) - 1

    def activation(self, shape, quant: TensorQuant, name: str) -> int:
        return self.tensor(_Tensor(tuple(int(s) for s in shape), tflite.TensorType.INT8, name,
                                   scales=(quant.scale,), zero_points=(quant.zero_point,)))

    def const(self, array: np.ndarray, ttype: int, name: str, scales=None, zero_points=None,
              axis: int = 0) -> int:
        return self.tensor(_Tensor(array.shape, ttype, name, np.ascontiguousarray(array).tobytes(),
                                   scales, zero_points, axis))

    def int32(self, values, name: str) -> int:
        return self.const(np.asarray(values, dtype="<i4"), tflite.TensorType.INT32, name)


def _nhwc(shape: torch.Size) -> tuple[int, ...]:
    return (shape[0], shape[2], shape[3], shape[1]) if len(shape) == 4 else tuple(shape)


def _padding_code(size, kernel, stride, dilation, padding):
    """TFLite padding (SAME / VALID) equal to a symmetric explicit ``padding``, or None."""
    if all(p == 0 for p in padding):
        return tflite.Padding.VALID
    for n, k, s, d, p in zip(size, kernel, stride, dilation, padding):
        out = -(-n // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
        if total // 2 != p or total - total // 2 != p:
            return None
    return tflite.Padding.SAME


class _Writer:
    def __init__(self, model: QuantizedModel, input_shape) -> None:
        self.g = _Graph()
        self.model = model
        self.example = torch.zeros((1, *input_shape), dtype=torch.int8)
        self.flatten_perm: tuple[int, int, int] | None = None  # (C, H, W) of a pending RESHAPE

    def affine(self, layer, x: int, shape: torch.Size, name: str, out_shape: torch.Size) -> int:
        g = self.g
        w = layer.weight.detach().cpu().numpy()
        scales = layer.weight_quant.scales
        bias_scales = tuple(float(np.float32(layer.input_quant.scale) * np.float32(s))
                            for s in scales)
        b = g.const(layer.bias.detach().cpu().numpy().astype("<i4"), tflite.TensorType.INT32,
                    f"{name}.bias", bias_scales, (0,) * len(scales))
        act = ACTIVATION_CODES[layer.activation]
        if isinstance(layer, QLinear):
            if self.flatten_perm is not None:  # columns from NCHW to NHWC flattening order
                c, h, wd = self.flatten_perm
                w = w.reshape(-1, c, h, wd).transpose(0, 2, 3, 1).reshape(w.shape[0], -1)
                self.flatten_perm = None
            wt = g.const(w, tflite.TensorType.INT8, f"{name}.weight", scales,
                         (0,) * len(scales), 0)
            y = g.activation(out_shape, layer.output_quant, name)
            g.ops.append(_Op(tflite.BuiltinOperator.FULLY_CONNECTED, [x, wt, b], [y],
                             _OPTIONS.FullyConnectedOptions,
                             _options("FullyConnectedOptions", fused_activation_function=act)))
            return y
        code = _padding_code(shape[2:], layer.kernel_size, layer.stride, layer.dilation,
                             layer.padding)
        if code is None:  # explicit symmetric padding: PAD with the zero point, then VALID
            ph, pw = layer.padding
            padded = (shape[0], shape[1], shape[2] + 2 * ph, shape[3] + 2 * pw)
            x = self.pad(x, (0, 0, ph, ph, pw, pw, 0, 0), padded, layer.input_quant, name)
            code = tflite.Padding.VALID
        depthwise = layer.groups > 1
        if depthwise and layer.groups != layer.in_channels:
            raise ValueError(f"stage {name!r}: grouped convolution with groups={layer.groups} "
                             f"(neither 1 nor in_channels={layer.in_channels}) has no TFLite op")
        if depthwise:  # [O, 1, KH, KW] -> [1, KH, KW, O], scales along axis 3
            wt = g.const(w.transpose(1, 2, 3, 0), tflite.TensorType.INT8, f"{name}.weight",
                         scales, (0,) * len(scales), 3)
        else:  # [O, I, KH, KW] -> [O, KH, KW, I]
            wt = g.const(w.transpose(0, 2, 3, 1), tflite.TensorType.INT8, f"{name}.weight",
                         scales, (0,) * len(scales), 0)
        y = g.activation(_nhwc(out_shape), layer.output_quant, name)
        sh, sw = layer.stride
        dh, dw = layer.dilation
        mult = layer.out_channels // layer.in_channels
        common = dict(padding=code, stride_h=sh, stride_w=sw, dilation_h_factor=dh,
                      dilation_w_factor=dw, fused_activation_function=act)
        if depthwise:
            g.ops.append(_Op(tflite.BuiltinOperator.DEPTHWISE_CONV_2D, [x, wt, b], [y],
                             _OPTIONS.DepthwiseConv2DOptions,
                             _options("DepthwiseConv2DOptions", depth_multiplier=mult, **common)))
        else:
            g.ops.append(_Op(tflite.BuiltinOperator.CONV_2D, [x, wt, b], [y],
                             _OPTIONS.Conv2DOptions, _options("Conv2DOptions", **common)))
        return y

    def pad(self, x: int, pads, out_shape, quant: TensorQuant, name: str) -> int:
        p = self.g.int32(np.asarray(pads, dtype="<i4").reshape(4, 2), f"{name}.paddings")
        y = self.g.activation(out_shape if len(out_shape) != 4 else _nhwc(out_shape), quant,
                              f"{name}.pad")
        self.g.ops.append(_Op(tflite.BuiltinOperator.PAD, [x, p], [y], _OPTIONS.PadOptions,
                              _options("PadOptions")))
        return y

    def stage(self, module: nn.Module, x: int, xt: torch.Tensor, quant: TensorQuant, name: str,
              previous: nn.Module | None) -> tuple[int, TensorQuant]:
        g = self.g
        out = module(xt)
        if isinstance(module, (QConv2d, QLinear)):
            if isinstance(module, QLinear) and not is_litert_linear(module):
                raise ValueError(
                    f"stage {name!r}: this QLinear rescales with a fixed-point multiplier; "
                    "LiteRT's FULLY_CONNECTED rescales in double (about 0.05% of outputs differ "
                    "by one unit); call bpfree.tflite.use_litert_kernels(model) first")
            if isinstance(module, QLinear) and xt.dim() != 2:
                raise ValueError(f"stage {name!r}: QLinear on a {xt.dim()}-D input has no "
                                 "FULLY_CONNECTED equivalent here; flatten to 2-D first")
            return self.affine(module, x, xt.shape, name, out.shape), module.output_quant
        if isinstance(module, QInvertedResidual):
            y, q, t, prev = x, quant, xt, None
            for i, conv in enumerate(module.body):
                y, q = self.stage(conv, y, t, q, f"{name}.body.{i}", prev)
                t, prev = conv(t), conv
            if module.add is None:
                return y, q
            add = module.add
            z = g.activation(_nhwc(out.shape), add.output_quant, f"{name}.add")
            act = ACTIVATION_CODES[add.activation]
            g.ops.append(_Op(tflite.BuiltinOperator.ADD, [x, y], [z], _OPTIONS.AddOptions,
                             _options("AddOptions", fused_activation_function=act)))
            return z, add.output_quant
        if isinstance(module, QGlobalAvgPool2d):
            if module.rule != "litert":
                raise ValueError(
                    f"stage {name!r}: QGlobalAvgPool2d uses the {module.rule!r} MEAN rule, which "
                    "LiteRT's interpreter does not run (about 1% of pooled values differ by one "
                    "unit); call bpfree.tflite.use_litert_kernels(model) first")
            axes = g.int32([1, 2], f"{name}.axes")
            z = g.activation(_nhwc(out.shape) if module.keepdim else tuple(out.shape),
                             module.output_quant, name)
            g.ops.append(_Op(tflite.BuiltinOperator.MEAN, [x, axes], [z],
                             _OPTIONS.ReducerOptions,
                             _options("ReducerOptions", keep_dims=bool(module.keepdim))))
            return z, module.output_quant
        if isinstance(module, (QAvgPool2d, QMaxPool2d)):
            return self.pool(module, x, xt, out, quant, name), quant
        if isinstance(module, QPad):
            return self.pad(x, module.tflite_paddings(), out.shape, quant, name), quant
        if isinstance(module, QSoftmax):
            z = g.activation(tuple(out.shape), module.output_quant, name)
            g.ops.append(_Op(tflite.BuiltinOperator.SOFTMAX, [x], [z], _OPTIONS.SoftmaxOptions,
                             _options("SoftmaxOptions", beta=module.beta)))
            return z, module.output_quant
        if isinstance(module, QFlatten):
            if xt.dim() == 4 and xt.shape[2] * xt.shape[3] > 1:
                self.flatten_perm = tuple(xt.shape[1:])
            elif xt.dim() not in (2, 4):
                raise ValueError(f"stage {name!r}: flatten of a {xt.dim()}-D tensor")
            if (module.start_dim, module.end_dim) != (1, -1):
                raise ValueError(f"stage {name!r}: only Flatten(1, -1) maps to RESHAPE")
            shape = g.int32([-1, out.shape[1]], f"{name}.shape")
            z = g.activation(tuple(out.shape), quant, name)
            g.ops.append(_Op(tflite.BuiltinOperator.RESHAPE, [x, shape], [z],
                             _OPTIONS.ReshapeOptions,
                             _options("ReshapeOptions", new_shape=[-1, int(out.shape[1])])))
            return z, quant
        if isinstance(module, QReLU):
            fused = getattr(previous, "range", None)
            if fused is not None and (fused.qmin, fused.qmax) == (module.range.qmin,
                                                                 module.range.qmax):
                return x, quant  # idempotent clamp after the same fused activation
            raise ValueError(f"stage {name!r}: a standalone QReLU that is not fused into the "
                             "previous layer has no supported TFLite op")
        if isinstance(module, nn.Identity):
            return x, quant
        raise ValueError(f"stage {name!r}: no TFLite operator for {type(module).__name__}")

    def pool(self, module, x: int, xt: torch.Tensor, out: torch.Tensor, quant: TensorQuant,
             name: str) -> int:
        kernel, stride, padding = (_pair(module.kernel_size), _pair(module.stride),
                                   _pair(module.padding))
        if isinstance(module, QMaxPool2d) and (module.ceil_mode
                                               or _pair(module.dilation) != (1, 1)):
            raise ValueError(f"stage {name!r}: MAX_POOL_2D has no ceil_mode or dilation")
        code = _padding_code(xt.shape[2:], kernel, stride, (1, 1), padding)
        if code is None:
            raise ValueError(f"stage {name!r}: pooling padding {padding} is neither VALID nor "
                             "TFLite's SAME for this input size")
        act = ACTIVATION_CODES[getattr(module, "activation", None)]
        z = self.g.activation(_nhwc(out.shape), quant, name)
        op = (tflite.BuiltinOperator.MAX_POOL_2D if isinstance(module, QMaxPool2d)
              else tflite.BuiltinOperator.AVERAGE_POOL_2D)
        self.g.ops.append(_Op(op, [x], [z], _OPTIONS.Pool2DOptions, _options(
            "Pool2DOptions", padding=code, stride_h=stride[0], stride_w=stride[1],
            filter_height=kernel[0], filter_width=kernel[1], fused_activation_function=act)))
        return z

    def build(self) -> bytes:
        model = self.model
        xt = self.example
        x = self.g.activation(_nhwc(xt.shape), model.input_quant, "input")
        q, prev = model.input_quant, None
        with torch.no_grad():
            for i, stage in enumerate(model.body):
                x, q = self.stage(stage, x, xt, q, f"body.{i}", prev)
                xt, prev = stage(xt), stage
        if self.flatten_perm is not None:
            raise ValueError("a flatten of a spatial tensor must be followed by a QLinear (the "
                             "NHWC and NCHW flattening orders differ)")
        return _serialize(self.g, 0, x)


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


# ------------------------------------------------------------------------ flatbuffer building


def _table(b, kind: str, **fields) -> int:
    """Build one ``<kind>`` table: ``tflite.<kind>Start``, ``tflite.<kind>Add<Field>`` per field
    that is not None (CamelCase of the keyword), ``tflite.<kind>End``."""
    getattr(tflite, f"{kind}Start")(b)
    for k, v in fields.items():
        if v is not None:
            getattr(tflite, f"{kind}Add{_camel(k)}")(b, v)
    return getattr(tflite, f"{kind}End")(b)


def _options(kind: str, **fields):
    """A builder (callable(builder) -> offset) of the ``<kind>`` options table; list fields
    become int32 vectors."""
    def build(b):
        vectors = {k: _int_vector(b, getattr(tflite, f"{kind}Start{_camel(k)}Vector"), v,
                                  b.PrependInt32)
                   for k, v in fields.items() if isinstance(v, (list, tuple))}
        return _table(b, kind, **{**fields, **vectors})
    return build


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _int_vector(b, start, values, prepend):
    start(b, len(values))
    for v in reversed(list(values)):
        prepend(v)
    return b.EndVector()


def _quantization(b, t: _Tensor):
    scales = _int_vector(b, tflite.QuantizationParametersStartScaleVector, t.scales,
                         b.PrependFloat32)
    zeros = _int_vector(b, tflite.QuantizationParametersStartZeroPointVector, t.zero_points,
                        b.PrependInt64)
    return _table(b, "QuantizationParameters", scale=scales, zero_point=zeros,
                  quantized_dimension=t.axis)


def _serialize(g: _Graph, input_tensor: int, output_tensor: int, *,
               signature: tuple[str, dict[str, int], dict[str, int]] | None = None,
               metadata: dict[str, bytes] | None = None) -> bytes:
    """The flatbuffer of ``g``; optionally a SignatureDef ``(key, {input name: tensor},
    {output name: tensor})`` and ``metadata`` entries (name -> bytes), as the converter writes."""
    b = flatbuffers.Builder(1024)
    # Buffers: 0 is the empty sentinel; each constant tensor gets its own.
    buffer_of, datas = [], [b""]
    for t in g.tensors:
        if t.data is None:
            buffer_of.append(0)
        else:
            buffer_of.append(len(datas))
            datas.append(t.data)
    metadata_buffers = {}
    for key, value in (metadata or {}).items():
        metadata_buffers[key] = len(datas)
        datas.append(value)
    buffer_offsets = [_table(b, "Buffer", data=b.CreateByteVector(d) if d else None)
                      for d in datas]
    tensor_offsets = []
    for t, buf in zip(g.tensors, buffer_of):
        name = b.CreateString(t.name)
        shape = _int_vector(b, tflite.TensorStartShapeVector, t.shape, b.PrependInt32)
        quant = _quantization(b, t) if t.scales is not None else None
        tensor_offsets.append(_table(b, "Tensor", shape=shape, type=t.ttype, buffer=buf,
                                     name=name, quantization=quant))
    codes = list(dict.fromkeys(op.code for op in g.ops))
    op_offsets = []
    for op in g.ops:
        ins = _int_vector(b, tflite.OperatorStartInputsVector, op.inputs, b.PrependInt32)
        outs = _int_vector(b, tflite.OperatorStartOutputsVector, op.outputs, b.PrependInt32)
        opts = op.options(b)
        op_offsets.append(_table(b, "Operator", opcode_index=codes.index(op.code), inputs=ins,
                                 outputs=outs, builtin_options_type=op.options_type,
                                 builtin_options=opts))
    subgraph = _table(
        b, "SubGraph",
        tensors=_offset_vector(b, tflite.SubGraphStartTensorsVector, tensor_offsets),
        inputs=_int_vector(b, tflite.SubGraphStartInputsVector, [input_tensor], b.PrependInt32),
        outputs=_int_vector(b, tflite.SubGraphStartOutputsVector, [output_tensor],
                            b.PrependInt32),
        operators=_offset_vector(b, tflite.SubGraphStartOperatorsVector, op_offsets),
        name=b.CreateString("main"))
    code_offsets = [_table(b, "OperatorCode", deprecated_builtin_code=min(code, 127),
                           builtin_code=code, version=1) for code in codes]
    signatures = None
    if signature is not None:
        key, ins, outs = signature
        maps = [[_table(b, "TensorMap", name=b.CreateString(n), tensor_index=t)
                 for n, t in side.items()] for side in (ins, outs)]
        sig = _table(b, "SignatureDef",
                     inputs=_offset_vector(b, tflite.SignatureDefStartInputsVector, maps[0]),
                     outputs=_offset_vector(b, tflite.SignatureDefStartOutputsVector, maps[1]),
                     signature_key=b.CreateString(key), subgraph_index=0)
        signatures = _offset_vector(b, tflite.ModelStartSignatureDefsVector, [sig])
    entries = [_table(b, "Metadata", name=b.CreateString(k), buffer=i)
               for k, i in metadata_buffers.items()]
    model = _table(
        b, "Model", version=SCHEMA_VERSION,
        operator_codes=_offset_vector(b, tflite.ModelStartOperatorCodesVector, code_offsets),
        subgraphs=_offset_vector(b, tflite.ModelStartSubgraphsVector, [subgraph]),
        description=b.CreateString("bpfree"),
        buffers=_offset_vector(b, tflite.ModelStartBuffersVector, buffer_offsets),
        metadata=_offset_vector(b, tflite.ModelStartMetadataVector, entries) if entries else None,
        signature_defs=signatures)
    b.Finish(model, file_identifier=FILE_IDENTIFIER)
    return bytes(b.Output())


def _offset_vector(b, start, offsets):
    start(b, len(offsets))
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def to_bytes(model: QuantizedModel, input_shape=None) -> bytes:
    """The ``.tflite`` bytes of ``model`` (see :func:`save`)."""
    if not isinstance(model, QuantizedModel):
        raise ValueError(f"save needs a bpfree.quant.QuantizedModel, got {type(model).__name__}")
    shape = input_shape if input_shape is not None else getattr(model, "input_shape", None)
    if shape is None:
        raise ValueError("input_shape (one sample's shape, e.g. (1, 28, 28) or (784,)) is "
                         "required for a model that was not loaded from a .tflite file")
    shape = tuple(int(s) for s in shape)
    device = next((t.device for t in model.buffers()), torch.device("cpu"))
    if device.type != "cpu":
        raise ValueError(f"move the model to the CPU before saving (it is on {device})")
    return _Writer(model, shape).build()


def save(model: QuantizedModel, path: str | os.PathLike, *, input_shape=None,
         rebuild: bool = False) -> None:
    """Write ``model`` as a full-integer ``.tflite`` file, atomically.

    A model loaded by :func:`bpfree.tflite.load` is written into a copy of its own file with
    only the weights and biases changed (:mod:`bpfree.tflite.patch`), so its operators,
    signature, tensor names and metadata stay those deployed code knows; ``rebuild=True``, a
    different ``input_shape`` or a model whose layers changed since loading writes a new graph
    instead (:func:`to_bytes`).

    Args:
        model: a :class:`~bpfree.quant.ptq.QuantizedModel` (from ``quantize_model``,
            :func:`bpfree.tflite.load` or MCUNet-in1's importer), on the CPU.
        path: destination; a temporary file in the same folder is renamed over it, so the path
            holds either the old file or the whole new one.
        input_shape: one sample's NCHW (or feature) shape; default ``model.input_shape`` (set by
            :func:`bpfree.tflite.load`).

    Raises ValueError naming the stage for a layer that has no TFLite operator.
    """
    atomic_write_bytes(path, file_bytes(model, input_shape=input_shape, rebuild=rebuild))


def file_bytes(model: QuantizedModel, *, input_shape=None, rebuild: bool = False) -> bytes:
    """What :func:`save` writes: the patched original file when the model has one and neither
    ``rebuild`` nor a different ``input_shape`` asks for a new graph, else :func:`to_bytes`."""

    same_shape = input_shape is None or tuple(input_shape) == tuple(
        getattr(model, "input_shape", ()))
    if not rebuild and same_shape and getattr(model, "tflite_file", None) is not None:
        try:
            return patched_bytes(model)
        except PatchError as err:
            log.warning("writing a new .tflite graph (the original file's signature, tensor "
                        "names and operator forms are not kept): %s", err)
    return to_bytes(model, input_shape)
