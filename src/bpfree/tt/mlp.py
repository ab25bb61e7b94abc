"""The TT-MLP of TT-ZO §5.1 and its dense counterpart.

MNIST 784-1024-10 with ReLU; the layer sizes are folded as 784 = 7*4*4*7, 1024 = 8*4*4*8,
10 = 1*5*2*1 and both layers have TT-ranks ``[1, r, r, r, 1]``. Parameter count convention
(reproduces the paper's Tables 1-2 exactly): TT-core entries of both layers plus the two
*dense* bias vectors (1024 + 10 = 1034),

    (112 r + 32 r^2) + (16 r + 28 r^2) + 1034 = 60 r^2 + 128 r + 1034,

i.e. 3,962 at r = 6 and 8,314 at r = 10 (the dense MLP has 814,090).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn

from .layers import TTLinear

__all__ = ["PAPER_FACTORS", "tt_mlp", "tt_mlp_r6", "tt_mlp_r10", "dense_mlp",
           "tt_mlp_num_parameters"]

PAPER_FACTORS = ((7, 4, 4, 7), (8, 4, 4, 8), (1, 5, 2, 1))

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "sigmoid": nn.Sigmoid}


def _activation(name):
    if name not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]()


def tt_mlp(rank=6, factors: Sequence[Sequence[int]] = PAPER_FACTORS,
           sizes: Sequence[int] | None = None, activation: str = "relu", bias: bool = True,
           init="kaiming", last_init="lecun", plan="auto") -> nn.Sequential:
    """TT-MLP: one :class:`TTLinear` per consecutive pair of folded layer sizes, with activations.

    ``factors[i]`` folds layer size ``i`` (input first); layer ``i`` maps
    ``factors[i] -> factors[i+1]``. ``rank`` is an int (ranks ``[1, r, ..., r, 1]`` in every
    layer) or a list with one rank spec (int or L+1 ranks) per layer. ``sizes`` (optional)
    are checked against the products of ``factors``. Hidden layers use ``init``, the output
    layer ``last_init``.
    """
    factors = [tuple(f) for f in factors]
    if len(factors) < 2:
        raise ValueError(f"need at least 2 folded layer sizes, got {factors}")
    if sizes is not None:
        sizes = tuple(sizes)
        prods = tuple(math.prod(f) for f in factors)
        if len(sizes) != len(factors) or sizes != prods:
            raise ValueError(f"layer sizes {sizes} do not match the factorizations {factors} "
                             f"(products {prods})")
    n_layers = len(factors) - 1
    if isinstance(rank, int) and not isinstance(rank, bool):
        ranks = [rank] * n_layers
    else:
        ranks = list(rank)
    if len(ranks) != n_layers:
        raise ValueError(f"got {len(ranks)} rank specs {ranks} for {n_layers} layers; pass an "
                         f"int or one spec per layer")
    layers: list[nn.Module] = []
    for i in range(n_layers):
        last = i == n_layers - 1
        layers.append(TTLinear(factors[i], factors[i + 1], ranks[i], bias=bias,
                               init=last_init if last else init, plan=plan))
        if not last:
            layers.append(_activation(activation))
    return nn.Sequential(*layers)


def dense_mlp(sizes: Sequence[int] = (784, 1024, 10), activation: str = "relu",
              bias: bool = True) -> nn.Sequential:
    """The dense MLP a TT-MLP replaces (``nn.Linear`` layers with activations in between)."""
    sizes = tuple(sizes)
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1], bias=bias))
        if i < len(sizes) - 2:
            layers.append(_activation(activation))
    return nn.Sequential(*layers)


def tt_mlp_num_parameters(model: nn.Module) -> int:
    """Trainable parameters of a (TT-)MLP: TT-core entries plus biases (the paper's count)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def tt_mlp_r6() -> nn.Sequential:
    """The paper's TT-MLP at r = 6 (3,962 parameters; registry ``tt-mlp-r6``)."""
    return tt_mlp(6)


def tt_mlp_r10() -> nn.Sequential:
    """The paper's TT-MLP at r = 10 (8,314 parameters; registry ``tt-mlp-r10``)."""
    return tt_mlp(10)
