"""Loss-landscape utilities (QZO-FF Fig. 6; Li et al. 2018 trajectory-PCA plots)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from bpfree.landscape import (TrajectoryRecorder, flatten_params, landscape_figure, loss_surface,
                              pca_directions, plot_landscape, project, set_flat_params_)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class Quadratic(nn.Module):
    """loss = 0.5 * sum(h * (theta - t)^2), theta = [w.flatten(), b]: a known quadratic."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([[0.5, -1.0], [2.0, 0.25]], dtype=torch.float64))
        self.b = nn.Parameter(torch.tensor([0.3, -0.7], dtype=torch.float64))
        self.frozen = nn.Parameter(torch.ones(3, dtype=torch.float64), requires_grad=False)
        self.register_buffer("h", torch.tensor([1.0, 2.0, 3.0, 0.5, 4.0, 1.5], dtype=torch.float64))
        self.register_buffer("t", torch.tensor([0.1, 0.2, -0.3, 0.4, 0.0, -1.0],
                                               dtype=torch.float64))

    def loss(self) -> torch.Tensor:
        theta = torch.cat([self.w.reshape(-1), self.b])
        return 0.5 * (self.h * (theta - self.t) ** 2).sum()


def _plane(d: int = 40, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, 2, generator=g, dtype=torch.float64))
    center = torch.randn(d, generator=g, dtype=torch.float64)
    return center, q.T.contiguous(), g  # directions (2, d), orthonormal


# --------------------------------------------------------------------------- parameters

def test_flatten_and_set_roundtrip_and_subset():
    m = Quadratic()
    flat = flatten_params(m)
    assert flat.shape == (6,)  # frozen parameter excluded by default
    assert torch.equal(flat, torch.tensor([0.5, -1.0, 2.0, 0.25, 0.3, -0.7], dtype=torch.float64))
    sub = flatten_params(m, ["b", "frozen"])
    assert torch.equal(sub, torch.tensor([0.3, -0.7, 1.0, 1.0, 1.0], dtype=torch.float64))
    set_flat_params_(m, torch.arange(6, dtype=torch.float32))
    assert torch.equal(m.w, torch.tensor([[0.0, 1.0], [2.0, 3.0]], dtype=torch.float64))
    assert torch.equal(m.b, torch.tensor([4.0, 5.0], dtype=torch.float64))
    set_flat_params_(m, torch.zeros(2), names=["b"])
    assert torch.equal(m.b, torch.zeros(2, dtype=torch.float64))
    assert flat.data_ptr() != m.w.data_ptr()  # a copy, not a view


def test_bad_parameter_input_raises():
    m = Quadratic()
    with pytest.raises(ValueError, match="unknown parameter"):
        flatten_params(m, ["w", "nope"])
    with pytest.raises(ValueError, match="more than once"):
        flatten_params(m, ["w", "w"])
    with pytest.raises(ValueError, match="6"):
        set_flat_params_(m, torch.zeros(5))
    with pytest.raises(ValueError, match="1-D"):
        set_flat_params_(m, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="unknown parameter"):
        TrajectoryRecorder(m, ["bias"])
    with pytest.raises(ValueError, match="every"):
        TrajectoryRecorder(m, every=0)


def test_recorder_every_and_force():
    m = Quadratic()
    rec = TrajectoryRecorder(m, names=["b"], every=3)
    for step in range(7):
        with torch.no_grad():
            m.b.fill_(float(step))
        rec.record()
    assert rec.steps == [0, 3, 6]
    assert [float(s[0]) for s in rec.snapshots] == [0.0, 3.0, 6.0]
    with torch.no_grad():
        m.b.fill_(9.0)
    assert rec.record(force=True)
    assert rec.steps == [0, 3, 6, 7] and len(rec) == 4
    assert rec.stacked().shape == (4, 2)
    assert rec.snapshots[0].device.type == "cpu"


# --------------------------------------------------------------------------- PCA plane

