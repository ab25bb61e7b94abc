"""Learning-rate grids of the benchmarks' searches: the rate one step past an edge.

A search whose choice sits on its grid's smallest or largest rate has not bracketed the best
rate, so the benchmarks try one rate further, at the grid's own ratio between its two
outermost rates on that side (``bench pmt-t6``, ``bench qzo-ff``'s few-shot and ViT searches).
"""

from __future__ import annotations

from collections.abc import Iterable


def rate_past_edge(rates: Iterable[float], chosen: float, *, min_rates: int = 3,
                   digits: int | None = None) -> float | None:
    """The rate one grid step past the edge ``chosen`` sits on: ``edge**2 / inner`` with
    ``inner`` the edge's neighbour, so a grid of ratio ``r`` goes on by ``r``. ``None`` when
    ``chosen`` is inside the grid or the grid has fewer than ``min_rates`` rates (a grid too
    small to say where the best rate lies). ``digits``: significant digits to round to
    (``0.1``, not ``0.10000000000000002``); ``None`` keeps the float as computed."""
    grid = sorted(rates)
    if min_rates < 2:
        raise ValueError(f"min_rates must be at least 2 (an edge and its neighbour), "
                         f"got {min_rates}")
    if len(grid) < min_rates or chosen not in (grid[0], grid[-1]):
        return None
    edge, inner = (grid[0], grid[1]) if chosen == grid[0] else (grid[-1], grid[-2])
    rate = edge * edge / inner
    return rate if digits is None else float(f"{rate:.{digits}g}")
