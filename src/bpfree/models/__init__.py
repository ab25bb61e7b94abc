"""Reference models used by the demo, the benchmarks and ``bpfree memory``.

Each entry is a builder plus the input shape of one sample, so memory and compute can be
accounted without data. Later issues add the papers' own models here (e.g. MCUNet-in1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn


def digits_mlp() -> nn.Sequential:
    """64–64–10 MLP for scikit-learn's 8×8 digits (the demo's model)."""
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def mnist_mlp() -> nn.Sequential:
    """784–1024–10 MLP: the MNIST MLP of TT-ZO §5.1 and the foundation benchmark (814,090 parameters)."""
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 10))


def mnist_cnn() -> nn.Sequential:
    """Small 2-conv CNN for 1×28×28 inputs (20,490 parameters), the benchmark's CNN."""
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 7 * 7, 10))


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    description: str


MODELS = {spec.name: spec for spec in (
    ModelSpec("digits-mlp", digits_mlp, (64,), "64-64-10 MLP on 8x8 digits (the demo)"),
    ModelSpec("mnist-mlp", mnist_mlp, (784,), "784-1024-10 MLP (TT-ZO §5.1, throughput benchmark)"),
    ModelSpec("mnist-cnn", mnist_cnn, (1, 28, 28), "2-conv CNN on 1x28x28 (throughput benchmark)"),
)}


def list_models() -> list[str]:
    return sorted(MODELS)


def get_model(name: str) -> ModelSpec:
    """The registered model ``name``; unknown names raise ValueError listing the known ones."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(list_models())}")
    return MODELS[name]
