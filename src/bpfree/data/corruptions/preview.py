"""A PNG grid of every corruption at every severity, to look at what a table does."""

from __future__ import annotations

from typing import Sequence

from .batch import as_float, check_int
from .registry import DEFAULT_TABLE, SEVERITIES, check_table, corrupt, list_corruptions

__all__ = ["preview_grid"]


def preview_grid(images, path, *, names: Sequence[str] | None = None,
                 table: str = DEFAULT_TABLE, seed: int = 0, index: int = 0) -> None:
    """Write a PNG grid: one row per corruption (``names``, default every one that applies
    to ``images``), columns clean and severities 1..5, all of image ``images[index]``."""
    # Figure + Agg canvas rather than pyplot: no global backend switch, no GUI, no leak.
    # lazy: matplotlib only for this figure
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    check_table(table)
    x, _ = as_float(images)
    index = check_int(index, "index", 0, x.shape[0] - 1)
    one = images[index:index + 1]
    if names is None:
        names = list_corruptions(table, grayscale=x.shape[-1] != 3)
    gray = x.shape[-1] == 1
    fig = Figure(figsize=(6 * 1.2, len(names) * 1.25))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(names), 6, squeeze=False)
    for row, name in enumerate(names):
        panels = [x[index]] + [
            as_float(corrupt(one, name, s, seed=seed, table=table))[0][0] for s in SEVERITIES]
        for col, panel in enumerate(panels):
            ax = axes[row, col]
            ax.imshow(panel[..., 0] if gray else panel, cmap="gray" if gray else None,
                      vmin=0.0, vmax=1.0, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title("clean" if col == 0 else f"severity {col}", fontsize=8)
            if col == 0:
                ax.set_ylabel(name, fontsize=7, rotation=0, ha="right", va="center")
    fig.suptitle(f"bpfree.data.corruptions, table={table}, seed={seed}", fontsize=9)
    # Leave the top strip to the suptitle so it does not cover the column titles.
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
    fig.savefig(path, dpi=100)
