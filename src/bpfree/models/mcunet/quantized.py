"""MCUNet-in1 as a real-quantized :class:`~bpfree.quant.stages.QuantizedModel`, built from
its graph with either requantization rule (module docstring of :mod:`bpfree.models.mcunet`)."""

from __future__ import annotations

import math

import torch
from torch import nn

from ...quant.fixed_point import INT8_MIN
from ...quant.layers import QAdd, QConv2d, QGlobalAvgPool2d, QLinear
from ...quant.params import TensorQuant
from ...quant.stages import QInvertedResidual, QuantizedModel, stage_output_quant
from .float_rule import (FloatRuleAdd, FloatRuleConv2d, FloatRuleGlobalAvgPool2d,
                         FloatRuleLinear, effective_scale)
from .graph import MCUNET_INPUT_SHAPE, ModelFormatError, block_of, is_int, load_graph

__all__ = ["REQUANT_RULES", "load_quantized", "mcunet_in1"]

REQUANT_RULES = ("tflite", "float")


def _quant(layer: dict, prefix: str) -> TensorQuant:
    zero = layer[f"{prefix}_zero"]
    if not is_int(zero):
        raise ModelFormatError(f"layer {layer['name']!r}: {prefix}_zero must be an int in "
                               f"[-128, 127], got {zero!r}")
    try:
        return TensorQuant(float(layer[f"{prefix}_scale"]), zero)
    except (TypeError, ValueError) as err:
        raise ModelFormatError(f"layer {layer['name']!r}: bad {prefix}_scale / {prefix}_zero: "
                               f"{err}") from None


def _is_relu6(q: TensorQuant) -> bool:
    return q.zero_point == INT8_MIN and math.isclose(q.scale * 255.0, 6.0, rel_tol=1e-6)


def _same_quant(a: TensorQuant, b: TensorQuant) -> bool:
    return a.zero_point == b.zero_point and math.isclose(a.scale, b.scale, rel_tol=1e-6)


def _build_conv(layer: dict, arrays: dict, q_in: TensorQuant, requant: str, backend: str,
                linear: bool) -> nn.Module:
    name = layer["name"]
    q_out = _quant(layer, "y")
    w = torch.from_numpy(arrays[f"{name}.weight"].copy())
    b = torch.from_numpy(arrays[f"{name}.bias"].copy())
    scales = arrays[f"{name}.w_scales"]
    common = dict(weight_scale=torch.from_numpy(scales.copy()), input_quant=q_in,
                  output_quant=q_out, activation="relu6" if _is_relu6(q_out) else None,
                  backend=backend)
    if requant == "float":
        common["effective_scale"] = effective_scale(layer["x_scale"], scales, layer["y_scale"])
    try:
        if linear:
            cls = FloatRuleLinear if requant == "float" else QLinear
            return cls(w.reshape(w.shape[0], -1), b, **common)
        cls = FloatRuleConv2d if requant == "float" else QConv2d
        return cls(w, b, stride=int(layer["stride"]), padding=int(layer["padding"]),
                   groups=int(layer["groups"]), **common)
    except ValueError as err:
        raise ModelFormatError(f"layer {name!r}: {err}") from None


def _check_input(layer: dict, q: TensorQuant, channels: int, hw, previous: str) -> None:
    name = layer["name"]
    q_in = _quant(layer, "x")
    if not _same_quant(q_in, q):
        raise ModelFormatError(f"layer {name!r}: input quantization (scale {q_in.scale:.6g}, zero "
                               f"{q_in.zero_point}) does not match the output of {previous!r} "
                               f"(scale {q.scale:.6g}, zero {q.zero_point})")
    if layer["in_channels"] != channels:
        raise ModelFormatError(f"layer {name!r}: in_channels={layer['in_channels']} but "
                               f"{previous!r} produces {channels} channels")
    if hw is not None and layer.get("in_hw") is not None and layer["in_hw"] != hw:
        raise ModelFormatError(f"layer {name!r}: in_hw={layer['in_hw']} but {previous!r} "
                               f"produces {hw}x{hw}")
    if hw is not None and "in_hw" in layer and layer["in_hw"] is None:
        raise ModelFormatError(f"layer {name!r}: in_hw is null (a layer after the global "
                               f"pooling) but {previous!r} produces {hw}x{hw}: no mean_hw "
                               "layer precedes it")


