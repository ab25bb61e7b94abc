"""Float twin of a real-quantized model, for BP baselines and gradient diagnostics.

PMT compares its zeroth-order (BP-free) training of the INT8 model (§2.1, §3) with first-order
training, and judges gradient estimates by their cosine similarity with the true gradient. Both
need autograd through a float graph that computes what the integer model computes, in the
integer model's parameter units. :func:`float_twin` builds that graph from a
:class:`~.ptq.QuantizedModel`:

* every :class:`~.layers.QConv2d` / :class:`~.layers.QLinear` becomes a :class:`TwinConv2d` /
  :class:`TwinLinear` **with the same qualified module name**, whose Parameters are in integer
  units: ``weight`` holds the int8 values ``W`` (float32) and ``bias`` the int32 values ``B``;
  the effective float weight is ``W * s_w[c]`` and bias ``B * s_in * s_w[c]`` (the TFLite int8
  spec's dequantization). ``weight.grad`` is therefore ``dL/dW`` per integer unit, directly
  comparable with an estimate of the gradient of the integer trainer;
* fused ReLU / ReLU6 are float clamps;
* ``fake_quant=True`` also fake-quantizes every activation with the integer model's
  :class:`~.params.TensorQuant` (round, clamp to int8, straight-through gradient inside the
  range, as ``torch.fake_quantize_per_tensor_affine``) and rounds / clamps ``W`` and ``B``
  (straight-through): a quantization-aware forward equal to the integer model's up to rounding
  ties and the fixed-point multiplier's rounding. ``fake_quant=False`` is the plain float graph
  with the same (dequantized) weights.

:func:`write_back` copies trained twin parameters back into the integer model.
:func:`to_float_units` re-expresses a plain float twin's Parameters in float units, for FP32
training: SGD on integer-unit Parameters steps the effective weight by ``lr * s_w^2 * g``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .fixed_point import INT8_MAX, INT8_MIN, INT32_MAX, INT32_MIN
from .layers import QAdd, QAvgPool2d, QConv2d, QFlatten, QGlobalAvgPool2d, QLinear, QReLU
from .params import TensorQuant
from .stages import QInvertedResidual, QMaxPool2d, stage_output_quant

#: int32 biases up to this magnitude are exact in a float32 Parameter; larger ones get float64.
FLOAT32_EXACT_INT = 2**24


def _fake_quantize(x: torch.Tensor, quant: TensorQuant) -> torch.Tensor:
    """Round to the int8 grid of ``quant`` and dequantize; the gradient passes straight through
    inside the representable range and is zero outside (clamped)."""
    return torch.fake_quantize_per_tensor_affine(x, quant.scale, quant.zero_point,
                                                 INT8_MIN, INT8_MAX)


def _round_ste(t: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """``clamp(round(t), lo, hi)`` forward, identity gradient (straight-through estimator)."""
    return t + (torch.round(t).clamp(lo, hi) - t).detach()


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation == "relu":
        return F.relu(y)
    if activation == "relu6":
        return F.relu6(y)
    return y


class _TwinAffine(nn.Module):
    """Integer-unit Parameters and the float epilogue shared by TwinConv2d / TwinLinear."""

    def _init_from(self, q: QConv2d | QLinear, fake_quant: bool) -> None:
        self.input_quant = q.input_quant
        self.output_quant = q.output_quant
        self.activation = q.activation
        self.fake_quant = bool(fake_quant)
        self.weight = nn.Parameter(q.weight.detach().to(torch.float32).clone())
        bias = q.bias.detach()
        big = bias.numel() and int(bias.to(torch.int64).abs().max()) > FLOAT32_EXACT_INT
        # float32 holds |B| <= 2**24 exactly (PTQ guarantees it); beyond, float64 keeps the
        # write_back round trip exact.
        self.bias = nn.Parameter(bias.to(torch.float64 if big else torch.float32).clone())
        scales = torch.tensor(q.weight_quant.scales, dtype=torch.float64)
        self.register_buffer("weight_scale", scales.to(torch.float32).to(q.weight.device))
        # s_in * s_w[c] in double, as TFLite computes effective scales.
        self.register_buffer("bias_scale",
                             (scales * q.input_quant.scale).to(torch.float32).to(q.weight.device))

    def effective_weight(self) -> torch.Tensor:
        """``W * s_w[c]`` (``W`` rounded and clamped to int8, straight-through, if fake_quant)."""
        w = _round_ste(self.weight, INT8_MIN, INT8_MAX) if self.fake_quant else self.weight
        return w * self.weight_scale.view(-1, *([1] * (w.dim() - 1)))

    def effective_bias(self) -> torch.Tensor:
        """``B * s_in * s_w[c]`` in the weight dtype (``B`` rounded / clamped to int32 if
        fake_quant)."""
        b = _round_ste(self.bias, INT32_MIN, INT32_MAX) if self.fake_quant else self.bias
        return (b * self.bias_scale).to(self.weight.dtype)

    def _epilogue(self, y: torch.Tensor) -> torch.Tensor:
        y = _activate(y, self.activation)
        return _fake_quantize(y, self.output_quant) if self.fake_quant else y

    def extra_repr(self) -> str:
        return f"activation={self.activation}, fake_quant={self.fake_quant}"


class TwinConv2d(_TwinAffine):
    """Float twin of a :class:`~.layers.QConv2d` (integer-unit ``weight`` / ``bias``)."""

    def __init__(self, q: QConv2d, fake_quant: bool) -> None:
        super().__init__()
        self._init_from(q, fake_quant)
        self.stride, self.padding = q.stride, q.padding
        self.dilation, self.groups = q.dilation, q.groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, self.effective_weight(), self.effective_bias(), self.stride,
                     self.padding, self.dilation, self.groups)
        return self._epilogue(y)


class TwinLinear(_TwinAffine):
    """Float twin of a :class:`~.layers.QLinear` (integer-unit ``weight`` / ``bias``)."""

    def __init__(self, q: QLinear, fake_quant: bool) -> None:
        super().__init__()
        self._init_from(q, fake_quant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._epilogue(F.linear(x, self.effective_weight(), self.effective_bias()))


class TwinActivation(nn.Module):
    """Float twin of a stage without parameters (``kind``: "relu", "relu6", "avg_pool",
    "global_avg_pool"), then fake quantization to ``quant`` if fake_quant."""

    KINDS = ("relu", "relu6", "avg_pool", "global_avg_pool")

    def __init__(self, kind: str, quant: TensorQuant, fake_quant: bool, *,
                 kernel_size=None, stride=None, padding=0, keepdim: bool = False,
                 activation: str | None = None) -> None:
        super().__init__()
        if kind not in self.KINDS:
            raise ValueError(f"kind must be one of {self.KINDS}, got {kind!r}")
        self.kind = kind
        self.quant = quant
        self.fake_quant = bool(fake_quant)
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.keepdim = keepdim
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "global_avg_pool":
            y = x.mean(dim=(2, 3), keepdim=self.keepdim)
        elif self.kind == "avg_pool":
            # QAvgPool2d excludes padding from the count, as TFLite's AveragePool.
            y = _activate(F.avg_pool2d(x, self.kernel_size, self.stride, self.padding,
                                       count_include_pad=False), self.activation)
        else:
            y = _activate(x, self.kind)
        return _fake_quantize(y, self.quant) if self.fake_quant else y

    def extra_repr(self) -> str:
        return f"{self.kind}, fake_quant={self.fake_quant}"


class TwinAdd(nn.Module):
    """Float twin of :class:`~.layers.QAdd`: ``a + b`` (+ activation), fake-quantized."""

    def __init__(self, q: QAdd, fake_quant: bool) -> None:
        super().__init__()
        self.output_quant = q.output_quant
        self.activation = q.activation
        self.fake_quant = bool(fake_quant)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = _activate(a + b, self.activation)
        return _fake_quantize(y, self.output_quant) if self.fake_quant else y


class TwinInvertedResidual(QInvertedResidual):
    """Float twin of :class:`~.ptq.QInvertedResidual`: the same composition (``body``, then
    ``add`` of input and output) over twin layers, so module names match."""


class FloatTwin(nn.Module):
    """Float graph mirroring a :class:`~.ptq.QuantizedModel` module for module (see the module
    docstring). Input: float images (or int8, dequantized with ``input_quant``); output: float
    logits."""

    def __init__(self, body: nn.Sequential, input_quant: TensorQuant, output_quant: TensorQuant,
                 fake_quant: bool) -> None:
        super().__init__()
        self.body = body
        self.input_quant = input_quant
        self.output_quant = output_quant
        self.fake_quant = bool(fake_quant)

    def set_fake_quant(self, fake_quant: bool) -> FloatTwin:
        """Switch every module between the quantization-aware and the plain float forward."""
        for m in self.modules():
            if hasattr(m, "fake_quant"):
                m.fake_quant = bool(fake_quant)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.int8:
            x = self.input_quant.dequantize(x)
        elif self.fake_quant:
            x = _fake_quantize(x.to(torch.float32), self.input_quant)
        return self.body(x)


def _twin_stage(stage: nn.Module, q_in: TensorQuant, fake_quant: bool, name: str) -> nn.Module:
    if isinstance(stage, QConv2d):
        return TwinConv2d(stage, fake_quant)
    if isinstance(stage, QLinear):
        return TwinLinear(stage, fake_quant)
    if isinstance(stage, QInvertedResidual):
        convs, q = [], q_in
        for i, conv in enumerate(stage.body):
            convs.append(_twin_stage(conv, q, fake_quant, f"{name}.body.{i}"))
            q = stage_output_quant(conv, q)
        add = None if stage.add is None else TwinAdd(stage.add, fake_quant)
        return TwinInvertedResidual(nn.Sequential(*convs), add)
    if isinstance(stage, QGlobalAvgPool2d):
        return TwinActivation("global_avg_pool", stage.output_quant, fake_quant,
                              keepdim=stage.keepdim)
    if isinstance(stage, QAvgPool2d):
        return TwinActivation("avg_pool", stage.quant or q_in, fake_quant,
                              kernel_size=stage.kernel_size, stride=stage.stride,
                              padding=stage.padding, activation=stage.activation)
    if isinstance(stage, QMaxPool2d):
        return nn.MaxPool2d(stage.kernel_size, stage.stride, stage.padding, stage.dilation,
                            ceil_mode=stage.ceil_mode)
    if isinstance(stage, QFlatten):
        return nn.Flatten(stage.start_dim, stage.end_dim)
    if isinstance(stage, QReLU):
        return TwinActivation("relu6" if stage.six else "relu", stage.quant, fake_quant)
    if type(stage) is nn.Identity:
        return nn.Identity()
    raise ValueError(f"float_twin: no float twin for stage {name!r} of type "
                     f"{type(stage).__name__}; supported: QConv2d, QLinear, QInvertedResidual, "
                     "QGlobalAvgPool2d, QAvgPool2d, QMaxPool2d, QFlatten, QReLU, Identity")


def float_twin(qmodel: nn.Module, *, fake_quant: bool) -> FloatTwin:
    """The :class:`FloatTwin` of ``qmodel`` (a :class:`~.ptq.QuantizedModel`), on its device.

    ``fake_quant=True``: quantization-aware forward reproducing ``qmodel(x)`` up to rounding
    (``torch.round`` / ``fake_quantize`` round half to even, TFLite half away from zero or up,
    and the fixed-point multipliers are 31-bit approximations of the real scales: an occasional
    one-LSB difference that may propagate). ``fake_quant=False``: the float graph.
    """
    for attr in ("body", "input_quant", "output_quant"):
        if not hasattr(qmodel, attr):
            raise ValueError(f"float_twin needs a QuantizedModel (body, input_quant, "
                             f"output_quant), got {type(qmodel).__name__} without {attr!r}")
    if not isinstance(fake_quant, bool):
        raise ValueError(f"fake_quant must be True or False, got {fake_quant!r}")
    stages, q = [], qmodel.input_quant
    for i, stage in enumerate(qmodel.body):
        stages.append(_twin_stage(stage, q, fake_quant, f"body.{i}"))
        q = stage_output_quant(stage, q)
    return FloatTwin(nn.Sequential(*stages), qmodel.input_quant, qmodel.output_quant, fake_quant)


def write_back(twin: nn.Module, qmodel: nn.Module) -> None:
    """Copy the twin's integer-unit parameters into ``qmodel``'s buffers, in place.

    ``weight = clamp(round(W), -128, 127)`` (int8), ``bias = clamp(round(B), int32)`` (int32).
    Every layer is validated first (a twin affine layer of the same name, same shapes, same
    weight scales, finite values), so a bad twin raises ValueError naming the layer and leaves
    ``qmodel`` untouched.
    """
    q_layers = trainable_layers(qmodel)
    t_modules = dict(twin.named_modules())
    t_names = {n for n, m in t_modules.items() if isinstance(m, _TwinAffine)}
    extra = sorted(t_names - {n for n, _ in q_layers})
    if extra:
        raise ValueError(f"write_back: twin layers {extra} have no QConv2d / QLinear of the same "
                         "name in the quantized model")
    updates = []
    for name, q in q_layers:
        if not isinstance(q, (QConv2d, QLinear)):
            raise ValueError(f"write_back: {name!r} in the target is a {type(q).__name__}, not "
                             "a QConv2d / QLinear (pass the QuantizedModel second)")
        t = t_modules.get(name)
        if not isinstance(t, _TwinAffine):
            raise ValueError(f"write_back: the twin has no TwinConv2d / TwinLinear named "
                             f"{name!r}")
        if tuple(t.weight.shape) != tuple(q.weight.shape) or \
                tuple(t.bias.shape) != tuple(q.bias.shape):
            raise ValueError(f"write_back: layer {name!r} shapes differ: twin weight "
                             f"{tuple(t.weight.shape)} / bias {tuple(t.bias.shape)}, quantized "
                             f"{tuple(q.weight.shape)} / {tuple(q.bias.shape)}")
        scales = torch.tensor(q.weight_quant.scales, dtype=torch.float32)
        if not torch.equal(t.weight_scale.detach().cpu(), scales):
            raise ValueError(f"write_back: layer {name!r} weight scales differ between twin and "
                             "quantized model (integer units would not match)")
        w, b = t.weight.detach(), t.bias.detach()
        if not bool(torch.isfinite(w).all()) or not bool(torch.isfinite(b).all()):
            raise ValueError(f"write_back: layer {name!r} has non-finite twin weight or bias")
        w_int = torch.round(w).clamp(INT8_MIN, INT8_MAX).to(torch.int8)
        b_int = torch.round(b.to(torch.float64)).clamp(INT32_MIN, INT32_MAX).to(torch.int32)
        updates.append((q, w_int, b_int))
    with torch.no_grad():
        for q, w_int, b_int in updates:
            q.weight.copy_(w_int.to(q.weight.device))
            q.bias.copy_(b_int.to(q.bias.device))


def trainable_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(qualified name, module)`` of every QConv2d / QLinear in forward order.

    Works on a :class:`QuantizedModel` and on its float twin (:class:`~.twin.FloatTwin`, whose
    affine layers carry the same names). Forward order is registration order: stages are
    visited in ``body`` order and a block's convolutions before its ``add``.
    """
    kinds = (QConv2d, QLinear, TwinConv2d, TwinLinear)
    return [(name, m) for name, m in model.named_modules() if isinstance(m, kinds)]


