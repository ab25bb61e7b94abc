"""Forward gradient by forward-mode AD (Baydin et al. 2022; QZO-FF Eq. 1), as a reference.

``g(θ) = (∇L(θ)·z) z`` with the directional derivative ``∇L·z`` computed exactly by one
Jacobian-vector product (``torch.func.jvp``): unbiased, no finite-difference error. It needs
autodiff support on the device, so bpfree uses it as the gold standard the finite-difference
estimators are compared with, not as a deployable method.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.func import functional_call, jvp

from .base import Estimate, QueryContext, check_positive_int
from .weight import _require_objective


@dataclass(frozen=True)
class ForwardGradient:
    num_queries: int = 1
    name: str = "forward_gradient"

    def __post_init__(self):
        check_positive_int("num_queries", self.num_queries)

    def estimate(self, ctx: QueryContext) -> Estimate:
        objective = _require_objective(ctx, "the forward gradient")
        primals = tuple(p.detach() for p in ctx.params)

        def loss(*ps):
            out = functional_call(objective.model, dict(zip(ctx.names, ps)), (objective.inputs,))
            return objective.loss_fn(out, objective.targets).mean()

        seeds = [[ctx.seed_for(q, i) for i in range(len(primals))] for q in range(self.num_queries)]
        weights = torch.zeros(self.num_queries, dtype=torch.float64)
        value, dropped = float("nan"), 0
        for q in range(self.num_queries):
            tangents = tuple(ctx.distribution.sample(seeds[q][i], p.shape, dtype=p.dtype, device=p.device)
                             for i, p in enumerate(primals))
            value_t, deriv = jvp(loss, primals, tangents)
            value = float(value_t)
            if torch.isfinite(deriv):
                weights[q] = float(deriv)
            else:
                dropped += 1
        nvalid = self.num_queries - dropped
        weights /= max(nvalid, 1)
        dim = sum(p.numel() for p in primals)
        return Estimate(loss=value, forward_passes=self.num_queries, queries=self.num_queries,
                        dropped=dropped, num_directions=[max(nvalid, 1)] * len(primals),
                        dims=[dim] * len(primals), weights=weights, seeds=seeds)


def forward_gradient(num_queries: int = 1) -> ForwardGradient:
    """Forward gradient via ``torch.func.jvp`` averaged over ``num_queries`` directions."""
    return ForwardGradient(num_queries)
