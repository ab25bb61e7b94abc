"""BP-free physics-informed neural networks (TT-ZO, Zhao et al., §2.2, §4, §5.2).

* :mod:`.sparse_grid` — :func:`sparse_grid` (Smolyak sparse Gauss–Hermite rule, Eq. 10–12).
* :mod:`.derivatives` — ∇u and Δu backends ``(fn, x) -> (grad, laplacian)``:
  :class:`AutoDiff`, :class:`FiniteDifference`, :class:`SteinMC` (Eq. 9),
  :class:`SparseGridStein` (Eq. 13); :class:`ShiftedFn` lets them evaluate every node of
  every point through a network's shared-work path (``SineMLP.forward_shifted``).
* :mod:`.problems` — :class:`HJB` (Eq. 14), :class:`Poisson2D`, :func:`pinn_loss` (Eq. 3–6),
  :func:`transformed` (``f′ = f + ‖x‖₁ + 1 − t``), :func:`validation_mse`.
* :mod:`.models` — sine MLPs: dense, TT-compressed (7745 params), sparse-pruned (7603).
* :mod:`.train` — :func:`train_fo` (BP on θ only) and :func:`train_zo` (ZO-signRGE, no BP).
"""

from .derivatives import (BACKENDS, AutoDiff, FiniteDifference, ShiftedFn, SparseGridStein, SteinMC,
                          get_backend)
from .models import (SineMLP, SparseLinear, build_model, dense_sine_mlp, num_parameters,
                     pruned_sine_mlp, tt_sine_mlp)
from .problems import (HJB, Collocation, PDEProblem, Poisson2D, Transformed, check_model,
                       check_points, pinn_loss, transformed, validation_mse)
from .sparse_grid import gauss_hermite, sparse_grid, sparse_grid_size
from .train import PINNResult, train_fo, train_zo

__all__ = [
    "BACKENDS", "AutoDiff", "FiniteDifference", "ShiftedFn", "SparseGridStein", "SteinMC",
    "get_backend",
    "SineMLP", "SparseLinear", "build_model", "dense_sine_mlp", "num_parameters",
    "pruned_sine_mlp", "tt_sine_mlp", "HJB", "Collocation", "PDEProblem", "Poisson2D",
    "check_model", "check_points", "pinn_loss", "Transformed", "transformed", "validation_mse",
    "gauss_hermite", "sparse_grid", "sparse_grid_size", "PINNResult", "train_fo", "train_zo",
]
