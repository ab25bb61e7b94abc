"""The models of TT-ZO's MNIST study (§5.1, Tables 1-3), built by name.

``"mlp"`` (784-1024-10, 814,090 parameters), ``"small-mlp"`` (784-10-10, 7,960), ``"tt"``
(TT-MLP with ranks ``[1, r, r, r, 1]``), ``"sp"`` (the dense MLP pruned at initialization
with GraSP to a given number of trainable parameters, biases included).
"""

from __future__ import annotations

import torch

from ..tt import dense_mlp, tt_mlp
from ..models.pruning import grasp_prune

__all__ = ["DENSE_PARAMS", "MODELS", "compression_ratio", "make_model"]

MODELS = ("mlp", "small-mlp", "tt", "sp")
#: Parameters of the dense 784-1024-10 MLP, the denominator of the paper's "Ratio" column.
DENSE_PARAMS = 814_090


def compression_ratio(params: int) -> float:
    """Parameters relative to the dense 784-1024-10 MLP (the paper's "Ratio" column)."""
    return params / DENSE_PARAMS


def make_model(kind: str, *, rank: int = 6, seed: int = 0, sp_params: int | None = None,
               prune_data=None) -> torch.nn.Module:
    """One of :data:`MODELS`, initialised from ``seed`` (``"sp"`` needs ``sp_params`` and
    ``prune_data``, a list of ``(x, y)`` batches for GraSP's scores)."""
    torch.manual_seed(seed)
    if kind == "mlp":
        return dense_mlp((784, 1024, 10))
    if kind == "small-mlp":
        return dense_mlp((784, 10, 10))
    if kind == "tt":
        return tt_mlp(rank)
    if kind == "sp":
        if sp_params is None or prune_data is None:
            raise ValueError("model 'sp' needs sp_params and prune_data (an (x, y) batch)")
        dense = dense_mlp((784, 1024, 10))
        _, masked = grasp_prune(dense, prune_data, sp_params, count_unprunable=True)
        return masked
    raise ValueError(f"unknown model {kind!r}; choose one of {MODELS}")
