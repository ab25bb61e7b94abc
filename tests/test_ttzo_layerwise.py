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


# --- issue 32: the per-core batched path against the reference path --------------------------

def _all_points(params, delta):
    return [(i, j, delta) for i, p in enumerate(params) for j in range(p.numel())]


def _both(model, x, y, points, params=None):
    params = list(model.parameters()) if params is None else params
    objective = Objective(model, x, y)
    fast = layerwise_losses(objective, params, points)
    reference = layerwise_losses(objective, params, points, reference=True)
    return fast, reference


@pytest.mark.parametrize("activation", ["relu", "tanh", "gelu"])
@pytest.mark.parametrize("delta", [1e-2, 0.5])
def test_fast_path_equals_the_reference_float64(activation, delta):
    """Every coordinate of a 3-layer TT-MLP (middle and last layers' cores, biases), at the
    paper's CGE radius and at a radius large enough that many ReLU outputs cross the kink
    (the exact correction of the piecewise path): equal to rounding in float64."""
    torch.manual_seed(7)
    model = tt_mlp([(1, 2, 3, 1), (1, 3, 2, 1), (1, 2, 2, 1)],
                   factors=((2, 3, 4), (3, 2, 2), (2, 2, 2), (1, 3, 2)),
                   activation=activation).double()
    x, y = _batch()
    points = _all_points(list(model.parameters()), delta)
    (b0, fast), (b1, ref) = _both(model, x, y, points)
    assert b0 == b1
    fast, ref = torch.tensor(fast), torch.tensor(ref)
    assert (fast - b0).abs().max() > 1e-3
    torch.testing.assert_close(fast, ref, rtol=1e-13, atol=0)


