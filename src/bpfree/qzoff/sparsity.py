"""Sparse-update masks of QZO-FF §3.4: top-k magnitude, random and threshold pruning.

A mask is a bool tensor of the weight's shape, ``True`` where the weight is trained. The
trainer multiplies every perturbation and every update by it, so masked weights never move
(Table 5's "FF, Sparse" prunes 90% of the trainable parameters).
"""

from __future__ import annotations

import math
import numbers

import torch

__all__ = ["check_mask", "make_mask", "random_mask", "threshold_mask", "topk_magnitude_mask"]


def _check_sparsity(sparsity) -> float:
    if (isinstance(sparsity, bool) or not isinstance(sparsity, numbers.Real)
            or not 0.0 <= float(sparsity) < 1.0):
        raise ValueError(f"sparsity must be a number in [0, 1), got {sparsity!r}")
    return float(sparsity)


def _keep_count(numel: int, sparsity: float) -> int:
    """Weights kept: ``numel − floor(sparsity·numel)``, at least one of a non-empty tensor."""
    return max(numel - math.floor(sparsity * numel), 1 if numel else 0)


def topk_magnitude_mask(w: torch.Tensor, sparsity: float = 0.9) -> torch.Tensor:
    """Keep the ``(1 − sparsity)`` fraction of entries with the largest ``|w|`` (ties broken by
    ``torch.topk``)."""
    sparsity = _check_sparsity(sparsity)
    flat = w.detach().reshape(-1).abs()
    keep = _keep_count(flat.numel(), sparsity)
    mask = torch.zeros(flat.numel(), dtype=torch.bool, device=w.device)
    if keep:
        mask[torch.topk(flat.float(), keep).indices] = True
    return mask.reshape(w.shape)


def random_mask(shape, sparsity: float = 0.9, seed: int = 0, *, device="cpu") -> torch.Tensor:
    """Keep a uniformly random ``(1 − sparsity)`` fraction of entries (a seeded permutation)."""
    sparsity = _check_sparsity(sparsity)
    shape = torch.Size(shape)
    numel = shape.numel()
    g = torch.Generator().manual_seed(int(seed))
    mask = torch.zeros(numel, dtype=torch.bool)
    mask[torch.randperm(numel, generator=g)[:_keep_count(numel, sparsity)]] = True
    return mask.reshape(shape).to(device)


def threshold_mask(w: torch.Tensor, threshold: float) -> torch.Tensor:
    """Keep the entries with ``|w| > threshold``."""
    if not (isinstance(threshold, numbers.Real) and math.isfinite(threshold) and threshold >= 0):
        raise ValueError(f"threshold must be a finite number >= 0, got {threshold!r}")
    return w.detach().abs() > float(threshold)


def make_mask(method: str, w: torch.Tensor, *, sparsity: float = 0.9,
              threshold: float | None = None, seed: int = 0) -> torch.Tensor:
    """Dispatch by name: ``"topk"``, ``"random"`` or ``"threshold"``."""
    if method == "topk":
        return topk_magnitude_mask(w, sparsity)
    if method == "random":
        return random_mask(w.shape, sparsity, seed, device=w.device)
    if method == "threshold":
        if threshold is None:
            raise ValueError("threshold pruning needs threshold=")
        return threshold_mask(w, threshold)
    raise ValueError(f"unknown mask method {method!r}; use 'topk', 'random' or 'threshold'")


def check_mask(mask, shape, name: str) -> torch.Tensor:
    """Validate a user mask: a tensor of exactly ``shape``; returned as bool."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask for {name!r} must be a tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"mask for {name!r} has shape {tuple(mask.shape)}, but the parameter "
                         f"has shape {tuple(shape)}")
    if mask.dtype != torch.bool:
        if mask.dtype.is_floating_point or mask.dtype.is_complex:
            vals = torch.unique(mask)
            if not bool(((vals == 0) | (vals == 1)).all()):
                raise ValueError(f"mask for {name!r} must hold only 0/1 values")
        mask = mask != 0
    return mask
