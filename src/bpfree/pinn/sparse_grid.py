"""Smolyak sparse Gaussian quadrature (TT-ZO §4.2, Eq. 10–12).

The level-``k`` rule for ``δ ~ N(0, σ² I_D)`` is built by the combination technique (Eq. 11)
from univariate Gauss–Hermite rules, level ``l`` using ``l`` nodes (exact up to degree
``2l − 1``). Nodes shared by several tensor grids are merged and their weights summed, so each
distinct node is evaluated once (Eq. 12). At level 3 the grid has ``2D² + 2D + 1`` nodes
(``D = 21``: the paper's 925) and integrates every Gaussian moment of total degree
``≤ 2·level − 1`` exactly.
"""

from __future__ import annotations

import itertools
import math
import numbers
from functools import lru_cache

import numpy as np
import torch
from numpy.polynomial.hermite_e import hermegauss

__all__ = ["MAX_TENSOR_POINTS", "sparse_grid", "sparse_grid_size", "gauss_hermite"]

#: Most tensor-grid points the combination technique may visit (:func:`_tensor_points`); a
#: few seconds of construction. D = 21 at level 3 (the paper's rule) visits 946, D = 50 at
#: level 8 about 2.6e10, which would run for hours and not fit in memory.
MAX_TENSOR_POINTS = 2_000_000


def _check(dim, level, sigma) -> tuple[int, int, float]:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ValueError(f"dim must be an integer >= 1, got {dim!r}")
    if isinstance(level, bool) or not isinstance(level, (int, np.integer)) or level < 1:
        raise ValueError(f"level must be an integer >= 1, got {level!r}")
    if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real) \
            or not math.isfinite(sigma) or sigma <= 0:
        raise ValueError(f"sigma must be a finite number > 0, got {sigma!r}")
    dim, level = int(dim), int(level)
    points = _tensor_points(dim, level)
    if points > MAX_TENSOR_POINTS:
        raise ValueError(f"sparse_grid(dim={dim}, level={level}) is too large: building it "
                         f"visits {points:.3g} tensor-grid points, the limit is "
                         f"{MAX_TENSOR_POINTS:,}; lower level (level 3 has "
                         f"{2 * dim * dim + 2 * dim + 1:,} nodes at this dim) or dim")
    return dim, level, float(sigma)


def _tensor_points(dim: int, level: int) -> int:
    """Points of all tensor grids the combination technique (Eq. 11) visits: excess vectors
    summing to q each give prod(e_m + 1) points, and summed over them that is the t^q
    coefficient of (1 - t)^(-2 dim), C(2 dim + q - 1, q), for q = max(0, level - dim)..level-1."""
    return sum(math.comb(2 * dim + q - 1, q) for q in range(max(0, level - dim), level))


@lru_cache(maxsize=None)
def gauss_hermite(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n``-point Gauss–Hermite rule for the standard normal (weights sum to 1)."""
    x, w = hermegauss(n)
    x = np.where(np.abs(x) < 1e-13, 0.0, x)  # the middle node of an odd rule is exactly 0
    return x, w / w.sum()


def _excess_vectors(dim: int, q: int):
    """All ``l - 1`` with ``Σ (l_m − 1) = q`` as sparse dicts {dim: excess}."""
    for combo in itertools.combinations_with_replacement(range(dim), q):
        out: dict[int, int] = {}
        for m in combo:
            out[m] = out.get(m, 0) + 1
        yield out


@lru_cache(maxsize=32)
def _build(dim: int, level: int, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    acc: dict[tuple, float] = {}
    for q in range(max(0, level - dim), level):
        coef = (-1) ** (level - 1 - q) * math.comb(dim - 1, level - 1 - q)
        if coef == 0:
            continue
        for excess in _excess_vectors(dim, q):
            dims = sorted(excess)
            rules = [gauss_hermite(excess[m] + 1) for m in dims]
            for idx in itertools.product(*[range(len(r[0])) for r in rules]):
                w = float(coef)
                key = []
                for (x, wt), i, m in zip(rules, idx, dims):
                    w *= wt[i]
                    if x[i] != 0.0:
                        key.append((m, round(float(x[i]), 12)))
                key = tuple(key)
                acc[key] = acc.get(key, 0.0) + w
    keys = [k for k, w in acc.items() if abs(w) > 1e-15]
    keys.sort(key=lambda k: (len(k), k))
    nodes = np.zeros((len(keys), dim))
    weights = np.empty(len(keys))
    for j, k in enumerate(keys):
        for m, v in k:
            nodes[j, m] = v
        weights[j] = acc[k]
    nodes *= sigma
    nodes.setflags(write=False)
    weights.setflags(write=False)
    return nodes, weights


def sparse_grid(dim: int, level: int, sigma: float = 1.0, *, dtype=torch.float64,
                device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes ``(n, dim)`` and weights ``(n,)`` of the level-``level`` sparse rule for N(0, σ²I).

    ``Σ_j w_j g(δ_j) ≈ E g(δ)``; exact for polynomials of total degree ``≤ 2·level − 1``.
    The rule is cached per ``(dim, level, sigma)``; the returned tensors are fresh copies.
    The first node is the origin whenever the rule contains it.
    """
    dim, level, sigma = _check(dim, level, sigma)
    nodes, weights = _build(dim, level, sigma)
    return (torch.tensor(nodes, dtype=dtype, device=device),
            torch.tensor(weights, dtype=dtype, device=device))


def sparse_grid_size(dim: int, level: int) -> int:
    """Number of distinct nodes of the level-``level`` rule in ``dim`` dimensions."""
    dim, level, _ = _check(dim, level, 1.0)
    return int(_build(dim, level, 1.0)[0].shape[0])
