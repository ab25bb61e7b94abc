"""Figures: a headless pyplot and one way to save PNGs, for the library's plots and the
benchmarks'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["pyplot", "save_figure"]


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend (plots are written to files,
    often on machines without a display)."""
    import matplotlib  # lazy: heavy optional dependency, loaded only to draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after choosing the Agg backend

    return plt


def save_figure(fig: Any, path: str | Path, root: str | Path | None = None, *,
                dpi: int = 120) -> Path:
    """Lay out, write ``fig`` as PNG to ``path`` (parents created) and close it.

    Returns the path, relative to ``root`` when given (the form the result JSON's
    ``figures`` entries and ``docs/BENCHMARKS.md`` use).
    """
    import matplotlib.pyplot as plt  # lazy: heavy optional dependency

    path = Path(path)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path.relative_to(root) if root is not None else path
