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

    with pytest.raises(FloatingPointError, match="non-finite loss at epoch 0, step 0"):
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


class _Indexer:
    """A Method that records the batch it saw (x holds the sample indices) and its rate."""

    def __init__(self, losses=None):
        self.forwards, self.seen, self.rates = 0, [], []
        self.losses = losses or {}

    def step(self, x, y, lr):
        self.forwards += x.shape[0]
        self.seen.append(x[:, 0].long().tolist())
        self.rates.append(lr)
        return {"loss": self.losses.get(len(self.seen) - 1, 1.0), "phase": "p"}


def test_fit_per_epoch_schedule_truncation_and_epoch_record():
    from bpfree.harness import batches
    from bpfree.transforms import exponential

    x, y = torch.arange(10.0)[:, None], torch.zeros(10)
    full = [b.tolist() for b in batches(10, 3, 3, seed=7)]          # 4 batches per epoch
    m = _Indexer()
    hist = fit(m, x, y, epochs=3, batch_size=3, lr=0.8, schedule=exponential(0.5, 2),
               schedule_unit="epoch", seed=7, max_steps_per_epoch=2)
    # the skipped batches are still drawn: epoch e runs batches 4e and 4e + 1 of the stream
    assert m.seen == [full[0], full[1], full[4], full[5], full[8], full[9]]
    assert m.rates == [0.8, 0.8, 0.8, 0.8, 0.4, 0.4] == hist.lr
    assert hist.epoch_lr == [0.8, 0.8, 0.4] and hist.epoch_loss == [1.0, 1.0, 1.0]
    assert hist.epoch_forwards == [6, 12, 18] == hist.forwards[1::2]
    assert hist.epoch_batch_forwards == [None] * 3 and hist.epoch_phase == [None] * 3
    by_step = fit(_Indexer(), x, y, epochs=1, batch_size=3, lr=0.8, schedule=exponential(0.5, 2))
    assert by_step.lr == [0.8, 0.8, 0.4, 0.4]


def test_fit_stops_on_divergence_unless_the_step_says_nan_is_expected():
    x, y = torch.arange(8.0)[:, None], torch.zeros(8, dtype=torch.long)
    nan_at_3 = {3: float("nan")}
    with pytest.raises(FloatingPointError, match="non-finite loss at epoch 1, step 1"):
        fit(_Indexer(nan_at_3), x, y, epochs=3, batch_size=4, lr=0.1)
    hist = fit(_Indexer(nan_at_3), x, y, epochs=3, batch_size=4, lr=0.1, on_nonfinite="stop")
    assert hist.diverged == "non-finite loss at epoch 1, step 1"
    assert hist.loss == [1.0, 1.0, 1.0] and len(hist.epoch_loss) == 2   # epoch 1 closed
    hist = fit(_Indexer(nan_at_3), x, y, epochs=3, batch_size=4, lr=0.1,
               nonfinite_ok=lambda out: out["phase"] == "p")
    assert hist.diverged is None and len(hist.loss) == 6 and math.isnan(hist.loss[3])
    assert hist.epoch_loss == [1.0, 1.0, 1.0]                 # the mean of finite losses


def test_fit_validates_after_the_epoch_hook_and_keeps_the_best_epoch():
    class Flipper(torch.nn.Module):
        """Identity on 2 classes; the hook flips it after epoch 1 (a late collapse)."""

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.eye(2))
            self.forwards = 0

        def step(self, x, y, lr):
            return {"loss": 0.0}

        def forward(self, x):
            return x @ self.w

    def hook(epoch, history):
        order.append((epoch, len(history.epoch_loss), len(history.val_acc)))
        if epoch == 1:
            with torch.no_grad():
                m.w.copy_(torch.eye(2).flip(0))

    x, y = torch.eye(2).repeat(3, 1), torch.tensor([0, 1] * 3)
    m, order = Flipper(), []
    hist = fit(m, x, y, epochs=3, batch_size=2, lr=0.1, x_val=x, y_val=y, keep_best=True,
               on_epoch_end=hook)
    assert order == [(0, 1, 0), (1, 2, 1), (2, 3, 2)]    # before that epoch's validation
    assert hist.val_acc == [100.0, 0.0, 0.0] and hist.best_epoch == 0
    assert torch.equal(m.w, torch.eye(2))                 # the best epoch's weights restored


