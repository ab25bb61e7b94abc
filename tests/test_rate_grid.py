"""bpfree.bench.rate_grid: the rate one step past a search grid's edge."""

from __future__ import annotations

import pytest

from bpfree.bench.rate_grid import rate_past_edge


def test_the_grid_goes_on_by_its_own_ratio_on_the_side_chosen():
    grid = (1e-3, 3e-3, 1e-2)
    assert rate_past_edge(grid, 1e-3) == pytest.approx(1e-3 / 3)
    assert rate_past_edge(grid, 1e-2) == pytest.approx(1e-2 * 1e-2 / 3e-3)
    assert rate_past_edge(reversed(grid), 1e-2) == rate_past_edge(grid, 1e-2)  # order-free
    assert rate_past_edge({1e-2: 70.0, 1e-1: 80.0, 1e-3: 60.0}, 1e-1, digits=3) == 1.0


def test_inside_or_too_small_a_grid_gives_none():
    assert rate_past_edge((1e-3, 3e-3, 1e-2), 3e-3) is None
    assert rate_past_edge((1e-3, 1e-2), 1e-3) is None                  # default: 3 rates
    assert rate_past_edge((1e-3, 1e-2), 1e-3, min_rates=2) == pytest.approx(1e-4)


def test_rounding_to_significant_digits():
    assert rate_past_edge((0.01, 0.1, 0.3), 0.01, digits=3) == 0.001
    assert rate_past_edge((1e-4, 3e-4, 1e-3), 1e-3, digits=6) == 0.00333333
    assert rate_past_edge((1e-4, 3e-4, 1e-3), 1e-3, digits=3) == 0.00333


def test_min_rates_below_two_is_refused():
    with pytest.raises(ValueError, match="min_rates must be at least 2"):
        rate_past_edge((1e-3, 1e-2), 1e-3, min_rates=1)
