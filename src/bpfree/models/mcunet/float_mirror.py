"""The float mirror of MCUNet-in1's int8 graph, for the memory / compute accounting."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .graph import ModelFormatError, block_of, load_graph

__all__ = ["mcunet_in1_float"]


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
        block = block_of(layer["name"])
        if layer["op"] == "mean_hw":
            stages += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
            pooled, i = True, i + 1
        elif block is None:
            stages.append(conv_of(layer, linear=pooled))
            i += 1
        else:
            convs, residual = [], False
            while i < len(layers) and block_of(layers[i]["name"]) == block:
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
