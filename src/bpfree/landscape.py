"""Loss-landscape plots around the final weights, along PCA directions of training trajectories.

QZO-FF (§4.2 "Loss landscape", App. E, Fig. 6) draws the 2-D contours of the loss around the
final weights, together with the BP and forward-gradient (FF) trajectories, following the
trajectory-PCA variant of Li et al. 2018 ("Visualizing the Loss Landscape of Neural Nets", §7):

1. record the trained parameters after every step (or every ``every`` steps) with
   :class:`TrajectoryRecorder`;
2. :func:`pca_directions`: the first two principal directions of the snapshots' offsets
   ``snapshot - center`` from the final point ``center``;
3. :func:`project`: each snapshot's coordinates ``(a, b)`` in that plane;
4. :func:`loss_surface`: ``loss(center + a d1 + b d2)`` on a grid covering the projected
   trajectories plus a margin;
5. :func:`plot_landscape`: filled contours with the trajectories drawn on them, as PNG.

:func:`landscape_figure` chains the five steps.

**Two trajectories, one plane.** Li et al. take the PCA of *one* trajectory, centred at its
final point. To draw BP and FF on the *same* contour plot they must share the plane, so
:func:`pca_directions` pools the snapshots of all given trajectories into one matrix and takes
its PCA about a *given* centre (normally the final weights of the run whose landscape is drawn)
rather than about the snapshots' mean. The "explained variance" is therefore the share of the
pooled sum of squared distances to that centre, ``sum ||x - center||^2``, carried by each
direction; it reduces to Li et al.'s construction when one trajectory is given. Directions are
orthonormal, so the plot's axes are Euclidean distances in parameter space (no filter
normalisation: Li et al. use it for random directions, not for the PCA ones).

Coordinates come back as numpy float64 arrays; directions as float64 tensors on the centre's
device, which :func:`set_flat_params_` casts to each parameter's own dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

__all__ = ["TrajectoryRecorder", "flatten_params", "landscape_figure", "loss_surface",
           "pca_directions", "plot_landscape", "project", "set_flat_params_"]


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


# --------------------------------------------------------------------------- loss grid

def _grid_range(coords, span, margin: float) -> tuple[float, float, float, float]:
    if span is not None:
        if np.isscalar(span):
            s = float(span)
            if not s > 0:
                raise ValueError(f"span must be positive, got {span}")
            return -s, s, -s, s
        vals = [float(v) for v in span]
        if len(vals) == 2:
            vals = [-vals[0], vals[0], -vals[1], vals[1]]
        if len(vals) != 4 or not (vals[0] < vals[1] and vals[2] < vals[3]):
            raise ValueError("span must be a positive number, (span_a, span_b) or "
                             f"(a_min, a_max, b_min, b_max) with min < max; got {span!r}")
        return tuple(vals)
    if coords is None:
        raise ValueError("pass `coords` (projected trajectories) or `span` to set the grid")
    if isinstance(coords, Mapping):
        coords = list(coords.values())
    if isinstance(coords, (np.ndarray, torch.Tensor)):
        coords = [coords]
    pts = [np.asarray(torch.as_tensor(c).cpu(), dtype=np.float64).reshape(-1, 2)
           if isinstance(c, torch.Tensor) else np.asarray(c, dtype=np.float64).reshape(-1, 2)
           for c in coords]
    pts = np.concatenate(pts + [np.zeros((1, 2))])  # always include the centre
    if not np.all(np.isfinite(pts)):
        raise ValueError("coords contain NaN or inf")
    lo, hi = pts.min(0), pts.max(0)
    ext = hi - lo
    ext = np.where(ext > 0, ext, max(float(ext.max()), 1.0))
    lo, hi = lo - margin * ext, hi + margin * ext
    return float(lo[0]), float(hi[0]), float(lo[1]), float(hi[1])


def loss_surface(model: nn.Module, loss_fn: Callable[[nn.Module], float | torch.Tensor],
                 center: torch.Tensor, directions: torch.Tensor, *,
                 names: Iterable[str] | None = None, coords=None, span=None,
                 steps: int | tuple[int, int] = 21, margin: float = 0.2,
                 eval_mode: bool = True, progress: bool | str = False
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``loss_fn(model)`` at ``center + a*d1 + b*d2`` over a grid of ``(a, b)``.

    The grid is set by exactly one of
      * ``span``: ``s`` (``[-s, s]`` on both axes), ``(s_a, s_b)``, or
        ``(a_min, a_max, b_min, b_max)``; it takes precedence when both are given;
      * ``coords``: projected trajectories (an ``(n, 2)`` array, a list or a dict of them); the
        grid covers them and the origin, widened by ``margin`` times their extent per side.

    ``steps``: points per axis (int or ``(n_a, n_b)``, each >= 2). ``names`` selects the
    parameters the vectors refer to (as in :func:`flatten_params`); ``directions`` needs at
    least two rows, the first two are used. With ``eval_mode`` the model is put in ``eval()``
    while evaluating (dropout off, batch-norm running statistics); ``loss_fn`` runs under
    ``torch.no_grad()`` and returns a float or a scalar tensor. ``progress``: a tqdm bar (a str
    is its label).

    Returns ``(alphas, betas, losses)`` with ``losses[j, i]`` the loss at
    ``(alphas[i], betas[j])`` (matplotlib's ``contour`` layout). The selected parameters and
    the modules' train/eval flags are restored exactly afterwards, also when ``loss_fn`` raises.
    """
    chosen = _selected(model, names)
    center = _check_center(center)
    total = sum(p.numel() for _, p in chosen)
    if center.numel() != total:
        raise ValueError(f"center has {center.numel()} entries but the {len(chosen)} selected "
                         f"parameters have {total}")
    dirs = torch.as_tensor(directions)
    if dirs.dim() != 2 or dirs.shape[0] < 2:
        raise ValueError(f"directions must be (k >= 2, D), got shape {tuple(dirs.shape)}")
    if dirs.shape[1] != total:
        raise ValueError(f"directions have {dirs.shape[1]} entries but the selected parameters "
                         f"have {total}")
    na, nb = (steps, steps) if isinstance(steps, int) else tuple(steps)
    if na < 2 or nb < 2:
        raise ValueError(f"steps must be >= 2 per axis, got {steps!r}")
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    a0, a1, b0, b1 = _grid_range(coords, span, margin)
    alphas, betas = np.linspace(a0, a1, na), np.linspace(b0, b1, nb)

    dev = chosen[0][1].device
    c64 = center.to(device=dev, dtype=torch.float64)
    d1, d2 = (dirs[i].to(device=dev, dtype=torch.float64) for i in range(2))
    names_list = [n for n, _ in chosen]
    saved = [p.detach().clone() for _, p in chosen]
    modes = [(m, m.training) for m in model.modules()]
    losses = np.full((nb, na), np.nan)
    bar = None
    if progress:
        from tqdm.auto import tqdm  # lazy: only for the optional progress bar
        bar = tqdm(total=na * nb, desc=progress if isinstance(progress, str) else "landscape",
                   leave=False)
    try:
        if eval_mode:
            model.eval()
        with torch.no_grad():
            for j, b in enumerate(betas):
                for i, a in enumerate(alphas):
                    set_flat_params_(model, c64 + float(a) * d1 + float(b) * d2, names_list)
                    val = loss_fn(model)
                    losses[j, i] = float(val.detach().cpu().item()
                                         if isinstance(val, torch.Tensor) else val)
                    if bar is not None:
                        bar.update()
    finally:
        if bar is not None:
            bar.close()
        with torch.no_grad():
            for (_, p), s in zip(chosen, saved):
                p.copy_(s)
        for m, flag in modes:
            m.training = flag
    return alphas, betas, losses


