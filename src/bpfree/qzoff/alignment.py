"""How well the sign-m-SPSA estimate (QZO-FF Eq. 3) points along the true gradient.

The estimate's *direction*, not its length, limits what one step can do; its mean cosine with
the back-propagated gradient, measured (:func:`estimate_alignment`) and predicted for Gaussian
directions (:func:`expected_alignment`), says how much averaging ``m`` directions buys.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch import nn

from .trainer import QZOFF, QZOFFConfig

__all__ = ["estimate_alignment", "expected_alignment"]


def estimate_alignment(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, m: int = 3,
                       eps: float = 1e-3, draws: int = 8, seed: int = 0) -> float:
    """Mean cosine between the fp32 sign-m-SPSA estimate (QZO-FF Eq. 3) at ``model``'s
    weights and the true gradient of the mean cross-entropy on ``(x, y)``, over ``draws``
    independent direction sets (seeds ``seed * 1009 + k``). For Gaussian directions in ``d``
    dimensions it is about ``sqrt(2m / (π d))`` (:func:`expected_alignment`). ``model`` is
    not modified."""
    model = copy.deepcopy(model)
    for p in model.parameters():
        p.requires_grad_(True)
    params = [p for p in model.parameters() if p.requires_grad]
    loss = nn.functional.cross_entropy(model(x), y)
    g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(loss, params)])
    cos = []
    for k in range(draws):
        config = QZOFFConfig(mode="fp32", m=m, eps=eps, seed=seed * 1009 + k)
        est = QZOFF(model, config).estimate(x, y)
        v = torch.cat([t.reshape(-1) for t in est.grads])
        cos.append(float(v @ g) / max(float(v.norm() * g.norm()), 1e-30))
    return float(np.mean(cos))


def expected_alignment(m: int, d: int) -> float:
    """``E cos(ĝ, ∇L) ≈ sqrt(2m / (π d))`` for sign-m-SPSA with ``N(0, I_d)`` directions
    (``E|zᵀg| = sqrt(2/π)·|g|``, ``|ĝ| ≈ sqrt(d/m)``), large ``d``."""
    return math.sqrt(2 * m / (math.pi * d))
