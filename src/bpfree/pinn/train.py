"""PINN training loops: FO (BP on θ only) and fully BP-free ZO (TT-ZO §5.2, Tables 4–6).

* :func:`train_fo` — Adam on θ with the loss of :func:`~bpfree.pinn.problems.pinn_loss`; the
  derivatives in the loss come from any backend (AD, FD, SE, SG), so only the parameter
  gradient uses BP.
* :func:`train_zo` — :class:`~bpfree.optim.ZOOptimizer` with ZO-signRGE (μ = 0.1, N = 10
  queries by default) and a forward-only backend (FD, SE, SG): no BP anywhere.

Each step draws fresh collocation points and (for SE) fresh Stein directions; within one ZO
step all N + 1 loss evaluations share them (common random numbers). Returned
:class:`PINNResult` records the validation MSE against the exact solution, the number of
loss evaluations and of network point-evaluations (a forward of one point of one batch row),
and the wall time.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from ..estimators import sign_rge
from ..optim import ZOOptimizer
from ..progress import progress_bar
from ..transforms import cosine
from .derivatives import AutoDiff, get_backend
from .problems import PDEProblem, check_model, pinn_loss, validation_mse

__all__ = ["PINNResult", "train_fo", "train_zo"]


@dataclass
class PINNResult:
    val_mse: float
    initial_val_mse: float
    steps: int
    loss_evaluations: int
    point_evaluations: int
    seconds: float
    history: dict = field(default_factory=lambda: {"step": [], "loss": [], "val_mse": []})


def _setup(model, problem, backend, steps, batch_size, lr):
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(problem, PDEProblem):
        raise TypeError(f"problem must be a PDEProblem, got {type(problem).__name__}")
    check_model(model, problem)
    for name, v in (("steps", steps), ("batch_size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    return get_backend(backend) if isinstance(backend, str) else backend


def _sample(problem, batch_size, n_initial, n_boundary, gen, model):
    """Collocation points in the model's floating dtype (a float64 PINN samples float64)."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return problem.sample(batch_size, n_initial, n_boundary, generator=gen, dtype=dtype)


def _log(res, step, loss, model, problem, val):
    res.history["step"].append(step)
    res.history["loss"].append(float(loss))
    res.history["val_mse"].append(validation_mse(model, problem, val))


def train_fo(model: nn.Module, problem: PDEProblem, backend="AD", *, steps: int = 500,
             batch_size: int = 64, n_initial: int = 64, n_boundary: int = 0, lr: float = 1e-3,
             lambda_initial: float = 1.0, lambda_boundary: float = 1.0, seed: int = 0,
             val_points: torch.Tensor | None = None, log_every: int = 50,
             progress: bool | str | None = None, quiet: bool = False) -> PINNResult:
    """First-order training (Adam, cosine lr) with derivatives from ``backend``.

    ``progress`` / ``quiet``: a bar of the steps, by default only on a terminal
    (:func:`bpfree.progress.show_progress`)."""
    backend = _setup(model, problem, backend, steps, batch_size, lr)
    gen = torch.Generator().manual_seed(seed)
    val = problem.validation_points(1000) if val_points is None else val_points
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps, eta_min=lr * 0.01)
    res = PINNResult(val_mse=math.nan, initial_val_mse=validation_mse(model, problem, val),
                     steps=steps, loss_evaluations=0, point_evaluations=0, seconds=0.0)
    start = time.perf_counter()
    per_point = backend.evaluations(problem.input_dim)
    bar = progress_bar(steps, "PINN (FO)", progress, quiet)
    for step in range(steps):
        batch = _sample(problem, batch_size, n_initial, n_boundary, gen, model)
        backend.resample()
        parts = pinn_loss(model, problem, backend, batch, lambda_initial, lambda_boundary)
        loss = parts["loss"]
        if not torch.isfinite(loss):
            bar.close()
            raise FloatingPointError(f"non-finite PINN loss at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        res.loss_evaluations += 1
        res.point_evaluations += batch_size * per_point + n_initial + n_boundary
        if log_every and (step % log_every == 0 or step == steps - 1):
            _log(res, step, loss.item(), model, problem, val)
        bar.update(1)
    bar.close()
    res.seconds = time.perf_counter() - start
    res.val_mse = validation_mse(model, problem, val)
    return res


def train_zo(model: nn.Module, problem: PDEProblem, backend="SG", *, steps: int = 500,
             batch_size: int = 64, n_initial: int = 64, n_boundary: int = 0, lr: float = 1e-3,
             num_queries: int = 10, mu: float = 0.1, lambda_initial: float = 1.0,
             lambda_boundary: float = 1.0, seed: int = 0,
             val_points: torch.Tensor | None = None, log_every: int = 50,
             progress: bool | str | None = None, quiet: bool = False) -> PINNResult:
    """Fully BP-free training: ZO-signRGE on θ, a forward-only backend for ∇u and Δu.

    Each step moves every parameter by ``±lr_t`` (the sign of the RGE estimate), with a cosine
    decay of ``lr`` to 1 % over ``steps``. ``progress`` / ``quiet``: a bar of the steps with
    the loss, by default only on a terminal (:func:`bpfree.progress.show_progress`).
    """
    backend = _setup(model, problem, backend, steps, batch_size, lr)
    if isinstance(backend, AutoDiff):
        raise ValueError("BP-free (ZO) training needs a forward-only backend (FD, SE or SG), not AD")
    gen = torch.Generator().manual_seed(seed)
    val = problem.validation_points(1000) if val_points is None else val_points
    params = [p for p in model.parameters() if p.requires_grad]
    # cached: each direction drawn once per step; the weights are lean mode's bit for bit
    opt = ZOOptimizer(params, lr=lr, estimator=sign_rge(num_queries, mu), distribution="gaussian",
                      schedule=cosine(steps, final=0.01), seed=seed, mode="cached")
    res = PINNResult(val_mse=math.nan, initial_val_mse=validation_mse(model, problem, val),
                     steps=steps, loss_evaluations=0, point_evaluations=0, seconds=0.0)
    per_point = backend.evaluations(problem.input_dim)
    start = time.perf_counter()
    bar = progress_bar(steps, "PINN (ZO)", progress, quiet)
    for step in range(steps):
        batch = _sample(problem, batch_size, n_initial, n_boundary, gen, model)
        backend.resample()

        def closure():
            return pinn_loss(model, problem, backend, batch, lambda_initial, lambda_boundary)["loss"]

        before = opt.batch_forwards
        loss = opt.step(closure)
        n = opt.batch_forwards - before
        res.loss_evaluations += n
        res.point_evaluations += n * (batch_size * per_point + n_initial + n_boundary)
        if log_every and (step % log_every == 0 or step == steps - 1):
            _log(res, step, loss, model, problem, val)
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss):.4g}", refresh=False)
    bar.close()
    res.seconds = time.perf_counter() - start
    res.val_mse = validation_mse(model, problem, val)
    return res
