"""PDE problems and the PINN loss (TT-ZO §2.2 Eq. 3–6, §5.2 Eq. 14).

A :class:`PDEProblem` supplies the residual ``r = N[u] − l`` (Eq. 4) from ``u``, ∇u and Δu,
collocation samplers, and optional initial/terminal and boundary data. :func:`pinn_loss`
assembles ``L = L_r + λ₀ L₀ + λ_b L_b`` (Eq. 5–6) with any derivative backend of
:mod:`bpfree.pinn.derivatives`.

* :class:`HJB` — ``∂_t u + Δu − 0.05‖∇ₓu‖² = −2`` on ``[0,1]^D × [0,1]``,
  ``u(x, 1) = ‖x‖₁``; exact ``u = ‖x‖₁ + 1 − t`` (Eq. 14, ``D = 20``). Inputs are
  ``(x, t)``, so the network sees ``D + 1`` coordinates and Δ acts on the first ``D``.
  :func:`transformed` gives the paper's ``f′ = f + ‖x‖₁ + 1 − t``.
* :class:`Poisson2D` — ``−Δu = 2π² sin(πx) sin(πy)`` on ``[0,1]²``, ``u = 0`` on the
  boundary; exact ``u = sin(πx) sin(πy)``: a cheap problem for tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .derivatives import ShiftedFn
from .models import SineMLP

__all__ = ["PDEProblem", "HJB", "Poisson2D", "Collocation", "pinn_loss", "transformed", "Transformed",
           "validation_mse", "check_points", "check_model"]


def check_points(x: Tensor, dim: int, what: str = "collocation points") -> Tensor:
    if not isinstance(x, Tensor) or x.ndim != 2 or x.shape[1] != dim:
        raise ValueError(f"{what} must have shape (N, {dim}), got {tuple(getattr(x, 'shape', ()))}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{what} contain non-finite (NaN/Inf) values")
    return x


def _check_shape(x: Tensor, dim: int) -> None:
    if x.ndim != 2 or x.shape[1] != dim:
        raise ValueError(f"points must have shape (N, {dim}), got {tuple(x.shape)}")


@dataclass
class Collocation:
    """One batch of points: interior (residual), initial/terminal and boundary, with targets."""

    interior: Tensor
    initial: Tensor | None = None
    initial_target: Tensor | None = None
    boundary: Tensor | None = None
    boundary_target: Tensor | None = None


class PDEProblem:
    """Base class. ``input_dim`` coordinates enter the network; ``laplacian_dims`` the Laplacian."""

    name = "pde"
    #: whether :meth:`residual` uses ``u`` itself (then pinn_loss evaluates the network once more)
    needs_value = False
    input_dim: int
    laplacian_dims: list[int]

    def residual(self, points: Tensor, u: Tensor, grad: Tensor, lap: Tensor) -> Tensor:
        """Eq. 4 per point and output: shapes u (B, n), grad (B, n, D), lap (B, n) -> (B, n).

        ``u`` is None unless the problem sets ``needs_value``.
        """
        raise NotImplementedError

    def exact(self, points: Tensor) -> Tensor:
        raise NotImplementedError

    def sample(self, n_interior: int, n_initial: int = 0, n_boundary: int = 0,
               generator: torch.Generator | None = None, dtype=torch.float32) -> Collocation:
        raise NotImplementedError

    def validation_points(self, n: int, seed: int = 1234, dtype=torch.float32) -> Tensor:
        g = torch.Generator().manual_seed(seed)
        return self.sample(n, generator=g, dtype=dtype).interior


class HJB(PDEProblem):
    """The D-dim Hamilton–Jacobi–Bellman equation of TT-ZO Eq. 14 (D = 20 in the paper)."""

    name = "hjb"

    def __init__(self, dim: int = 20, coefficient: float = 0.05, source: float = -2.0) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be an integer >= 1, got {dim!r}")
        self.dim = dim
        self.input_dim = dim + 1
        self.laplacian_dims = list(range(dim))
        self.coefficient = coefficient
        self.source = source

    def residual(self, points, u, grad, lap):
        gx, gt = grad[..., :self.dim], grad[..., self.dim]
        return gt + lap - self.coefficient * (gx ** 2).sum(-1) - self.source

    def exact(self, points):
        _check_shape(points, self.input_dim)
        return (points[:, :self.dim].abs().sum(-1) + 1 - points[:, self.dim])[:, None]

    def terminal(self, x: Tensor) -> Tensor:
        return x.abs().sum(-1, keepdim=True)

    def sample(self, n_interior, n_initial=0, n_boundary=0, generator=None, dtype=torch.float32):
        inner = torch.rand(n_interior, self.input_dim, generator=generator, dtype=dtype)
        col = Collocation(interior=inner)
        if n_initial:
            x = torch.rand(n_initial, self.dim, generator=generator, dtype=dtype)
            col.initial = torch.cat([x, torch.ones(n_initial, 1, dtype=dtype)], 1)
            col.initial_target = self.terminal(x)
        return col


class Poisson2D(PDEProblem):
    """``−Δu = 2π² sin(πx) sin(πy)`` on the unit square, zero Dirichlet boundary."""

    name = "poisson2d"
    input_dim = 2
    laplacian_dims = [0, 1]

    def residual(self, points, u, grad, lap):
        f = 2 * math.pi ** 2 * torch.sin(math.pi * points[:, :1]) * torch.sin(math.pi * points[:, 1:2])
        return -lap - f

    def exact(self, points):
        _check_shape(points, 2)
        return (torch.sin(math.pi * points[:, 0]) * torch.sin(math.pi * points[:, 1]))[:, None]

    def sample(self, n_interior, n_initial=0, n_boundary=0, generator=None, dtype=torch.float32):
        col = Collocation(interior=torch.rand(n_interior, 2, generator=generator, dtype=dtype))
        if n_boundary:
            s = torch.rand(n_boundary, generator=generator, dtype=dtype)
            side = torch.randint(0, 4, (n_boundary,), generator=generator)
            fixed = (side % 2).to(dtype)                      # 0 or 1
            pts = torch.where((side < 2)[:, None], torch.stack([fixed, s], 1),
                              torch.stack([s, fixed], 1))
            col.boundary, col.boundary_target = pts, torch.zeros(n_boundary, 1, dtype=dtype)
        return col


class Transformed(nn.Module):
    """``f′(x, t) = f(x, t) + ‖x‖₁ + 1 − t`` (TT-ZO §5.2).

    ``exact_known_part=True`` (default): the backends differentiate the network ``f`` only and
    the known part's derivatives are added in closed form (∇ₓ = sign x, ∂_t = −1, Δ = 0), which
    needs no BP. ``False`` follows the paper literally: the backend differentiates the whole
    ``f′``, so the Stein backends smooth the kink of ``‖x‖₁`` too (Δ of the smoothed ``|x_i|``
    is ``2φ(x_i/σ)/σ``, up to 8 at ``x_i = 0`` for σ = 0.1), which biases the residual.
    """

    def __init__(self, base: nn.Module, dim: int, exact_known_part: bool = True) -> None:
        super().__init__()
        self.base, self.dim = base, dim
        #: None when the base network does not declare its input width (checked by a probe)
        self.in_features = getattr(base, "in_features", None)
        self.exact_known_part = exact_known_part

    def known(self, z: Tensor) -> Tensor:
        return (z[:, :self.dim].abs().sum(-1) + 1 - z[:, self.dim])[:, None]

    def known_derivatives(self, z: Tensor) -> tuple[Tensor, Tensor]:
        grad = torch.cat([torch.sign(z[:, :self.dim]), -torch.ones_like(z[:, self.dim:])], 1)
        return grad[:, None, :], z.new_zeros(len(z), 1)

    def network(self, z: Tensor) -> Tensor:
        out = self.base(z)
        return out[:, None] if out.ndim == 1 else out

    def network_fn(self):
        """:meth:`network` for the derivative backends: with the base network's shared-work
        path (:meth:`bpfree.pinn.SineMLP.forward_shifted`) when it has one that applies."""
        if isinstance(self.base, SineMLP) and len(self.base.layers) >= 2:
            return ShiftedFn(self.network, self.base.forward_shifted)
        return self.network

    def forward(self, z: Tensor) -> Tensor:
        return self.network(z) + self.known(z)


def transformed(base: nn.Module, problem: HJB, exact_known_part: bool = True) -> Transformed:
    """Wrap a base network into the paper's transformed network for the HJB problem."""
    if not isinstance(problem, HJB):
        raise TypeError("the transformed network f' = f + ||x||_1 + 1 - t is defined for HJB")
    check_model(base, problem)
    return Transformed(base, problem.dim, exact_known_part)


