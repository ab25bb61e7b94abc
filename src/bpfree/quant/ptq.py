"""Post-training quantization (PTQ) of a float ``nn.Module`` into a real-quantized int8 model.

PMT (§2.1, §4.1) trains a model that was "quantized to the INT8 format by post-training
quantization", with "batch normalization layers fused into the adjacent convolution layer";
only integer parameters and the integer inference graph exist on the MCU. This module builds
that model from a float network, following the TFLite int8 quantization specification
(``https://www.tensorflow.org/lite/performance/quantization_spec``):

* BatchNorm folded into the preceding convolution (:func:`fold_batchnorm`);
* weights: int8, symmetric per output channel, ``s_w[c] = max|w[c]| / 127`` (values in
  [-127, 127], as the spec asks);
* bias: int32 at scale ``s_in * s_w[c]``, ``round(b / (s_in * s_w[c]))``;
* activations: int8, per-tensor asymmetric, ranges calibrated with forward hooks on the float
  model (min / max, optionally percentiles), always containing 0 so that 0 (padding, ReLU) is
  exactly representable;
* ReLU / ReLU6 after a convolution or linear layer fused as a clamp of its output range;
* residual ADD requantized with its own calibrated output range (:class:`~.layers.QAdd`).

The integer stages it builds (:class:`~.stages.QuantizedModel` and the blocks
:mod:`.layers` does not provide) live in :mod:`.stages`, the weight quantization in
:mod:`.weights` and the activation calibration in :mod:`.calibrate`; this module analyses the
float model and assembles the converted one.
The result is a :class:`QuantizedModel` whose ``body`` is an ``nn.Sequential`` with one int8
stage per top-level stage of the float ``nn.Sequential`` (``body[k]`` corresponds to
``model[k]``), the layout :mod:`bpfree.pmt` trains stage by stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..blocks import InvertedResidual
from .calibrate import calibrate_ranges
from .layers import (
    QAdd,
    QAvgPool2d,
    QConv2d,
    QFlatten,
    QGlobalAvgPool2d,
    QLinear,
    QReLU,
)
from .layers.arith import _ACCUMULATE, _BACKENDS
from .params import TensorQuant
from .stages import QInvertedResidual, QMaxPool2d, QuantizedModel
from .weights import fold_batchnorm, quantize_weights


# ---------------------------------------------------------------------------------------------
# Model analysis (everything is validated here, before calibration or construction)
# ---------------------------------------------------------------------------------------------


@dataclass
class _Unit:
    """One affine unit: Conv2d [+ BatchNorm2d] or Linear, with its fused activation."""

    name: str
    layer: nn.Module
    bn: nn.BatchNorm2d | None
    activation: str | None
    out_key: str  # module whose output range is the unit's output quantization


@dataclass
class _Stage:
    kind: str  # affine | block | gap | avgpool | maxpool | flatten | relu | identity
    name: str
    module: nn.Module
    units: tuple[_Unit, ...] = ()
    residual: bool = False
    six: bool = False


def _unsupported(name: str, module: nn.Module, where: str) -> ValueError:
    return ValueError(
        f"cannot quantize layer {name!r} of type {type(module).__name__} ({where}). Supported "
        "top-level stages: Conv2d, Linear, Sequential(Conv2d [BatchNorm2d] [ReLU|ReLU6]) "
        "(conv_bn), Sequential(Linear [ReLU|ReLU6]), InvertedResidual, AdaptiveAvgPool2d(1), "
        "AvgPool2d, MaxPool2d, Flatten, ReLU, ReLU6, Dropout, Identity")


def _activation_of(module: nn.Module) -> str | None:
    if isinstance(module, nn.ReLU6):
        return "relu6"
    if isinstance(module, nn.ReLU):
        return "relu"
    return None


def _check_finite(name: str, module: nn.Module) -> None:
    for pname, t in list(module.named_parameters(recurse=False)) + list(
            module.named_buffers(recurse=False)):
        if t is not None and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"layer {name!r}: {pname} has non-finite values (nan / inf)")


def _conv_padding(conv: nn.Conv2d, name: str) -> tuple[int, int]:
    if conv.padding_mode != "zeros":
        raise ValueError(f"layer {name!r}: padding_mode must be 'zeros' (TFLite pads with the "
                         f"input zero point), got {conv.padding_mode!r}")
    if conv.padding == "valid":
        return (0, 0)
    if conv.padding == "same":
        total = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size)]
        if any(t % 2 for t in total):
            raise ValueError(f"layer {name!r}: padding='same' with an even effective kernel is "
                             "asymmetric; QConv2d pads symmetrically")
        return (total[0] // 2, total[1] // 2)
    return tuple(int(p) for p in conv.padding)


def _check_layer(name: str, layer: nn.Module) -> None:
    _check_finite(name, layer)
    if isinstance(layer, nn.Conv2d):
        _conv_padding(layer, name)


def _check_bn(name: str, bn: nn.BatchNorm2d, conv: nn.Conv2d) -> None:
    if type(bn) is not nn.BatchNorm2d:
        raise _unsupported(name, bn, "only nn.BatchNorm2d folds into a convolution")
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError(f"layer {name!r}: BatchNorm2d needs running statistics to be folded "
                         "(track_running_stats=True)")
    if bn.num_features != conv.out_channels:
        raise ValueError(f"layer {name!r}: BatchNorm2d has {bn.num_features} features, the "
                         f"convolution {conv.out_channels} output channels")
    _check_finite(name, bn)
    if not bool((bn.running_var.detach() + bn.eps > 0).all()):
        raise ValueError(f"layer {name!r}: running_var + eps must be > 0")


def _parse_unit(name: str, seq: nn.Sequential) -> _Unit:
    """Sequential(Conv2d [BatchNorm2d] [ReLU|ReLU6]) or Sequential(Linear [ReLU|ReLU6])."""
    items = list(seq.named_children())
    if not items:
        raise _unsupported(name, seq, "empty Sequential")
    first_name, layer = items[0]
    if type(layer) not in (nn.Conv2d, nn.Linear):
        raise _unsupported(f"{name}.{first_name}", layer,
                           "a Sequential stage must start with Conv2d or Linear")
    _check_layer(f"{name}.{first_name}", layer)
    bn, activation, out_key = None, None, f"{name}.{first_name}"
    for child_name, child in items[1:]:
        qname = f"{name}.{child_name}"
        if isinstance(child, nn.BatchNorm2d) and bn is None and activation is None \
                and isinstance(layer, nn.Conv2d):
            _check_bn(qname, child, layer)
            bn = child
        elif _activation_of(child) is not None and activation is None:
            activation = _activation_of(child)
        else:
            raise _unsupported(qname, child, "inside a Sequential stage, after the Conv2d / "
                               "Linear only one BatchNorm2d (convolutions) then one ReLU / ReLU6 "
                               "may follow")
        out_key = qname
    return _Unit(name, layer, bn, activation, out_key)


def _analyse(model: nn.Sequential) -> list[_Stage]:
    if not isinstance(model, nn.Sequential):
        raise ValueError("quantize_model needs an nn.Sequential of stages (each mapping one "
                         f"tensor to one tensor), got {type(model).__name__}")
    stages: list[_Stage] = []
    for name, m in model.named_children():
        if isinstance(m, InvertedResidual):
            if not isinstance(m.conv, nn.Sequential) or len(m.conv) == 0:
                raise _unsupported(name, m, "its .conv must be a non-empty Sequential")
            units = []
            for child_name, child in m.conv.named_children():
                if not isinstance(child, nn.Sequential):
                    raise _unsupported(f"{name}.conv.{child_name}", child,
                                       "inverted-residual units must be conv_bn Sequentials")
                unit = _parse_unit(f"{name}.conv.{child_name}", child)
                if not isinstance(unit.layer, nn.Conv2d):
                    raise _unsupported(f"{name}.conv.{child_name}", unit.layer,
                                       "inverted-residual units must be convolutions")
                units.append(unit)
            stages.append(_Stage("block", name, m, tuple(units), residual=bool(m.use_residual)))
        elif isinstance(m, nn.Sequential):
            stages.append(_Stage("affine", name, m, (_parse_unit(name, m),)))
        elif type(m) in (nn.Conv2d, nn.Linear):
            _check_layer(name, m)
            stages.append(_Stage("affine", name, m, (_Unit(name, m, None, None, name),)))
        elif type(m) is nn.AdaptiveAvgPool2d:
            size = m.output_size
            if size not in (1, (1, 1), [1, 1]):
                raise _unsupported(name, m, f"only output_size 1 (global pooling), got {size!r}")
            stages.append(_Stage("gap", name, m))
        elif type(m) is nn.AvgPool2d:
            pad = m.padding if isinstance(m.padding, tuple) else (m.padding, m.padding)
            if m.ceil_mode or m.divisor_override is not None:
                raise _unsupported(name, m, "ceil_mode and divisor_override are not supported")
            if any(pad) and m.count_include_pad:
                raise _unsupported(name, m, "with padding, count_include_pad must be False "
                                   "(TFLite's AveragePool excludes padding from the count)")
            stages.append(_Stage("avgpool", name, m))
        elif type(m) is nn.MaxPool2d:
            if m.return_indices:
                raise _unsupported(name, m, "return_indices=True")
            stages.append(_Stage("maxpool", name, m))
        elif type(m) is nn.Flatten:
            stages.append(_Stage("flatten", name, m))
        elif type(m) in (nn.ReLU, nn.ReLU6):
            stages.append(_Stage("relu", name, m, six=isinstance(m, nn.ReLU6)))
        elif type(m) in (nn.Identity, nn.Dropout):
            stages.append(_Stage("identity", name, m))
        else:
            raise _unsupported(name, m, "no integer kernel for it")
    if not stages:
        raise ValueError("quantize_model needs a non-empty nn.Sequential")
    # A top-level ReLU / ReLU6 right after an affine stage without activation is fused into it
    # (the int8 output then uses the post-activation range); the ReLU stage stays as an
    # idempotent QReLU clamp so that body[k] keeps matching model[k].
    for prev, stage in zip(stages, stages[1:]):
        if stage.kind == "relu" and prev.kind == "affine" and prev.units[0].activation is None:
            unit = prev.units[0]
            unit.activation = "relu6" if stage.six else "relu"
            unit.out_key = stage.name
    return stages


def _hook_keys(stages: list[_Stage]) -> list[str]:
    """The modules whose outputs calibration observes: every stage and every unit's output."""
    keys = [s.name for s in stages]
    for s in stages:
        keys += [u.out_key for u in s.units]
    return keys


