"""BP-free PINN pieces (TT-ZO §4, §5.2): sparse grid, derivative backends, HJB, training."""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np

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


def test_grid_cache_is_keyed_by_dim_level_sigma():
    build = sys.modules["bpfree.pinn.sparse_grid"]._build
    sparse_grid(7, 3, 0.3)
    before = build.cache_info()
    sparse_grid(7, 3, 0.3)                                   # same key: served from the cache
    after = build.cache_info()
    assert after.hits == before.hits + 1 and after.misses == before.misses
    n1, w1 = sparse_grid(7, 3, 1.0)                          # new sigma: a new entry ...
    assert build.cache_info().misses == after.misses + 1
    n3, w3 = sparse_grid(7, 3, 0.3)                          # ... with nodes scaled by sigma
    torch.testing.assert_close(n3, 0.3 * n1, rtol=0, atol=1e-15)
    torch.testing.assert_close(w3, w1, rtol=0, atol=0)
    assert sparse_grid(7, 2, 0.3)[0].shape[0] == 2 * 7 + 1   # new level: a different rule
    # NumPy scalars are accepted like Python numbers.
    n_np, _ = sparse_grid(np.int64(7), np.int64(3), np.float32(0.3))
    assert n_np.shape == n3.shape


@pytest.mark.parametrize("kwargs", [dict(dim=3, level=0), dict(dim=3, level=-1),
                                    dict(dim=3, level=3, sigma=0.0),
                                    dict(dim=3, level=3, sigma=-1.0),
                                    dict(dim=3, level=3, sigma=float("nan")),
                                    dict(dim=0, level=3), dict(dim=3, level=2.5)])
def test_sparse_grid_bad_input(kwargs):
    with pytest.raises(ValueError):
        sparse_grid(**kwargs)


def test_sparse_grid_too_large_is_refused_at_once_naming_the_size():
    """Issue 20 probe 16: sparse_grid(50, 8) used to run for minutes before running out."""
    from bpfree.pinn.sparse_grid import sparse_grid_size

    with pytest.raises(ValueError, match=r"sparse_grid\(dim=50, level=8\) is too large: .*2\.61e\+10 "
                                         r"tensor-grid points, the limit is 2,000,000"):
        sparse_grid(50, 8)
    with pytest.raises(ValueError, match="too large"):
        sparse_grid_size(50, 8)
    assert sparse_grid_size(21, 3) == 925  # the paper's rule stays well inside the limit
    # level 3 at D = 2000 would visit 1 + 4000 + 8,002,000 points
    with pytest.raises(ValueError, match=r"dim=2000, level=3\) is too large: .*8\.01e\+06"):
        sparse_grid(2000, 3)


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


def _rms(t):
    return float(t.pow(2).mean().sqrt())


@pytest.mark.parametrize("seed", range(5))
def test_stein_mc_against_smoothed(seed):
    """SteinMC converges to the derivatives of the σ-smoothed function (and, up to the O(σ²)
    smoothing bias, to AD's). Tolerances from the spread over seeds 0-29 at M = 20000, as
    mean + 5 sd of the RMS error over the 12 gradient / 12 Laplacian entries:
    vs smoothed, gradient 0.020 ± 0.007 (max 0.040), Laplacian 0.108 ± 0.055 (max 0.293);
    vs AD, gradient 0.032 ± 0.009 (max 0.066), Laplacian 0.127 ± 0.063 (max 0.374).
    The RMS of the smoothed values themselves is 1.24 (gradient) and 3.34 (Laplacian)."""
    sigma = 0.1
    se = SteinMC(sigma=sigma, num_samples=20000, seed=seed)
    g, l = se(sines, X)
    assert se.evaluations(D) == 40001
    gs, ls = sines_derivatives(X, sigma)
    assert _rms(g - gs) < 0.055 and _rms(l - ls) < 0.38, (_rms(g - gs), _rms(l - ls))
    g0, l0 = AutoDiff()(sines, X)
    assert _rms(g - g0) < 0.078 and _rms(l - l0) < 0.44, (_rms(g - g0), _rms(l - l0))


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