def check_model(model: nn.Module, problem: PDEProblem) -> None:
    """Raise ``ValueError`` unless ``model`` takes the problem's ``input_dim`` coordinates.

    Uses ``model.in_features`` when the model declares it; otherwise evaluates the model once
    at one point of the right width and reports a failure as a dimension mismatch.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    d = getattr(model, "in_features", None)
    if d is not None:
        if d != problem.input_dim:
            raise ValueError(f"the network takes {d} inputs but problem {problem.name!r} has "
                             f"{problem.input_dim} coordinates")
        return
    param = next(iter(model.parameters()), None)
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    probe = torch.full((1, problem.input_dim), 0.5, dtype=dtype)
    try:
        with torch.no_grad():
            model(probe)
    except (RuntimeError, ValueError) as err:
        raise ValueError(f"the network cannot take the {problem.input_dim} coordinates of "
                         f"problem {problem.name!r} (dimension mismatch?): {err}") from err


def _check_target(target, points: Tensor, what: str) -> Tensor:
    if not isinstance(target, Tensor) or target.ndim != 2 or target.shape[0] != len(points):
        raise ValueError(f"{what} targets must be a ({len(points)}, n) tensor, got "
                         f"{tuple(getattr(target, 'shape', ())) or type(target).__name__}")
    if not bool(torch.isfinite(target).all()):
        raise ValueError(f"{what} targets contain non-finite (NaN/Inf) values")
    return target


def pinn_loss(model: nn.Module, problem: PDEProblem, backend, batch: Collocation,
              lambda_initial: float = 1.0, lambda_boundary: float = 1.0) -> dict[str, Tensor]:
    """Eq. 5–6: mean squared residual + λ₀ initial/terminal + λ_b boundary losses.

    Returns a dict with ``loss`` (the total) and its parts ``residual``, ``initial``,
    ``boundary`` (zero when the batch has no such points).
    """
    check_model(model, problem)
    x = check_points(batch.interior, problem.input_dim)
    if isinstance(model, Transformed) and model.exact_known_part:
        grad, lap = backend(model.network_fn(), x, laplacian_dims=problem.laplacian_dims)
        kg, kl = model.known_derivatives(x)
        grad, lap = grad + kg, lap + kl
    else:
        grad, lap = backend(model, x, laplacian_dims=problem.laplacian_dims)
    u = model(x).reshape(len(x), -1) if problem.needs_value else None
    res = problem.residual(x, u, grad, lap)
    parts = {"residual": (res ** 2).sum(-1).mean()}
    zero = parts["residual"].new_zeros(())
    parts["initial"] = zero
    parts["boundary"] = zero
    if batch.initial is not None and len(batch.initial):
        p = check_points(batch.initial, problem.input_dim, "initial points")
        target = _check_target(batch.initial_target, p, "initial")
        parts["initial"] = ((model(p).reshape(len(p), -1) - target) ** 2).sum(-1).mean()
    if batch.boundary is not None and len(batch.boundary):
        p = check_points(batch.boundary, problem.input_dim, "boundary points")
        target = _check_target(batch.boundary_target, p, "boundary")
        parts["boundary"] = ((model(p).reshape(len(p), -1) - target) ** 2).sum(-1).mean()
    parts["loss"] = parts["residual"] + lambda_initial * parts["initial"] \
        + lambda_boundary * parts["boundary"]
    return parts


@torch.no_grad()
def validation_mse(model: nn.Module, problem: PDEProblem, points: Tensor) -> float:
    """Mean squared error of the network against the exact solution at ``points``."""
    check_model(model, problem)
    points = check_points(points, problem.input_dim, "validation points")
    pred = model(points).reshape(len(points), -1)
    return float(((pred - problem.exact(points).to(pred)) ** 2).mean())