# ---------------------------------------------------------------------------------------------
# Construction
# ---------------------------------------------------------------------------------------------


def _build_unit(unit: _Unit, q_in: TensorQuant, q_out: TensorQuant, accumulate: str,
                backend: str) -> nn.Module:
    layer = unit.layer
    if isinstance(layer, nn.Conv2d):
        w, b = fold_batchnorm(layer, unit.bn)
    else:
        w = layer.weight.detach().to(torch.float32)
        b = (layer.bias.detach().to(torch.float32) if layer.bias is not None
             else torch.zeros(w.shape[0]))
    w_int, b_int, wq = quantize_weights(w, b, q_in.scale, unit.name)
    try:
        if isinstance(layer, nn.Conv2d):
            return QConv2d(w_int, b_int, weight_scale=wq, input_quant=q_in, output_quant=q_out,
                           stride=tuple(layer.stride), padding=_conv_padding(layer, unit.name),
                           dilation=tuple(layer.dilation), groups=layer.groups,
                           activation=unit.activation, accumulate=accumulate, backend=backend)
        return QLinear(w_int, b_int, weight_scale=wq, input_quant=q_in, output_quant=q_out,
                       activation=unit.activation, accumulate=accumulate, backend=backend)
    except ValueError as err:
        raise ValueError(f"layer {unit.name!r}: {err}") from None