def test_poisson_exact_solution_has_zero_residual_under_ad():
    p = Poisson2D()
    batch = p.sample(32, n_boundary=16, generator=torch.Generator().manual_seed(1),
                     dtype=torch.float64)
    parts = pinn_loss(_Exact(p), p, AutoDiff(), batch)
    assert float(parts["residual"]) < 1e-24 and float(parts["boundary"]) < 1e-30


@pytest.mark.parametrize("backend", ["FD", "SG"])
def test_fo_training_on_the_2d_problem(backend):
    p = Poisson2D()
    net = dense_sine_mlp(2, 32, seed=0)
    b = get_backend(backend, **({"sigma": 0.05} if backend == "SG" else {}))
    r = train_fo(net, p, b, steps=300, batch_size=64, n_initial=0, n_boundary=32, lr=1e-2,
                 lambda_boundary=10.0, log_every=0)
    # Untrained MSE ≈ 0.36; training recovers u = sin(πx) sin(πy) to ~2e-3 (SG: the σ = 0.05
    # smoothing damps sin(πx)sin(πy) by e^{−σ²π²} ≈ 0.976, a floor of ~1e-4).
    assert r.val_mse < 0.02 * r.initial_val_mse and r.val_mse < 5e-3, r.val_mse
    if backend == "SG":
        assert b.evaluations(2) == 2 * 4 + 2 * 2 + 1        # 13 nodes: level 3 at D = 2


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
    # A network that does not declare in_features is probed at the problem's width.
    seq = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    with pytest.raises(ValueError, match="21 coordinates"):
        pinn_loss(seq, p, FiniteDifference(), p.sample(4))
    with pytest.raises(ValueError, match="21 coordinates"):
        transformed(seq, p)
    with pytest.raises(ValueError, match="21 coordinates"):
        train_zo(seq, p, "FD", steps=1)
    # Non-finite initial/boundary targets.
    batch = p.sample(4, 4)
    batch.initial_target[0, 0] = float("nan")
    with pytest.raises(ValueError, match="initial targets contain non-finite"):
        pinn_loss(transformed(dense_sine_mlp(21, 8), p), p, FiniteDifference(), batch)
    q = Poisson2D()
    batch = q.sample(4, n_boundary=4)
    batch.boundary[1, 0] = float("inf")
    with pytest.raises(ValueError, match="boundary points contain non-finite"):
        pinn_loss(dense_sine_mlp(2, 8), q, FiniteDifference(), batch)
    with pytest.raises(ValueError, match="allowed"):
        get_backend("SG", levle=3)


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


@pytest.mark.parametrize("backend", ["FD", "SE"])
def test_zo_training_with_fd_and_stein_mc(backend):
    p = HJB(20)
    net = transformed(tt_sine_mlp(21, 16, rank=2), p)
    b = get_backend(backend, **({"num_samples": 32} if backend == "SE" else {}))
    r = train_zo(net, p, b, steps=30, batch_size=4, n_initial=8, lr=3e-3, log_every=0)
    per = {"FD": 2 * 21 + 1, "SE": 2 * 32 + 1}[backend]
    assert r.loss_evaluations == 30 * 11
    assert r.point_evaluations == 30 * 11 * (4 * per + 8)
    assert r.val_mse < r.initial_val_mse
    assert all(p_.grad is None for p_ in net.parameters())


# -- benchmark (bpfree bench pinn) ------------------------------------------------------------

def _pinn_bench():
    from bpfree.bench.runner import load_module

    return load_module("pinn")


def _tiny_config(bench, quick=True, config=None):
    cfg = (config or bench._config)(quick)
    cfg.update(fo_steps=2, zo_steps=2, batch=2, n_initial=2, time_repeats=1, seeds=(0,))
    cfg["poisson"] = dict(cfg["poisson"], fo_steps=3, zo_steps=2, batch=4, n_boundary=4)
    return cfg


