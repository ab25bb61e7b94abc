"""Derivative backends for ``u: R^D -> R^n`` at a batch of points (TT-ZO §4, §5.2).

Every backend is a callable ``backend(fn, x) -> (grad, laplacian)``:

* ``fn`` maps a batch ``(B, D)`` to ``(B, n)`` (or ``(B,)``, read as ``n = 1``), one output
  row per input row (rows independent);
* ``grad`` has shape ``(B, n, D)`` (∇ₓu) and ``laplacian`` ``(B, n)`` (Σ_{i∈dims} ∂²u/∂x_i²,
  ``dims`` = the call's or else the backend's ``laplacian_dims``, all coordinates by
  default; e.g. the spatial coordinates of ``(x, t)``).

``backend.evaluations(D)`` is the number of point evaluations of ``fn`` per input point, and
``backend.forward_evaluations`` accumulates the point evaluations it has made.

=================  ======================================================  ==============
backend            what it computes                                         evals / point
=================  ======================================================  ==============
AutoDiff           exact derivatives (``torch.func`` jacrev / hessian)      1 (+ BP)
FiniteDifference   central differences, step h                              2D + 1
SteinMC            Stein estimator of the σ-smoothed u, Eq. 9, M ± pairs    2M + 1
SparseGridStein    Stein estimator, sparse Gaussian quadrature, Eq. 13      n_L (level 3:
                                                                            2D² + 2D + 1)
=================  ======================================================  ==============

The Stein backends differentiate the Gaussian-smoothed ``u_σ(x) = E f(x + δ)``, δ ~ N(0, σ²I)
(Eq. 8), not ``f`` itself; as σ → 0 they approach the derivatives of ``f``.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.func import jacfwd, jacrev, vmap

from .sparse_grid import sparse_grid

__all__ = ["AutoDiff", "FiniteDifference", "SteinMC", "SparseGridStein", "ShiftedFn",
           "get_backend", "BACKENDS"]

Fn = Callable[[Tensor], Tensor]


def _check_x(x: Tensor) -> Tensor:
    if not isinstance(x, Tensor) or x.ndim != 2:
        raise ValueError(f"x must be a (B, D) tensor, got {getattr(x, 'shape', type(x))}")
    if not x.is_floating_point():
        raise TypeError(f"x must be floating point, got {x.dtype}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("x contains non-finite (NaN/Inf) points")
    return x


def _as_2d(y: Tensor, rows: int) -> Tensor:
    if y.ndim == 1:
        y = y[:, None]
    if y.ndim != 2 or y.shape[0] != rows:
        raise ValueError(f"fn must map (B, D) to (B, n) or (B,); got output {tuple(y.shape)} "
                         f"for {rows} input rows")
    return y


class ShiftedFn:
    """``fn`` with a fast path ``shifted(x, shifts) -> (B, K, n)`` for ``fn`` at every
    ``x_b + s_k`` (e.g. :meth:`bpfree.pinn.SineMLP.forward_shifted`, which shares the rows'
    common work). The FD and Stein backends evaluate through it when ``fn`` carries one."""

    def __init__(self, fn: Fn, shifted: Callable[[Tensor, Tensor], Tensor]) -> None:
        self.fn, self.shifted = fn, shifted

    def __call__(self, x: Tensor) -> Tensor:
        return self.fn(x)


def _shifted_values(fn: Fn, x: Tensor, shifts: Tensor) -> Tensor:
    """``fn`` at every ``x_b + s_k``: (B, K, n), by ``fn.shifted`` when it has one."""
    b, k = x.shape[0], shifts.shape[0]
    shifted = getattr(fn, "shifted", None)
    if shifted is not None:
        y = shifted(x, shifts)
        y = y[..., None] if y.ndim == 2 else y
        if y.ndim != 3 or tuple(y.shape[:2]) != (b, k):
            raise ValueError(f"fn.shifted must map (B, D) points and (K, D) shifts to (B, K, n) "
                             f"or (B, K); got {tuple(y.shape)} for B={b}, K={k}")
        return y
    pts = (x[:, None, :] + shifts[None]).reshape(-1, x.shape[1])
    return _as_2d(fn(pts), pts.shape[0]).reshape(b, k, -1)


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


class _Backend:
    name = "?"

    def __init__(self, laplacian_dims: Sequence[int] | None = None) -> None:
        self.laplacian_dims = None if laplacian_dims is None else [int(i) for i in laplacian_dims]
        self.forward_evaluations = 0

    def _mask(self, dim: int, like: Tensor, dims=None) -> Tensor:
        dims = self.laplacian_dims if dims is None else [int(i) for i in dims]
        m = torch.zeros(dim, dtype=like.dtype, device=like.device)
        if dims is None:
            m.fill_(1.0)
        else:
            if any(not 0 <= i < dim for i in dims):
                raise ValueError(f"laplacian_dims {dims} out of range for D={dim}")
            m[dims] = 1.0
        return m

    def evaluations(self, dim: int) -> int:
        raise NotImplementedError

    def resample(self, generator: torch.Generator | None = None) -> None:
        """Draw fresh random directions (Monte Carlo backends only; no-op otherwise)."""

    def __call__(self, fn: Fn, x: Tensor, laplacian_dims=None) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class AutoDiff(_Backend):
    """Exact ∇u and Δu by ``torch.func`` (jacrev, jacfwd∘jacrev per point): the reference.

    Differentiable with respect to the parameters ``fn`` closes over (FO training).
    """

    name = "AD"

    def evaluations(self, dim: int) -> int:
        return 1

    def __call__(self, fn: Fn, x: Tensor, laplacian_dims=None) -> tuple[Tensor, Tensor]:
        x = _check_x(x)
        b, d = x.shape
        _as_2d(fn(x[:1]), 1)

        def one(p):
            return _as_2d(fn(p[None]), 1)[0]

        grad = vmap(jacrev(one))(x)                       # (B, n, D)
        hess = vmap(jacfwd(jacrev(one)))(x)               # (B, n, D, D)
        diag = torch.diagonal(hess, dim1=-2, dim2=-1)     # (B, n, D)
        lap = (diag * self._mask(d, diag, laplacian_dims)).sum(-1)
        self.forward_evaluations += b
        return grad, lap


class FiniteDifference(_Backend):
    """Central differences: ∂_i u ≈ (u(x+he_i) − u(x−he_i))/2h, ∂²_i u ≈ (… − 2u(x))/h²."""

    name = "FD"

    def __init__(self, h: float = 0.01, laplacian_dims: Sequence[int] | None = None) -> None:
        super().__init__(laplacian_dims)
        self.h = _positive("h", h)

    def evaluations(self, dim: int) -> int:
        return 2 * dim + 1

    def __call__(self, fn: Fn, x: Tensor, laplacian_dims=None) -> tuple[Tensor, Tensor]:
        x = _check_x(x)
        b, d = x.shape
        eye = torch.eye(d, dtype=x.dtype, device=x.device) * self.h
        shifts = torch.cat([torch.zeros(1, d, dtype=x.dtype, device=x.device), eye, -eye])
        y = _shifted_values(fn, x, shifts)                             # (B, 2D+1, n)
        y0, yp, ym = y[:, :1], y[:, 1:d + 1], y[:, d + 1:]
        grad = ((yp - ym) / (2 * self.h)).transpose(1, 2)              # (B, n, D)
        second = ((yp + ym - 2 * y0) / self.h ** 2).transpose(1, 2)    # (B, n, D)
        lap = (second * self._mask(d, second, laplacian_dims)).sum(-1)
        self.forward_evaluations += b * shifts.shape[0]
        return grad, lap


def _stein(y0: Tensor, yp: Tensor, ym: Tensor, delta: Tensor, w: Tensor, sigma: float,
           mask: Tensor) -> tuple[Tensor, Tensor]:
    """Eq. 9 / Eq. 13 with weights ``w`` (K,), directions ``delta`` (K, D); y* are (B, K, n)."""
    s2 = sigma ** 2
    gcoef = delta * (w[:, None] / (2 * s2))                               # (K, D)
    grad = torch.einsum("bkn,kd->bnd", yp - ym, gcoef)
    # Only the coordinates in ``mask`` enter ‖δ‖² − σ² D (the Laplacian over those dims).
    lcoef = w * (((delta ** 2) * mask).sum(-1) - s2 * mask.sum()) / (2 * s2 ** 2)  # (K,)
    lap = torch.einsum("bkn,k->bn", yp + ym - 2 * y0, lcoef)
    return grad, lap


class SteinMC(_Backend):
    """Monte Carlo Stein estimator (Eq. 9) with ``num_samples`` antithetic ± pairs.

    The directions are drawn once (``seed``) and kept until :meth:`resample`, so every
    evaluation inside one ZO step sees the same noise (common random numbers).

    ``compute_dtype`` (default: the points' dtype) is the dtype ``fn`` is evaluated in; the
    estimate is combined in the points' dtype. ``fn`` must accept points of that dtype
    (:class:`ShiftedFn` of :meth:`bpfree.pinn.SineMLP.forward_shifted` does, whatever its
    weights' dtype). With equal positive weights 1/M the values' rounding averages out over
    the M pairs, so float32 values leave the estimate's error to its own sampling noise
    (measured by ``bench pinn-cost``'s rounding rows), unlike FD's and the sparse grid's.
    """

    name = "SE"

    def __init__(self, sigma: float = 0.1, num_samples: int = 1024, seed: int = 0,
                 laplacian_dims: Sequence[int] | None = None,
                 compute_dtype: torch.dtype | None = None) -> None:
        super().__init__(laplacian_dims)
        if compute_dtype is not None and not (isinstance(compute_dtype, torch.dtype)
                                              and compute_dtype.is_floating_point):
            raise ValueError(f"compute_dtype must be a floating torch dtype or None, got "
                             f"{compute_dtype!r}")
        self.compute_dtype = compute_dtype
        self.sigma = _positive("sigma", sigma)
        if isinstance(num_samples, bool) or not isinstance(num_samples, numbers.Integral) \
                or num_samples < 1:
            raise ValueError(f"num_samples must be an integer >= 1, got {num_samples!r}")
        self.num_samples = int(num_samples)
        self._gen = torch.Generator().manual_seed(int(seed))
        self._z: Tensor | None = None
        self._dim: int | None = None

    def evaluations(self, dim: int) -> int:
        return 2 * self.num_samples + 1

    def resample(self, generator: torch.Generator | None = None) -> None:
        self._z = None
        if generator is not None:
            self._gen = generator

    def _directions(self, dim: int) -> Tensor:
        if self._z is None or self._dim != dim:
            self._z = torch.randn(self.num_samples, dim, generator=self._gen, dtype=torch.float64)
            self._dim = dim
        return self._z

    def __call__(self, fn: Fn, x: Tensor, laplacian_dims=None) -> tuple[Tensor, Tensor]:
        x = _check_x(x)
        b, d = x.shape
        delta = (self._directions(d) * self.sigma).to(x.dtype)
        k = delta.shape[0]
        shifts = torch.cat([torch.zeros(1, d, dtype=x.dtype), delta, -delta]).to(x.device)
        dtype = self.compute_dtype or x.dtype
        y = _shifted_values(fn, x.to(dtype), shifts.to(dtype)).to(x.dtype)  # (B, 2M+1, n)
        w = torch.full((k,), 1.0 / k, dtype=x.dtype, device=x.device)
        self.forward_evaluations += b * shifts.shape[0]
        return _stein(y[:, :1], y[:, 1:k + 1], y[:, k + 1:], delta.to(x.device), w, self.sigma,
                      self._mask(d, x, laplacian_dims))


class SparseGridStein(_Backend):
    """Stein estimator on the level-``level`` sparse Gaussian grid (Eq. 13).

    The grid is symmetric, so ``f(x − δ_j)`` is the value at the mirror node: each distinct
    point of ``{0} ∪ S ∪ −S`` is evaluated once (``2D² + 2D + 1`` points at level 3).
    """

    name = "SG"

    def __init__(self, sigma: float = 0.1, level: int = 3,
                 laplacian_dims: Sequence[int] | None = None) -> None:
        super().__init__(laplacian_dims)
        self.sigma = _positive("sigma", sigma)
        if isinstance(level, bool) or not isinstance(level, numbers.Integral) or level < 1:
            raise ValueError(f"level must be an integer >= 1, got {level!r}")
        self.level = int(level)
        self._plans: dict[int, tuple] = {}

    def _plan(self, dim: int):
        if dim not in self._plans:
            nodes, w = sparse_grid(dim, self.level, self.sigma)
            pts = torch.cat([torch.zeros(1, dim, dtype=nodes.dtype), nodes, -nodes])
            uniq, inv = torch.unique(torch.round(pts, decimals=12), dim=0, return_inverse=True)
            k = nodes.shape[0]
            self._plans[dim] = (uniq, inv[0], inv[1:k + 1], inv[k + 1:], nodes, w)
        return self._plans[dim]

    def evaluations(self, dim: int) -> int:
        return int(self._plan(dim)[0].shape[0])

    def __call__(self, fn: Fn, x: Tensor, laplacian_dims=None) -> tuple[Tensor, Tensor]:
        x = _check_x(x)
        b, d = x.shape
        uniq, i0, ip, im, nodes, w = self._plan(d)
        u = uniq.to(x.dtype).to(x.device)
        y = _shifted_values(fn, x, u)                                 # (B, nodes, n)
        self.forward_evaluations += b * u.shape[0]
        return _stein(y[:, i0:i0 + 1], y[:, ip], y[:, im], nodes.to(x), w.to(x), self.sigma,
                      self._mask(d, x, laplacian_dims))


BACKENDS = {"AD": AutoDiff, "FD": FiniteDifference, "SE": SteinMC, "SG": SparseGridStein}


def get_backend(name: str, **options) -> _Backend:
    """Build a backend by its short name: ``AD``, ``FD``, ``SE`` or ``SG``."""
    key = name.upper() if isinstance(name, str) else name
    if key not in BACKENDS:
        raise ValueError(f"unknown derivative backend {name!r}; choose one of {sorted(BACKENDS)}")
    cls = BACKENDS[key]
    allowed = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for backend {key}; allowed: {allowed}")
    return cls(**options)
