"""TT-ZO's trainers by name: the ZO methods of §5.1 and the baselines of Table 3.

``"fo"`` (SGD with BP), ``"rge"``, ``"sign_rge"``, ``"cge"`` (momentum 0.9 unless given),
``"hybrid"`` (:class:`~bpfree.ttzo.HybridZO`), ``"fg-w"``, ``"fg-a"``, ``"fa"``, ``"dfa"``.

CGE (alone or as the hybrid's second phase) runs in batched mode unless told otherwise: its
``d + 1`` losses per step then come from one forward plus the layers after each coordinate
(:class:`~bpfree.ttzo.LayerwiseCGE`), equal to the lean ones up to float rounding, instead
of ``d + 1`` full forwards per step. RGE and signRGE (alone or as the hybrid's first phase)
run in cached mode unless told otherwise: each step draws its ``N`` directions once instead
of three times, with weights bit-identical to lean mode's (:class:`~bpfree.optim.ZOOptimizer`).
"""

from __future__ import annotations

import torch

from ..baselines import (BPTrainer, DirectFeedbackAlignment, FeedbackAlignment,
                         ForwardGradientA, ForwardGradientW)
from .hybrid import HybridZO, ZOTrainer

__all__ = ["METHODS", "make_method"]

METHODS = ("fo", "rge", "sign_rge", "cge", "hybrid", "fg-w", "fg-a", "fa", "dfa")


def make_method(name: str, model: torch.nn.Module, *, seed: int = 0, **kwargs):
    """A :class:`bpfree.harness.Method` trainer of :data:`METHODS` for ``model``; ``kwargs``
    go to its constructor (e.g. ``cge_coordinates``, ``patience``, ``max_coarse_epochs``)."""
    if name == "fo":
        return BPTrainer(model, "sgd", **kwargs)
    if name in ("rge", "sign_rge"):
        kwargs.setdefault("mode", "cached")
        return ZOTrainer(model, name, seed=seed, **kwargs)
    if name == "cge":
        kwargs.setdefault("momentum", 0.9)
        kwargs.setdefault("mode", "batched")
        return ZOTrainer(model, "cge", seed=seed, **kwargs)
    if name == "hybrid":
        kwargs.setdefault("mode", "cached")
        kwargs.setdefault("cge_mode", "batched")
        return HybridZO(model, seed=seed, **kwargs)
    if name == "fg-w":
        return ForwardGradientW(model, seed=seed, **kwargs)
    if name == "fg-a":
        return ForwardGradientA(model, seed=seed, **kwargs)
    if name == "fa":
        return FeedbackAlignment(model, seed=seed, **kwargs)
    if name == "dfa":
        return DirectFeedbackAlignment(model, seed=seed, **kwargs)
    raise ValueError(f"unknown method {name!r}; choose one of {METHODS}")
