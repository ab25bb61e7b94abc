"""One training harness for every method: epochs, cosine schedule, budget accounting.

Every method exposes ``step(x, y, lr) -> dict`` (with at least ``"loss"``) and a ``forwards``
counter of per-sample forward passes (Table 5's unit), so :func:`fit` can run any of them on
the same data, the same batches and the same schedule, and report the same history.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from tqdm.auto import tqdm


class Method(Protocol):
    forwards: int

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict: ...


@dataclass
class History:
    """Per-step training record: clean loss, learning rate, cumulative forward passes."""

    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    forwards: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"loss": self.loss, "lr": self.lr, "forwards": self.forwards,
                "seconds": self.seconds}


def check_learning_rate(lr) -> float:
    """``lr`` as a float; a clear ValueError unless it is a finite real number >= 0."""
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not math.isfinite(lr) \
            or lr < 0:
        raise ValueError(f"learning rate must be a finite number >= 0, got {lr!r}")
    return float(lr)


def check_batch(x: torch.Tensor, y: torch.Tensor) -> None:
    """A clear ValueError unless inputs and labels hold the same non-zero number of samples."""
    if x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"x and y must hold the same non-zero number of samples, got "
                         f"{x.shape[0]} and {y.shape[0]}")


def cosine_lr(base: float, step: int, total: int) -> float:
    """Cosine decay from ``base`` to 0 over ``total`` steps (§4.1)."""
    return base * 0.5 * (1.0 + math.cos(math.pi * min(step, total) / max(total, 1)))


def batches(n: int, batch_size: int, epochs: int, seed: int):
    """Shuffled index batches, reproducible from ``seed``; the last partial batch is kept."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g)
        for lo in range(0, n, batch_size):
            yield perm[lo:lo + batch_size]


def fit(method: Method, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
        lr: float, schedule: str = "cosine", seed: int = 0, progress: bool | str = False,
        before_step: Callable[[int, int], None] | None = None) -> History:
    """Train ``method`` for ``epochs`` over ``(x, y)``; returns the :class:`History`.

    ``before_step(step, total)`` is called before each step (e.g. TinyFoA's slice schedule).
    Raises FloatingPointError when a step's loss is not finite (the step did not update).
    """
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1, got {epochs} and {batch_size}")
    if schedule not in ("cosine", "constant"):
        raise ValueError(f"schedule must be 'cosine' or 'constant', got {schedule!r}")
    lr = check_learning_rate(lr)
    check_batch(x, y)
    n = x.shape[0]
    total = epochs * math.ceil(n / batch_size)
    history = History()
    t0 = time.perf_counter()
    bar = tqdm(total=total, desc=progress if isinstance(progress, str) else "train",
               disable=not progress, leave=False)
    for step, idx in enumerate(batches(n, batch_size, epochs, seed)):
        if before_step is not None:
            before_step(step, total)
        rate = cosine_lr(lr, step, total) if schedule == "cosine" else lr
        out = method.step(x[idx], y[idx], rate)
        if not math.isfinite(out["loss"]):
            raise FloatingPointError(f"non-finite loss at step {step}")
        history.loss.append(out["loss"])
        history.lr.append(rate)
        history.forwards.append(method.forwards)
        bar.update(1)
        bar.set_postfix(loss=f"{out['loss']:.3f}")
    bar.close()
    history.seconds = time.perf_counter() - t0
    return history


@torch.no_grad()
def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
             batch_size: int = 1000) -> float:
    """Top-1 accuracy (%) of ``model(x)`` logits; an empty or mismatched set is an error (an
    accuracy of 0 % on no samples would read as a result)."""
    check_batch(x, y)
    correct = 0
    for lo in range(0, x.shape[0], batch_size):
        correct += int((model(x[lo:lo + batch_size]).argmax(-1) == y[lo:lo + batch_size]).sum())
    return 100.0 * correct / x.shape[0]


def holdout_split(n: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train indices, held-out indices) of ``n`` samples, a seeded shuffle."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"holdout fraction must lie in (0, 1), got {fraction}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    k = max(1, int(round(n * fraction)))
    return perm[k:], perm[:k]


def pick_lr(make: Callable[[], tuple[Method, torch.nn.Module]], x: torch.Tensor,
            y: torch.Tensor, rates, *, epochs: int, batch_size: int, seed: int = 0,
            holdout: float = 0.2) -> tuple[float, dict[float, float]]:
    """The rate of ``rates`` whose run scores best on a held-out part of the training data.

    Each candidate trains a fresh ``make() -> (method, model)`` for ``epochs`` on the other
    part and is scored by its :func:`accuracy` on the held-out part, never on test data; a
    run whose loss turns non-finite scores -1. Ties go to the smaller rate. A single rate is
    returned without training (empty scores).
    """
    rates = tuple(rates)
    if not rates:
        raise ValueError("rates must hold at least one learning rate")
    if len(rates) == 1:
        return rates[0], {}
    train_idx, held_idx = holdout_split(x.shape[0], holdout, seed)
    scores: dict[float, float] = {}
    for lr in rates:
        method, model = make()
        try:
            fit(method, x[train_idx], y[train_idx], epochs=epochs, batch_size=batch_size,
                lr=lr, seed=seed)
            scores[lr] = accuracy(model, x[held_idx], y[held_idx])
        except FloatingPointError:
            scores[lr] = -1.0
    best = max(rates, key=lambda r: (scores[r], -r))
    return best, scores
