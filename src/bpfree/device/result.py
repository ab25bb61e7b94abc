"""What a device run returns: per-step losses and the model with the C-trained weights."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch

#: The fixed-point loss unit of bpfree.pmt.exact (2**-24 nats).
LOSS_SCALE = 2.0 ** -24


@dataclass
class DeviceResult:
    """Per-step mean losses (float, from the integer sums) and the C-trained model copy;
    ``instructions``: executed instructions per step (emulated runs with counting only)."""

    losses: list[float]
    model: torch.nn.Module
    loss_sums: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    instructions: list[int] | None = None


def load_weights(program: DeviceProgram, weights: list[tuple[np.ndarray, np.ndarray]]
                 ) -> torch.nn.Module:
    """A copy of the program's model with the given (int8 weight, int32 bias) per layer."""
    model = copy.deepcopy(program.model)
    modules = dict(model.named_modules())
    for row, (w, b) in zip(program.meta["trainable"], weights):
        m = modules[row["name"]]
        m.weight.copy_(torch.from_numpy(w.reshape(tuple(m.weight.shape))))
        m.bias.copy_(torch.from_numpy(b))
    return model
