"""bpfree.harness: the shared epoch loop, schedule hook and input checks."""

from __future__ import annotations

import math

import pytest
import torch

from bpfree.harness import (check_batch, check_learning_rate, cosine_lr, fit, holdout_split,
                            pick_lr)


class _Recorder:
    """A Method that records what it was asked to do."""

    def __init__(self):
        self.forwards = 0
        self.calls = []

    def step(self, x, y, lr):
        self.forwards += x.shape[0]
        self.calls.append((x.shape[0], lr))
        return {"loss": float(len(self.calls))}


def test_fit_calls_before_step_with_step_and_total_and_follows_the_cosine():
    seen = []
    m = _Recorder()
    hist = fit(m, torch.zeros(10, 2), torch.zeros(10), epochs=2, batch_size=4, lr=0.5,
               before_step=lambda step, total: seen.append((step, total)))
    assert seen == [(i, 6) for i in range(6)]                 # ceil(10 / 4) = 3 per epoch
    assert [n for n, _ in m.calls] == [4, 4, 2, 4, 4, 2]     # last partial batch kept
    assert hist.lr == [0.5 * 0.5 * (1 + math.cos(math.pi * i / 6)) for i in range(6)]
    assert hist.forwards[-1] == 20 and cosine_lr(0.5, 6, 6) == 0.0


def test_fit_rejects_a_non_finite_loss():
    class Bad(_Recorder):
        def step(self, x, y, lr):
            return {"loss": float("nan")}

    with pytest.raises(FloatingPointError, match="non-finite loss at step 0"):
        fit(Bad(), torch.zeros(4, 2), torch.zeros(4), epochs=1, batch_size=2, lr=0.1)


@pytest.mark.parametrize("lr", [-1.0, float("nan"), float("inf"), True, "0.1"])
def test_bad_learning_rates(lr):
    with pytest.raises(ValueError, match="learning rate must be a finite number >= 0"):
        check_learning_rate(lr)


def test_check_batch_and_fit_argument_errors():
    assert check_learning_rate(0) == 0.0
    with pytest.raises(ValueError, match="same non-zero number of samples, got 3 and 2"):
        check_batch(torch.zeros(3, 1), torch.zeros(2))
    with pytest.raises(ValueError, match="schedule must be"):
        fit(_Recorder(), torch.zeros(2, 1), torch.zeros(2), epochs=1, batch_size=1, lr=0.1,
            schedule="step")


class _RateModel(torch.nn.Module):
    """Predicts class 1 once it has seen a learning rate of at least ``good``; a rate above
    ``bad`` makes the loss non-finite (a diverging run)."""

    def __init__(self, good: float, bad: float):
        super().__init__()
        self.good, self.bad, self.lr = good, bad, 0.0

    def step(self, x, y, lr):
        self.lr = max(self.lr, lr)
        return {"loss": math.inf if lr > self.bad else 1.0}

    def forward(self, x):
        logits = torch.zeros(x.shape[0], 2)
        logits[:, 1 if self.lr >= self.good else 0] = 1.0
        return logits


def test_pick_lr_scores_on_held_out_data_and_drops_diverging_rates():
    x, y = torch.zeros(20, 3), torch.ones(20, dtype=torch.long)
    made = []

    def make():
        made.append(_RateModel(good=0.1, bad=0.5))
        made[-1].forwards = 0
        return made[-1], made[-1]

    best, scores = pick_lr(make, x, y, (0.01, 0.1, 0.3, 1.0), epochs=1, batch_size=5)
    # 0.1 and 0.3 both score 100 on the held-out fifth: the smaller wins; 1.0 diverged.
    assert best == 0.1 and scores == {0.01: 0.0, 0.1: 100.0, 0.3: 100.0, 1.0: -1.0}
    assert len(made) == 4
    assert pick_lr(make, x, y, (0.3,), epochs=1, batch_size=5) == (0.3, {})
    assert len(made) == 4  # a single rate trains nothing
    with pytest.raises(ValueError, match="at least one"):
        pick_lr(make, x, y, (), epochs=1, batch_size=5)
    train, held = holdout_split(20, 0.2, seed=0)
    assert len(held) == 4 and not set(train.tolist()) & set(held.tolist())


def test_accuracy_is_exact_and_refuses_an_empty_or_mismatched_set():
    from bpfree.harness import accuracy

    model = torch.nn.Identity()
    logits = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    assert accuracy(model, logits, torch.tensor([0, 1, 1, 1]), batch_size=3) == 75.0
    with pytest.raises(ValueError, match="non-zero number of samples"):
        accuracy(model, logits[:0], torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="same non-zero number"):
        accuracy(model, logits, torch.zeros(3, dtype=torch.long))
