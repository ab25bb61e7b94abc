"""ZOOptimizer: updates, transforms, modes, NaN guard, state and resume, bad input."""

import math

import pytest
import torch
from torch import nn

from bpfree import transforms as T
from bpfree.checkpoint import restore_checkpoint, save_checkpoint
from bpfree.estimators import cge, node_perturbation, rge, spsa
from bpfree.objective import Objective
from bpfree.optim import ZOOptimizer, select_parameters


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def batch(seed=1, n=32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def test_lazy_update_equals_sgd_on_the_materialized_estimate():
    """Seed-replayed update θ ← θ − η Σ w_k ξ_k must equal an explicit SGD step."""
    m1, m2 = mlp(), mlp()
    x, y = batch()
    o1 = ZOOptimizer(m1.parameters(), lr=0.05, estimator=rge(4, 1e-3), seed=5)
    o2 = ZOOptimizer(m2.parameters(), lr=0.05, estimator=rge(4, 1e-3), seed=5,
                     transforms=[T.clip_by_value(1e30)])  # forces the materialized path
    o1.step(Objective(m1, x, y))
    o2.step(Objective(m2, x, y))
    for a, b in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert not all(torch.equal(a, b) for a, b in zip(mlp().parameters(), m1.parameters()))


def test_training_reduces_the_loss():
    model = mlp()
    x, y = batch(n=64)
    obj = Objective(model, x, y)
    opt = ZOOptimizer(model.parameters(), lr=0.5, estimator=node_perturbation(8, 1e-3),
                      transforms=[T.gradient_norm_scaling()], mode="batched")
    first = float(obj())
    for _ in range(40):
        opt.step(obj)
    assert float(obj()) < 0.8 * first
    assert opt.batch_forwards == 40 * 2 * (8 + 1)  # two layers, Q + 1 passes each


def test_lean_and_batched_training_agree():
    x, y = batch()
    results = []
    for mode in ("lean", "batched"):
        model = mlp()
        opt = ZOOptimizer(model.parameters(), lr=0.1, estimator=spsa(4, 1e-2), mode=mode, seed=3)
        for _ in range(3):
            opt.step(Objective(model, x, y))
        results.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_trainable_subset_by_name_pattern_leaves_the_rest_untouched():
    model = mlp()
    frozen = model[0].weight.detach().clone()
    opt = ZOOptimizer(select_parameters(model, "2.*"), lr=0.1, estimator=rge(4, 1e-2))
    x, y = batch()
    opt.step(Objective(model, x, y))
    assert torch.equal(model[0].weight, frozen)
    assert opt.param_groups[0]["param_names"] == ["2.weight", "2.bias"]


def test_select_parameters_errors_and_module_selection():
    model = mlp()
    assert [n for n, _ in select_parameters(model, modules=model[2])] == ["2.weight", "2.bias"]
    assert [n for n, _ in select_parameters(model, exclude="*.bias")] == ["0.weight", "2.weight"]
    with pytest.raises(ValueError, match="no parameter matches"):
        select_parameters(model, "nope.*")


def test_gradient_norm_and_quantization_scaling_factors():
    info = T.TensorInfo(name="w", num_directions=10, dim=91, scale=0.5)
    assert T.gradient_norm_scaling().factor(info) == pytest.approx(10 / 100)
    assert T.quantization_aware_scaling().factor(info) == pytest.approx(4.0)


def test_qas_scales_the_step_by_inverse_square_scale():
    x, y = batch()
    deltas = []
    for scale in (1.0, 0.5):
        model = mlp()
        before = model[2].weight.detach().clone()
        opt = ZOOptimizer([{"params": list(model.parameters()), "scale": scale}], lr=0.01,
                          estimator=rge(2, 1e-3), transforms=[T.quantization_aware_scaling()], seed=1)
        opt.step(Objective(model, x, y))
        deltas.append(model[2].weight.detach() - before)
    torch.testing.assert_close(deltas[1], 4.0 * deltas[0], rtol=1e-4, atol=1e-8)


def test_tensor_transforms():
    g = [torch.tensor([3.0, -4.0]), torch.tensor([0.5])]
    p = [torch.tensor([6.0, 8.0]), torch.tensor([2.0])]
    infos = [None, None]
    assert torch.equal(T.sign().update(g, {}, infos, p)[0], torch.tensor([1.0, -1.0]))
    kn = T.kernelwise_normalization().update(g, {}, infos, p)
    assert float(torch.linalg.vector_norm(kn[0])) == pytest.approx(10.0)
    clipped = T.clip_by_norm(1.0).update(g, {}, infos, p)
    total = math.sqrt(sum(float((c ** 2).sum()) for c in clipped))
    assert total == pytest.approx(1.0, rel=1e-6)
    assert T.clip_by_value(0.5).update(g, {}, infos, p)[0].tolist() == [0.5, -0.5]
    mom = T.momentum(0.5)
    st = mom.init(p)
    mom.update([torch.ones(2), torch.ones(1)], st, infos, p)
    out = mom.update([torch.ones(2), torch.ones(1)], st, infos, p)
    assert out[0].tolist() == [1.5, 1.5]  # b_t = m b_{t-1} + g_t


def test_schedules():
    c = T.cosine(100, final=0.1)
    assert c(0) == pytest.approx(1.0) and c(100) == pytest.approx(0.1) and c(50) == pytest.approx(0.55)
    e = T.exponential(0.9, every=10)
    assert e(9) == 1.0 and e(10) == pytest.approx(0.9) and e(25) == pytest.approx(0.81)
    with pytest.raises(ValueError, match="total_steps"):
        T.cosine(0)
    with pytest.raises(ValueError, match="gamma"):
        T.exponential(1.5)


def test_nan_step_changes_nothing():
    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    opt = ZOOptimizer(model.parameters(), lr=0.1, estimator=rge(3, 1e-3),
                      transforms=[T.momentum(0.9)])
    opt.step(lambda: torch.tensor(float("nan")))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert opt.last_stats.dropped == 3 and not opt.last_stats.applied
    assert opt.state["transforms"][0]["buffers"] == [None] * 4  # momentum untouched
    assert opt.step_count == 1


def test_partial_nan_queries_are_dropped_but_step_applies():
    model = mlp()
    x, y = batch()
    obj = Objective(model, x, y)
    calls = {"n": 0}

    def closure():
        calls["n"] += 1
        return torch.tensor(float("inf")) if calls["n"] == 3 else obj()

    opt = ZOOptimizer(model.parameters(), lr=0.1, estimator=rge(4, 1e-3))
    opt.step(closure)
    assert opt.last_stats.dropped == 1 and opt.last_stats.applied
    assert all(torch.isfinite(p).all() for p in model.parameters())


def _train(model, opt, steps, start=0):
    for t in range(start, start + steps):
        x, y = batch(seed=100 + t)
        opt.step(Objective(model, x, y))


def test_resume_from_checkpoint_is_bit_identical(tmp_path):
    def make():
        m = mlp()
        return m, ZOOptimizer(m.parameters(), lr=0.05, estimator=rge(4, 1e-3), seed=11,
                              transforms=[T.gradient_norm_scaling(), T.momentum(0.9)],
                              schedule=T.cosine(10))

    m_full, o_full = make()
    _train(m_full, o_full, 10)

    m_a, o_a = make()
    _train(m_a, o_a, 4)
    path = save_checkpoint(tmp_path / "ck.safetensors", model=m_a, optimizer=o_a)
    m_b, o_b = make()
    restore_checkpoint(path, model=m_b, optimizer=o_b)
    assert o_b.step_count == 4
    _train(m_b, o_b, 6, start=4)
    for a, b in zip(m_full.parameters(), m_b.parameters()):
        assert torch.equal(a, b)
    assert o_b.batch_forwards == o_full.batch_forwards


def test_bad_hyper_parameters_are_rejected():
    params = list(mlp().parameters())
    with pytest.raises(ValueError, match="lr must be"):
        ZOOptimizer(params, lr=-1.0)
    with pytest.raises(ValueError, match="lr must be"):
        ZOOptimizer(params, lr=float("inf"))
    with pytest.raises(ValueError, match="mode must be one of"):
        ZOOptimizer(params, mode="fast")
    with pytest.raises(ValueError, match="unknown estimator"):
        ZOOptimizer(params, estimator="backprop")
    with pytest.raises(ValueError, match="rademacher"):
        ZOOptimizer(params, distribution="cauchy")
    with pytest.raises(ValueError, match="seed"):
        ZOOptimizer(params, seed=-3)
    with pytest.raises(TypeError, match="transforms"):
        ZOOptimizer(params, transforms=[lambda g: g])
    with pytest.raises(ValueError, match="scale"):
        ZOOptimizer([{"params": params, "scale": 0.0}])
    with pytest.raises(TypeError, match="floating-point"):
        ZOOptimizer([nn.Parameter(torch.zeros(3, dtype=torch.int32), requires_grad=False)])


def test_bad_closures_are_rejected():
    model = mlp()
    opt = ZOOptimizer(model.parameters(), estimator=rge(2))
    with pytest.raises(TypeError, match="needs a closure"):
        opt.step()
    with pytest.raises(ValueError, match="scalar loss"):
        opt.step(lambda: torch.ones(3))
    batched = ZOOptimizer(model.parameters(), estimator=cge(1e-3), mode="batched")
    with pytest.raises(TypeError, match="Objective"):
        batched.step(lambda: torch.tensor(1.0))


def test_objective_validates_shapes():
    model = mlp()
    with pytest.raises(ValueError, match="first \\(batch\\) dimension"):
        Objective(model, torch.randn(4, 8), torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="nn.Module"):
        Objective(lambda x: x, torch.randn(4, 8), torch.zeros(4, dtype=torch.long))
    bad = Objective(model, torch.randn(4, 8), torch.zeros(4, dtype=torch.long),
                    loss_fn=lambda o, t: nn.functional.cross_entropy(o, t))
    with pytest.raises(ValueError, match="reduction='none'"):
        bad.per_sample()
    with pytest.raises(RuntimeError):
        Objective(model, torch.randn(4, 5), torch.zeros(4, dtype=torch.long)).per_sample()


@pytest.mark.parametrize("lr", [-1.0, float("nan"), float("inf"), True, "0.1"])
def test_each_param_group_lr_is_checked(lr):
    model = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="param group 1: lr must be a finite number >= 0"):
        ZOOptimizer([{"params": [model.weight]}, {"params": [model.bias], "lr": lr}], lr=0.1)
    opt = ZOOptimizer([model.weight], lr=0.1)
    with pytest.raises(ValueError, match="param group 1: scale must be a finite number > 0"):
        opt.add_param_group({"params": [model.bias], "scale": 0.0})


