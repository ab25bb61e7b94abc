"""BP-free PINN pieces (TT-ZO §4, §5.2): sparse grid, derivative backends, HJB, training."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from bpfree.pinn import (HJB, AutoDiff, FiniteDifference, Poisson2D, SparseGridStein, SteinMC,
                         build_model, dense_sine_mlp, get_backend, num_parameters, pinn_loss,
                         pruned_sine_mlp, sparse_grid, sparse_grid_size, train_fo, train_zo,
                         transformed, tt_sine_mlp, validation_mse)


def gaussian_moment(k: int, sigma: float) -> float:
    return 0.0 if k % 2 else sigma ** k * math.prod(range(k - 1, 0, -2))


# -- sparse grid ------------------------------------------------------------------------------

@pytest.mark.parametrize("dim", [2, 3, 5, 10, 21])
def test_level3_node_count(dim):
    nodes, weights = sparse_grid(dim, 3, sigma=0.1)
    assert nodes.shape == (2 * dim * dim + 2 * dim + 1, dim)
    assert weights.shape == (nodes.shape[0],)
    assert torch.unique(nodes, dim=0).shape[0] == nodes.shape[0]   # duplicates merged


def test_paper_925_nodes_and_small_levels():
    assert sparse_grid_size(21, 3) == 925
    assert sparse_grid_size(4, 1) == 1
    assert sparse_grid_size(4, 2) == 2 * 4 + 1
    n1, w1 = sparse_grid(1, 4, sigma=1.0)          # D = 1: the plain 4-point Gauss–Hermite rule
    assert n1.shape == (4, 1) and float(w1.sum()) == pytest.approx(1.0)


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_moments_exact_up_to_degree(level):
    dim, sigma = 3, 0.7
    nodes, w = sparse_grid(dim, level, sigma)
    degree = 2 * level - 1
    for powers in itertools.product(range(degree + 1), repeat=dim):
        if sum(powers) > degree:
            continue
        quad = float((w * torch.prod(nodes ** torch.tensor(powers, dtype=nodes.dtype), 1)).sum())
        exact = math.prod(gaussian_moment(k, sigma) for k in powers)
        assert quad == pytest.approx(exact, abs=1e-12, rel=1e-10), powers
    # ... and the degree is sharp: the next even moment of one coordinate is not exact.
    quad = float((w * nodes[:, 0] ** (2 * level)).sum())
    assert quad != pytest.approx(gaussian_moment(2 * level, sigma), rel=1e-6)


def test_grid_is_cached_and_copied():
    a, _ = sparse_grid(6, 3, 0.1)
    a.zero_()
    b, _ = sparse_grid(6, 3, 0.1)
    assert float(b.abs().sum()) > 0


@pytest.mark.parametrize("kwargs", [dict(dim=3, level=0), dict(dim=3, level=-1),
                                    dict(dim=3, level=3, sigma=0.0),
                                    dict(dim=3, level=3, sigma=-1.0),
                                    dict(dim=3, level=3, sigma=float("nan")),
                                    dict(dim=0, level=3), dict(dim=3, level=2.5)])
def test_sparse_grid_bad_input(kwargs):
    with pytest.raises(ValueError):
        sparse_grid(**kwargs)


def test_backend_bad_input():
    with pytest.raises(ValueError, match="level"):
        SparseGridStein(sigma=0.1, level=0)
    with pytest.raises(ValueError, match="sigma"):
        SteinMC(sigma=0.0)
    with pytest.raises(ValueError, match="sigma"):
        SparseGridStein(sigma=-0.1)
    with pytest.raises(ValueError, match="h"):
        FiniteDifference(h=0)
    with pytest.raises(ValueError, match="unknown"):
        get_backend("XX")
    x = torch.rand(4, 3, dtype=torch.float64)
    x[1, 2] = float("nan")
    for b in (AutoDiff(), FiniteDifference(), SteinMC(num_samples=4), SparseGridStein()):
        with pytest.raises(ValueError, match="non-finite"):
            b(lambda z: z.sum(-1), x)


# -- backends against AD on a sum of sines ---------------------------------------------------

D = 5
GEN = torch.Generator().manual_seed(0)
W = torch.randn(2, 3, D, generator=GEN, dtype=torch.float64) * 0.8   # n = 2 outputs, 3 sines each
B = torch.rand(2, 3, generator=GEN, dtype=torch.float64)
X = torch.rand(6, D, generator=GEN, dtype=torch.float64)


def sines(x):
    """u_j(x) = Σ_k sin(w_jk·x + b_jk), shape (B, 2)."""
    return torch.sin(torch.einsum("bd,jkd->bjk", x, W) + B).sum(-1)


def sines_derivatives(x, sigma=0.0):
    """∇u and Δu of the σ-smoothed sines: E sin(w·(x+δ)+b) = e^{−σ²|w|²/2} sin(w·x+b)."""
    damp = torch.exp(-0.5 * sigma ** 2 * (W ** 2).sum(-1))           # (2, 3)
    phase = torch.einsum("bd,jkd->bjk", x, W) + B
    grad = torch.einsum("bjk,jkd->bjd", damp * torch.cos(phase), W)
    lap = -(damp * (W ** 2).sum(-1) * torch.sin(phase)).sum(-1)
    return grad, lap


def test_autodiff_matches_closed_form():
    g, l = AutoDiff()(sines, X)
    g0, l0 = sines_derivatives(X)
    assert g.shape == (6, 2, D) and l.shape == (6, 2)
    torch.testing.assert_close(g, g0, rtol=0, atol=1e-12)
    torch.testing.assert_close(l, l0, rtol=0, atol=1e-12)


def test_finite_difference_against_ad():
    g0, l0 = AutoDiff()(sines, X)
    fd = FiniteDifference(h=0.01)
    g, l = fd(sines, X)
    assert fd.evaluations(D) == 2 * D + 1 and fd.forward_evaluations == 6 * (2 * D + 1)
    assert (g - g0).abs().max() < 3e-4      # O(h²): h² |w|³ / 6 per sine
    assert (l - l0).abs().max() < 1e-3


def test_sparse_grid_stein_against_smoothed_and_ad():
    sigma = 0.1
    sg = SparseGridStein(sigma=sigma, level=3)
    g, l = sg(sines, X)
    assert sg.evaluations(D) == 2 * D * D + 2 * D + 1
    gs, ls = sines_derivatives(X, sigma)
    assert (g - gs).abs().max() < 2e-3      # quadrature error, non-separable sines
    # The level-3 rule integrates the O(1) part of the Laplacian integrand exactly (degree 4)
    # but not its O(σ²) part (degree 6): errors of a few % of max |Δu| ≈ 6.5 here.
    assert (l - ls).abs().max() < 0.3
    g0, l0 = AutoDiff()(sines, X)           # smoothing bias is O(σ²)
    assert (g - g0).abs().max() < 0.1
    assert (l - l0).abs().max() < 0.15
    # The Laplacian over a subset of coordinates.
    _, l_sub = sg(sines, X, laplacian_dims=[0, 2])
    _, l_sub_ad = AutoDiff()(sines, X, laplacian_dims=[0, 2])
    assert (l_sub - l_sub_ad).abs().max() < 5e-2


def test_stein_mc_against_smoothed():
    sigma = 0.1
    se = SteinMC(sigma=sigma, num_samples=20000, seed=0)
    g, l = se(sines, X)
    assert se.evaluations(D) == 40001
    gs, ls = sines_derivatives(X, sigma)
    assert (g - gs).abs().max() < 0.1       # MC: error ~ |∇u| sqrt(D / M) + ...
    assert (l - ls).abs().max() < 0.5


def test_sparse_grid_beats_monte_carlo_at_equal_evaluations():
    sigma = 0.1
    sg = SparseGridStein(sigma=sigma, level=3)
    evals = sg.evaluations(D)
    gs, ls = sines_derivatives(X, sigma)
    g, l = sg(sines, X)
    sg_err = ((g - gs) ** 2).mean() + ((l - ls) ** 2).mean()
    mc_errs = []
    for seed in range(10):
        se = SteinMC(sigma=sigma, num_samples=(evals - 1) // 2, seed=seed)
        assert se.evaluations(D) == evals
        g, l = se(sines, X)
        mc_errs.append(float(((g - gs) ** 2).mean() + ((l - ls) ** 2).mean()))
    assert float(sg_err) * 10 < min(mc_errs)


# -- problems ---------------------------------------------------------------------------------

class _Exact(torch.nn.Module):
    def __init__(self, problem):
        super().__init__()
        self.problem, self.in_features = problem, problem.input_dim

    def forward(self, z):
        return self.problem.exact(z)


def test_hjb_exact_solution_has_zero_residual_under_ad():
    p = HJB(20)
    batch = p.sample(32, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    parts = pinn_loss(_Exact(p), p, AutoDiff(), batch)
    assert float(parts["residual"]) == pytest.approx(0.0, abs=1e-20)
    assert float(parts["initial"]) == pytest.approx(0.0, abs=1e-20)
    # The transformed network with a zero base network is the exact solution for every backend.
    base = dense_sine_mlp(21, 8).double()
    torch.nn.init.zeros_(base.layers[-1].weight)
    torch.nn.init.zeros_(base.layers[-1].bias)
    net = transformed(base, p)
    for b in (AutoDiff(), FiniteDifference(), SteinMC(num_samples=8), SparseGridStein()):
        assert float(pinn_loss(net, p, b, batch)["loss"].detach()) == pytest.approx(0.0, abs=1e-20)
    assert validation_mse(net, p, p.validation_points(64, dtype=torch.float64)) == 0.0


def test_poisson_exact_residual_small_with_fd():
    p = Poisson2D()
    batch = p.sample(16, n_boundary=8, generator=torch.Generator().manual_seed(0),
                     dtype=torch.float64)
    parts = pinn_loss(_Exact(p), p, FiniteDifference(h=1e-3), batch)
    assert float(parts["residual"]) < 1e-6 and float(parts["boundary"]) < 1e-20


def test_dimension_mismatch_and_bad_points():
    p = HJB(20)
    with pytest.raises(ValueError, match="inputs"):
        transformed(dense_sine_mlp(10, 8), p)
    with pytest.raises(ValueError, match="inputs"):
        pinn_loss(dense_sine_mlp(10, 8), p, AutoDiff(), p.sample(4))
    with pytest.raises(ValueError, match="inputs"):
        train_fo(dense_sine_mlp(3, 8), Poisson2D(), "AD", steps=1)
    batch = p.sample(4)
    batch.interior[0, 0] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        pinn_loss(transformed(dense_sine_mlp(21, 8), p), p, AutoDiff(), batch)
    with pytest.raises(ValueError, match="shape"):
        validation_mse(dense_sine_mlp(21, 8), p, torch.rand(4, 20))


# -- models -----------------------------------------------------------------------------------

def test_paper_parameter_counts():
    assert num_parameters(tt_sine_mlp(21, 768)) == 7745          # TT-3, Table 6
    assert num_parameters(pruned_sine_mlp(21, 768)) == 7603      # SP-3, Table 6
    assert num_parameters(dense_sine_mlp(21, 78)) == 7957        # FC-3 (paper: 7800, no bias)
    assert num_parameters(dense_sine_mlp(21, 768)) == 608257     # FC-3 full MLP, Table 4
    with pytest.raises(ValueError):
        build_model("conv")


def test_tt_dense_form_is_the_same_function():
    m = tt_sine_mlp(21, 64, rank=4)
    x = torch.rand(50, 21)
    y = m(x)
    m.dense_rows = 1
    torch.testing.assert_close(m(x), y, rtol=1e-5, atol=1e-6)


# -- training ---------------------------------------------------------------------------------

def test_fo_training_with_each_backend_reduces_error():
    p = HJB(20)
    for name in ("AD", "FD", "SE", "SG"):
        backend = get_backend(name, **({"num_samples": 64} if name == "SE" else {}))
        net = transformed(dense_sine_mlp(21, 16), p)
        r = train_fo(net, p, backend, steps=30, batch_size=8, n_initial=16, lr=3e-3,
                     log_every=0)
        assert r.val_mse < 0.5 * r.initial_val_mse, name
        assert r.loss_evaluations == 30
        per = backend.evaluations(21)
        assert r.point_evaluations == 30 * (8 * per + 16)


@pytest.mark.parametrize("kind", ["dense", "tt", "pruned"])
def test_zo_training_is_bp_free_and_counts_forwards(kind):
    p = HJB(20)
    base = {"dense": lambda: dense_sine_mlp(21, 16), "tt": lambda: tt_sine_mlp(21, 16, rank=2),
            "pruned": lambda: pruned_sine_mlp(21, 32, trainable=300)}[kind]()
    net = transformed(base, p)
    r = train_zo(net, p, "SG", steps=30, batch_size=4, n_initial=8, lr=3e-3, log_every=0)
    assert r.loss_evaluations == 30 * 11                    # N = 10 queries + the base loss
    assert r.point_evaluations == 30 * 11 * (4 * 925 + 8)   # 925-node level-3 grid at D = 21
    assert r.val_mse < r.initial_val_mse
    assert all(p_.grad is None for p_ in net.parameters())  # no BP anywhere
    with pytest.raises(ValueError, match="forward-only"):
        train_zo(net, p, "AD", steps=1)