# --------------------------------------------------------------------------- figure

def _axis_label(i: int, explained) -> str:
    ordinal = {0: "1st", 1: "2nd"}.get(i, f"{i + 1}th")
    if explained is None or len(explained) <= i:
        return f"{ordinal} PCA direction"
    return f"{ordinal} PCA direction ({100.0 * float(explained[i]):.1f} % of variance)"


def plot_landscape(alphas, betas, losses, trajectories: Mapping[str, np.ndarray] | None,
                   path: str | Path, *, title: str | None = "Loss landscape",
                   explained_variance_ratio=None, levels: int = 25, log_levels: bool | None = None,
                   dpi: int = 130) -> Path:
    """Filled loss contours with trajectories drawn on them; writes a PNG and returns its path.

    ``losses[j, i]`` at ``(alphas[i], betas[j])`` (as from :func:`loss_surface`);
    ``trajectories``: ``{label: (n, 2) coordinates}`` (from :func:`project`), each drawn as a
    line through its snapshots, a circle at the start and a star at the end; the centre (origin)
    is marked with a cross. ``explained_variance_ratio`` (from :func:`pca_directions`) labels
    the axes with percentages. ``log_levels``: log-spaced contour levels; default when the
    losses are positive and span more than a factor of 10. Non-finite losses are masked.
    """
    # lazy: matplotlib is a heavy optional dependency, needed only to draw
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure

    alphas = np.asarray(alphas, dtype=np.float64)
    betas = np.asarray(betas, dtype=np.float64)
    z = np.asarray(losses, dtype=np.float64)
    if alphas.ndim != 1 or betas.ndim != 1 or z.shape != (betas.size, alphas.size):
        raise ValueError(f"losses must be (len(betas), len(alphas)) = ({betas.size}, "
                         f"{alphas.size}), got {z.shape}")
    finite = z[np.isfinite(z)]
    if finite.size == 0:
        raise ValueError("no finite loss value to plot")
    zm = np.ma.masked_invalid(z)
    lo, hi = float(finite.min()), float(finite.max())
    if log_levels is None:
        log_levels = lo > 0 and hi > 10 * lo
    if log_levels and not lo > 0:
        raise ValueError("log-spaced levels need positive losses")
    if hi <= lo:
        hi = lo + (abs(lo) * 1e-6 or 1e-6)
    if log_levels:
        lv = np.geomspace(lo, hi, levels + 1)
        norm = LogNorm(vmin=lo, vmax=hi)
    else:
        lv = np.linspace(lo, hi, levels + 1)
        norm = None

    fig = Figure(figsize=(6.4, 5.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    filled = ax.contourf(alphas, betas, zm, levels=lv, norm=norm, cmap="viridis", extend="both")
    ax.contour(alphas, betas, zm, levels=lv, norm=norm, colors="k", linewidths=0.3, alpha=0.5)
    cbar = fig.colorbar(filled, ax=ax)
    cbar.set_label("loss (log-spaced levels)" if log_levels else "loss")
    if log_levels:
        # lazy: matplotlib (heavy optional dependency)
        from matplotlib.ticker import LogLocator, NullFormatter, StrMethodFormatter
        cbar.ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        cbar.ax.yaxis.set_major_formatter(StrMethodFormatter("{x:.3g}"))
        cbar.ax.yaxis.set_minor_formatter(NullFormatter())
    colors = ["tab:red", "w", "tab:orange", "tab:cyan", "tab:pink", "tab:olive"]
    for idx, (label, c) in enumerate((trajectories or {}).items()):
        c = np.asarray(torch.as_tensor(c).cpu() if isinstance(c, torch.Tensor) else c,
                       dtype=np.float64)
        if c.ndim != 2 or c.shape[1] < 2 or c.shape[0] < 1:
            raise ValueError(f"trajectory {label!r}: expected (n, 2) coordinates, got {c.shape}")
        col = colors[idx % len(colors)]
        ax.plot(c[:, 0], c[:, 1], "-", color=col, lw=1.4, marker=".", ms=3, label=label)
        ax.plot(c[0, 0], c[0, 1], "o", color=col, ms=7, mec="k")
        ax.plot(c[-1, 0], c[-1, 1], "*", color=col, ms=12, mec="k")
    ax.plot(0.0, 0.0, "x", color="k", ms=8, mew=1.5, label="center")
    if trajectories:
        ax.plot([], [], "o", color="0.6", mec="k", ms=6, label="start")
        ax.plot([], [], "*", color="0.6", mec="k", ms=10, label="end")
    ax.set_xlim(alphas[0], alphas[-1])
    ax.set_ylim(betas[0], betas[-1])
    ax.set_xlabel(_axis_label(0, explained_variance_ratio))
    ax.set_ylabel(_axis_label(1, explained_variance_ratio))
    if title:
        ax.set_title(title, fontsize=9)  # long titles otherwise overflow the axes
    ax.legend(loc="best", fontsize=8, framealpha=0.8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png")
    return path


def landscape_figure(model: nn.Module, loss_fn: Callable[[nn.Module], float | torch.Tensor],
                     trajectories: Mapping[str, Sequence], path: str | Path, *,
                     center: torch.Tensor | None = None, names: Iterable[str] | None = None,
                     steps: int = 21, margin: float = 0.2, span=None,
                     title: str | None = "Loss landscape", progress: bool | str = False) -> dict:
    """The whole Fig. 6 pipeline: PCA plane, projections, loss grid and PNG.

    ``trajectories``: ``{label: snapshots}`` (lists of flat tensors or recorders);
    ``center``: default the model's current selected parameters. Returns a dict with
    ``path``, ``directions``, ``explained_variance_ratio``, ``coords`` (per label),
    ``alphas``, ``betas`` and ``losses``.
    """
    if center is None:
        center = flatten_params(model, names)
    labels = list(trajectories)
    dirs, evr = pca_directions([trajectories[k] for k in labels], center, k=2)
    coords = {k: project(trajectories[k], center, dirs) for k in labels}
    alphas, betas, losses = loss_surface(model, loss_fn, center, dirs, names=names,
                                         coords=coords, span=span, steps=steps, margin=margin,
                                         progress=progress)
    out = plot_landscape(alphas, betas, losses, coords, path, title=title,
                         explained_variance_ratio=evr)
    return {"path": out, "directions": dirs, "explained_variance_ratio": evr, "coords": coords,
            "alphas": alphas, "betas": betas, "losses": losses}
