"""bpfree.optim.ZOMethod: a ZOOptimizer run by harness.fit is the hand-written loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bpfree.estimators import rge
from bpfree.harness import batches, cosine_lr, fit
from bpfree.objective import Objective
from bpfree.optim import ZOMethod, ZOOptimizer
from bpfree.ttzo import ZOTrainer


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(30, 5, generator=g), torch.randint(0, 3, (30,), generator=g)


def _optimizer(model):
    return ZOOptimizer(list(model.named_parameters()), lr=1.0, estimator=rge(4, 1e-2), seed=3)


def test_fit_on_a_zo_method_is_the_hand_written_loop_bit_for_bit():
    x, y = _data()
    model = _model()
    method = ZOMethod(model, _optimizer(model))
    hist = fit(method, x, y, epochs=2, batch_size=8, lr=0.2, seed=5)

    ref = _model()
    opt = _optimizer(ref)
    total, losses = 2 * 4, []
    for step, idx in enumerate(batches(30, 8, 2, seed=5)):
        for group in opt.param_groups:
            group["lr"] = cosine_lr(0.2, step, total)
        losses.append(float(opt.step(Objective(ref, x[idx], y[idx]))))
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.equal(a, b)
    assert hist.loss == losses
    # RGE with 4 queries evaluates the batch 5 times per step: 8 steps, 2 epochs of 30 samples
    assert method.batch_forwards == 8 * 5 and method.forwards == 5 * 30 * 2 == hist.forwards[-1]
    assert method.steps == 8 and hist.epoch_batch_forwards == [20, 40]


def test_tt_zo_trainer_is_a_zo_method():
    x, y = _data()
    trainer = ZOTrainer(_model(), "rge", num_queries=4, mu=1e-2, seed=3, distribution="rademacher")
    model = _model()
    method = ZOMethod(model, _optimizer(model))
    out_t, out_m = trainer.step(x, y, 0.1), method.step(x, y, 0.1)
    assert isinstance(trainer, ZOMethod) and out_t == {**out_m, "estimator": "rge"}
    for a, b in zip(trainer.model.parameters(), model.parameters()):
        assert torch.equal(a, b)


def test_zo_method_refuses_what_it_cannot_run():
    model = _model()
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        ZOMethod(lambda x: x, _optimizer(model))
    with pytest.raises(TypeError, match="optimizer must be a bpfree.optim.ZOOptimizer"):
        ZOMethod(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="learning rate must be a finite number >= 0"):
        ZOMethod(model, _optimizer(model)).step(*_data(), -1.0)
