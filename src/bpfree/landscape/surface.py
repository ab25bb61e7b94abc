"""The loss surface on a trajectory plane and its figure (QZO-FF Fig. 6): :func:`loss_surface`
on a grid around the projected trajectories, :func:`plot_landscape` (contours and
trajectories as PNG) and :func:`landscape_figure`, the whole pipeline."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .trajectory import (_check_center, _selected, flatten_params, pca_directions, project,
                         set_flat_params_)

__all__ = ["landscape_figure", "loss_surface", "plot_landscape"]


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
