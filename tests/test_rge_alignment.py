"""rge_alignment: the RGE estimate's cosine with the autograd gradient (a diagnostic)."""

import math

import pytest
import torch

from bpfree.estimators.alignment import rge_alignment


def test_one_parameter_estimate_points_along_the_gradient():
    w = torch.nn.Parameter(torch.tensor([2.0]))
    out = rge_alignment([w], lambda: (w ** 2).sum(), mu=1e-3, queries=3, draws=4)
    # d = 1: every forward difference times its direction has the gradient's sign
    assert out["cosine"] == pytest.approx(1.0) and out["sign_cosine"] == pytest.approx(1.0)
    assert out["ideal_cosine"] == 1.0
    assert w.item() == 2.0                                    # parameters restored


def test_small_radius_reaches_sqrt_n_over_d_and_a_huge_one_loses_the_gradient():
    torch.manual_seed(0)
    d = 400
    a = torch.randn(d)
    w = torch.nn.Parameter(torch.randn(d) * 0.1)
    # linear term plus strong curvature: at a large radius the quadratic term dominates
    loss = lambda: a @ w + 50.0 * (w ** 2).sum()   # noqa: E731
    small = rge_alignment([w], loss, mu=1e-4, queries=10, draws=30, seed=1)
    big = rge_alignment([w], loss, mu=10.0, queries=10, draws=30, seed=1)
    ideal = math.sqrt(10 / d)
    assert small["ideal_cosine"] == pytest.approx(ideal)
    assert 0.6 * ideal < small["cosine"] < 1.6 * ideal
    assert abs(big["cosine"]) < 0.5 * ideal
    assert big["median_relative_change"] > 100 * small["median_relative_change"]
    assert big["perturbation_to_weights"] == pytest.approx(10.0 * math.sqrt(d) / float(w.detach().norm()))


@pytest.mark.parametrize("kwargs", [dict(mu=0.0), dict(mu=float("nan")), dict(mu=0.1, queries=0),
                                    dict(mu=0.1, draws=1.5)])
def test_bad_arguments_are_named(kwargs):
    w = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(ValueError, match="mu|queries|draws"):
        rge_alignment([w], lambda: w.sum(), **kwargs)