def test_benchmark_poisson_table_smoke():
    from bpfree.bench.runner import validate_rows

    bench = _pinn_bench()
    for quick in (True, False):        # both modes carry the Poisson-2D settings
        pc = bench._config(quick)["poisson"]
        assert pc["sigma"] == 0.05 and pc["width"] == 32 and pc["zo_steps"] >= 1000
    rows, runs = bench._poisson_table(_tiny_config(bench))
    validate_rows(rows)
    assert {r["table"] for r in rows} == {bench.TP}
    methods = ["FO+AD", "FO+FD", "FO+SE", "FO+SG", "ZO+FD", "ZO+SE", "ZO+SG"]
    metrics = ["test MSE (seed 0)", "evals per collocation point", "loss evaluations",
               "network point-evals (M)", "train time (s)"]
    cells = {(r["method"], r["metric"]): r["value"] for r in rows}
    assert sorted(cells) == sorted((m, k) for m in methods for k in metrics)
    assert all(math.isfinite(v) for v in cells.values())
    per = {"AD": 1, "FD": 5, "SE": 2 * 64 + 1, "SG": 13}          # D = 2
    for m in methods:
        kind, b = m.split("+")
        assert cells[(m, "evals per collocation point")] == per[b]
        assert cells[(m, "loss evaluations")] == (3 if kind == "FO" else 2 * 11)
        assert cells[(m, "train time (s)")] > 0
    assert all(r["setting"] == "FC-2 32 (2-32-1 sine), 129 params" for r in rows)


def _tiny_bench(tmp_path, monkeypatch):
    """The pinn benchmark with a few-step config, writing under ``tmp_path``."""
    bench = _pinn_bench()
    original = bench._config
    monkeypatch.setattr(bench, "_config", lambda quick: _tiny_config(bench, quick, original))
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    monkeypatch.setattr(bench, "FIGURES", tmp_path / "figures")
    return bench


def test_benchmark_run_smoke_has_train_time_columns(tmp_path, monkeypatch):
    from bpfree.bench.runner import validate_rows

    bench = _tiny_bench(tmp_path, monkeypatch)
    rows, extra = bench._run(True)
    validate_rows(rows)
    tables = [bench.T4, bench.T5, bench.T6, bench.TD, bench.TZ, bench.TP]
    assert sorted({r["table"] for r in rows}) == sorted(tables)
    for table, metric in ((bench.T4, "train time (s, mean over seeds)"),
                          (bench.T5, "train time (s, mean over seeds)"),
                          (bench.TP, "train time (s)")):
        methods = {r["method"] for r in rows if r["table"] == table}
        timed = {r["method"] for r in rows if r["table"] == table and r["metric"] == metric}
        assert methods == timed, table
    t6 = {r["metric"] for r in rows if r["table"] == bench.T6}
    assert {"FO-AD train time (s, mean over seeds)", "ZO-SG train time (s, mean over seeds)"} <= t6
    ids = {c["id"] for c in extra["claims"]}
    assert {"pinn-t4-fo-sg-beats-se", "pinn-t5-zo-sg-best", "pinn-t6-sp-best-fo"} <= ids
    probe = extra["zo_investigation"]
    assert sorted(probe["alignment"]) == sorted(f"{m:g}" for m in bench.ZO_MUS)
    assert sorted(probe["ablation"]) == sorted(f"{m:g}" for m in bench.ABLATION_MUS)
    d = 7745                                  # the paper's TT-3 768, whatever the mode
    assert probe["alignment"]["0.1"]["ideal_cosine"] == pytest.approx(math.sqrt(10 / d))
    # a ten times larger radius: ten times the perturbation relative to the weights
    assert probe["alignment"]["0.1"]["perturbation_to_weights"] == \
        pytest.approx(10 * probe["alignment"]["0.01"]["perturbation_to_weights"])
    assert all("Below the paper's budget" in c["note"] for c in extra["claims"])
    assert any("Poisson-2D table (quick)" in n for n in extra["notes"])
    assert all((tmp_path / f["path"]).exists() for f in extra["figures"])