def test_a_meta_device_model_is_refused_when_the_optimizer_is_built():
    with torch.device("meta"):
        model = nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"param group 0: .*meta device.*to_empty"):
        ZOOptimizer(model.parameters(), lr=0.1)
    cpu = nn.Linear(3, 2)
    opt = ZOOptimizer(cpu.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="param group 1: .*meta device"):
        opt.add_param_group({"params": list(model.parameters())})
    assert len(opt.param_groups) == 1     # the refused group is not kept


@pytest.mark.parametrize("lr", [-1.0, float("nan"), float("inf")])
def test_an_lr_changed_after_construction_is_refused_at_step_with_weights_unchanged(lr):
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    opt = ZOOptimizer(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    opt.param_groups[0]["lr"] = lr        # what a scheduler does
    with pytest.raises(ValueError, match="param group 0: lr must be a finite number >= 0"):
        opt.step(Objective(model, x, y))
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert opt.step_count == 0
    opt.param_groups[0]["lr"] = 0.1
    opt.step(Objective(model, x, y))
    assert not all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


@pytest.mark.parametrize("transforms", [(), (T.momentum(0.9),)])
def test_an_lr_that_would_overflow_the_weights_is_refused_unchanged(transforms):
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    opt = ZOOptimizer([{"params": [model.weight], "lr": 1e308}, {"params": [model.bias]}],
                      lr=0.1, estimator=rge(4, 1e-3), transforms=transforms)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="weight.*lr 1e\\+308.*weights left unchanged"):
        opt.step(Objective(model, x, y))
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p, b)
    # A large but representable rate is still allowed: the guard is about overflow only.
    opt.param_groups[0]["lr"] = 10.0
    opt.step(Objective(model, x, y))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert not torch.equal(model.weight, before[0])