def load_quantized(path=None, *, requant: str = "tflite", backend: str = "auto",
                   input_hw: int | None = None):
    """The real-quantized model of a graph.json + weights.npz folder (see the module docstring).

    Layers named ``blocks.K.<conv>`` (and ``blocks.K.residual_add``) form one inverted-residual
    stage; any other conv is a stage of its own, ``mean_hw`` is a pooling stage, and a conv after
    the pooling (``in_hw`` null) is a fully-connected ``QLinear``. The chain is checked: each
    layer's input quantization, channels and spatial size must be its producer's.

    Args:
        path: the model folder (default :func:`default_model_dir`).
        requant: ``"tflite"`` (fixed point) or ``"float"`` (the model's own rule).
        backend: epilogue backend of the TFLite layers ("auto", "torch", "numba").
        input_hw: spatial size of the input (default: the first layer's ``in_hw``, else 128,
            MCUNet-in1's). The model's ``sample_shape`` is ``(in_channels, input_hw, input_hw)``.
    """
    if requant not in REQUANT_RULES:
        raise ValueError(f"requant must be one of {REQUANT_RULES}, got {requant!r}")
    graph = load_graph(path)
    layers = graph.layers
    first = layers[0]
    if first["op"] != "conv2d":
        raise ModelFormatError(f"layer {first['name']!r}: the first layer must be a conv2d, got "
                               f"{first['op']!r}")
    input_quant = _quant(first, "x")
    if input_hw is None:
        input_hw = first.get("in_hw") if is_int(first.get("in_hw")) else MCUNET_INPUT_SHAPE[1]
    q, channels, hw, previous = input_quant, first["in_channels"], input_hw, "the input"
    pooled = False
    stages: list[nn.Module] = []
    names: dict[str, str] = {}
    i = 0
    while i < len(layers):
        layer = layers[i]
        name, op = layer["name"], layer["op"]
        block = block_of(name)
        if op == "mean_hw":
            if pooled:
                raise ModelFormatError(f"layer {name!r}: a second global pooling")
            pool_cls = FloatRuleGlobalAvgPool2d if requant == "float" else QGlobalAvgPool2d
            stages.append(pool_cls(q, q))
            names[name] = f"body.{len(stages) - 1}"
            pooled, hw, previous, i = True, None, name, i + 1
            continue
        if op == "add" and block is None:
            raise ModelFormatError(f"layer {name!r}: an add must belong to a block "
                                   "('blocks.K.residual_add')")
        if block is None:  # a conv stage of its own (first conv, classifier)
            _check_input(layer, q, channels, hw, previous)
            module = _build_conv(layer, graph.arrays, q, requant, backend, linear=pooled)
            stages.append(module)
            names[name] = f"body.{len(stages) - 1}"
            q, channels, previous = module.output_quant, layer["out_channels"], name
            hw = None if pooled else layer.get("out_hw")
            i += 1
            continue
        # An inverted-residual block: consecutive layers named blocks.K.*.
        if pooled:
            raise ModelFormatError(f"layer {name!r}: a block after the global pooling")
        block_in, block_channels, block_hw, block_prev = q, channels, hw, previous
        convs, add_layer = [], None
        index = len(stages)
        while i < len(layers) and block_of(layers[i]["name"]) == block:
            sub = layers[i]
            if add_layer is not None:
                raise ModelFormatError(f"layer {sub['name']!r}: nothing may follow the residual "
                                       f"add of {block!r}")
            if sub["op"] == "conv2d":
                _check_input(sub, q, channels, hw, previous)
                conv = _build_conv(sub, graph.arrays, q, requant, backend, linear=False)
                names[sub["name"]] = f"body.{index}.body.{len(convs)}"
                convs.append(conv)
                q, channels, hw, previous = conv.output_quant, sub["out_channels"], \
                    sub.get("out_hw"), sub["name"]
            elif sub["op"] == "add":
                add_layer = sub
            else:
                raise ModelFormatError(f"layer {sub['name']!r}: op {sub['op']!r} inside a block")
            i += 1
        if not convs:
            raise ModelFormatError(f"block {block!r} has no conv2d layer")
        add = None
        if add_layer is not None:
            aname = add_layer["name"]
            q1 = _quant(add_layer, "x")
            if not _same_quant(q1, block_in):
                raise ModelFormatError(f"layer {aname!r}: input 1 quantization (scale "
                                       f"{q1.scale:.6g}, zero {q1.zero_point}) does not match the "
                                       f"block input from {block_prev!r}")
            if channels != block_channels or hw != block_hw:
                raise ModelFormatError(f"layer {aname!r}: the block output ({channels} channels, "
                                       f"{hw}x{hw}) cannot be added to its input "
                                       f"({block_channels} channels, {block_hw}x{block_hw})")
            add_cls = FloatRuleAdd if requant == "float" else QAdd
            try:
                add = add_cls(block_in, q, _quant(add_layer, "y"), backend=backend)
            except ValueError as err:
                raise ModelFormatError(f"layer {aname!r}: {err}") from None
            names[aname] = f"body.{index}.add"
            q, previous = add.output_quant, aname
        stages.append(QInvertedResidual(nn.Sequential(*convs), add))
        names[block] = f"body.{index}"
    body = nn.Sequential(*stages)
    quants, qq = [], input_quant
    for stage in body:
        qq = stage_output_quant(stage, qq)
        quants.append(qq)
    model = QuantizedModel(body, input_quant, quants)
    model.graph_names = names
    model.requant_rule = requant
    model.source = str(graph.folder)
    model.sample_shape = (first["in_channels"], input_hw, input_hw)
    return model


def mcunet_in1(path=None, *, requant: str = "tflite", backend: str = "auto"):
    """PMT's MCUNet-in1 (ImageNet-1k, INT8, 128x128) as a real-quantized
    :class:`~bpfree.quant.ptq.QuantizedModel` (:func:`load_quantized` of ``path``, default
    :func:`default_model_dir`). 42 convs in 14 inverted-residual blocks (7 residual adds),
    global average pooling and the 160 -> 1000 classifier; input: pixel p -> int8 p - 128
    (:func:`preprocess_image`); output: 1000 int8 logits."""
    return load_quantized(path, requant=requant, backend=backend, input_hw=MCUNET_INPUT_SHAPE[1])