def test_pca_recovers_known_plane_and_pools_trajectories():
    center, plane, g = _plane(d=50)
    ab1 = torch.randn(12, 2, generator=g, dtype=torch.float64) * torch.tensor([3.0, 0.5])
    ab2 = torch.randn(8, 2, generator=g, dtype=torch.float64)
    traj1 = [center + c @ plane for c in ab1]
    traj2 = torch.stack([center + c @ plane for c in ab2])  # an (n, D) tensor is accepted too
    dirs, evr = pca_directions([traj1, traj2], center, k=2)
    assert dirs.shape == (2, 50)
    assert torch.allclose(dirs @ dirs.T, torch.eye(2, dtype=torch.float64), atol=1e-12)
    # Same span: projecting the known basis onto the found one loses nothing (and vice versa).
    assert torch.allclose((plane @ dirs.T) @ dirs, plane, atol=1e-10)
    assert torch.allclose((dirs @ plane.T) @ plane, dirs, atol=1e-10)
    assert evr.shape == (2,) and np.isclose(evr.sum(), 1.0) and evr[0] >= evr[1] > 0
    # Every snapshot of both trajectories is reconstructed from its 2-D coordinates.
    for traj in (traj1, traj2):
        c = torch.from_numpy(project(traj, center, dirs))
        recon = center + c @ dirs
        assert torch.allclose(recon, torch.stack(list(traj)), atol=1e-10)
    # Sign convention: the first trajectory starts at non-positive coordinates.
    assert np.all(project([traj1[0]], center, dirs) <= 1e-12)


def test_pca_noisy_plane_explains_most_variance():
    center, plane, g = _plane(d=30, seed=1)
    # Uncorrelated coordinates with variances 25 : 4, so the principal axes are plane's rows.
    q, _ = torch.linalg.qr(torch.randn(40, 2, generator=g, dtype=torch.float64))
    ab = q * torch.tensor([5.0, 2.0]) * 40 ** 0.5
    snaps = center + ab @ plane + 1e-3 * torch.randn(40, 30, generator=g, dtype=torch.float64)
    dirs, evr = pca_directions([snaps], center, k=3)
    assert dirs.shape == (3, 30) and evr[:2].sum() > 0.999
    assert torch.allclose(dirs @ dirs.T, torch.eye(3, dtype=torch.float64), atol=1e-10)
    # The directions align with the known ones, in order of variance.
    assert abs(float(dirs[0] @ plane[0])) > 0.9999 and abs(float(dirs[1] @ plane[1])) > 0.9999
    assert np.isclose(evr[0] / evr[1], 25 / 4, rtol=1e-3)


def test_pca_matches_svd_on_small_chunks():
    g = torch.Generator().manual_seed(3)
    center = torch.randn(17, generator=g, dtype=torch.float64)
    snaps = torch.randn(9, 17, generator=g, dtype=torch.float64)
    dirs, evr = pca_directions([snaps], center, k=2, chunk=5)
    _, s, vh = torch.linalg.svd(snaps - center, full_matrices=False)
    for i in range(2):
        assert abs(abs(float(dirs[i] @ vh[i])) - 1.0) < 1e-10
    assert np.allclose(evr, (s[:2] ** 2 / (s ** 2).sum()).numpy(), atol=1e-12)


def test_project_returns_known_coordinates():
    center, plane, g = _plane(d=25, seed=2)
    ab = torch.randn(15, 2, generator=g, dtype=torch.float64)
    pts = [center + a * plane[0] + b * plane[1] for a, b in ab]
    coords = project(pts, center, plane)
    assert coords.shape == (15, 2)
    assert np.allclose(coords, ab.numpy(), atol=1e-12)
    # Least squares also for independent, non-orthonormal directions; off-plane parts dropped.
    skew = torch.stack([plane[0], plane[0] + 2 * plane[1]])
    normal = torch.randn(25, generator=g, dtype=torch.float64)
    normal -= (plane @ normal) @ plane
    pts2 = torch.stack([center + a * skew[0] + b * skew[1] + normal for a, b in ab])
    assert np.allclose(project(pts2, center, skew), ab.numpy(), atol=1e-10)