class _LSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(4, 5, batch_first=True)
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


def test_batched_mode_refuses_a_recurrent_model_and_lean_trains_it():
    """Issue 20 probe 14: batched CGE (vmap) on an LSTM failed deep inside torch.func; it now
    names the module and the mode that works, before anything moves. Batched weight
    perturbation no longer uses vmap (issue 30) and trains it with lean mode's bits."""
    torch.manual_seed(0)
    model = _LSTMClassifier()
    g = torch.Generator().manual_seed(0)
    objective = Objective(model, torch.randn(8, 6, 4, generator=g),
                          torch.randint(0, 3, (8,), generator=g))
    before = [p.clone() for p in model.parameters()]
    opt = ZOOptimizer(model.parameters(), lr=0.05, estimator=cge(1e-3), mode="batched")
    with pytest.raises(ValueError, match=r"cannot run the LSTM at 'rnn'.*use mode='lean'"):
        opt.step(objective)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    after = []
    for mode in ("lean", "batched"):
        with torch.no_grad():
            for p, b in zip(model.parameters(), before):
                p.copy_(b)
        ZOOptimizer(model.parameters(), lr=0.05, estimator=rge(4), mode=mode).step(objective)
        after.append([p.detach().clone() for p in model.parameters()])
    assert not all(torch.equal(a, b) for a, b in zip(before, after[0]))
    assert all(torch.equal(a, b) for a, b in zip(*after))


def test_old_counter_names_warn_and_read_the_batch_forwards():
    """forward_passes was renamed batch_forwards (whole-batch passes; a trainer's forwards
    counts per sample): the old name still reads the count, with a DeprecationWarning."""
    p = torch.zeros(3)
    opt = ZOOptimizer([p], estimator=rge(4, mu=1e-2))
    opt.step(lambda: float((p - 1).square().sum()))
    assert opt.batch_forwards == 5 and opt.last_stats.batch_forwards == 5  # Q + 1
    with pytest.warns(DeprecationWarning, match="use ZOOptimizer.batch_forwards"):
        assert opt.forward_passes == 5
    with pytest.warns(DeprecationWarning, match="use StepStats.batch_forwards"):
        assert opt.last_stats.forward_passes == 5
