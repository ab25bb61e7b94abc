"""Reference models used by the demo, the benchmarks and ``bpfree memory``.

Each entry is a builder plus the input shape of one sample, so memory and compute can be
accounted without data. Later issues add the papers' own models here (e.g. MCUNet-in1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..blocks import InvertedResidual, conv_bn
from .mcunet import mcunet_in1, mcunet_in1_float
from .pruning import MaskedModel, grasp_prune, grasp_scores
from .vit import mnist_vit
from bpfree.tt.mlp import tt_mlp_r6, tt_mlp_r10


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


def mnist_mobilenet(num_classes: int = 10) -> nn.Sequential:
    """Small MobileNetV2-style CNN for 1x28x28 (depthwise-separable, BN; PMT benchmark model).

    A stem conv, four inverted-residual blocks (two with a residual add), a 1x1 head conv,
    global average pooling and a linear classifier: the same kinds of layers as MCUNet-in1,
    at MNIST scale. Every stage maps one tensor to one tensor, so PTQ keeps the Sequential.
    """
    return nn.Sequential(
        conv_bn(1, 8, 3, stride=2),            # 14x14
        InvertedResidual(8, 8, 1),
        InvertedResidual(8, 16, 2),            # 7x7
        InvertedResidual(16, 16, 1),
        InvertedResidual(16, 24, 2),           # 4x4
        conv_bn(24, 64, 1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, num_classes),
    )


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
    ModelSpec("mnist-mobilenet", mnist_mobilenet, (1, 28, 28),
              "MobileNetV2-style CNN on 1x28x28 (PMT benchmark; PTQ to int8)"),
    ModelSpec("mnist-vit", mnist_vit, (1, 28, 28),
              "TinyViT on 1x28x28: 7x7 patches, dim 64, depth 4 (QZO-FF few-shot / D-VPT)"),
    ModelSpec("tt-mlp-r6", tt_mlp_r6, (784,),
              "TT-MLP 784-1024-10, ranks [1,6,6,6,1] (TT-ZO §5.1, 3,962 parameters)"),
    ModelSpec("tt-mlp-r10", tt_mlp_r10, (784,),
              "TT-MLP 784-1024-10, ranks [1,10,10,10,1] (TT-ZO Table 2, 8,314 parameters)"),
    ModelSpec("mcunet-in1", lambda: mcunet_in1_float(), (3, 128, 128),
              "PMT's INT8 MCUNet-in1, 128x128: float mirror of the bundled mcunet-in1-int8"),
)}


def list_models() -> list[str]:
    return sorted(MODELS)


def get_model(name: str) -> ModelSpec:
    """The registered model ``name``; unknown names raise ValueError listing the known ones."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(list_models())}")
    return MODELS[name]
