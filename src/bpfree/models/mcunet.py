"""MCUNet-in1 (INT8, 128x128), PMT's own model, imported from ``graph.json`` + ``weights.npz``.

PMT (§3.4, §4.1, Tables 8-9) trains the pre-trained, post-training-quantized INT8 MCUNet-in1 of
MIT HAN Lab's tiny-training (``mcunet-5fps.pkl``). ``../shared/models/mcunet-in1-int8/`` holds
it converted to JSON + npz (read its ``MANIFEST.txt``):

* ``graph.json``: ``layers`` in execution order, each ``{"name", "op", ...}`` with op
  ``conv2d`` (channels, kernel, stride, groups, padding, spatial sizes, input / output scale
  and zero point), ``add`` (the residual add of a block: input 1 is the block input with
  ``x_scale`` / ``x_zero``, input 2 the block's last conv output, output ``y_scale`` /
  ``y_zero``) and ``mean_hw`` (global average pooling, quantization unchanged);
* ``weights.npz``: ``<name>.weight`` int8 [out, in/groups, kh, kw], ``<name>.bias`` int32
  [out] (scale ``x_scale * w_scale``), ``<name>.w_scales`` float32 [out].

ReLU6 is not an op: a conv whose output has ``y_zero = -128`` and ``y_scale = 6/255`` clamps
to [0, 6] by the int8 range itself; such convs are built with ``activation="relu6"``, whose
TFLite clamp (``[z, z + round(6/s)] = [-128, 127]``) is the same range, so the flag only
documents the graph.

:func:`load_quantized` builds a :class:`~bpfree.quant.ptq.QuantizedModel` whose ``body`` is an
``nn.Sequential`` of int8 stages (the first conv, one
:class:`~bpfree.quant.ptq.QInvertedResidual` per ``blocks.K`` with its requantized residual
add, the global average pooling and the 1x1 classifier as a ``QLinear``), so
:class:`bpfree.pmt.PMTTrainer` trains it unchanged. ``model.graph_names`` maps each graph
layer name to the module's qualified name (``"blocks.3.depthwise" -> "body.4.body.1"``).

Two requantization rules (``requant=``):

* ``"tflite"`` (default): the TFLite int8 reference kernels of :mod:`bpfree.quant.layers`
  (fixed-point multipliers, round half away from zero; the ADD of ``add.cc`` with
  ``left_shift = 20``; ``MEAN`` with rounding division);
* ``"float"``: the model's own rule (tiny-training ``quantized_ops.py``, MANIFEST):
  ``y = clamp(round_half_even((acc + bias) * x_scale * w_scale / y_scale) + y_zero)`` in
  float64, the add ``round_half_even(((a - z1) s1 + (b - z2) s2) / s_y) + z_y`` (products and
  sum in float32, the division in float64, as the source) and the pooling
  ``round_half_even(mean(x))``. Implemented by subclasses of the quant layers that override
  only the epilogue (:class:`FloatRuleConv2d`, :class:`FloatRuleLinear`,
  :class:`FloatRuleAdd`, :class:`FloatRuleGlobalAvgPool2d`), so node perturbation
  (``node_offset``) and the integer state are those of the TFLite layers.

:func:`compare_requant` counts the output values on which the two rules differ.
:func:`mcunet_in1_float` builds the float mirror (dequantized weights, nn.Conv2d / nn.Linear
with biases, fused ReLU6 omitted) that :mod:`bpfree.memory` profiles for the hardware-cost
tables (the int8 layers keep their state in buffers, which the memory profiler does not count as
parameters).
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..quant.fixed_point import INT8_MAX, INT8_MIN
from ..quant.layers import QAdd, QConv2d, QGlobalAvgPool2d, QLinear, _check_int8_input
from ..quant.params import TensorQuant
from ..quant.stages import QInvertedResidual, QuantizedModel, stage_output_quant

__all__ = [
    "DEFAULT_DIRNAME",
    "MCUNET_INPUT_SHAPE",
    "REQUANT_RULES",
    "FloatRuleAdd",
    "FloatRuleConv2d",
    "FloatRuleGlobalAvgPool2d",
    "FloatRuleLinear",
    "ModelFormatError",
    "compare_requant",
    "default_model_dir",
    "load_graph",
    "load_quantized",
    "mcunet_in1",
    "mcunet_in1_float",
    "preprocess_image",
]

#: Folder name of the model under ``$BPFREE_MODELS`` or ``<repo>/../shared/models``.
DEFAULT_DIRNAME = "mcunet-in1-int8"
#: One sample's input (C, H, W).
MCUNET_INPUT_SHAPE = (3, 128, 128)
REQUANT_RULES = ("tflite", "float")
OPS = ("conv2d", "add", "mean_hw")
_CONV_KEYS = ("in_channels", "out_channels", "kernel_size", "stride", "groups", "padding",
              "x_scale", "x_zero", "y_scale", "y_zero")
_ADD_KEYS = ("x_scale", "x_zero", "y_scale", "y_zero")


class ModelFormatError(ValueError):
    """A graph.json / weights.npz that cannot be imported (the message names the layer)."""


# ---------------------------------------------------------------------------------------------
# Locating and reading the files
# ---------------------------------------------------------------------------------------------


def default_model_dir() -> Path:
    """``$BPFREE_MODELS/mcunet-in1-int8`` if ``BPFREE_MODELS`` is set, else
    ``<repository>/../shared/models/mcunet-in1-int8`` (the project's shared model folder)."""
    root = os.environ.get("BPFREE_MODELS")
    if root:
        return Path(root) / DEFAULT_DIRNAME
    repo = Path(__file__).resolve().parents[3]  # src/bpfree/models/mcunet.py -> repository
    return repo.parent / "shared" / "models" / DEFAULT_DIRNAME


def _resolve_dir(path) -> Path:
    folder = default_model_dir() if path is None else Path(path)
    if not folder.is_dir():
        hint = ("" if path is not None else
                " (set BPFREE_MODELS to the folder holding mcunet-in1-int8/, or pass the path)")
        raise FileNotFoundError(f"MCUNet model folder not found: {folder}{hint}")
    for name in ("graph.json", "weights.npz"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name} is missing (a model folder holds graph.json "
                                    "and weights.npz)")
    return folder


@dataclass
class Graph:
    """The parsed files: ``layers`` (graph.json's list) and ``arrays`` (name -> ndarray)."""

    folder: Path
    layers: list[dict]
    arrays: dict[str, np.ndarray]
    model: str = ""


def load_graph(path=None) -> Graph:
    """Read and check ``graph.json`` + ``weights.npz`` of ``path`` (default:
    :func:`default_model_dir`). Raises FileNotFoundError for a missing folder / file and
    :class:`ModelFormatError` (naming the layer) for malformed JSON, unknown ops, missing keys
    or arrays, wrong dtypes and shape mismatches."""
    folder = _resolve_dir(path)
    try:
        doc = json.loads((folder / "graph.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ModelFormatError(f"{folder / 'graph.json'} is not valid JSON: {err}") from None
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list) or not layers:
        raise ModelFormatError(f"{folder / 'graph.json'} must hold a non-empty 'layers' list")
    if not zipfile.is_zipfile(folder / "weights.npz"):
        raise ModelFormatError(f"{folder / 'weights.npz'} is not an npz (zip) archive: the file "
                               "is truncated or not a numpy.savez output")
    try:
        with np.load(folder / "weights.npz", allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise ModelFormatError(f"{folder / 'weights.npz'} cannot be read as an npz archive: "
                               f"{err}") from None
    seen: set[str] = set()
    for i, layer in enumerate(layers):
        if not isinstance(layer, dict) or not isinstance(layer.get("name"), str):
            raise ModelFormatError(f"graph.json layer #{i} must be an object with a 'name'")
        name, op = layer["name"], layer.get("op")
        if name in seen:
            raise ModelFormatError(f"layer {name!r} (#{i}): the name is used twice in graph.json")
        seen.add(name)
        if op not in OPS:
            raise ModelFormatError(f"layer {name!r}: unknown op {op!r} (supported: "
                                   f"{', '.join(OPS)})")
        keys = _CONV_KEYS if op == "conv2d" else _ADD_KEYS if op == "add" else ()
        missing = [k for k in keys if k not in layer]
        if missing:
            raise ModelFormatError(f"layer {name!r} ({op}): missing {', '.join(missing)}")
        if op == "conv2d":
            _check_conv_fields(layer)
            _check_conv_arrays(layer, arrays)
    return Graph(folder, layers, arrays, str(doc.get("model", "")))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_conv_fields(layer: dict) -> None:
    """Types and ranges of a conv2d entry, and ``out_hw`` against the conv arithmetic
    ``(in_hw + 2 padding - k) // stride + 1`` where both sizes are given."""
    name = layer["name"]
    for key, low in (("in_channels", 1), ("out_channels", 1), ("groups", 1), ("stride", 1),
                     ("padding", 0)):
        v = layer[key]
        if not _is_int(v) or v < low:
            raise ModelFormatError(f"layer {name!r}: {key} must be an int >= {low}, got {v!r}")
    k = layer["kernel_size"]
    if not (isinstance(k, list) and len(k) == 2 and all(_is_int(v) and v >= 1 for v in k)):
        raise ModelFormatError(f"layer {name!r}: kernel_size must be [kh, kw], two ints >= 1, "
                               f"got {k!r}")
    for key in ("in_hw", "out_hw"):
        v = layer.get(key)
        if v is not None and (not _is_int(v) or v < 1):
            raise ModelFormatError(f"layer {name!r}: {key} must be an int >= 1 or null (after "
                                   f"the global pooling), got {v!r}")
    for key in ("x_scale", "y_scale"):
        v = layer[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ModelFormatError(f"layer {name!r}: {key} must be a number, got {v!r}")
    for key in ("x_zero", "y_zero"):
        if not _is_int(layer[key]):
            raise ModelFormatError(f"layer {name!r}: {key} must be an int in [-128, 127], got "
                                   f"{layer[key]!r}")
    hin, hout = layer.get("in_hw"), layer.get("out_hw")
    if hin is not None and hout is not None:
        want = (hin + 2 * layer["padding"] - k[0]) // layer["stride"] + 1
        if hout != want:
            raise ModelFormatError(
                f"layer {name!r}: out_hw={hout}, but a {k[0]}x{k[1]} conv with stride "
                f"{layer['stride']} and padding {layer['padding']} maps {hin}x{hin} to "
                f"{want}x{want}")
    if (hin is None) != (hout is None):
        raise ModelFormatError(f"layer {name!r}: in_hw and out_hw must both be ints or both "
                               f"null, got {hin!r} and {hout!r}")


def _check_conv_arrays(layer: dict, arrays: dict) -> None:
    name = layer["name"]
    cout, cin, groups = layer["out_channels"], layer["in_channels"], layer["groups"]
    kh, kw = layer["kernel_size"]
    if groups < 1 or cin % groups or cout % groups:
        raise ModelFormatError(f"layer {name!r}: groups={groups} must divide in_channels={cin} "
                               f"and out_channels={cout}")
    want = {"weight": ((cout, cin // groups, kh, kw), np.int8),
            "bias": ((cout,), np.int32), "w_scales": ((cout,), np.float32)}
    for part, (shape, dtype) in want.items():
        key = f"{name}.{part}"
        if key not in arrays:
            raise ModelFormatError(f"layer {name!r}: weights.npz has no array {key!r}")
        a = arrays[key]
        if tuple(a.shape) != shape:
            raise ModelFormatError(f"layer {name!r}: {part} has shape {tuple(a.shape)}, the graph "
                                   f"needs {shape}")
        if a.dtype != dtype:
            raise ModelFormatError(f"layer {name!r}: {part} has dtype {a.dtype}, expected "
                                   f"{np.dtype(dtype).name}")
    scales = arrays[f"{name}.w_scales"]
    if not (np.isfinite(scales).all() and (scales > 0).all()):
        raise ModelFormatError(f"layer {name!r}: w_scales must be finite and > 0")


# ---------------------------------------------------------------------------------------------
# The model's own (float-scale, round half to even) requantization rule
# ---------------------------------------------------------------------------------------------


#: Rounding of the float-scale epilogue: the model's own rule rounds half to even (numpy,
#: tiny-training); LiteRT's float-scale FULLY_CONNECTED (``reference_integer_ops::
#: FullyConnectedPerChannel``) uses ``std::round``, half away from zero.
ROUNDINGS = ("half_even", "half_away")


def _float_rule_epilogue(layer, acc: torch.Tensor, axis: int) -> torch.Tensor:
    """``round((acc + bias) * eff) + y_zero`` (``layer.rounding``), clamped like the TFLite
    epilogue (node perturbation ``node_offset`` added before the fused-activation clamp)."""
    shape = [1] * acc.dim()
    shape[axis] = -1
    v = acc.to(torch.float64) + layer.bias.to(torch.float64).view(shape)  # exact (< 2**53)
    v = v.mul_(layer.effective_scale.to(v.device).view(shape))
    if layer.rounding == "half_even":
        v = torch.round(v)
    else:  # v - trunc(v) is exact, so ties are detected exactly
        t = torch.trunc(v)
        v = t.add_(torch.sign(v) * ((v - t).abs() >= 0.5))
    v = v.add_(layer.output_quant.zero_point)
    offset = layer.node_offset
    if offset is None:
        return v.clamp_(layer.range.qmin, layer.range.qmax).to(torch.int8)
    z = v.clamp_(INT8_MIN, INT8_MAX).to(torch.int16)
    z = z.add_(offset.to(device=z.device, dtype=torch.int16))
    return z.clamp_(layer.range.qmin, layer.range.qmax).to(torch.int8)


def _effective_scale(x_scale: float, w_scales, y_scale: float) -> torch.Tensor:
    w = torch.as_tensor(np.asarray(w_scales, dtype=np.float32)).to(torch.float64)
    return w * float(x_scale) / float(y_scale)


class FloatRuleConv2d(QConv2d):
    """:class:`~bpfree.quant.layers.QConv2d` with the float-scale, round-half-to-even epilogue.

    ``effective_scale`` (float64, per output channel) is ``x_scale * w_scale / y_scale``. The
    fixed-point ``multiplier`` / ``shift`` buffers are kept (unused) so that tools reading them
    still work."""

    rounding = "half_even"

    def __init__(self, weight, bias=None, *, effective_scale: torch.Tensor, **kwargs) -> None:
        super().__init__(weight, bias, **kwargs)
        self.register_buffer("effective_scale", effective_scale.to(torch.float64).clone())

    def _epilogue(self, acc: torch.Tensor, axis: int) -> torch.Tensor:
        return _float_rule_epilogue(self, acc, axis)


class FloatRuleLinear(QLinear):
    """:class:`~bpfree.quant.layers.QLinear` with the float-scale epilogue
    (see :class:`FloatRuleConv2d`); ``rounding="half_away"`` is LiteRT's FULLY_CONNECTED."""

    def __init__(self, weight, bias=None, *, effective_scale: torch.Tensor,
                 rounding: str = "half_even", **kwargs) -> None:
        super().__init__(weight, bias, **kwargs)
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
        self.rounding = rounding
        self.register_buffer("effective_scale", effective_scale.to(torch.float64).clone())

    def _epilogue(self, acc: torch.Tensor, axis: int) -> torch.Tensor:
        return _float_rule_epilogue(self, acc, axis)


class FloatRuleAdd(QAdd):
    """Residual add of the model's own rule (tiny-training ``QuantizedElementwise``):
    ``clamp(round_half_even(float64(float32((a - z1) s1 + (b - z2) s2)) / s_y) + z_y)``."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        _check_int8_input(a, "input1")
        _check_int8_input(b, "input2")
        if a.shape != b.shape:
            raise ValueError(f"input1 and input2 must have the same shape, got "
                             f"{tuple(a.shape)} and {tuple(b.shape)}")
        f32 = torch.float32
        s1 = torch.tensor(self.input1_quant.scale, dtype=f32)
        s2 = torch.tensor(self.input2_quant.scale, dtype=f32)
        x1 = (a.to(f32) - self.input1_quant.zero_point) * s1
        x2 = (b.to(f32) - self.input2_quant.zero_point) * s2
        out = torch.round((x1 + x2).to(torch.float64) / float(self.output_quant.scale))
        out = out.add_(self.output_quant.zero_point)
        return out.clamp_(self.range.qmin, self.range.qmax).to(torch.int8)


class FloatRuleGlobalAvgPool2d(QGlobalAvgPool2d):
    """Global average pooling of the model's own rule (tiny-training ``QuantizedAvgPool``):
    ``round_half_even(mean(x))`` over H and W, same quantization in and out."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_int8_input(x)
        if x.dim() != 4:
            raise ValueError(f"input must have shape (N, C, H, W), got {tuple(x.shape)}")
        out = torch.round(x.to(torch.float32).mean(dim=(2, 3)))
        out = out.clamp_(INT8_MIN, INT8_MAX).to(torch.int8)
        return out[:, :, None, None] if self.keepdim else out


# ---------------------------------------------------------------------------------------------
# Building the integer model
# ---------------------------------------------------------------------------------------------


def _quant(layer: dict, prefix: str) -> TensorQuant:
    zero = layer[f"{prefix}_zero"]
    if not _is_int(zero):
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
        common["effective_scale"] = _effective_scale(layer["x_scale"], scales, layer["y_scale"])
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


def _block_of(name: str) -> str | None:
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) >= 3 and parts[0] == "blocks" else None


def load_quantized(path=None, *, requant: str = "tflite", backend: str = "auto",
                   input_hw: int = 128):
    """The real-quantized model of a graph.json + weights.npz folder (see the module docstring).

    Layers named ``blocks.K.<conv>`` (and ``blocks.K.residual_add``) form one inverted-residual
    stage; any other conv is a stage of its own, ``mean_hw`` is a pooling stage, and a conv after
    the pooling (``in_hw`` null) is a fully-connected ``QLinear``. The chain is checked: each
    layer's input quantization, channels and spatial size must be its producer's.

    Args:
        path: the model folder (default :func:`default_model_dir`).
        requant: ``"tflite"`` (fixed point) or ``"float"`` (the model's own rule).
        backend: epilogue backend of the TFLite layers ("auto", "torch", "numba").
        input_hw: spatial size of the input (128 for MCUNet-in1).
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
    q, channels, hw, previous = input_quant, first["in_channels"], input_hw, "the input"
    pooled = False
    stages: list[nn.Module] = []
    names: dict[str, str] = {}
    i = 0
    while i < len(layers):
        layer = layers[i]
        name, op = layer["name"], layer["op"]
        block = _block_of(name)
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
        while i < len(layers) and _block_of(layers[i]["name"]) == block:
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
    return model


def mcunet_in1(path=None, *, requant: str = "tflite", backend: str = "auto"):
    """PMT's MCUNet-in1 (ImageNet-1k, INT8, 128x128) as a real-quantized
    :class:`~bpfree.quant.ptq.QuantizedModel` (:func:`load_quantized` of ``path``, default
    :func:`default_model_dir`). 42 convs in 14 inverted-residual blocks (7 residual adds),
    global average pooling and the 160 -> 1000 classifier; input: pixel p -> int8 p - 128
    (:func:`preprocess_image`); output: 1000 int8 logits."""
    return load_quantized(path, requant=requant, backend=backend, input_hw=MCUNET_INPUT_SHAPE[1])


# ---------------------------------------------------------------------------------------------
# Float mirror for the memory / compute accounting
# ---------------------------------------------------------------------------------------------


class _FloatBlock(nn.Module):
    def __init__(self, convs: list[nn.Module], residual: bool) -> None:
        super().__init__()
        self.conv = nn.Sequential(*convs)
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        return x + out if self.residual else out


def mcunet_in1_float(path=None, *, num_classes: int | None = None) -> nn.Sequential:
    """Float mirror of the int8 graph: the same convs (weights ``w_int8 * w_scale``, biases
    ``b_int32 * x_scale * w_scale``), residual adds as ``x + out``, ``AdaptiveAvgPool2d(1)``,
    ``Flatten`` and ``nn.Linear`` classifier. ReLU6 is fused in the int8 graph (an output
    range), so it has no module here: the mirror is for :func:`bpfree.memory.profile_model`
    (parameters, MACs, activation live sets of the deployed graph), not for accuracy.

    ``num_classes``: replace the 1000-class head by a freshly initialised one of this size
    (PMT's downstream heads, e.g. 10 for CIFAR-10); None keeps the ImageNet head.
    """
    graph = load_graph(path)
    stages: list[nn.Module] = []

    def conv_of(layer: dict, linear: bool) -> nn.Module:
        name = layer["name"]
        w_int = torch.from_numpy(graph.arrays[f"{name}.weight"].astype(np.float32))
        scales = torch.from_numpy(graph.arrays[f"{name}.w_scales"].astype(np.float32))
        bias = torch.from_numpy(graph.arrays[f"{name}.bias"].astype(np.float64))
        w = w_int * scales.view(-1, 1, 1, 1)
        b = (bias * float(layer["x_scale"]) * scales.to(torch.float64)).to(torch.float32)
        if linear:
            m = nn.Linear(layer["in_channels"], layer["out_channels"])
            m.weight.data.copy_(w.reshape(w.shape[0], -1))
        else:
            m = nn.Conv2d(layer["in_channels"], layer["out_channels"], tuple(layer["kernel_size"]),
                          int(layer["stride"]), int(layer["padding"]), groups=int(layer["groups"]))
            m.weight.data.copy_(w)
        m.bias.data.copy_(b)
        return m

    pooled, i, layers = False, 0, graph.layers
    while i < len(layers):
        layer = layers[i]
        block = _block_of(layer["name"])
        if layer["op"] == "mean_hw":
            stages += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
            pooled, i = True, i + 1
        elif block is None:
            stages.append(conv_of(layer, linear=pooled))
            i += 1
        else:
            convs, residual = [], False
            while i < len(layers) and _block_of(layers[i]["name"]) == block:
                if layers[i]["op"] == "add":
                    residual = True
                else:
                    convs.append(conv_of(layers[i], linear=False))
                i += 1
            stages.append(_FloatBlock(convs, residual))
    if num_classes is not None:
        head = stages[-1]
        if not isinstance(head, nn.Linear):
            raise ModelFormatError("num_classes needs a model ending in a linear classifier")
        stages[-1] = nn.Linear(head.in_features, int(num_classes))
    return nn.Sequential(*stages)


# ---------------------------------------------------------------------------------------------
# Inputs and the two requantization rules
# ---------------------------------------------------------------------------------------------


def preprocess_image(image, size: int = 128) -> torch.Tensor:
    """An RGB image (H, W, 3) uint8 array (or H, W grayscale; RGBA drops alpha) to the model's
    int8 input (1, 3, size, size): center square crop, bilinear resize (antialiased) to
    ``size`` when it is not already ``size`` x ``size``, pixel p -> p - 128 (MANIFEST)."""
    a = np.asarray(image)
    if a.ndim == 2:
        a = np.stack([a] * 3, axis=-1)
    if a.ndim != 3 or a.shape[2] not in (3, 4):
        raise ValueError(f"image must be (H, W, 3) RGB or (H, W) grayscale, got shape {a.shape}")
    a = a[:, :, :3]
    if a.dtype != np.uint8:
        if np.issubdtype(a.dtype, np.floating) and a.size and a.max() <= 1.0:
            a = np.round(a * 255.0)
        a = np.clip(a, 0, 255).astype(np.uint8)
    h, w = a.shape[:2]
    if (h, w) != (size, size):
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        a = a[top:top + side, left:left + side]
        t = torch.from_numpy(np.ascontiguousarray(a)).permute(2, 0, 1)[None].to(torch.float32)
        t = torch.nn.functional.interpolate(t, size=(size, size), mode="bilinear",
                                            align_corners=False, antialias=True)
        a = t[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()
    x = torch.from_numpy(np.array(a, copy=True)).permute(2, 0, 1).to(torch.int16) - 128
    return x.to(torch.int8)[None]


@torch.no_grad()
def compare_requant(model_a, model_b, x: torch.Tensor) -> dict:
    """Count the output values on which two imported models (e.g. ``requant="tflite"`` and
    ``"float"``) disagree, stage by stage, on the same int8 input ``x``.

    Per stage (``stages`` rows): ``isolated`` runs both stages on the *same* input (``model_a``'s
    activation), so it counts the rounding differences of that stage alone, with
    ``isolated_max_abs`` their largest size; ``differ`` / ``max_abs`` run each model on its own
    activations, so differences of earlier stages propagate. Totals: ``values`` (outputs of all
    stages), ``isolated_differ``, ``values_differ``; ``logits_differ`` of ``logits_values``;
    ``top1_equal`` / ``top5_equal`` per sample, all-true as booleans."""
    ha, hb = x, x
    rows = []
    for k, (sa, sb) in enumerate(zip(model_a.body, model_b.body)):
        same = sb(ha)
        ha, hb = sa(ha), sb(hb)
        iso = (ha.to(torch.int16) - same.to(torch.int16)).abs()
        diff = (ha.to(torch.int16) - hb.to(torch.int16)).abs()
        rows.append({"stage": k, "values": int(diff.numel()),
                     "isolated": int((iso > 0).sum()),
                     "isolated_max_abs": int(iso.max()) if iso.numel() else 0,
                     "differ": int((diff > 0).sum()),
                     "max_abs": int(diff.max()) if diff.numel() else 0})
    diff = ha.to(torch.int16) != hb.to(torch.int16)
    k = min(5, ha.shape[-1])
    return {"stages": rows, "logits_differ": int(diff.sum()), "logits_values": int(diff.numel()),
            "top1_equal": bool(torch.equal(ha.argmax(-1), hb.argmax(-1))),
            "top5_equal": bool(torch.equal(ha.topk(k, -1).indices, hb.topk(k, -1).indices)),
            "isolated_differ": sum(r["isolated"] for r in rows),
            "values_differ": sum(r["differ"] for r in rows),
            "values": sum(r["values"] for r in rows)}