@torch.no_grad()
def to_float_units(twin: FloatTwin) -> FloatTwin:
    """Fold every affine layer's scales into its Parameters, in place: ``weight <- W * s_w``,
    ``bias <- B * s_in * s_w``, both scales set to 1. The forward is unchanged; the gradient
    becomes ``dL/dw`` per float unit.

    FP32 BP (PMT Table 7's FullTrain FP32) is plain SGD on the float weights. On a twin's
    integer-unit Parameters the same step ``W <- W - lr * dL/dW`` moves the float weight by
    ``lr * s_w^2 * dL/dw`` (and the bias by ``lr * (s_in s_w)^2 * dL/db``): with MCUNet-in1's
    weight scales of about 1e-2 .. 1e-3 that is a rate 1e4 .. 1e6 times smaller than asked, and
    a float baseline that barely trains. Only a plain float twin (``fake_quant=False``) can be
    converted: a fake-quantized one rounds ``W`` to integers, which needs integer units; the
    converted twin no longer fits :func:`write_back`.
    """
    if not isinstance(twin, FloatTwin):
        raise ValueError(f"to_float_units needs a FloatTwin (float_twin(...)), got "
                         f"{type(twin).__name__}")
    if any(getattr(m, "fake_quant", False) for m in twin.modules()):
        raise ValueError("to_float_units needs a plain float twin (fake_quant=False): a "
                         "fake-quantized twin rounds its weights to integers, in integer units")
    for module in twin.modules():
        if not isinstance(module, _TwinAffine):
            continue
        shape = (-1, *([1] * (module.weight.dim() - 1)))
        module.weight.mul_(module.weight_scale.view(shape).to(module.weight.dtype))
        module.bias.mul_(module.bias_scale.to(module.bias.dtype))
        module.weight_scale.fill_(1.0)
        module.bias_scale.fill_(1.0)
    return twin

