"""How well a random-direction estimate points along the true gradient (a diagnostic).

TT-ZO Eq. 4 (RGE): ``ĝ = (1/N) Σ_i [L(θ + μξ_i) − L(θ)] / μ · ξ_i`` with Gaussian ξ_i. For a
smooth loss and small μ its expected cosine with ∇L is about sqrt(N / d); when μξ is so large
that the loss difference is dominated by curvature, the cosine falls to ~0 and a signRGE step
is a random walk. :func:`rge_alignment` measures both cosines (of ĝ and of sign ĝ, what a
signRGE step moves along) and how far one perturbation moves the loss.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from .base import check_mu, check_positive_int

__all__ = ["rge_alignment"]


def rge_alignment(params: Sequence[Tensor], loss: Callable[[], Tensor], mu: float,
                  queries: int = 10, draws: int = 10, seed: int = 0) -> dict:
    """Mean cosines of RGE estimates (Eq. 4, ``queries`` Gaussian directions, forward
    differences at radius ``mu``) with the autograd gradient of ``loss()`` at ``params``.

    Returns ``cosine`` (of ĝ), ``sign_cosine`` (of sign ĝ), ``median_relative_change``
    (median over queries of |L(θ + μξ) − L(θ)| / |L(θ)|), ``perturbation_to_weights``
    (‖μξ‖ / ‖θ‖ at the expected ‖ξ‖ = sqrt(d)) and ``ideal_cosine`` sqrt(N / d) (capped at
    1). ``params`` are left as they were.
    """
    mu = check_mu(mu)
    check_positive_int("queries", queries)
    check_positive_int("draws", draws)
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("rge_alignment needs at least one parameter with requires_grad")
    for p in params:
        p.grad = None
    loss().backward()
    true = torch.cat([p.grad.reshape(-1) for p in params]).detach()
    for p in params:
        p.grad = None
    theta = parameters_to_vector(params).detach().clone()
    gen = torch.Generator().manual_seed(seed)
    cos, sign_cos, rel = [], [], []
    try:
        with torch.no_grad():
            base = float(loss())
            for _ in range(draws):
                est = torch.zeros_like(theta)
                for _ in range(queries):
                    u = torch.randn(theta.shape, generator=gen, dtype=theta.dtype)
                    vector_to_parameters(theta + mu * u, params)
                    diff = float(loss()) - base
                    rel.append(abs(diff) / max(abs(base), 1e-300))
                    est += diff / mu / queries * u
                cos.append(float(torch.nn.functional.cosine_similarity(est, true, dim=0)))
                sign_cos.append(float(torch.nn.functional.cosine_similarity(
                    torch.sign(est), true, dim=0)))
    finally:
        vector_to_parameters(theta, params)
    d = theta.numel()
    return {"cosine": statistics.fmean(cos), "sign_cosine": statistics.fmean(sign_cos),
            "median_relative_change": statistics.median(rel),
            "perturbation_to_weights": mu * math.sqrt(d) / max(float(theta.norm()), 1e-300),
            "ideal_cosine": min(1.0, math.sqrt(queries / d))}
