"""What a .tflite graph needs beyond :mod:`bpfree.quant`: PAD, and LiteRT's kernel rules.

LiteRT's reference kernels follow TFLite Micro's everywhere but in two places, which
:func:`use_litert_kernels` switches: FULLY_CONNECTED rescales in double (:func:`litert_linear`)
and MEAN folds ``1 / (H*W)`` into its multiplier (``QGlobalAvgPool2d(rule="litert")``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..models.mcunet.float_rule import FloatRuleLinear, effective_scale
from ..quant.layers import QGlobalAvgPool2d, QLinear, _check_int8_input
from ..quant.params import TensorQuant


class QPad(nn.Module):
    """TFLite int8 ``PAD`` of an NCHW tensor: pads with the zero point (the real value 0).

    ``pads`` is ``(top, bottom, left, right)``; input and output share ``quant``.
    """

    def __init__(self, pads: tuple[int, int, int, int], quant: TensorQuant) -> None:
        super().__init__()
        if len(pads) != 4 or any(int(p) < 0 for p in pads):
            raise ValueError(f"pads must be four ints >= 0 (top, bottom, left, right), "
                             f"got {pads!r}")
        self.pads = tuple(int(p) for p in pads)
        self.quant = quant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_int8_input(x)
        top, bottom, left, right = self.pads
        return F.pad(x, (left, right, top, bottom), value=self.quant.zero_point)

    def tflite_paddings(self) -> tuple[int, ...]:
        """The PAD operator's NHWC ``paddings`` (flattened [4, 2])."""
        top, bottom, left, right = self.pads
        return (0, 0, top, bottom, left, right, 0, 0)

    def extra_repr(self) -> str:
        return f"pads={self.pads}, quant={self.quant}"


def litert_linear(layer: QLinear) -> FloatRuleLinear:
    """``layer`` with LiteRT's FULLY_CONNECTED epilogue (same integers and quantization).

    LiteRT's reference int8 FULLY_CONNECTED rescales in double,
    ``std::round(acc * (double(s_in) * double(s_w[c]) / double(s_out)))``, not with the gemmlowp
    fixed-point multiplier of CONV_2D (whose double rounding differs on about 0.05% of outputs):
    :class:`~bpfree.models.mcunet.FloatRuleLinear` with ``rounding="half_away"``.
    """
    out = FloatRuleLinear(
        layer.weight, layer.bias, weight_scale=layer.weight_quant,
        input_quant=layer.input_quant, output_quant=layer.output_quant,
        activation=layer.activation, accumulate=layer.accumulate, backend=layer.backend,
        effective_scale=effective_scale(layer.input_quant.scale, layer.weight_quant.scales,
                                         layer.output_quant.scale),
        rounding="half_away")
    return out.to(layer.weight.device)


def is_litert_linear(module: nn.Module) -> bool:
    return isinstance(module, FloatRuleLinear) and module.rounding == "half_away"


def use_litert_kernels(model: nn.Module) -> int:
    """Give ``model`` LiteRT's integer rules where they differ from TFLite Micro's, in place.

    Every :class:`~bpfree.quant.layers.QLinear` becomes :func:`litert_linear` and every
    :class:`~bpfree.quant.layers.QGlobalAvgPool2d` uses ``rule="litert"``, so that the model
    computes exactly what its saved ``.tflite`` computes in LiteRT. Call it on a model from
    :func:`~bpfree.quant.quantize_model` before training it for a ``.tflite`` (models from
    :func:`bpfree.tflite.load` have these rules already). Returns how many modules changed.
    """
    changed = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, QLinear) and not is_litert_linear(child):
                setattr(parent, name, litert_linear(child))
                changed += 1
            elif isinstance(child, QGlobalAvgPool2d) and child.rule != "litert":
                child.rule = "litert"
                changed += 1
    return changed