def test_cost_projection_covers_every_full_run_once_and_scales_with_steps():
    from bpfree.bench.runner import load_module

    bench, cost = _pinn_bench(), load_module("pinn_cost")
    cfg = bench.planned_config()
    # issue 32: the plan is the run, at FULL_POINTS and FITTED_STEPS steps, a budget not
    # below the float32 run's (250 steps at 8 + 32 points)
    assert cfg == bench._config(False)
    assert (cfg["zo_steps"], cfg["fo_steps"], cfg["batch"], cfg["n_initial"]) == \
        (bench.FITTED_STEPS, bench.FITTED_STEPS, *bench.FULL_POINTS)
    assert bench.FITTED_STEPS >= 250 and cfg["batch"] >= 8 and cfg["n_initial"] >= 32
    assert (64, 128) in cost.POINT_OPTIONS and bench.FULL_POINTS in cost.POINT_OPTIONS
    tasks = cost.full_tasks(cfg, bench._models(cfg))
    # Tables 4-5 on the two networks (4 FO + 3 ZO backends each), Table 6 adds FO-AD and
    # ZO-SG on the three other networks; the shared runs are trained (and projected) once
    assert len(tasks) == len(set(tasks)) == 2 * 7 + 3 * 2
    assert ("ZO", "TT-3", "SG") in tasks and ("ZO", "SP-3", "SG") in tasks
    assert not any(kind == "ZO" and b == "AD" for kind, _, b in tasks)   # ZO has no AD
    per_step = {("FO", "a", "AD"): 0.5, ("ZO", "a", "SG"): 2.0}
    hours = cost.project(per_step, {"FO": 3000, "ZO": 600}, 3)
    assert hours[("FO", "a", "AD")] == pytest.approx(3 * 3000 * 0.5 / 3600)
    assert hours[("ZO", "a", "SG")] == pytest.approx(3 * 600 * 2.0 / 3600)
    assert cost.wall_hours(hours) == pytest.approx(sum(hours.values()) / cost.CORES)
    # one step of everything on 3 seeds: 3 * 2.5 s / 2 cores = 3.75 s; 2.5 h = 9000 s -> 2400
    assert cost.largest_fitting_steps(per_step, 3, 2.5, 3000) == 2400
    assert cost.largest_fitting_steps(per_step, 3, 2.5, 1000) == 1000
    assert cost.largest_fitting_steps({("FO", "a", "AD"): 0.0}, 3, 2.5, 3000) == 3000
    # every run bench pinn trains counts: 3 seeds, the search's candidates on seed 0 at
    # SEARCH_FRACTION of the steps (FO 5 lrs, ZO 4 radii) and ZO TT-3 SG's ablation runs
    runs = {t: cost.runs_per_task(bench, cfg, t) for t in tasks}
    assert runs[("FO", "TT-3", "AD")] == 3 + 5 * bench.SEARCH_FRACTION
    assert runs[("ZO", "FC-3 78", "SG")] == 3 + 4 * bench.SEARCH_FRACTION
    assert runs[("ZO", "TT-3", "SG")] == 3 + 4 * bench.SEARCH_FRACTION + 2
    assert cost.runs_per_task(bench, dict(cfg, search=False), ("FO", "TT-3", "AD")) == 3
    hours = cost.project(per_step, {"FO": 10, "ZO": 10}, {("FO", "a", "AD"): 4.25,
                                                        ("ZO", "a", "SG"): 6.0})
    assert hours[("ZO", "a", "SG")] == pytest.approx(6.0 * 10 * 2.0 / 3600)


