"""Float building blocks shared by the model zoo (:mod:`bpfree.models`) and the quantizer.

:func:`bpfree.quant.quantize_model` recognises these blocks and converts each to its integer
form, so they live below both packages: ``models`` and ``quant`` import them, never each other
the other way round.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["InvertedResidual", "conv_bn"]


def conv_bn(cin: int, cout: int, kernel: int = 1, stride: int = 1, groups: int = 1,
            activation: bool = True) -> nn.Sequential:
    """Conv2d (no bias) + BatchNorm2d (+ ReLU6): the unit PTQ folds into one int8 conv."""
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups,
                                         bias=False), nn.BatchNorm2d(cout)]
    if activation:
        layers.append(nn.ReLU6())
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """MobileNetV2 inverted-residual block: 1x1 expand, 3x3 depthwise, 1x1 linear project.

    ``conv`` is the Sequential of the three conv-BN units; the block adds its input to the
    output when ``use_residual`` (stride 1 and equal channels), as in MobileNetV2 / MCUNet.
    """

    def __init__(self, cin: int, cout: int, stride: int = 1, expand: int = 2) -> None:
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"stride must be 1 or 2, got {stride!r}")
        hidden = cin * expand
        self.use_residual = stride == 1 and cin == cout
        self.conv = nn.Sequential(conv_bn(cin, hidden, 1),
                                  conv_bn(hidden, hidden, 3, stride, groups=hidden),
                                  conv_bn(hidden, cout, 1, activation=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        return x + out if self.use_residual else out
