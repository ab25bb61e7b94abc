"""LayerwiseCGE (bpfree.ttzo.layerwise): the batched CGE losses equal the sequential ones.

The lean path perturbs one coordinate in place and runs the whole network; the layerwise
path adds the coordinate's column to the cached layer output and runs only the layers after
it. In float64 both must agree to rounding (1e-10 on gradients of order 0.1); in float32 to
the finite difference's rounding (loss rounding / mu).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bpfree.estimators import CoordinateWise
from bpfree.objective import Objective
from bpfree.tt import TTLinear, tt_mlp
from bpfree.ttzo import LayerwiseCGE, MaskedModel, ZOTrainer, layerwise_losses, make_method


def _batch(n=12, features=24, classes=6, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, features, generator=g, dtype=dtype),
            torch.randint(0, classes, (n,), generator=g))


def _small_tt():
    torch.manual_seed(0)
    # 24 = 2*3*4 -> 12 = 3*2*2 -> 6 = 1*3*2, ranks [1, 2, 3, 1]: every core position occurs
    return tt_mlp([(1, 2, 3, 1), (1, 3, 2, 1)], factors=((2, 3, 4), (3, 2, 2), (1, 3, 2))).double()


def _small_masked():
    torch.manual_seed(1)
    dense = nn.Sequential(nn.Linear(24, 10), nn.Tanh(), nn.Linear(10, 6))
    g = torch.Generator().manual_seed(2)
    masks = {"0.weight": torch.rand(10, 24, generator=g) < 0.3,
             "2.weight": torch.rand(6, 10, generator=g) < 0.5}
    return MaskedModel(dense, masks).double()


def _estimates(model, x, y, *, central=False, num_coordinates=None, mu=1e-2):
    out = []
    for mode in ("lean", "batched"):
        trainer = ZOTrainer(model, "cge", mu=mu, mode=mode, central=central,
                            num_coordinates=num_coordinates, seed=3)
        est = trainer.estimator.estimate(trainer.optimizer.context(Objective(model, x, y)))
        out.append((est.loss, torch.cat([g.flatten() for g in est.grads]), est.forward_passes))
    return out


@pytest.mark.parametrize("build", [_small_tt, _small_masked,
                                   lambda: nn.Sequential(nn.Linear(24, 9), nn.ReLU(),
                                                         nn.Linear(9, 7), nn.GELU(),
                                                         nn.Linear(7, 6)).double()],
                         ids=["tt-mlp", "masked-mlp", "three-layer-mlp"])
@pytest.mark.parametrize("central", [False, True])
def test_batched_cge_equals_sequential_float64(build, central):
    model = build()
    x, y = _batch()
    (l0, g0, f0), (l1, g1, f1) = _estimates(model, x, y, central=central)
    assert f0 == f1
    assert (l0 == l1) or (central and l0 != l0 and l1 != l1)  # NaN for central
    assert g0.abs().max() > 1e-3
    torch.testing.assert_close(g1, g0, rtol=0, atol=1e-10)


def test_batched_cge_equals_sequential_on_the_paper_tt_mlp_float32():
    """The §5.1 TT-MLP (784 -> 1024 -> 10) at r = 2 on a random subset of coordinates."""
    torch.manual_seed(0)
    model = tt_mlp(2)
    x, y = _batch(n=16, features=784, classes=10, dtype=torch.float32)
    (l0, g0, _), (l1, g1, _) = _estimates(model, x, y, num_coordinates=400)
    assert l0 == pytest.approx(l1, rel=1e-6)
    assert int((g0 != 0).sum()) > 300
    # One loss of ~2.3 rounds at ~2.4e-7; the finite difference divides by mu = 0.01.
    torch.testing.assert_close(g1, g0, rtol=0, atol=2e-4)


def test_tt_core_columns_match_the_dense_weight():
    """Each core entry's layer-output column equals the change of x @ W.T (dense W)."""
    torch.manual_seed(4)
    layer = TTLinear((2, 3, 4), (3, 2, 2), (1, 2, 3, 1)).double()
    x, y = _batch(n=5)
    head = nn.Sequential(layer)
    params = list(layer.cores)
    points = [(k, j, 0.5) for k in range(3) for j in range(params[k].numel())]
    objective = Objective(head, x, torch.zeros(5, dtype=torch.long),
                          lambda out, t: out.pow(2).sum(-1))
    base, losses = layerwise_losses(objective, params, points)
    expected = []
    for k, j, delta in points:
        with torch.no_grad():
            params[k].view(-1)[j] += delta
            w = layer.dense_weight()
            params[k].view(-1)[j] -= delta
        expected.append(float((x @ w.T).pow(2).sum(-1).mean()))
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-12, atol=0)
    assert base == pytest.approx(float(head(x).detach().pow(2).sum(-1).mean()), rel=1e-12)


def test_unsupported_model_falls_back_to_the_parent_evaluation():
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(24, 8), nn.LayerNorm(8), nn.Linear(8, 6)).double()
    x, y = _batch()
    assert layerwise_losses(Objective(model, x, y), list(model.parameters()), [(0, 0, 0.1)]) \
        is None
    (l0, g0, _), (l1, g1, _) = _estimates(model, x, y)
    assert l0 == l1
    torch.testing.assert_close(g1, g0, rtol=0, atol=1e-10)


def test_a_tensor_outside_the_layers_falls_back():
    model = _small_tt()
    x, y = _batch()
    stray = torch.zeros(3, dtype=torch.float64)
    assert layerwise_losses(Objective(model, x, y), [stray], [(0, 0, 0.1)]) is None


def test_make_method_runs_cge_batched_and_layerwise():
    model = _small_tt()
    cge = make_method("cge", model)
    hybrid = make_method("hybrid", model)
    assert cge.optimizer.mode == "batched" and isinstance(cge.estimator, LayerwiseCGE)
    assert hybrid.fine.optimizer.mode == "batched" and hybrid.coarse.optimizer.mode == "cached"
    assert isinstance(hybrid.fine.estimator, CoordinateWise)


@pytest.mark.parametrize("build", [_small_tt, _small_masked], ids=["tt-mlp", "masked-mlp"])
def test_first_layer_shortcut_runs_no_later_layer_and_equals_the_full_rest(build, monkeypatch):
    """A first-layer coordinate of a two-layer net changes only the outputs its column touches:
    the shortcut never runs the last layer and gives the losses of running it (float64)."""
    from bpfree.ttzo import layerwise

    model = build()
    x, y = _batch()
    layers = layerwise._layers(model)
    first = [p for p in layers[0].parameters()]
    points = [(i, j, 0.05) for i, p in enumerate(first) for j in range(p.numel())]
    calls = []
    hook = layers[-1].register_forward_hook(lambda *a: calls.append(1))
    base, fast = layerwise_losses(Objective(model, x, y), first, points)
    assert len(calls) == 1  # the base forward only
    monkeypatch.setattr(layerwise, "_tail", lambda *a: None)
    base2, full = layerwise_losses(Objective(model, x, y), first, points)
    hook.remove()
    assert len(calls) > 1 and base == base2
    torch.testing.assert_close(torch.tensor(fast), torch.tensor(full), rtol=0, atol=1e-12)
    assert max(abs(v - base) for v in fast) > 1e-4