def test_pca_and_project_bad_input_raises():
    center = torch.zeros(6, dtype=torch.float64)
    snaps = [torch.randn(6, dtype=torch.float64) for _ in range(3)]
    with pytest.raises(ValueError, match="at least 4 snapshots"):
        pca_directions([snaps], center, k=4)
    with pytest.raises(ValueError, match="entries"):
        pca_directions([snaps, [torch.zeros(5)]], center)
    with pytest.raises(ValueError, match="different sizes"):
        pca_directions([snaps + [torch.zeros(5)]], center)
    with pytest.raises(ValueError, match="entries"):
        pca_directions([snaps], torch.zeros(7))
    with pytest.raises(ValueError, match="no plane"):
        pca_directions([[center.clone(), center.clone()]], center)
    with pytest.raises(ValueError, match="list of trajectories"):
        pca_directions(torch.stack(snaps), center)
    with pytest.raises(ValueError, match="k must be"):
        pca_directions([snaps], center, k=0)
    with pytest.raises(ValueError, match="entries"):
        project(snaps, center, torch.zeros(2, 5))
    with pytest.raises(ValueError, match="entries"):
        project([torch.zeros(5)], center, torch.eye(6)[:2])


# --------------------------------------------------------------------------- loss grid

def _analytic(model: Quadratic, center, dirs, alphas, betas) -> np.ndarray:
    h, t = model.h.numpy(), model.t.numpy()
    c, d = center.numpy(), dirs.numpy()
    out = np.empty((len(betas), len(alphas)))
    for j, b in enumerate(betas):
        for i, a in enumerate(alphas):
            th = c + a * d[0] + b * d[1]
            out[j, i] = 0.5 * np.sum(h * (th - t) ** 2)
    return out


def test_loss_surface_matches_quadratic_and_restores_parameters():
    m = Quadratic()
    m.train()
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    center = flatten_params(m) + 0.05  # a centre other than the current weights
    g = torch.Generator().manual_seed(4)
    dirs, _ = torch.linalg.qr(torch.randn(6, 2, generator=g, dtype=torch.float64))
    dirs = dirs.T.contiguous()
    alphas, betas, losses = loss_surface(m, lambda mod: mod.loss(), center, dirs,
                                         span=(-1.0, 2.0, -0.5, 0.5), steps=(7, 5))
    assert np.allclose(alphas, np.linspace(-1, 2, 7))
    assert np.allclose(betas, np.linspace(-0.5, 0.5, 5))
    assert losses.shape == (5, 7)
    assert np.allclose(losses, _analytic(m, center, dirs, alphas, betas), rtol=1e-12, atol=1e-12)
    for n, p in m.named_parameters():
        assert torch.equal(p, before[n])
    assert m.training  # eval() during the sweep, train flag restored


def test_loss_surface_grid_from_coords_and_subset():
    m = Quadratic()
    center = flatten_params(m, ["b"])
    dirs = torch.eye(2, dtype=torch.float64)
    coords = {"bp": np.array([[-2.0, -1.0], [-1.0, -0.5], [0.0, 0.0]]),
              "ff": np.array([[-1.0, 1.0], [0.0, 0.0]])}
    alphas, betas, losses = loss_surface(m, lambda mod: mod.loss(), center, dirs, names=["b"],
                                         coords=coords, steps=11, margin=0.25)
    assert np.isclose(alphas[0], -2.5) and np.isclose(alphas[-1], 0.5)  # extent 2, margin 0.5
    assert np.isclose(betas[0], -1.5) and np.isclose(betas[-1], 1.5)    # extent 2, margin 0.5
    # Only b moves: loss = const(w) + 0.5 * sum h_b (b - t_b)^2.
    w_part = 0.5 * np.sum(m.h.numpy()[:4] * (m.w.detach().numpy().ravel() - m.t.numpy()[:4]) ** 2)
    hb, tb, b0 = m.h.numpy()[4:], m.t.numpy()[4:], center.numpy()
    expect = np.array([[w_part + 0.5 * np.sum(hb * (b0 + [a, b] - tb) ** 2) for a in alphas]
                       for b in betas])
    assert np.allclose(losses, expect, rtol=1e-12)
    assert torch.equal(flatten_params(m, ["b"]), center)


def test_loss_surface_restores_parameters_when_loss_fn_raises():
    m = Quadratic()
    m.train()
    before = flatten_params(m)
    calls = []

    def failing(mod):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("boom")
        return mod.loss()

    with pytest.raises(RuntimeError, match="boom"):
        loss_surface(m, failing, before + 1.0, torch.eye(6, dtype=torch.float64)[:2], span=1.0,
                     steps=3)
    assert torch.equal(flatten_params(m), before)
    assert m.training


