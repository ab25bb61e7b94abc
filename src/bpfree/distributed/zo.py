"""Data-parallel float zeroth-order training with :class:`bpfree.optim.ZOOptimizer`.

A weight-perturbation step (RGE, SPSA, ZO-signRGE, sign-m-SPSA; lean or batched) is decided
by the losses at its P = Q (+1, or 2Q) query points: the directions come from the seed and
the step counter. :class:`DataParallelZO` runs the estimator twice per step:

1. on this worker's shard, recording the P losses (the only forward passes of the step);
2. one ``all_reduce`` of ``n_w * L_w`` (P float64 values plus the shard size): the losses
   of the whole batch, weighted by shard size;
3. :meth:`ZOOptimizer.step` on a replaying objective that returns those global losses in
   the order the estimator asks for them, so the estimator (including the nonlinear sign
   variants, whose sign must be taken of the *global* difference) and the update run on
   the whole batch's losses without another forward pass.

Exactness: every rank receives the same reduced bytes, so workers stay bit-identical to one
another. The reduction is order-fixed for a fixed W and payload (gloo's algorithm is
deterministic), and with W = 1 the step is bit-identical to a plain ``ZOOptimizer.step`` (a
float32 loss times n and divided by n is exact in float64). For W > 1 the whole-batch mean
is re-associated (``sum_w n_w L_w / N`` against the model's own mean over N), so one process
over the whole batch agrees only to float rounding.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from ..estimators import WeightPerturbation
from ..objective import Objective
from ..optim import ZOOptimizer
from .comm import SingleProcess


class _Recording(Objective):
    """The shard's objective, remembering every loss the estimator asks for, in order."""

    def __init__(self, objective: Objective) -> None:
        super().__init__(objective.model, objective.inputs, objective.targets, objective.loss_fn)
        self.losses: list[float] = []

    def __call__(self) -> Tensor:
        loss = super().__call__()
        self.losses.append(float(loss))
        return loss

    def batched(self, stacked: Mapping[str, Tensor]) -> Tensor:
        out = super().batched(stacked)
        self.losses.extend(float(v) for v in out)
        return out


class _Replaying(Objective):
    """Returns the all-reduced losses in the order they were recorded; no forward pass."""

    def __init__(self, objective: Objective, losses: list[float]) -> None:
        super().__init__(objective.model, objective.inputs, objective.targets, objective.loss_fn)
        self._losses = list(losses)
        self._next = 0

    def _take(self, k: int) -> list[float]:
        if self._next + k > len(self._losses):
            raise RuntimeError("the estimator asked for more losses on replay than it did on "
                               "the shard; its query plan must not depend on loss values")
        out = self._losses[self._next:self._next + k]
        self._next += k
        return out

    def __call__(self) -> Tensor:
        return torch.tensor(self._take(1)[0], dtype=torch.float64)

    def batched(self, stacked: Mapping[str, Tensor]) -> Tensor:
        k = next(iter(stacked.values())).shape[0]
        return torch.tensor(self._take(k), dtype=torch.float64)


class DataParallelZO:
    """Wraps a :class:`ZOOptimizer` whose estimator is a weight perturbation.

    Every worker builds the same model and the same optimizer (same seed); ``step`` takes
    this worker's shard as an :class:`~bpfree.objective.Objective`.
    """

    def __init__(self, optimizer: ZOOptimizer, comm=None) -> None:
        est = optimizer.estimator
        if not isinstance(est, WeightPerturbation) or est.per_sample:
            raise ValueError("data-parallel ZO communicates the losses of weight-perturbation "
                             "queries: use the rge, spsa, sign_rge or sign_spsa estimator "
                             f"(not per-sample), got {est!r}")
        self.optimizer = optimizer
        self.comm = comm or SingleProcess()
        self.last_bytes = 0

    def step(self, shard: Objective) -> float:
        """One step; returns the whole batch's loss at the current parameters."""
        if not isinstance(shard, Objective):
            raise TypeError(f"the shard must be a bpfree.Objective, got {type(shard).__name__}")
        opt = self.optimizer
        recording = _Recording(shard)
        with torch.no_grad():
            opt.estimator.estimate(opt.context(recording))
        n = shard.batch_size
        payload = torch.tensor([n * v for v in recording.losses] + [n], dtype=torch.float64)
        before = self.comm.bytes_reduced
        self.comm.all_reduce(payload, "query losses")
        self.last_bytes = self.comm.bytes_reduced - before
        total = float(payload[-1])
        losses = (payload[:-1] / total).tolist()
        return opt.step(_Replaying(shard, losses))
