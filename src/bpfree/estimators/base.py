"""What every estimator returns, and the context it is given.

An estimate is kept in one of two forms:

* **directional** (lazy): ``ĝ = Σ_k w_k ξ_k`` with each direction ``ξ_k`` named by its seeds
  only. Nothing of size ``d`` is stored; the optimizer regenerates ``ξ_k`` to apply the update
  (MeZO's trick; PMT Algorithm 1 "perturbations regenerated from seeds").
* **dense**: one gradient tensor per parameter (coordinate-wise, node perturbation, or any
  estimate a tensor transform must see).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..perturb import Distribution


@dataclass
class QueryContext:
    """Everything an estimator may use for one step.

    Attributes:
        params: trainable tensors (perturbed in place in lean mode, never resized).
        names: their names in ``closure.model`` (for batched ``functional_call``).
        closure: an :class:`~bpfree.objective.Objective`, or any zero-argument callable
            returning the scalar loss (lean weight perturbation only).
        distribution: where directions come from.
        seed_for: ``seed_for(direction_index, tensor_index) -> int`` (stateless, so every
            direction can be regenerated at any time).
        mode: ``"lean"``, ``"cached"`` or ``"batched"`` (see :class:`~bpfree.optim.ZOOptimizer`).
        chunk_size: maximum number of parameter sets stacked in one batched forward.
        modules: ``{tensor_index: (module, attribute)}`` owning each parameter, for node
            perturbation.
    """

    params: list[Tensor]
    names: list[str]
    closure: Callable
    distribution: Distribution
    seed_for: Callable[[int, int], int]
    mode: str = "lean"
    chunk_size: int = 64
    modules: dict = field(default_factory=dict)
    step: int = 0


@dataclass
class Estimate:
    """A gradient estimate plus the bookkeeping a step reports.

    ``weights``/``seeds`` describe the lazy form, ``grads`` the dense form (exactly one of
    the two is set). ``num_directions[i]`` and ``dims[i]`` give, per tensor, the ``NQ`` and
    ``d`` of PMT Eq. 8 used by gradient-norm scaling. ``directions[k][i]``, when set (cached
    mode), is the tensor ``ξ_k`` of ``seeds[k][i]`` already drawn, so the update uses it
    instead of drawing it again.
    """

    loss: float
    forward_passes: int
    queries: int
    dropped: int
    num_directions: list[int]
    dims: list[int]
    weights: Tensor | None = None
    seeds: list[list[int]] | None = None
    grads: list[Tensor] | None = None
    directions: list[list[Tensor]] | None = None

    @property
    def is_lazy(self) -> bool:
        return self.grads is None


def check_positive_int(name: str, value, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_mu(mu) -> float:
    if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not math.isfinite(mu) or mu <= 0:
        raise ValueError(f"mu (the perturbation radius) must be a finite number > 0, got {mu!r}")
    return float(mu)


def materialize(params: list[Tensor], distribution: Distribution, weights: Tensor,
                seeds: list[list[int]], directions: list[list[Tensor]] | None = None
                ) -> list[Tensor]:
    """Dense gradients ``Σ_k w_k ξ_k`` from a lazy estimate: each ξ_k regenerated from its
    seeds, or taken from ``directions[k]`` when the step already drew it (the same tensors,
    so the same sums bit for bit)."""
    grads = [torch.zeros_like(p) for p in params]
    for k, w in enumerate(weights.tolist()):
        if w == 0.0:
            continue
        for i, p in enumerate(params):
            xi = (directions[k][i] if directions is not None
                  else distribution.sample(seeds[k][i], p.shape, dtype=p.dtype, device=p.device))
            grads[i].add_(xi * w)
    return grads


def draw_directions(params: list[Tensor], distribution: Distribution,
                    seeds: list[list[int]]) -> list[list[Tensor]]:
    """``ξ_k`` for every row of seeds and every tensor, each drawn once (cached mode)."""
    return [[distribution.sample(row[i], p.shape, dtype=p.dtype, device=p.device)
             for i, p in enumerate(params)] for row in seeds]


def loss_value(loss) -> float:
    """A closure's return value as a Python float (tensor, numpy scalar or number)."""
    if isinstance(loss, Tensor):
        if loss.numel() != 1:
            raise ValueError(
                f"the closure must return a scalar loss, got a tensor of shape {tuple(loss.shape)}")
        return float(loss.detach())
    try:
        return float(loss)
    except (TypeError, ValueError):
        raise TypeError(f"the closure must return a scalar loss, got {type(loss).__name__}") from None