def test_fast_path_handles_subsets_repeats_and_mixed_signs_float64():
    """A random subset in shuffled order, each coordinate at +δ and −δ (central CGE's
    points), and a coordinate asked twice at the same δ."""
    model = _small_tt()
    x, y = _batch()
    params = list(model.parameters())
    g = torch.Generator().manual_seed(4)
    points = []
    for i, p in enumerate(params):
        for j in torch.randperm(p.numel(), generator=g)[: max(1, p.numel() // 3)].tolist():
            points += [(i, j, 0.05), (i, j, -0.05)]
    points.append(points[0])
    order = torch.randperm(len(points), generator=g).tolist()
    points = [points[n] for n in order]
    (_, fast), (_, ref) = _both(model, x, y, points)
    assert not any(v != v for v in fast)
    torch.testing.assert_close(torch.tensor(fast), torch.tensor(ref), rtol=1e-13, atol=0)


def test_fast_path_on_the_paper_tt_mlp_float32_within_loss_rounding():
    """The §5.1 TT-MLP at r = 10, every coordinate, float32. Both paths sum the same terms in
    a different order (and the fast one skips the cancellation of σ(z + δJ) − σ(z)), so each
    loss (a mean of 64 cross-entropies near 2.3, each rounded at ~1 ulp) may differ by a few
    ulps of the loss, not more: 8 ulps = 8·2^-23·|L|."""
    torch.manual_seed(0)
    model = tt_mlp(10)
    x, y = _batch(n=64, features=784, classes=10, dtype=torch.float32)
    points = _all_points(list(model.parameters()), 1e-2)
    (b0, fast), (b1, ref) = _both(model, x, y, points)
    fast, ref = torch.tensor(fast, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64)
    bound = 8 * 2.0 ** -23 * ref.abs()
    assert bool(((fast - ref).abs() <= bound).all()), float(((fast - ref).abs() / bound).max())
    # the losses differ from the base by far more than the tolerance: the test can fail
    assert float((ref - b1).abs().median()) > 10 * float(bound.max())


def test_fast_path_takes_the_batched_products_for_every_core(monkeypatch):
    """The TT-MLP's cores and its first bias never reach the chunked reference path."""
    from bpfree.ttzo import layerwise

    model = _small_tt()
    x, y = _batch()
    params = list(model.parameters())
    seen = []
    original = layerwise._chunked_losses
    monkeypatch.setattr(layerwise, "_chunked_losses",
                        lambda *a: (seen.append(a[2]), original(*a))[1])
    layerwise_losses(Objective(model, x, y), params, _all_points(params, 0.01))
    assert seen == [(2, "bias", None)]


@pytest.mark.parametrize("wide", [16, 2])
def test_core_jacobian_is_the_core_columns_in_its_entry_layout(wide, monkeypatch):
    """_core_jacobian builds J[b, (ν, β, α), o, p] by two products; it equals _core_columns
    (one einsum, (b, o, α, ν, β, p)) permuted, for every core of a 4-core layer (first, middle
    and last core take different branches; ``wide`` = 2 sends the middle cores, whose M_> is
    2, through the broadcast product instead of the einsum)."""
    from bpfree.ttzo import layerwise

    monkeypatch.setattr(layerwise, "_WIDE_RIGHT", wide)
    torch.manual_seed(9)
    layer = TTLinear((2, 3, 2, 2), (3, 2, 1, 2), (1, 2, 3, 2, 1)).double()
    a, _ = _batch(n=5)
    for k, core in enumerate(layer.cores):
        r0, _, n, r1 = core.shape
        cols = layerwise._core_columns(layer, a, k)                  # (B, o, α, ν, β, p)
        B, O, _, _, _, P = cols.shape
        expected = cols.permute(0, 3, 4, 2, 1, 5).reshape(B, n * r1 * r0, O, P)
        torch.testing.assert_close(layerwise._core_jacobian(layer, a, k), expected,
                                   rtol=1e-13, atol=1e-15)


# --- the CGE step made cheaper with the same bits (issue 32) ----------------------------------

def _one_hot_moved_logits(logits, moved, mu, m):
    """A last-layer core's perturbed logits as formed before: ``moved`` spread over the
    digits by a one-hot product, plus the logits (the reference for the bits)."""
    B, c, O, P = moved.shape
    onehot = torch.nn.functional.one_hot(mu, m).to(logits.dtype)
    h = (moved.unsqueeze(3) * onehot.view(1, c, 1, m, 1)).view(B, c, O * m * P)
    return h.add_(logits.unsqueeze(1))


@pytest.mark.parametrize("split", [(1, 1, 10), (1, 5, 2), (5, 2, 1), (10, 1, 1), (2, 3, 2)])
def test_moved_logits_equal_the_one_hot_sum_bitwise(split):
    """Every folding of a 10-logit last layer's cores (and a generic one): the scatter gives
    the one-hot product's bits, with exact zeros and negative moves among the entries."""
    from bpfree.ttzo import layerwise

    O, m, P = split
    g = torch.Generator().manual_seed(sum(split))
    B, c = 7, 23
    logits = torch.randn(B, O * m * P, generator=g)
    moved = torch.randn(B, c, O, P, generator=g) * 1e-3
    moved[:, ::4] = 0.0
    mu = torch.randint(0, m, (c,), generator=g)
    expected = _one_hot_moved_logits(logits, moved.clone(), mu, m)
    got = layerwise._moved_logits(logits, moved.clone(), mu, m)
    assert got.shape == (B, c, O * m * P)
    assert torch.equal(got, expected)
    assert not torch.equal(got, logits.unsqueeze(1).expand_as(got))   # the moves are there


@pytest.mark.parametrize("central, subset", [(False, None), (True, 300)],
                         ids=["forward-full", "central-subset"])
def test_cge_steps_are_bit_identical_to_the_one_hot_path(central, subset, monkeypatch):
    """Float32 CGE training steps on the §5.1 TT-MLP (r = 2): every loss and the weights
    after the steps are the same bits as with the last layer's one-hot product."""
    from bpfree.ttzo import layerwise

    x, y = _batch(n=16, features=784, classes=10, dtype=torch.float32)

    def run():
        torch.manual_seed(0)
        model = tt_mlp(2)
        trainer = ZOTrainer(model, "cge", mu=1e-2, mode="batched", central=central,
                            num_coordinates=subset, momentum=0.9, seed=3)
        losses = [trainer.step(x, y, 1e-2)["loss"] for _ in range(3)]
        return losses, [p.detach().clone() for p in model.parameters()]

    losses, weights = run()
    monkeypatch.setattr(layerwise, "_moved_logits", _one_hot_moved_logits)
    ref_losses, ref_weights = run()
    assert losses == ref_losses or (central and all(v != v for v in losses + ref_losses))
    assert all(torch.equal(w, r) for w, r in zip(weights, ref_weights))
    torch.manual_seed(0)
    assert not all(torch.equal(w, p) for w, p in zip(weights, tt_mlp(2).parameters()))


def test_points_are_grouped_by_tensor_as_the_per_point_loop_did():
    """Shuffled points of three tensors with repeats: each tensor's positions, offsets and
    float64 steps in point order, tensors in order of first occurrence."""
    from bpfree.ttzo import layerwise

    g = torch.Generator().manual_seed(11)
    points = [(int(i), int(j), float(d)) for i, j, d in
              zip(torch.randint(0, 3, (200,), generator=g), torch.randint(0, 50, (200,), generator=g),
                  torch.randn(200, generator=g, dtype=torch.float64) * 1e-2)]
    points += points[:5]
    expected: dict = {}
    for n, (i, _, _) in enumerate(points):
        expected.setdefault(i, []).append(n)
    groups = layerwise._by_tensor(points)
    assert list(groups) == list(expected)
    for i, (index, flat, steps) in groups.items():
        assert index.tolist() == expected[i]
        assert flat.tolist() == [points[n][1] for n in expected[i]]
        assert steps.dtype == torch.float64
        assert steps.tolist() == [points[n][2] for n in expected[i]]
    assert layerwise._by_tensor([]) == {}


@pytest.mark.parametrize("central, subset, mu", [(False, None, 1e-2), (True, 40, 0.3),
                                                 (False, 40, 1e-3)])
def test_cge_points_are_the_nested_loops_points(central, subset, mu, monkeypatch):
    """CoordinateWise's evaluation points, zipped: the same (tensor, offset, ±1.0·μ) tuples
    in the same order as the nested comprehension they replace, and the same three columns
    as tensors (estimators.coordinate.Points)."""
    model = _small_tt()
    x, y = _batch()
    seen = []
    trainer = ZOTrainer(model, "cge", mu=mu, mode="batched", central=central,
                        num_coordinates=subset, seed=5)
    monkeypatch.setattr(type(trainer.estimator), "evaluate",
                        lambda self, ctx, points: (seen.append(points), (0.0, [0.0] * len(points)))[1])
    ctx = trainer.optimizer.context(Objective(model, x, y))
    trainer.estimator.estimate(ctx)
    sizes = [p.numel() for p in ctx.params]
    offsets = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    coords = trainer.estimator._coordinates(ctx, offsets[-1])
    tensor = torch.searchsorted(torch.tensor(offsets[1:]), coords, right=True)
    offset = coords - torch.tensor(offsets[:-1])[tensor]
    signs = (1.0, -1.0) if central else (1.0,)
    expected = [(i, j, s * mu) for i, j in zip(tensor.tolist(), offset.tolist()) for s in signs]
    assert seen == [expected]
    assert len(expected) == (subset or offsets[-1]) * len(signs)
    # the tensor columns it carries are the tuples', and group exactly as the tuples do
    points = seen[0]
    assert points.tensor.tolist() == [i for i, _, _ in expected]
    assert points.offset.tolist() == [j for _, j, _ in expected]
    assert points.step.dtype == torch.float64
    assert points.step.tolist() == [d for _, _, d in expected]
    from bpfree.ttzo import layerwise
    fast, plain = layerwise._by_tensor(points), layerwise._by_tensor(list(points))
    assert list(fast) == list(plain)
    assert all(torch.equal(a, b) for i in fast for a, b in zip(fast[i], plain[i]))


def _einsum_tail_outputs(kind, j, d, a, z, tail, logits):
    """The dense shortcut's outputs as the chunked path formed them before (the reference
    for :func:`~bpfree.ttzo.layerwise._dense_tail_outputs`' bits)."""
    acts_after, last = tail
    i_out = j if kind == "bias" else j // a.shape[-1]
    zs, ws = z[:, i_out].T, last[:, i_out].T
    zs_new = zs + (d[:, None] if kind == "bias" else d[:, None] * a[:, j % a.shape[-1]].T)
    for m in acts_after:
        zs_new, zs = m(zs_new), m(zs)
    return (logits + torch.einsum("cb,co->cbo", zs_new - zs, ws)).contiguous()


@pytest.mark.parametrize("activation", [nn.ReLU, nn.Identity])
@pytest.mark.parametrize("kind", ["dense", "bias"])
def test_dense_tail_outputs_equal_the_einsum_form_bitwise(activation, kind):
    """float32, steps of both signs and a repeated offset, large enough that ReLU outputs
    cross the kink: the same bits as the einsum form (ReLU / identity tails only, see
    _dense_tail_outputs)."""
    from bpfree.ttzo import layerwise

    g = torch.Generator().manual_seed(3)
    B, N, M, C = 9, 13, 7, 5
    a, z = torch.rand(B, N, generator=g), torch.randn(B, M, generator=g)
    tail = ([activation()], torch.randn(C, M, generator=g))
    logits = torch.randn(B, C, generator=g)
    size = M * N if kind == "dense" else M
    j = torch.cat([torch.randperm(size, generator=g)[:40], torch.tensor([3, 3])])[: size + 2]
    d = torch.randn(j.numel(), generator=g) * 0.5
    got = layerwise._dense_tail_outputs(kind, j, d, a, z, tail, logits)
    expected = _einsum_tail_outputs(kind, j, d, a, z, tail, logits)
    assert got.shape == (j.numel(), B, C) and got.is_contiguous()
    assert torch.equal(got, expected)
    assert not torch.equal(got, logits.expand_as(got))


def test_dense_mlp_cge_steps_are_bit_identical_to_the_einsum_form(monkeypatch):
    """Float32 CGE training steps on the 784-10-10 MLP (every first-layer weight takes the
    dense shortcut): the same losses and weights as with the einsum form."""
    from bpfree.ttzo import layerwise

    x, y = _batch(n=16, features=784, classes=10, dtype=torch.float32)

    def run():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(784, 10), nn.ReLU(), nn.Linear(10, 10))
        trainer = ZOTrainer(model, "cge", mu=1e-2, mode="batched", num_coordinates=2000,
                            momentum=0.9, seed=3)
        losses = [trainer.step(x, y, 1e-2)["loss"] for _ in range(3)]
        return losses, [p.detach().clone() for p in model.parameters()]

    losses, weights = run()
    monkeypatch.setattr(layerwise, "_dense_tail_outputs", _einsum_tail_outputs)
    ref_losses, ref_weights = run()
    assert losses == ref_losses
    assert all(torch.equal(w, r) for w, r in zip(weights, ref_weights))


def test_kinks_of_a_subset_step_skip_entries_not_asked_for_when_the_jacobian_is_not_finite():
    """A CGE step over a coordinate subset of a diverged model (an infinite Jacobian entry):
    an entry not asked for has δ = 0, and 0·inf is NaN, which "crosses" ReLU's kink. It
    has no column (-1) and must be skipped, not indexed (it raised IndexError inside
    bench tt-zo's seeded runs); entries asked for still get their exact kink."""
    from bpfree.ttzo.layerwise import _add_kinks

    shape = (1, 2, 2, 1)                            # (r0, m, n, r1): E = 2 entries, 2 digits
    zv = torch.tensor([0.05, -1.0], dtype=torch.float64).view(1, 1, 2, 1)   # (B, O, m, P)
    wv = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]],
                      dtype=torch.float64).view(3, 1, 2, 1)                  # (C, O, m, P)
    jac = torch.tensor([-1.0, float("inf")], dtype=torch.float64).view(1, 2, 1, 1)
    cols, deltas = torch.tensor([0]), torch.tensor([0.1], dtype=torch.float64)  # entry 0, digit 0
    h = torch.zeros(1, 1, 3, dtype=torch.float64)
    _add_kinks(h, jac, zv, wv, shape, cols, deltas)
    # entry 0 at digit 0: z = 0.05 moves by 0.1·(-1) to -0.05, crossing the kink:
    # κ = relu(-0.05) - relu(0.05) - (-0.1) = 0.05, times W'[:, output (0, 0, 0)]
    assert torch.allclose(h.view(-1), 0.05 * wv[:, 0, 0, 0])
