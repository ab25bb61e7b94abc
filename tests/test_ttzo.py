"""TT-ZO hybrid optimizer and baselines (bpfree.ttzo)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from bpfree.pmt import accuracy, fit
from bpfree.ttzo import (BPTrainer, DirectFeedbackAlignment, FeedbackAlignment, ForwardGradientA,
                         ForwardGradientW, HybridZO, MaskedModel, StallDetector, ZOTrainer,
                         grasp_prune, queries_to_accuracy, train)


def mlp(sizes=(64, 16, 10), seed=0):
    torch.manual_seed(seed)
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def batch(n=8, d=64, c=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, c, (n,), generator=g)


def bp_grads(model, x, y):
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def digits():
    from bpfree.data import load_digits_split

    xtr, ytr, xte, yte = (torch.from_numpy(a) for a in load_digits_split(seed=0))
    return xtr, ytr, xte, yte


# ------------------------------------------------------------------------------------------
# Stall detector
# ------------------------------------------------------------------------------------------


def run(detector, losses):
    return [e for e, loss in enumerate(losses) if detector.end_epoch(loss)]


def test_stall_detector_relative_rule_docstring_example():
    det = StallDetector(patience=2, threshold=0.01)
    assert run(det, [1.0, 0.9, 0.895, 0.894, 0.5]) == [3]
    assert det.stalled and det.stalled_at == 3


def test_stall_detector_patience_counts_consecutive_epochs():
    det = StallDetector(patience=3, threshold=0.0)
    # an improvement resets the count: stall only after 3 non-improving epochs in a row
    assert run(det, [1.0, 1.0, 1.0, 0.9, 0.95, 0.9, 0.91, 0.92]) == [6]


def test_stall_detector_threshold_edge_is_not_an_improvement():
    # absolute threshold: improvement needs loss < best - 0.25 strictly (exact binary values)
    det = StallDetector(patience=1, threshold=0.25, mode="absolute")
    assert run(det, [2.0, 1.5, 1.25]) == [2]       # 1.25 == 1.5 - 0.25: no improvement
    det = StallDetector(patience=1, threshold=0.25, mode="absolute")
    assert run(det, [2.0, 1.5, 1.125, 1.0]) == [3]
    # relative: 0.5 * |best|
    det = StallDetector(patience=1, threshold=0.5)
    assert run(det, [4.0, 1.0, 0.5]) == [2]        # 0.5 == 1.0 * (1 - 0.5)


def test_stall_detector_first_epoch_never_stalls_and_nan_does_not_improve():
    det = StallDetector(patience=1, threshold=0.0)
    assert run(det, [5.0]) == []
    det = StallDetector(patience=2, threshold=0.0)
    assert run(det, [1.0, float("nan"), float("inf")]) == [2]
    det = StallDetector(patience=1, threshold=0.0)
    assert run(det, [float("nan"), 3.0, 3.0]) == [0]   # a NaN epoch is a non-improving epoch
    assert det.best == 3.0 and det.stalled_at == 0     # stays stalled at the first stall


def test_stall_detector_uses_best_not_previous_loss():
    # a rise then a partial recovery is still not below the best
    det = StallDetector(patience=2, threshold=0.0)
    assert run(det, [1.0, 2.0, 1.5, 0.5]) == [2]


@pytest.mark.parametrize("kwargs", [dict(patience=0), dict(threshold=-1.0), dict(mode="x")])
def test_stall_detector_rejects_bad_config(kwargs):
    with pytest.raises(ValueError):
        StallDetector(**kwargs)


# ------------------------------------------------------------------------------------------
# ZO trainers: forward counting
# ------------------------------------------------------------------------------------------


def test_sign_rge_counts_n_plus_one_batch_forwards_per_step():
    model = mlp()
    x, y = batch(n=8)
    t = ZOTrainer(model, "sign_rge", num_queries=10, mu=0.1)
    for _ in range(3):
        out = t.step(x, y, 1e-3)
    assert out["batch_forwards"] == 11 == t.batch_forwards_per_step()
    assert t.batch_forwards == 3 * 11
    assert t.forwards == 3 * 8 * 11


def test_sign_rge_update_is_lr_times_sign():
    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    t = ZOTrainer(model, "sign_rge")
    t.step(*batch(), 1e-3)
    for b, p in zip(before, model.parameters()):
        step = (b - p.detach()).abs()
        assert torch.allclose(step, torch.full_like(step, 1e-3), atol=1e-7)


@pytest.mark.parametrize("central", [False, True])
def test_cge_counts_d_plus_one_or_2d(central):
    model = mlp(sizes=(6, 4, 3))
    d = sum(p.numel() for p in model.parameters())
    x, y = batch(n=5, d=6, c=3)
    t = ZOTrainer(model, "cge", central=central, momentum=0.9)
    t.step(x, y, 1e-2)
    t.step(x, y, 1e-2)
    per = 2 * d if central else d + 1
    assert t.batch_forwards_per_step() == per
    assert t.batch_forwards == 2 * per
    assert t.forwards == 2 * 5 * per


def test_cge_momentum_matches_heavy_ball_on_true_gradient():
    # CGE with small mu ~ the true gradient; two momentum steps: b1 = g0*m + g1
    model = mlp(sizes=(6, 4, 3)).double()
    ref = mlp(sizes=(6, 4, 3)).double()
    x, y = batch(n=5, d=6, c=3)
    x = x.double()
    t = ZOTrainer(model, "cge", mu=1e-5, central=True, momentum=0.9)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, dampening=0.0)
    for _ in range(2):
        t.step(x, y, 0.1)
        opt.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-8)


def test_zo_trainer_rejects_unknown_estimator():
    with pytest.raises(ValueError, match="estimator"):
        ZOTrainer(mlp(), "spsa")


# ------------------------------------------------------------------------------------------
# Hybrid
# ------------------------------------------------------------------------------------------


def test_hybrid_switches_estimator_and_logs_epoch_and_per_phase_forwards():
    model = mlp(sizes=(6, 4, 3))
    d = sum(p.numel() for p in model.parameters())
    x, y = batch(n=4, d=6, c=3)
    h = HybridZO(model, patience=2, threshold=0.0)
    scripted = [2.0, 1.0, 1.0, 1.0, 0.1]   # stall declared at epoch 3 (patience 2) -> CGE from 4
    steps_per_epoch = 2
    for epoch, loss in enumerate(scripted):
        for _ in range(steps_per_epoch):
            out = h.step(x, y, 1e-3)
            assert out["phase"] == ("sign_rge" if epoch < 4 else "cge")
        switched = h.end_epoch(loss)
        assert switched == (epoch == 3)
    hist = h.history
    assert hist["stall_epoch"] == 3 and hist["switch_epoch"] == 4
    assert hist["epoch_phase"] == ["sign_rge"] * 4 + ["cge"]
    assert hist["steps"] == {"sign_rge": 8, "cge": 2}
    assert hist["batch_forwards"] == {"sign_rge": 8 * 11, "cge": 2 * (d + 1)}
    assert hist["forwards"] == {"sign_rge": 4 * 8 * 11, "cge": 4 * 2 * (d + 1)}
    assert h.batch_forwards == 8 * 11 + 2 * (d + 1)
    assert h.forwards == 4 * h.batch_forwards
    assert isinstance(h.fine.optimizer.transforms[0].beta, float)
    assert h.fine.estimator.mu == 0.01 and h.coarse.estimator.mu == 0.1


def test_hybrid_stall_index_matches_scripted_rule():
    # scripted sequence above: epochs 2 and 3 (1.0, not below best 1.0) are the 2 bad epochs
    det = StallDetector(patience=2, threshold=0.0)
    assert run(det, [2.0, 1.0, 1.0, 1.0]) == [3]


def test_hybrid_min_and_max_coarse_epochs():
    x, y = batch(n=4, d=6, c=3)
    h = HybridZO(mlp(sizes=(6, 4, 3)), patience=1, threshold=0.0, min_coarse_epochs=4)
    for loss in [1.0, 1.0, 1.0]:
        assert not h.end_epoch(loss)
    assert h.end_epoch(1.0) and h.history["switch_epoch"] == 4
    h = HybridZO(mlp(sizes=(6, 4, 3)), patience=5, max_coarse_epochs=2)
    assert not h.end_epoch(3.0)
    assert h.end_epoch(2.0) and h.history["switch_epoch"] == 2
    h.step(x, y, 1e-3)
    assert h.phase == "cge"


def test_hybrid_cge_lr_scale_multiplies_only_the_cge_step():
    x, y = batch(n=4, d=6, c=3)
    moves = {}
    for scale in (1.0, 10.0):
        model = mlp(sizes=(6, 4, 3)).double()
        h = HybridZO(model, max_coarse_epochs=1, cge_lr_scale=scale)
        p0 = [p.detach().clone() for p in model.parameters()]
        h.step(x.double(), y, 1e-3)                       # signRGE: every entry moves by lr
        sign_move = torch.cat([(p - q).abs().flatten() for p, q in zip(model.parameters(), p0)])
        assert torch.allclose(sign_move, torch.full_like(sign_move, 1e-3), atol=1e-12)
        assert h.end_epoch(1.0) and h.phase == "cge"
        p1 = [p.detach().clone() for p in model.parameters()]
        h.step(x.double(), y, 1e-3)                       # CGE: b_0 = g_0, θ -= lr*scale*g_0
        moves[scale] = torch.cat([(p - q).flatten() for p, q in zip(model.parameters(), p1)])
    assert moves[1.0].abs().max() > 0
    assert torch.allclose(moves[10.0], 10.0 * moves[1.0], rtol=1e-9, atol=1e-15)
    for bad in (0.0, -1.0, float("inf"), True):
        with pytest.raises(ValueError, match="cge_lr_scale must be a finite number > 0"):
            HybridZO(mlp(sizes=(6, 4, 3)), cge_lr_scale=bad)


def test_hybrid_auto_epochs_under_pmt_fit(digits):
    xtr, ytr, _, _ = digits
    x, y = xtr[:128], ytr[:128]
    h = HybridZO(mlp(), patience=1, threshold=10.0, steps_per_epoch=2, cge_coordinates=20)
    fit(h, x, y, epochs=2, batch_size=64, lr=1e-3, schedule="constant")
    assert h.history["switch_epoch"] == 2 and len(h.history["epoch_loss"]) == 2
    h2 = HybridZO(mlp(), patience=1, threshold=10.0, steps_per_epoch=2, cge_coordinates=20)
    fit(h2, x, y, epochs=3, batch_size=64, lr=1e-3, schedule="constant")
    assert h2.history["steps"] == {"sign_rge": 4, "cge": 2}
    assert h2.history["batch_forwards"]["cge"] == 2 * 21


# ------------------------------------------------------------------------------------------
# Forward gradients
# ------------------------------------------------------------------------------------------


def test_fg_w_is_unbiased():
    model = mlp(sizes=(6, 5, 3))
    x, y = batch(n=16, d=6, c=3)
    true = torch.cat([g.flatten() for g in bp_grads(model, x, y)])
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    fg = ForwardGradientW(model, num_queries=2000, seed=3)
    fg.step(x, y, 1.0)   # θ ← θ − 1·ĝ, ĝ = mean over 2000 directions
    est = before - torch.cat([p.detach().flatten() for p in model.parameters()])
    cos = torch.nn.functional.cosine_similarity(est, true, dim=0)
    assert cos > 0.9
    assert fg.batch_forwards == 2000 and fg.forwards == 2000 * 16


def test_fg_a_weight_grads_equal_outer_product_formula():
    model = mlp(sizes=(6, 5, 3))
    x, y = batch(n=7, d=6, c=3)
    fga = ForwardGradientA(model, seed=0)
    loss, grads = fga.gradients(x, y)
    assert fga.batch_forwards == 2 and fga.forwards == 14
    lin = [m for m in model if isinstance(m, nn.Linear)]
    # inputs of each layer and the exact per-sample pre-activation gradients (autograd)
    h0 = x
    z1 = lin[0](h0)
    h1 = torch.relu(z1)
    z2 = lin[1](h1)
    z1.retain_grad()
    z2.retain_grad()
    nn.functional.cross_entropy(z2, y).backward()
    for g, h, z in zip(grads, (h0, h1), (z1, z2)):
        assert torch.allclose(g["input"], h.detach())
        # directional derivative per sample: d_n = B * ∇_{z_n} L · u_n
        d = (z.grad * 7 * g["u"]).sum(-1)
        assert torch.allclose(g["d"], d, atol=1e-5)
        g_z = d[:, None] * g["u"] / 7
        assert torch.allclose(g["weight"], g_z.T @ h.detach(), atol=1e-6)
        assert torch.allclose(g["bias"], g_z.sum(0), atol=1e-6)
    assert math.isclose(loss, float(nn.functional.cross_entropy(z2, y).detach()), rel_tol=1e-6)


def test_fg_a_unbiased_on_average_and_rejects_other_layers():
    model = mlp(sizes=(6, 5, 3))
    x, y = batch(n=4, d=6, c=3)
    true = bp_grads(model, x, y)
    fga = ForwardGradientA(model, seed=1)
    acc = [torch.zeros_like(t) for t in true]
    for _ in range(1000):
        _, grads = fga.gradients(x, y)
        for i, g in enumerate(grads):
            acc[2 * i] += g["weight"] / 1000
            acc[2 * i + 1] += g["bias"] / 1000
    est, ref = torch.cat([a.flatten() for a in acc]), torch.cat([t.flatten() for t in true])
    assert torch.nn.functional.cosine_similarity(est, ref, dim=0) > 0.9
    with pytest.raises(TypeError, match="nn.Linear"):
        ForwardGradientA(nn.Sequential(nn.Conv1d(1, 1, 3)))


# ------------------------------------------------------------------------------------------
# Feedback alignment
# ------------------------------------------------------------------------------------------


def test_fa_with_forward_weights_is_bp():
    model = mlp(sizes=(6, 5, 4, 3))
    x, y = batch(n=9, d=6, c=3)
    lin = [m for m in model if isinstance(m, nn.Linear)]
    fa = FeedbackAlignment(model, feedback=[l.weight for l in lin[1:]])
    loss, grads = fa.gradients(x, y)
    ref = bp_grads(model, x, y)
    flat = [g for pair in grads for g in pair]
    for g, r in zip(flat, ref):
        assert torch.allclose(g, r, atol=1e-6)
    ref_model = mlp(sizes=(6, 5, 4, 3))
    fa.step(x, y, 0.5)
    BPTrainer(ref_model).step(x, y, 0.5)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def test_dfa_matches_fa_on_one_hidden_layer():
    x, y = batch(n=9, d=6, c=3)
    b = torch.randn(3, 5)
    fa = FeedbackAlignment(mlp(sizes=(6, 5, 3)), feedback=[b])
    dfa = DirectFeedbackAlignment(mlp(sizes=(6, 5, 3)), feedback=[b])
    for _ in range(3):
        fa.step(x, y, 0.3)
        dfa.step(x, y, 0.3)
    for p, q in zip(fa.model.parameters(), dfa.model.parameters()):
        assert torch.equal(p, q)


def test_fa_random_feedback_differs_from_bp_and_rejects_non_mlps():
    model = mlp(sizes=(6, 5, 3))
    x, y = batch(n=9, d=6, c=3)
    _, grads = FeedbackAlignment(model, seed=0).gradients(x, y)
    ref = bp_grads(model, x, y)
    assert torch.allclose(grads[1][0], ref[2])           # output layer: exact
    assert not torch.allclose(grads[0][0], ref[0])       # hidden layer: random feedback
    for bad in (nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)),
                nn.Linear(4, 2)):
        with pytest.raises(TypeError, match="Linear"):
            DirectFeedbackAlignment(bad)
    with pytest.raises(ValueError, match="shapes"):
        FeedbackAlignment(model, feedback=[torch.zeros(5, 3)])


# ------------------------------------------------------------------------------------------
# GraSP / masked model
# ------------------------------------------------------------------------------------------


def test_grasp_keeps_exact_target_and_masked_weights_stay_zero():
    model = mlp(sizes=(6, 8, 3))
    x, y = batch(n=32, d=6, c=3)
    masks, sp = grasp_prune(model, (x, y), target_params=20)
    assert isinstance(sp, MaskedModel) and sp.net is not model
    assert sum(int(m.sum()) for m in masks.values()) == 20
    assert set(masks) == {"0.weight", "2.weight"}
    biases = 8 + 3
    assert sp.num_kept() == 20 + biases
    for name, w in sp.dense_weights().items():
        assert torch.all(w[~masks[name]] == 0)
    # the same function as the original model with the pruned weights zeroed
    ref = mlp(sizes=(6, 8, 3))
    with torch.no_grad():
        for name, m in masks.items():
            dict(ref.named_parameters())[name].mul_(m)
    assert torch.allclose(sp(x), ref(x), atol=1e-6)
    # train with BP, RGE, CGE (lean and batched): pruned weights stay zero
    trainers = [BPTrainer(sp), ZOTrainer(sp, "rge"), ZOTrainer(sp, "cge"),
                ZOTrainer(sp, "sign_rge", mode="batched"), ForwardGradientW(sp)]
    for t in trainers:
        t.step(x, y, 0.1)
    cge = trainers[2]
    assert cge.batch_forwards == 20 + biases + 1     # CGE only queries the kept weights
    for name, w in sp.dense_weights().items():
        assert torch.all(w[~masks[name]] == 0)
        assert torch.all(w[masks[name]] != 0)
        assert torch.equal(sp.masks()[name], masks[name])


def test_grasp_count_unprunable_and_errors():
    model = mlp(sizes=(6, 8, 3))
    x, y = batch(n=16, d=6, c=3)
    masks, sp = grasp_prune(model, (x, y), target_params=40, count_unprunable=True)
    assert sp.num_kept() == 40
    with pytest.raises(ValueError, match="only"):
        grasp_prune(model, (x, y), target_params=10_000)


def test_grasp_scores_are_minus_theta_hg():
    from bpfree.ttzo import grasp_scores

    model = mlp(sizes=(4, 3, 2))
    x, y = batch(n=8, d=4, c=2)
    scores = grasp_scores(model, (x, y), temperature=1.0)
    params = [model[0].weight, model[2].weight]
    f = lambda a, b: nn.functional.cross_entropy(  # noqa: E731
        torch.func.functional_call(model, {"0.weight": a, "2.weight": b}, (x,)), y)
    g = torch.autograd.grad(f(*params), params)
    _, hg = torch.autograd.functional.hvp(f, tuple(p.detach() for p in params), g)
    assert torch.allclose(scores["0.weight"], -params[0].detach() * hg[0], atol=1e-6)
    assert torch.allclose(scores["2.weight"], -params[1].detach() * hg[1], atol=1e-6)


# ------------------------------------------------------------------------------------------
# Short digits runs: every trainer reduces the loss
# ------------------------------------------------------------------------------------------


# name: (make(model, seed), lr, (mean, sd) of the drop of the training-split loss over 3
# epochs of 6 steps, measured on seeds 0-24 with exactly these settings). The ZO rates and
# query counts are set so that the drop stands at >= 3 sd from 0.
TRAINERS = {
    "bp_sgd": (lambda m, s: BPTrainer(m), 0.5, (0.607, 0.100)),
    "bp_adam": (lambda m, s: BPTrainer(m, "adam"), 1e-2, (0.633, 0.091)),
    "zo_rge": (lambda m, s: ZOTrainer(m, "rge", num_queries=10, mu=1e-2, seed=s), 0.2,
               (0.186, 0.048)),
    "zo_sign_rge": (lambda m, s: ZOTrainer(m, "sign_rge", num_queries=20, seed=s), 2e-2,
                    (0.094, 0.018)),
    "zo_cge": (lambda m, s: ZOTrainer(m, "cge", momentum=0.9, mode="batched", chunk_size=256,
                                      seed=s), 5e-2, (0.213, 0.048)),
    "hybrid": (lambda m, s: HybridZO(m, num_queries=20, patience=1, threshold=0.2,
                                     mode="batched", chunk_size=256, seed=s), 2e-2,
               (0.087, 0.018)),
    "fg_w": (lambda m, s: ForwardGradientW(m, num_queries=4, seed=s), 0.1, (0.083, 0.028)),
    "fg_a": (lambda m, s: ForwardGradientA(m, seed=s), 0.2, (0.140, 0.036)),
    "fa": (lambda m, s: FeedbackAlignment(m, seed=s), 0.5, (0.333, 0.061)),
    "dfa": (lambda m, s: DirectFeedbackAlignment(m, seed=s), 0.5, (0.434, 0.076)),
}


def _loss(model, x, y):
    with torch.no_grad():
        return float(nn.functional.cross_entropy(model(x), y))


@pytest.mark.parametrize("name", list(TRAINERS))
def test_short_digits_run_reduces_loss(digits, name):
    """On seeds 0-4 (weights, batch order, perturbations) the loss of the whole training split
    falls on every seed, and the 5-seed mean drop reaches the measured mean less 4 sd of a
    5-seed mean (4 sd / sqrt(5)); a trainer that does not learn drops nothing on average."""
    xtr, ytr, xte, yte = digits
    make, lr, (mean, sd) = TRAINERS[name]
    drops = []
    for seed in range(5):
        method = make(mlp(sizes=(64, 16, 10), seed=seed), seed)
        before = _loss(method.model, xtr, ytr)
        log = train(method, xtr, ytr, epochs=3, batch_size=64, lr=lr, x_val=xte, y_val=yte,
                    max_steps_per_epoch=6, seed=seed)
        drops.append(before - _loss(method.model, xtr, ytr))
        assert log.epoch_forwards[-1] == log.forwards[-1] == method.forwards > 0
        assert len(log.val_acc) == 3
        if name == "hybrid":
            assert log.switch_epoch is not None
            assert log.epoch_phase[-1] == "cge"
    assert min(drops) > 0, drops
    assert sum(drops) / len(drops) > mean - 4 * sd / math.sqrt(len(drops)), drops


def test_queries_to_accuracy_reads_the_log(digits):
    xtr, ytr, xte, yte = digits
    method = BPTrainer(mlp(seed=0))
    log = train(method, xtr, ytr, epochs=3, lr=0.5, x_val=xte, y_val=yte)
    assert queries_to_accuracy(log, 0.0, unit="forwards") == log.epoch_forwards[0] > 0
    assert log.epoch_forwards[0] == log.forwards[len(log.loss) // 3 - 1]   # end of epoch 0
    assert queries_to_accuracy(log, 101.0, unit="forwards") is None
    assert accuracy(method.model, xte, yte) == log.val_acc[-1]


def test_forward_gradient_w_takes_num_queries_and_its_old_name_with_a_warning():
    model = nn.Sequential(nn.Linear(4, 3))
    assert ForwardGradientW(model, num_queries=3).optimizer.estimator.num_queries == 3
    with pytest.warns(DeprecationWarning, match="'num_directions' is deprecated; use "
                                                "'num_queries'"):
        fg = ForwardGradientW(model, num_directions=2)
    assert fg.optimizer.estimator.num_queries == 2
    with pytest.raises(TypeError, match="give num_queries only"):
        ForwardGradientW(model, num_queries=2, num_directions=2)