def test_loss_surface_bad_input_raises():
    m = Quadratic()
    c = flatten_params(m)
    d = torch.eye(6, dtype=torch.float64)[:2]
    f = lambda mod: mod.loss()  # noqa: E731
    with pytest.raises(ValueError, match="center has 5"):
        loss_surface(m, f, c[:5], d, span=1.0)
    with pytest.raises(ValueError, match="directions have 5"):
        loss_surface(m, f, c, d[:, :5], span=1.0)
    with pytest.raises(ValueError, match="k >= 2"):
        loss_surface(m, f, c, d[:1], span=1.0)
    with pytest.raises(ValueError, match="coords"):
        loss_surface(m, f, c, d)
    with pytest.raises(ValueError, match="unknown parameter"):
        loss_surface(m, f, c, d, names=["x"], span=1.0)
    with pytest.raises(ValueError, match="steps"):
        loss_surface(m, f, c, d, span=1.0, steps=1)
    before = flatten_params(m)
    assert torch.equal(before, c)


# --------------------------------------------------------------------------- figure

def test_plot_landscape_writes_png(tmp_path):
    a = np.linspace(-1, 1, 9)
    b = np.linspace(-2, 2, 7)
    z = 0.01 + (a[None, :] ** 2 + 3 * b[:, None] ** 2) * 10  # positive, spans decades: log levels
    trajs = {"BP": np.array([[-0.9, -1.8], [-0.3, -0.5], [0.0, 0.0]]),
             "FF": torch.tensor([[0.8, 1.5], [0.1, 0.2]])}
    out = plot_landscape(a, b, z, trajs, tmp_path / "sub" / "landscape.png", title="test",
                         explained_variance_ratio=np.array([0.8, 0.15]))
    assert out.exists() and out.read_bytes()[:8] == PNG_SIGNATURE
    lin = plot_landscape(a, b, z - 50.0, None, tmp_path / "lin.png")  # negative: linear levels
    assert lin.read_bytes()[:8] == PNG_SIGNATURE
    with pytest.raises(ValueError, match="losses must be"):
        plot_landscape(a, b, z.T, trajs, tmp_path / "bad.png")
    with pytest.raises(ValueError, match="positive"):
        plot_landscape(a, b, z - 50.0, None, tmp_path / "bad.png", log_levels=True)


def test_end_to_end_two_optimisers(tmp_path):
    """BP (exact gradient) and a crude forward-difference 'FF' run share one plane and figure."""
    def run(kind: str) -> TrajectoryRecorder:
        torch.manual_seed(0)
        m = Quadratic()
        rec = TrajectoryRecorder(m)
        rec.record()
        gen = torch.Generator().manual_seed(1)
        for _ in range(15):
            if kind == "bp":
                m.zero_grad()
                m.loss().backward()
                grads = [p.grad for p in (m.w, m.b)]
            else:
                theta = flatten_params(m)
                u = torch.randn(theta.numel(), generator=gen, dtype=torch.float64)
                with torch.no_grad():
                    base = m.loss()
                    set_flat_params_(m, theta + 1e-4 * u)
                    dd = (m.loss() - base) / 1e-4
                    set_flat_params_(m, theta)
                g = dd * u
                grads = [g[:4].view(2, 2), g[4:]]
            with torch.no_grad():
                for p, gr in zip((m.w, m.b), grads):
                    p -= 0.05 * gr
            rec.record()
        return rec, m

    bp, model = run("bp")
    ff, _ = run("ff")
    res = landscape_figure(model, lambda mod: mod.loss(), {"BP": bp, "FF": ff},
                           tmp_path / "fig6.png", steps=9)
    assert res["path"].read_bytes()[:8] == PNG_SIGNATURE
    assert res["losses"].shape == (9, 9) and np.all(np.isfinite(res["losses"]))
    assert np.allclose(res["coords"]["BP"][-1], 0.0, atol=1e-12)  # ends at the centre
    assert res["coords"]["FF"].shape == (16, 2)
    assert torch.equal(flatten_params(model), bp.snapshots[-1])
