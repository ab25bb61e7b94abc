"""ZOOptimizer's cached mode: lean mode's weights bit for bit, each direction drawn once."""

import pytest
import torch
from torch import nn

from bpfree import transforms as T
from bpfree.estimators import rge, sign_rge, sign_spsa, spsa
from bpfree.objective import Objective
from bpfree.optim import ZOOptimizer
from bpfree.perturb import get_distribution
from bpfree.tt import tt_mlp
from bpfree.ttzo import make_method


def bits(tensors):
    return [t.detach().clone().view(torch.int32) for t in tensors]


def mlp(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    with torch.no_grad():  # entries whose float round trip is inexact, and a signed zero
        model[0].weight[0, :4] = torch.tensor([1e-9, -3e-8, 2.5e-7, -0.0])
    return model


def batch(seed=1, n=32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def train(mode, estimator, dist, transforms=(), steps=3):
    model = mlp()
    x, y = batch()
    opt = ZOOptimizer(model.parameters(), lr=0.05, estimator=estimator, distribution=dist,
                      transforms=list(transforms), mode=mode, seed=11)
    losses = [opt.step(Objective(model, x, y)) for _ in range(steps)]
    return bits(model.parameters()), losses, opt.batch_forwards


@pytest.mark.parametrize("dist", ["gaussian", "rademacher", "rademacher_torch",
                                  "quantized_gaussian"])
@pytest.mark.parametrize("estimator", [rge(4, 1e-3), sign_rge(4, 1e-2), spsa(3, 1e-2),
                                       sign_spsa(2, 1e-2)],
                         ids=["rge", "sign_rge", "spsa", "sign_spsa"])
def test_cached_training_is_bit_identical_to_lean(estimator, dist):
    lean = train("lean", estimator, dist)
    cached = train("cached", estimator, dist)
    assert lean[1] == cached[1] and lean[2] == cached[2]
    assert all(torch.equal(a, b) for a, b in zip(lean[0], cached[0]))
    assert not all(torch.equal(a, b) for a, b in zip(lean[0], bits(mlp().parameters())))


def train_chunked(estimator, dist, chunk_size, steps=3):
    model = mlp()
    x, y = batch()
    opt = ZOOptimizer(model.parameters(), lr=0.05, estimator=estimator, distribution=dist,
                      mode="batched", chunk_size=chunk_size, seed=11)
    losses = [opt.step(Objective(model, x, y)) for _ in range(steps)]
    return bits(model.parameters()), losses, opt.batch_forwards


@pytest.mark.parametrize("chunk_size", [1, 2, 64])
@pytest.mark.parametrize("estimator", [rge(5, 1e-3), spsa(3, 1e-2), sign_spsa(3, 1e-2)],
                         ids=["rge", "spsa", "sign_spsa"])
def test_batched_weight_perturbation_is_bit_identical_to_lean(estimator, chunk_size):
    """Batched weight perturbation (retired vmap, issue 30) draws chunk_size directions at a
    time; a chunk may split SPSA's +/- pair of one direction, which is then drawn twice."""
    lean = train("lean", estimator, "gaussian")
    batched = train_chunked(estimator, "gaussian", chunk_size)
    assert lean[1] == batched[1] and lean[2] == batched[2]
    assert all(torch.equal(a, b) for a, b in zip(lean[0], batched[0]))


def test_batched_weight_perturbation_draws_at_most_a_chunk_at_once(monkeypatch):
    """Memory stays chunk_size * d: no more than chunk_size directions are drawn together."""
    import bpfree.estimators.weight as weight
    sizes = []
    real = weight._draw_cached

    def spy(ctx, seeds):
        sizes.append(len(seeds))
        return real(ctx, seeds)

    monkeypatch.setattr(weight, "_draw_cached", spy)
    train_chunked(rge(7, 1e-3), "gaussian", chunk_size=3, steps=1)
    assert sizes == [3, 3, 1]


def test_cached_materialized_update_is_bit_identical_to_lean():
    """With a tensor transform the estimate is materialized from the drawn directions."""
    clip = [T.clip_by_value(1e30)]
    lean = train("lean", rge(4, 1e-3), "gaussian", clip)
    cached = train("cached", rge(4, 1e-3), "gaussian", clip)
    assert all(torch.equal(a, b) for a, b in zip(lean[0], cached[0]))


class CountingGaussian(type(get_distribution("gaussian"))):
    """The Gaussian distribution, counting its draws."""

    def sample(self, seed, shape, **kw):
        type(self).draws += 1
        return super().sample(seed, shape, **kw)


@pytest.mark.parametrize("estimator,per_step_lean", [(rge(4, 1e-3), 3), (sign_rge(4, 1e-2), 3)],
                         ids=["rge", "sign_rge"])
def test_cached_mode_draws_each_direction_once_per_step(estimator, per_step_lean):
    """Lean draws each direction to perturb, to restore and to update; cached draws it once."""
    tensors, queries, steps = 4, 4, 2
    counts = {}
    for mode in ("lean", "cached"):
        CountingGaussian.draws = 0
        train(mode, estimator, CountingGaussian(), steps=steps)
        counts[mode] = CountingGaussian.draws
    assert counts == {"lean": per_step_lean * steps * queries * tensors,
                      "cached": steps * queries * tensors}


def test_cached_estimate_restores_parameters_and_drops_nan_queries_like_lean():
    p = torch.tensor([1e-9, -0.0, 2.0, -3.0])
    results = []
    for mode in ("lean", "cached"):
        p.data = torch.tensor([1e-9, -0.0, 2.0, -3.0])
        calls = {"n": 0}
        seen = []

        def closure():
            calls["n"] += 1
            seen.append(p.detach().clone())
            return float("nan") if calls["n"] in (2, 4) else float((p - 1).square().sum())

        opt = ZOOptimizer([p], lr=0.1, estimator=rge(5, 1e-2), distribution="gaussian",
                          mode=mode, seed=2)
        opt.step(closure)
        results.append((bits(seen), bits([p]), opt.last_stats.dropped))
    (seen_l, p_l, drop_l), (seen_c, p_c, drop_c) = results
    assert drop_l == drop_c == 2
    assert all(torch.equal(a, b) for a, b in zip(seen_l, seen_c))  # the same perturbed bits
    assert torch.equal(p_l[0], p_c[0])


def test_cached_mode_refuses_integer_tensors():
    w = torch.zeros(4, dtype=torch.int16)
    with pytest.raises(ValueError, match="use mode='lean'"):
        ZOOptimizer([{"params": [w], "update": "round_and_clip"}], estimator=rge(2, 1.0),
                    mode="cached")


def _hybrid(mode):
    """A TT-ZO hybrid run through both phases (3 signRGE steps, then 2 CGE steps)."""
    torch.manual_seed(0)
    model = tt_mlp(rank=3)
    g = torch.Generator().manual_seed(2)
    x, y = torch.rand(16, 784, generator=g), torch.randint(0, 10, (16,), generator=g)
    h = make_method("hybrid", model, seed=5, mode=mode, max_coarse_epochs=1, steps_per_epoch=3,
                    cge_coordinates=40)
    for _ in range(5):
        h.step(x, y, 1e-3)
    assert h.history["steps"] == {"sign_rge": 3, "cge": 2}
    return bits(model.state_dict().values())


def test_cached_tt_hybrid_is_bit_identical_to_lean():
    assert all(torch.equal(a, b) for a, b in zip(_hybrid("lean"), _hybrid("cached")))


def test_tt_zo_methods_default_to_cached_signrge():
    model = tt_mlp(rank=2)
    assert make_method("sign_rge", model).optimizer.mode == "cached"
    assert make_method("rge", model).optimizer.mode == "cached"
    hybrid = make_method("hybrid", model)
    assert hybrid.coarse.optimizer.mode == "cached" and hybrid.fine.optimizer.mode == "batched"
    assert make_method("sign_rge", model, mode="lean").optimizer.mode == "lean"