def quantize_model(model: nn.Module, calibration, *, input_range: tuple[float, float] | None = None,
                   percentile: float | None = None, accumulate: str = "auto",
                   backend: str = "auto") -> QuantizedModel:
    """Post-training quantization of a float ``nn.Sequential`` to a :class:`QuantizedModel`.

    PMT §4.1: the model is "quantized to the INT8 format by post-training quantization" with
    BN "fused into the adjacent convolution layer"; the parameters follow the TFLite int8 spec
    (module docstring).

    Args:
        model: float ``nn.Sequential`` of stages (see the error message of an unsupported layer
            for the list); evaluated in eval mode (BN running statistics), its mode is restored
            and it is not modified.
        calibration: one float input tensor, or an iterable of them (or of (input, target)
            pairs), run through ``model`` to record activation ranges.
        input_range: (lo, hi) real range of the inputs, e.g. (0, 1) for images in [0, 1];
            default: the min / max of the calibration inputs.
        percentile: None (min / max over all batches) or p in (50, 100]: each activation range
            is [P(100 - p), P(p)] per batch, averaged over batches (clips outliers).
        accumulate, backend: passed to every QConv2d / QLinear.

    Returns the integer model on the float model's device. Raises ValueError naming the layer
    (qualified name and type) for an unsupported layer, before anything is built, and for
    non-finite weights, BN statistics or scales.
    """
    if percentile is not None and (isinstance(percentile, bool) or not
                                   isinstance(percentile, (int, float)) or
                                   not 50 < percentile <= 100):
        raise ValueError(f"percentile must be None or a number in (50, 100], got {percentile!r}")
    # Checked here, before calibration runs, rather than by the first layer built.
    for name, value, choices in (("accumulate", accumulate, _ACCUMULATE),
                                 ("backend", backend, _BACKENDS)):
        if value not in choices:
            raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    meta = ([name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
            if isinstance(model, nn.Module) else [])
    if meta:
        raise ValueError(f"the model's tensors are on the meta device (no values), e.g. "
                         f"{meta[0]!r}: a model built under torch.device('meta') has shapes only; "
                         "materialize it (model.to_empty(device='cpu'), then load its weights) "
                         "before quantizing")
    stages = _analyse(model)
    input_quant, quants = calibrate_ranges(model, _hook_keys(stages), calibration, percentile,
                                           input_range)

    body, stage_quants = [], []
    q = input_quant
    for stage in stages:
        if stage.kind == "affine":
            unit = stage.units[0]
            q_out = quants[unit.out_key]
            module = _build_unit(unit, q, q_out, accumulate, backend)
        elif stage.kind == "block":
            convs, q_unit = [], q
            for i, unit in enumerate(stage.units):
                last = i == len(stage.units) - 1
                # Without a residual the block output is the last unit's output.
                key = stage.name if last and not stage.residual else unit.out_key
                q_next = quants[key]
                convs.append(_build_unit(unit, q_unit, q_next, accumulate, backend))
                q_unit = q_next
            add = None
            q_out = q_unit
            if stage.residual:
                q_out = quants[stage.name]
                try:
                    add = QAdd(q, q_unit, q_out, backend=backend)
                except ValueError as err:
                    raise ValueError(f"layer {stage.name!r} (residual add): {err}") from None
            module = QInvertedResidual(nn.Sequential(*convs), add)
        elif stage.kind == "gap":
            q_out = quants[stage.name]
            module = QGlobalAvgPool2d(q, q_out, keepdim=True)
        elif stage.kind == "avgpool":
            m = stage.module
            q_out, module = q, QAvgPool2d(m.kernel_size, m.stride, m.padding, quant=q)
        elif stage.kind == "maxpool":
            m = stage.module
            q_out, module = q, QMaxPool2d(m.kernel_size, m.stride, m.padding, m.dilation,
                                          m.ceil_mode)
        elif stage.kind == "flatten":
            m = stage.module
            q_out, module = q, QFlatten(m.start_dim, m.end_dim)
        elif stage.kind == "relu":
            q_out, module = q, QReLU(q, six=stage.six)
        else:
            q_out, module = q, nn.Identity()
        body.append(module)
        stage_quants.append(q_out)
        q = q_out
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    return QuantizedModel(nn.Sequential(*body), input_quant, stage_quants).to(device)