@pytest.mark.slow  # a whole (tiny) full-mode run: 150 s under load, too long for CI's suite
def test_benchmark_full_mode_claims_say_the_fitted_budget(tmp_path, monkeypatch):
    bench = _tiny_bench(tmp_path, monkeypatch)
    rows, extra = bench._run(False)
    assert {r["method"] for r in rows if r["table"] == bench.T6} >= {"FC-3 768", "TT-3"}
    # the full mode's search ran on seed 0 and is recorded, every candidate scored
    search = extra["search"]
    assert "ZO TT-3 SG" in search and "FO TT-3 AD" in search
    assert sorted(search["ZO TT-3 SG"]["candidates"]) == sorted(f"{m:.3g}" for m in bench.ZO_MUS)
    for entry in search.values():
        scores = entry["candidates"]
        assert scores[f"{entry['chosen']:.3g}"] == min(scores.values())
    assert any("Search (full)" in n for n in extra["notes"])
    for c in extra["claims"]:
        assert "§5.2 states no step count" in c["note"], c["id"]
        assert "2 FO / 2 ZO steps with 2 residual + 2 terminal points" in c["note"], c["id"]
        assert "unmeasured number of wall hours" in c["note"]      # no pinn-cost.json in ROOT
    root = Path(__file__).resolve().parent.parent
    monkeypatch.setattr(bench, "ROOT", root)
    extra = json.loads((root / "results" / "pinn-cost.json").read_text())["extra"]
    for budget in extra.get("budgets", []):   # results/pinn-cost.json's projection at its points
        assert bench._planned_wall_hours(100, budget["points"]) == \
            f"{100 * budget['wall_hours_per_step']:.1f}"
    assert bench._planned_wall_hours(100, (3, 5)) == "an unmeasured number of"


def test_poisson_sigma_facts_match_the_closed_form():
    bench = _pinn_bench()
    pts = torch.rand(200, 2, generator=torch.Generator().manual_seed(0))
    for sigma in (0.1, 0.05):
        f = bench._poisson_sigma_facts(sigma, pts)
        assert f["factor"] == pytest.approx(math.exp(-(sigma * math.pi) ** 2))
        u2 = (torch.sin(math.pi * pts[:, 0].double()) * torch.sin(math.pi * pts[:, 1].double())) ** 2
        assert f["mse_floor"] == pytest.approx((1 - f["factor"]) ** 2 * float(u2.mean()))
        # a level-3 Gauss-Hermite grid integrates e^(iπδ) to within a few % at σ ≤ 0.1:
        # its Laplacian of sin·sin is a slightly damped Δu, the damping growing with σ
        assert f["factor"] < f["grid_laplacian_ratio"] < 1.0
    assert bench._poisson_sigma_facts(0.1, pts)["grid_laplacian_ratio"] < \
        bench._poisson_sigma_facts(0.05, pts)["grid_laplacian_ratio"]


def test_search_gives_fo_and_zo_the_same_budget_and_picks_the_lowest_validation_mse():
    bench = _pinn_bench()
    cfg = bench._config(False)
    assert cfg["search"] and not bench._config(True).get("search")
    fo, zo = bench.search_candidates("FO", cfg), bench.search_candidates("ZO", cfg)
    assert len(fo) == len(zo) + 1 == 5 and bench.PAPER_MU in zo
    assert fo == pytest.approx([cfg["fo_lr"] * f for f in (0.1, 1 / 3, 1, 3, 10)])
    # issue 32: one step past every edge the float32 full run's search picked
    assert min(zo) < 1e-3 and max(zo) == bench.PAPER_MU
    assert bench.pick_lowest([0.1, 0.01, 0.001], [3e-3, 5e-4, 9e-4]) == 0.01
    assert bench.pick_lowest([0.1, 0.01], [1e-3, 1e-3]) == 0.1            # tie: the first
    inf, nan = float("inf"), float("nan")
    assert bench.pick_lowest([0.1, 0.01, 0.001], [nan, inf, 2.0]) == 0.001
    assert bench.pick_lowest([0.1, 0.01], [nan, inf]) == 0.1



