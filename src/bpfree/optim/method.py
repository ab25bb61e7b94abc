"""A :class:`~bpfree.optim.ZOOptimizer` as a :class:`~bpfree.harness.Method`: the bridge
from the optimizer level to the trainer level.

Two levels, not two copies of one idea:

* **optimizer** -- :class:`~bpfree.optim.ZOOptimizer` is the ``torch.optim``-style piece:
  ``opt.step(Objective(model, x, y))`` in a loop you write, with its own ``lr`` and
  ``schedule``;
* **trainer** -- a Method (``step(x, y, lr) -> dict``, ``forwards``) is what
  :func:`bpfree.harness.fit` runs: batches, schedule, validation, history, the same for ZO,
  PMT, QZO-FF, TinyFoA and the BP baselines.

:class:`ZOMethod` wraps an optimizer, the model whose parameters it holds and a per-sample
loss into a Method, so ``fit`` trains any optimizer you compose.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..harness import check_batch, check_learning_rate
from ..objective import Objective, cross_entropy_per_sample
from .zo_optimizer import ZOOptimizer

__all__ = ["ZOMethod"]


class ZOMethod:
    """``optimizer`` on ``model`` with ``loss_fn``, as a Method :func:`bpfree.harness.fit` runs.

    ``step(x, y, lr)`` sets every parameter group's ``lr`` to ``lr`` (per-group factors belong
    in the group's ``scale``; an optimizer ``schedule``, if any, still multiplies it, so leave
    it unset when ``fit`` schedules), runs one ``optimizer.step`` on
    ``Objective(model, x, y, loss_fn)`` and returns ``{"loss", "batch_forwards", "applied"}``
    of that step (``loss`` at the parameters before the update; NaN where the estimator never
    evaluates them, e.g. central CGE).

    Counters: ``batch_forwards`` (whole-batch loss evaluations, TT-ZO's "queries"),
    ``forwards`` (per-sample passes: ``batch_forwards`` × batch size, PMT Table 5's unit) and
    ``steps``.

    Args:
        model: the ``nn.Module`` whose parameters ``optimizer`` holds; ``fit`` validates it.
        optimizer: a :class:`~bpfree.optim.ZOOptimizer`.
        loss_fn: per-sample loss ``(outputs, targets) -> [B]``; default cross-entropy.
    """

    def __init__(self, model: nn.Module, optimizer: ZOOptimizer,
                 loss_fn: Callable = cross_entropy_per_sample) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, ZOOptimizer):
            raise TypeError(f"optimizer must be a bpfree.optim.ZOOptimizer, got "
                            f"{type(optimizer).__name__}")
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable (outputs, targets) -> per-sample "
                            f"losses, got {type(loss_fn).__name__}")
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.forwards = self.batch_forwards = self.steps = 0

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        lr = check_learning_rate(lr)
        check_batch(x, y)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss = self.optimizer.step(Objective(self.model, x, y, self.loss_fn))
        stats = self.optimizer.last_stats
        self.batch_forwards += stats.batch_forwards
        self.forwards += stats.batch_forwards * int(x.shape[0])
        self.steps += 1
        return {"loss": float(loss), "batch_forwards": stats.batch_forwards,
                "applied": stats.applied}
