"""The model's own requantization rule (float scale, round half to even; tiny-training
``quantized_ops.py``) as subclasses of the TFLite layers that override only the epilogue, and
:func:`compare_requant`, which counts where the two rules differ."""

from __future__ import annotations

import numpy as np
import torch

from ...quant.fixed_point import INT8_MAX, INT8_MIN
from ...quant.layers import QAdd, QConv2d, QGlobalAvgPool2d, QLinear, _check_int8_input

__all__ = ["ROUNDINGS", "FloatRuleAdd", "FloatRuleConv2d", "FloatRuleGlobalAvgPool2d",
           "FloatRuleLinear", "compare_requant", "effective_scale"]


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


def effective_scale(x_scale: float, w_scales, y_scale: float) -> torch.Tensor:
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
        self.check_inputs(a, b)
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
