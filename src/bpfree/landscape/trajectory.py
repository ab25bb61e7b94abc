"""Training trajectories and their PCA plane (QZO-FF Fig. 6, after Li et al. 2018 §7): the
selected parameters flattened and written back, :class:`TrajectoryRecorder`, and
:func:`pca_directions` / :func:`project` onto the plane shared by all trajectories."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import nn


__all__ = ["TrajectoryRecorder", "flatten_params", "pca_directions", "project",
           "set_flat_params_"]


# --------------------------------------------------------------------------- parameters

def _selected(model: nn.Module, names: Iterable[str] | None) -> list[tuple[str, torch.Tensor]]:
    """``(name, parameter)`` pairs: ``names`` in the given order, or all trainable ones."""
    if names is None:
        chosen = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not chosen:
            raise ValueError("the model has no parameters with requires_grad=True; "
                             "pass `names` explicitly")
        return chosen
    if isinstance(names, str):
        names = [names]
    names = list(names)
    if not names:
        raise ValueError("`names` is empty: select at least one parameter")
    params = dict(model.named_parameters())
    unknown = [n for n in names if n not in params]
    if unknown:
        known = list(params)
        raise ValueError(f"unknown parameter name(s) {unknown}; the model has {len(known)} "
                         f"parameters, e.g. {known[:6]}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"parameter name(s) listed more than once: {dup}")
    return [(n, params[n]) for n in names]


def flatten_params(model: nn.Module, names: Iterable[str] | None = None, *,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
    """A detached 1-D copy of the selected parameters, concatenated in selection order.

    ``names``: parameter names (``model.named_parameters()`` keys) in the order wanted; default
    all parameters with ``requires_grad``. ``dtype``: default the promoted dtype of the
    selection (so no value is rounded). Lies on the parameters' device.
    Raises ValueError on unknown, duplicate or empty names.
    """
    chosen = _selected(model, names)
    if dtype is None:
        dtype = chosen[0][1].dtype
        for _, p in chosen[1:]:
            dtype = torch.promote_types(dtype, p.dtype)
    return torch.cat([p.detach().reshape(-1).to(dtype) for _, p in chosen]).clone()


def set_flat_params_(model: nn.Module, vec: torch.Tensor, names: Iterable[str] | None = None
                     ) -> nn.Module:
    """Write the 1-D ``vec`` (layout of :func:`flatten_params`) into the selected parameters.

    Each slice is cast to its parameter's dtype and device. Raises ValueError when ``vec`` is
    not 1-D or its length differs from the selection's total size. Returns ``model``.
    """
    chosen = _selected(model, names)
    vec = torch.as_tensor(vec)
    total = sum(p.numel() for _, p in chosen)
    if vec.dim() != 1:
        raise ValueError(f"expected a 1-D parameter vector, got shape {tuple(vec.shape)}")
    if vec.numel() != total:
        raise ValueError(f"vector has {vec.numel()} entries but the {len(chosen)} selected "
                         f"parameters have {total}")
    offset = 0
    with torch.no_grad():
        for _, p in chosen:
            n = p.numel()
            p.copy_(vec[offset:offset + n].view_as(p).to(device=p.device, dtype=p.dtype))
            offset += n
    return model


class TrajectoryRecorder:
    """Flattened snapshots of the selected parameters along training.

    Call :meth:`record` after each optimiser step (and once before training to include the
    starting point). The calls numbered 0, ``every``, ``2*every``, ... store a snapshot;
    ``record(force=True)`` always stores (e.g. the final point when the step count is not a
    multiple of ``every``). Snapshots are detached copies moved to ``device`` (default CPU, to
    keep accelerator memory free); ``steps`` holds each snapshot's call number.
    """

    def __init__(self, model: nn.Module, names: Iterable[str] | None = None, every: int = 1, *,
                 device: str | torch.device | None = "cpu") -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"`every` must be a positive integer, got {every!r}")
        self.model = model
        self.names = None if names is None else [n for n, _ in _selected(model, names)]
        _selected(model, self.names)  # validate now rather than at the first record()
        self.every = every
        self.device = device
        self.snapshots: list[torch.Tensor] = []
        self.steps: list[int] = []
        self._calls = 0

    def record(self, force: bool = False) -> bool:
        """Store a snapshot when this call is due (or ``force``); returns whether it did."""
        call = self._calls
        self._calls += 1
        if not force and call % self.every:
            return False
        if self.steps and self.steps[-1] == call:  # already stored this call
            return False
        vec = flatten_params(self.model, self.names)
        if self.device is not None:
            vec = vec.to(self.device)
        self.snapshots.append(vec)
        self.steps.append(call)
        return True

    def stacked(self) -> torch.Tensor:
        """The snapshots as one ``(n, D)`` tensor."""
        if not self.snapshots:
            raise ValueError("no snapshots recorded yet")
        return torch.stack(self.snapshots)

    def __len__(self) -> int:
        return len(self.snapshots)


# --------------------------------------------------------------------------- PCA plane

def _as_matrix(snapshots, what: str = "snapshots") -> torch.Tensor:
    """A trajectory (list of 1-D tensors, an (n, D) tensor/array or a recorder) as (n, D)."""
    if isinstance(snapshots, TrajectoryRecorder):
        snapshots = snapshots.snapshots
    if isinstance(snapshots, (torch.Tensor, np.ndarray)):
        m = torch.as_tensor(snapshots)
        if m.dim() == 1:
            m = m.unsqueeze(0)
        if m.dim() != 2:
            raise ValueError(f"{what}: expected an (n, D) array, got shape {tuple(m.shape)}")
        return m
    items = [torch.as_tensor(s) for s in snapshots]
    if not items:
        raise ValueError(f"{what}: empty trajectory")
    sizes = {s.numel() for s in items}
    bad = [tuple(s.shape) for s in items if s.dim() != 1]
    if bad:
        raise ValueError(f"{what}: each snapshot must be 1-D, got shape {bad[0]}")
    if len(sizes) > 1:
        raise ValueError(f"{what}: snapshots have different sizes {sorted(sizes)}")
    return torch.stack(items)


def _check_center(center: torch.Tensor) -> torch.Tensor:
    center = torch.as_tensor(center)
    if center.dim() != 1:
        raise ValueError(f"center must be 1-D, got shape {tuple(center.shape)}")
    return center


def pca_directions(trajectories: Sequence, center: torch.Tensor, k: int = 2, *,
                   chunk: int = 1 << 20) -> tuple[torch.Tensor, np.ndarray]:
    """The first ``k`` principal directions of all trajectories' offsets from ``center``.

    ``trajectories``: a list of trajectories, each a list of 1-D snapshots (or an ``(n, D)``
    tensor, or a :class:`TrajectoryRecorder`). All snapshots are pooled and taken relative to
    ``center`` (not to their mean; see the module docstring), so every trajectory shares the
    returned plane.

    Returns ``(directions, explained_variance_ratio)``: a ``(k, D)`` float64 tensor with
    orthonormal rows, and a length-``k`` numpy array with each direction's share of
    ``sum ||snapshot - center||^2``. Signs are fixed so that the first snapshot of the first
    trajectory has a non-positive coordinate on each direction (training then runs towards
    +a, +b, ending at the origin when it ends at ``center``).

    Computed via the ``n x n`` Gram matrix, accumulated over ``chunk`` columns at a time in
    float64, so ``D`` may be millions while only ``n`` (the snapshot count) must stay small.
    Raises ValueError on size mismatches, ``k < 1``, ``k`` above the snapshot count or ``D``,
    or when every snapshot equals ``center``.
    """
    center = _check_center(center)
    if isinstance(trajectories, (torch.Tensor, np.ndarray, TrajectoryRecorder)):
        raise ValueError("pass a list of trajectories, e.g. [bp_snapshots, ff_snapshots]")
    trajectories = list(trajectories)
    if not trajectories:
        raise ValueError("no trajectories given")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    mats = [_as_matrix(t, f"trajectory {i}") for i, t in enumerate(trajectories)]
    n = sum(m.shape[0] for m in mats)
    d = center.numel()
    for i, m in enumerate(mats):
        if m.shape[1] != d:
            raise ValueError(f"trajectory {i}: snapshots have {m.shape[1]} entries but center "
                             f"has {d}")
    if k > n:
        raise ValueError(f"k={k} directions need at least {k} snapshots, got {n}")
    if k > d:
        raise ValueError(f"k={k} exceeds the parameter dimension D={d}")

    dev = center.device
    c64 = center.to(torch.float64)

    def block(lo: int) -> torch.Tensor:  # (n, chunk) float64 offsets, no full (n, D) copy
        cols = [m[:, lo:lo + chunk].to(device=dev, dtype=torch.float64) for m in mats]
        return torch.cat(cols) - c64[lo:lo + chunk]

    gram = torch.zeros(n, n, dtype=torch.float64, device=dev)
    for lo in range(0, d, chunk):
        blk = block(lo)
        gram += blk @ blk.T
    evals, evecs = torch.linalg.eigh(gram)  # ascending
    evals, evecs = evals.flip(0).clamp_min(0.0), evecs.flip(1)
    total = float(evals.sum())
    if not total > 0.0:
        raise ValueError("every snapshot equals center: the trajectories span no plane")
    top = evals[:k]
    # Directions v_i = X^T u_i / s_i; a tiny floor keeps degenerate (rank < k) cases finite,
    # the QR below then completes them to an orthonormal set.
    scale = top.sqrt().clamp_min(top[0].sqrt() * 1e-12)
    dirs = torch.zeros(k, d, dtype=torch.float64, device=dev)
    for lo in range(0, d, chunk):
        dirs[:, lo:lo + chunk] = (evecs[:, :k].T @ block(lo)) / scale[:, None]
    rank = int((top > evals[0] * 1e-20).sum())
    if rank < k:  # fill the missing directions with something orthogonal, deterministically
        g = torch.Generator(device="cpu").manual_seed(0)
        dirs[rank:] = torch.randn(k - rank, d, generator=g, dtype=torch.float64).to(dev)
    q, r = torch.linalg.qr(dirs.T)  # (D, k): re-orthonormalise, keep the order of dirs
    q = q * torch.sign(torch.diagonal(r)).where(torch.diagonal(r) != 0, 1.0)
    dirs = q.T.contiguous()
    first = mats[0][0].to(dev, torch.float64) - c64
    sign = torch.sign(dirs @ first)
    dirs = dirs * torch.where(sign > 0, -1.0, 1.0).to(dirs)[:, None]
    return dirs, (top / total).cpu().numpy()


def project(snapshots, center: torch.Tensor, directions: torch.Tensor, *,
            chunk: int = 1 << 20) -> np.ndarray:
    """Least-squares coordinates ``c`` with ``snapshot ~ center + c @ directions``.

    ``snapshots``: a list of 1-D tensors, an ``(n, D)`` tensor or a recorder; ``directions``
    ``(k, D)`` (need not be orthonormal, only independent). Returns an ``(n, k)`` float64 numpy
    array. Raises ValueError on size mismatches.
    """
    center = _check_center(center)
    dirs = torch.as_tensor(directions)
    if dirs.dim() != 2:
        raise ValueError(f"directions must be (k, D), got shape {tuple(dirs.shape)}")
    if dirs.shape[1] != center.numel():
        raise ValueError(f"directions have {dirs.shape[1]} entries but center has "
                         f"{center.numel()}")
    dev = center.device
    x = _as_matrix(snapshots, "snapshots")
    if x.shape[1] != center.numel():
        raise ValueError(f"snapshots have {x.shape[1]} entries but center has "
                         f"{center.numel()}")
    c64 = center.to(torch.float64)
    # Normal equations (k x k): exact for orthonormal directions, cheap for any D; the
    # right-hand side is accumulated over column chunks (no full float64 (n, D) copy).
    gram = torch.zeros(dirs.shape[0], dirs.shape[0], dtype=torch.float64, device=dev)
    rhs = torch.zeros(dirs.shape[0], x.shape[0], dtype=torch.float64, device=dev)
    for lo in range(0, center.numel(), chunk):
        dblk = dirs[:, lo:lo + chunk].to(device=dev, dtype=torch.float64)
        xblk = x[:, lo:lo + chunk].to(device=dev, dtype=torch.float64) - c64[lo:lo + chunk]
        gram += dblk @ dblk.T
        rhs += dblk @ xblk.T
    coords = torch.linalg.solve(gram, rhs).T
    return coords.cpu().numpy()