@pytest.mark.parametrize("kwargs,match", [
    (dict(schedule=3), "schedule must be 'cosine', 'constant' or a callable"),
    (dict(schedule_unit="batch"), "schedule_unit must be 'step' or 'epoch'"),
    (dict(on_nonfinite="ignore"), "on_nonfinite must be 'raise' or 'stop'"),
    (dict(x_val=torch.zeros(2, 1)), "both x_val and y_val"),
    (dict(keep_best=True), "keep_best needs a validation split"),
    (dict(max_steps_per_epoch=0), "max_steps_per_epoch must be an int >= 1"),
])
def test_fit_option_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fit(_Recorder(), torch.zeros(2, 1), torch.zeros(2), epochs=1, batch_size=1, lr=0.1,
            **kwargs)


class _Seen(_Recorder):
    """Records the batches themselves."""

    def step(self, x, y, lr):
        self.batches = getattr(self, "batches", []) + [(x.clone(), y.clone())]
        return super().step(x, y, lr)


def test_fit_on_a_dataloader_steps_through_its_batches_with_the_same_rates():
    """fit(method, loader): each epoch is one pass over the loader, in its order; the
    schedule, counts and history are those of the tensor path with the same batch sizes."""
    from torch.utils.data import DataLoader, TensorDataset

    x, y = torch.arange(20.0).view(10, 2), torch.arange(10)
    loader = DataLoader(TensorDataset(x, y), batch_size=4)            # 4, 4, 2; not shuffled
    m = _Seen()
    hist = fit(m, loader, epochs=2, lr=0.5)
    assert [b[1].tolist() for b in m.batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] * 2
    reference = fit(_Recorder(), x, y, epochs=2, batch_size=4, lr=0.5)
    assert hist.lr == reference.lr and hist.forwards == reference.forwards
    assert hist.epoch_loss == reference.epoch_loss
    # a plain list of pairs is a loader too; max_steps_per_epoch truncates each pass
    pairs = [(x[:3], y[:3]), (x[3:], y[3:])]
    m = _Seen()
    fit(m, pairs, epochs=3, lr=0.1, max_steps_per_epoch=1, schedule="constant")
    assert [b[1].tolist() for b in m.batches] == [[0, 1, 2]] * 3


def test_fit_loader_errors_name_the_problem():
    x, y = torch.zeros(4, 2), torch.zeros(4)
    with pytest.raises(ValueError, match=r"each batch must be an \(x, y\) pair"):
        fit(_Recorder(), [x], epochs=1, lr=0.1)
    with pytest.raises(ValueError, match="gave no batch in epoch 1"):
        fit(_Recorder(), iter([(x, y)]), epochs=2, lr=0.1, schedule="constant")
    with pytest.raises(ValueError, match="cosine schedule needs the number of batches"):
        fit(_Recorder(), iter([(x, y)]), epochs=1, lr=0.1)
    with pytest.raises(ValueError, match="y must be None"):
        fit(_Recorder(), [(x, y)], y, epochs=1, lr=0.1)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        fit(_Recorder(), x, y, epochs=1, lr=0.1)
    with pytest.raises(ValueError, match="same non-zero number of samples"):
        fit(_Recorder(), [(x, y[:3])], epochs=1, lr=0.1)
    with pytest.raises(ValueError, match="epochs must be an int >= 1"):
        fit(_Recorder(), [(x, y)], epochs=0, lr=0.1)


def test_history_plot_draws_the_recorded_curves(tmp_path):
    m = _RateModel(good=0.1, bad=10.0)
    m.forwards = 0
    hist = fit(m, torch.zeros(8, 1), torch.ones(8, dtype=torch.long), epochs=3, batch_size=4,
               lr=0.5, x_val=torch.zeros(4, 1), y_val=torch.ones(4, dtype=torch.long),
               keep_best=True)
    fig = hist.plot(tmp_path / "sub" / "h.png")
    assert (tmp_path / "sub" / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loss_ax, lr_ax, val_ax = fig.axes
    assert list(loss_ax.lines[0].get_ydata()) == hist.loss
    assert list(lr_ax.lines[0].get_ydata()) == hist.lr
    assert list(val_ax.lines[0].get_ydata()) == hist.val_acc == [100.0] * 3


def test_progress_shows_on_a_terminal_only_unless_asked(monkeypatch):
    import io
    import sys

    from bpfree.progress import show_progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not show_progress() and show_progress(True) and show_progress("title")
    monkeypatch.setattr(sys, "stderr", Tty())
    assert show_progress() and not show_progress(quiet=True) and not show_progress(False)
    assert not show_progress("title", quiet=True)
    fit(_Recorder(), torch.zeros(4, 1), torch.zeros(4), epochs=1, batch_size=2, lr=0.1)
    assert "train" in sys.stderr.getvalue()              # the default bar, on a terminal
    monkeypatch.setattr(sys, "stderr", Tty())
    fit(_Recorder(), torch.zeros(4, 1), torch.zeros(4), epochs=1, batch_size=2, lr=0.1,
        quiet=True)
    assert sys.stderr.getvalue() == ""