def test_pinn_zo_probe_reads_only_a_full_runs_zo_sg_seeds(tmp_path):
    """The probe divides the full run's ZO-SG test MSEs by its own untrained ones: it takes
    exactly the "ZO <network> SG" entries of a full result, and nothing from a quick one
    (narrower networks) or a missing file."""
    import json

    from bpfree.bench.runner import load_module

    probe = load_module("pinn_zo_probe")
    path = tmp_path / "pinn.json"
    assert probe.full_run_zo(path) is None
    per_seed = {"ZO TT-3 SG": [1e-3, 2e-3], "ZO FC-3 768 SG": [5e-4, 6e-4],
                "ZO TT-3 SE": [9.0, 9.0], "FO TT-3 SG": [9.0, 9.0]}
    path.write_text(json.dumps({"quick": True, "extra": {"per_seed_test_mse": per_seed}}))
    assert probe.full_run_zo(path) is None
    path.write_text(json.dumps({"quick": False, "extra": {"per_seed_test_mse": per_seed}}))
    assert probe.full_run_zo(path) == {"TT-3": [1e-3, 2e-3], "FC-3 768": [5e-4, 6e-4]}


def test_pinn_zo_probe_derivative_errors_separate_rounding_from_the_estimator():
    """In float64, central differences (h = 0.01) match AD's Laplacian to ~1e-5 and the
    Monte-Carlo Stein estimate does not (its sampling error); float32 rounding can only add
    error to the deterministic FD. The network is left in float32 afterwards."""
    import torch

    from bpfree.bench.runner import load_module
    from bpfree.pinn import HJB

    probe, pinn = load_module("pinn_zo_probe"), _pinn_bench()
    problem = HJB(20)
    base = pinn._models(pinn._config(False), 0)["FC-3 78"]()
    points = problem.sample(8, 0, generator=torch.Generator().manual_seed(7)).interior
    err = probe.derivative_errors_by_dtype(pinn, base, problem, points)
    assert set(err) == {"float64", "float32"}
    assert err["float64"]["FD"]["laplacian"] < 1e-4 and err["float64"]["FD"]["gradient"] < 1e-4
    assert err["float64"]["SE"]["laplacian"] > 10 * err["float64"]["FD"]["laplacian"]
    assert err["float32"]["FD"]["laplacian"] > err["float64"]["FD"]["laplacian"]
    assert next(base.parameters()).dtype == torch.float32


def test_full_mode_runs_in_float64_and_its_grid_and_fd_laplacians_reach_the_probes_level():
    """Issue 32: the full run's networks and points are float64, so the sparse grid's and FD's
    Laplacians of the paper's TT-3 768 against float64 AD fall from float32's ~0.49 to the
    float64 level bench pinn-zo-probe measured (SG 0.054, FD 2.9e-6 on 64 points): here
    below 0.1 and 1e-4, where the same network in float32 is above 0.3 for both."""
    import torch

    from bpfree.pinn import HJB, AutoDiff

    pinn = _pinn_bench()
    problem, cfg = HJB(20), pinn._config(False)
    assert cfg["dtype"] == "float64" and pinn._config(True)["dtype"] == "float32"
    net = pinn.network(cfg, "TT-3", problem, 0)
    assert {p.dtype for p in net.parameters()} == {torch.float64}
    assert pinn.eval_points(problem, cfg, pinn.VAL_SEED).dtype == torch.float64
    points = problem.sample(16, 0, generator=torch.Generator().manual_seed(7),
                            dtype=torch.float64).interior
    reference = [t.detach() for t in AutoDiff()(net.network, points,
                                                laplacian_dims=problem.laplacian_dims)]
    # through the runs' evaluation path (Transformed.network_fn: SineMLP.forward_shifted)
    f64 = pinn.derivative_errors(net.network_fn(), problem, points, reference)
    assert f64["SG"]["laplacian"] < 0.1 and f64["FD"]["laplacian"] < 1e-4
    net.float()                       # the same network in float32, as before issue 32
    f32 = pinn.derivative_errors(net.network_fn(), problem, points.float(), reference)
    assert f32["SG"]["laplacian"] > 0.3 and f32["FD"]["laplacian"] > 0.3


