"""Integer element-wise layers: :class:`QAdd` (TFLite ``ADD``, the residual add),
:class:`QReLU` (a clamp) and :class:`QFlatten`, int8 in and out."""

from __future__ import annotations

import torch
from torch import nn

from ..fixed_point import requantized_add
from ..params import ActivationRange, AddRequantization, TensorQuant

from .arith import _BACKENDS, _check_choice, _check_int8_input, _check_quant

__all__ = ["QAdd", "QFlatten", "QReLU"]


class QAdd(nn.Module):
    """Residual add of two int8 tensors with different scales (TFLite int8 ``ADD``).

    See :class:`~bpfree.quant.params.AddRequantization` for the integer parameters; ``forward``
    runs :func:`~bpfree.quant.fixed_point.requantized_add`. Both inputs must have the same
    shape (no broadcasting).
    """

    def __init__(self, input1_quant: TensorQuant, input2_quant: TensorQuant,
                 output_quant: TensorQuant, activation: str | None = None,
                 backend: str = "auto") -> None:
        super().__init__()
        self.input1_quant = _check_quant(input1_quant, "input1_quant")
        self.input2_quant = _check_quant(input2_quant, "input2_quant")
        self.output_quant = _check_quant(output_quant, "output_quant")
        self.params = AddRequantization.from_quant(self.input1_quant, self.input2_quant,
                                                   self.output_quant)
        self.activation = activation
        self.range = ActivationRange.from_activation(activation, self.output_quant)
        self.backend = _check_choice(backend, "backend", _BACKENDS)

    @staticmethod
    def check_inputs(a: torch.Tensor, b: torch.Tensor) -> None:
        """Both inputs int8 and of one shape (shared with the float-rule add of MCUNet)."""
        _check_int8_input(a, "input1")
        _check_int8_input(b, "input2")
        if a.shape != b.shape:
            raise ValueError(f"input1 and input2 must have the same shape, got "
                             f"{tuple(a.shape)} and {tuple(b.shape)}")

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        self.check_inputs(a, b)
        if a.device != b.device:
            raise ValueError(f"input1 and input2 must be on one device, got {a.device} and "
                             f"{b.device}")
        p = self.params
        return requantized_add(a, b, p.input1_offset, p.input2_offset, p.left_shift,
                               p.input1_multiplier, p.input1_shift, p.input2_multiplier,
                               p.input2_shift, p.output_multiplier, p.output_shift,
                               p.output_offset, self.range.qmin, self.range.qmax,
                               backend=self.backend)

    def extra_repr(self) -> str:
        return (f"input1={self.input1_quant}, input2={self.input2_quant}, "
                f"output={self.output_quant}, activation={self.activation}")



class QReLU(nn.Module):
    """Standalone ReLU / ReLU6 on an int8 tensor whose quantization it keeps: a clamp to
    ``[max(-128, z), 127]`` or ``[max(-128, z), min(127, z + round(6 / s))]``."""

    def __init__(self, quant: TensorQuant, six: bool = False) -> None:
        super().__init__()
        self.quant = _check_quant(quant, "quant")
        self.six = bool(six)
        self.range = ActivationRange.from_activation("relu6" if six else "relu", self.quant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_int8_input(x)
        return x.clamp(self.range.qmin, self.range.qmax)

    def extra_repr(self) -> str:
        return f"quant={self.quant}, six={self.six}, range=[{self.range.qmin}, {self.range.qmax}]"


class QFlatten(nn.Flatten):
    """``nn.Flatten`` for int8 tensors (NCHW order; TFLite's NHWC flatten orders differently)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_int8_input(x)
        return super().forward(x)
