"""The integer stages of a real-quantized model that :mod:`.layers` does not provide.

:class:`QuantizedModel` (the int8 graph :func:`~.ptq.quantize_model` builds), int8 max pooling
and the MobileNetV2 inverted-residual block, and :func:`stage_output_quant`. The converter
(:mod:`.ptq`) and the float twin (:mod:`.twin`) both build on this module.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .layers import QAdd, QConv2d, QGlobalAvgPool2d, QLinear, _check_int8_input
from .params import TensorQuant

__all__ = ["QInvertedResidual", "QMaxPool2d", "QuantizedModel", "stage_output_quant"]


class QMaxPool2d(nn.Module):
    """Int8 max pooling (TFLite ``MaxPool``): input and output share one quantization.

    The maximum commutes with the monotone affine dequantization, so pooling the int8 values is
    exact; padded positions never win (PyTorch pads with -inf, TFLite skips them).
    """

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride
        self.padding = padding
        self.dilation = dilation
        self.ceil_mode = bool(ceil_mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_int8_input(x)
        # float32 holds every int8 value exactly; max is exact.
        out = F.max_pool2d(x.to(torch.float32), self.kernel_size, self.stride, self.padding,
                           self.dilation, self.ceil_mode)
        return out.to(torch.int8)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class QInvertedResidual(nn.Module):
    """Int8 MobileNetV2 inverted-residual block: ``body`` (1x1 expand + ReLU6, 3x3 depthwise +
    ReLU6, 1x1 linear project, each a :class:`~.layers.QConv2d` with BN folded) and, when the
    float block has a residual, ``add`` (:class:`~.layers.QAdd`, TFLite's requantized ADD) of
    the block input and the projection."""

    def __init__(self, body: nn.Sequential, add: QAdd | None) -> None:
        super().__init__()
        self.body = body
        self.add = add

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return out if self.add is None else self.add(x, out)


class QuantizedModel(nn.Module):
    """A real-quantized model: int8 stages between an input quantizer and an output dequantizer.

    ``body`` is an ``nn.Sequential`` of stages that each map one int8 tensor to one int8 tensor
    (``body[k]`` is the integer form of the float model's ``model[k]``). ``stage_quants[k]`` is
    the :class:`TensorQuant` of the output of ``body[k]``; the input of stage 0 is
    ``input_quant``, the logits are ``output_quant`` (= ``stage_quants[-1]``).
    """

    def __init__(self, body: nn.Sequential, input_quant: TensorQuant,
                 stage_quants: Iterable[TensorQuant]) -> None:
        super().__init__()
        if not isinstance(body, nn.Sequential) or len(body) == 0:
            raise ValueError(f"body must be a non-empty nn.Sequential of int8 stages, got {body!r}")
        self.body = body
        self.input_quant = input_quant
        self.stage_quants = tuple(stage_quants)
        if len(self.stage_quants) != len(body):
            raise ValueError(f"stage_quants must have one TensorQuant per stage ({len(body)}), "
                             f"got {len(self.stage_quants)}")
        self.output_quant = self.stage_quants[-1]

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        """Float images to the int8 input (TFLite QUANTIZE with ``input_quant``)."""
        return self.input_quant.quantize(x)

    def forward_int(self, xq: torch.Tensor) -> torch.Tensor:
        """int8 input to int8 logits (``output_quant``). A model loaded from a ``.tflite``
        file (whose own input is NHWC) also takes NHWC batches, as LiteRT users hold them."""
        _check_int8_input(xq)
        return self.body(self.as_nchw(xq))

    def as_nchw(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` itself, or an NHWC batch permuted to NCHW when the model came from a
        ``.tflite`` file (``tflite_file``), one sample of its ``input_shape`` is (C, H, W)
        and ``x``'s samples are (H, W, C) but not (C, H, W)."""
        shape = tuple(getattr(self, "input_shape", ()) or ())
        if (getattr(self, "tflite_file", None) is not None and len(shape) == 3 and x.dim() == 4
                and tuple(x.shape[1:]) != shape
                and tuple(x.shape[1:]) == (shape[1], shape[2], shape[0])):
            return x.permute(0, 3, 1, 2)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Float (or already int8) input to dequantized float logits."""
        xq = x if x.dtype == torch.int8 else self.quantize_input(x)
        return self.output_quant.dequantize(self.forward_int(xq))

    def extra_repr(self) -> str:
        return f"input={self.input_quant}, output={self.output_quant}"


def stage_output_quant(stage: nn.Module, input_quant: TensorQuant) -> TensorQuant:
    """The output :class:`TensorQuant` of an int8 stage given its input's."""
    if isinstance(stage, (QConv2d, QLinear, QGlobalAvgPool2d)):
        return stage.output_quant
    if isinstance(stage, QInvertedResidual):
        return stage.add.output_quant if stage.add is not None else stage.body[-1].output_quant
    return input_quant