def test_zo_training_samples_points_in_the_networks_dtype():
    from bpfree.pinn import HJB, dense_sine_mlp, train_zo, transformed

    problem = HJB(4)
    net = transformed(dense_sine_mlp(5, 8, seed=0).double(), problem)
    res = train_zo(net, problem, "FD", steps=2, batch_size=4, n_initial=4, lr=1e-3,
                   log_every=0, val_points=problem.validation_points(16, dtype=torch.float64))
    assert math.isfinite(res.val_mse) and {p.dtype for p in net.parameters()} == {torch.float64}


def test_grid_and_fd_laplacians_of_a_known_quadratic_reach_float64_rounding_in_the_full_dtype():
    """Issue 32, on a known function: u = 2 + 0.05‖x‖² + 0.02·x₀x₁ in D = 21 (values near 3,
    Laplacian 2.1, like the transformed network's scale). Central differences and the level-3
    grid (exact to total degree 5, Eq. 13's integrands here have degree 4) are exact for a
    quadratic, so their error against float64 AD is rounding alone: in the full run's dtype
    (float64) below 1e-8, in float32 above 1e-2 (the FD quotient divides values near 3 by
    h² = 1e-4; the grid sums weights of absolute sum 841 over σ⁴)."""
    import torch

    from bpfree.pinn import AutoDiff

    pinn = _pinn_bench()
    dtype = getattr(torch, pinn._config(False)["dtype"])

    def u(x):
        return 2.0 + 0.05 * (x * x).sum(-1, keepdim=True) + 0.02 * x[:, :1] * x[:, 1:2]

    x = torch.rand(32, 21, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    _, exact = AutoDiff()(u, x)
    assert torch.allclose(exact, torch.full_like(exact, 2.1))

    def error(name, dt):
        _, lap = pinn._backend(name)(u, x.to(dt))
        return float((lap.double() - exact).norm() / exact.norm())

    for name in ("FD", "SG"):
        assert error(name, dtype) < 1e-8, name
        assert error(name, torch.float32) > 1e-2, name


def _three_kinds_and_two_layers():
    from torch import nn

    from bpfree.pinn import SineMLP, dense_sine_mlp, pruned_sine_mlp, tt_sine_mlp

    torch.manual_seed(0)
    return {"dense": dense_sine_mlp(21, 24, seed=0), "tt": tt_sine_mlp(21, 64, rank=3, seed=0),
            "pruned": pruned_sine_mlp(21, 64, trainable=400, seed=0),
            "two-layer": SineMLP([nn.Linear(21, 20), nn.Linear(20, 2)], 21, "dense")}


@pytest.mark.parametrize("kind", ["dense", "tt", "pruned", "two-layer"])
def test_forward_shifted_is_the_forward_at_every_shifted_point(kind):
    """Issue 32: SineMLP.forward_shifted (first layer by angle addition, chunked buffers
    without gradients) is forward at every x_b + s_k, to float64 rounding, and so are its
    parameter gradients; in float32 weights' dtype it computes in the points' dtype."""
    net = _three_kinds_and_two_layers()[kind].double()
    net.shifted_rows = 7                                   # several chunks, one ragged
    g = torch.Generator().manual_seed(1)
    x = torch.rand(5, 21, generator=g, dtype=torch.float64)
    shifts = 0.1 * torch.randn(3, 21, generator=g, dtype=torch.float64)
    ref = net((x[:, None] + shifts[None]).reshape(-1, 21)).reshape(5, 3, -1)
    with torch.no_grad():
        assert torch.allclose(net.forward_shifted(x, shifts), ref, rtol=0, atol=1e-12)
    out = net.forward_shifted(x, shifts)
    assert torch.allclose(out, ref.detach(), rtol=0, atol=1e-12)
    params = [p for p in net.parameters() if p.requires_grad]
    got = torch.autograd.grad(out.square().sum(), params)
    want = torch.autograd.grad(ref.square().sum(), params)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    with torch.no_grad():
        low = net.forward_shifted(x.float(), shifts.float())
    assert low.dtype == torch.float32 and torch.allclose(low.double(), ref.detach(), atol=1e-5)
    with pytest.raises(ValueError, match="shifts"):
        net.forward_shifted(x, shifts[:, :5])


def _sine_net_and_laplacians(sigma):
    """A 21-20-2 sine net and its exact Laplacians: of the net, and of its σ-smoothed version
    (E sin(w·(x+δ)+b) = exp(−σ²‖w‖²/2) sin(w·x+b) for δ ~ N(0, σ²I))."""
    net = _three_kinds_and_two_layers()["two-layer"].double()
    first, last = net.layers
    x = torch.rand(8, 21, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with torch.no_grad():
        a = x @ first.weight.t() + first.bias                   # (B, H)
        sq = (first.weight ** 2).sum(1)                         # ‖w_j‖²
        exact = -(a.sin() * sq) @ last.weight.t()               # (B, n)
        smoothed = -(a.sin() * sq * torch.exp(-sigma ** 2 * sq / 2)) @ last.weight.t()
    return net, x, exact, smoothed


def test_backends_through_the_shared_work_path_reach_the_analytic_laplacians_in_float64():
    """FD and the sparse grid through ShiftedFn (the runs' path) against the closed-form
    Laplacians of a sine net: FD's O(h²) error leaves it within 1e-5 of the exact one, the
    grid's quadrature error (level 3 is exact to degree 5, so the net's degree-4 Taylor terms,
    of relative size ~(σ‖w‖)², σ‖w‖ ≈ 0.06 here, remain) within 2 % of the smoothed one; and
    both agree with the plain path (fn on the B·K rows) to float64 rounding."""
    from bpfree.pinn import FiniteDifference, ShiftedFn, SparseGridStein

    net, x, exact, smoothed = _sine_net_and_laplacians(0.1)
    fn = ShiftedFn(net, net.forward_shifted)
    with torch.no_grad():
        for backend, want, tol in ((FiniteDifference(h=0.01), exact, 1e-5),
                                   (SparseGridStein(0.1), smoothed, 2e-2)):
            _, lap = backend(fn, x)
            assert float((lap - want).norm() / want.norm()) < tol, backend.name
            _, plain = backend(net, x)
            assert float((lap - plain).norm() / plain.norm()) < 1e-9, backend.name
            assert backend.forward_evaluations == 2 * len(x) * backend.evaluations(21)


def test_stein_mc_float32_values_round_far_below_its_sampling_noise():
    """Issue 32: SE's equal positive weights average its values' rounding out, so computing
    them in float32 (compute_dtype, the runs' SE_DTYPE) moves the Laplacian by far less than
    a fresh draw of directions does (here under 1 % of it)."""
    from bpfree.pinn import ShiftedFn, SteinMC

    net, x, _, smoothed = _sine_net_and_laplacians(0.1)
    fn = ShiftedFn(net, net.forward_shifted)
    with torch.no_grad():
        draws = [SteinMC(0.1, 256, seed=s)(fn, x)[1] for s in range(4)]
        low = SteinMC(0.1, 256, seed=0, compute_dtype=torch.float32)(fn, x)[1]
    assert low.dtype == torch.float64
    stack = torch.stack(draws)
    sampling = float((stack - stack.mean(0)).norm() / stack.mean(0).norm())
    rounding = float((low - draws[0]).norm() / draws[0].norm())
    assert 0 < rounding < 0.01 * sampling
    with pytest.raises(ValueError, match="compute_dtype"):
        SteinMC(compute_dtype=torch.int32)
