"""Training loop: :func:`bpfree.pmt.harness.fit`'s batches and schedule, plus TinyFoA's slice
schedule (``F`` data exchanges spread evenly over training, §4.2)."""

from __future__ import annotations

import math
import time

import torch

from bpfree.pmt.harness import History, accuracy, batches, cosine_lr

__all__ = ["evaluate", "fit_epochs"]


def fit_epochs(method, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
               lr: float, exchanges: int | None = None, schedule: str = "constant",
               seed: int = 0) -> History:
    """Train ``method`` (any Method: ``step`` + ``forwards``) for ``epochs``.

    ``exchanges`` is ``F``: how many times the active slice changes over training
    (default ``E``, once per epoch as in the paper); ignored by methods without
    ``set_progress``.
    """
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1, got {epochs} and {batch_size}")
    if schedule not in ("cosine", "constant"):
        raise ValueError(f"schedule must be 'cosine' or 'constant', got {schedule!r}")
    f = epochs if exchanges is None else int(exchanges)
    if f < 1:
        raise ValueError(f"the number of data exchanges F must be >= 1, got {f}")
    n = x.shape[0]
    total = epochs * math.ceil(n / batch_size)
    history = History()
    t0 = time.perf_counter()
    for step, idx in enumerate(batches(n, batch_size, epochs, seed)):
        if hasattr(method, "set_progress"):
            method.set_progress(step, total, f)
        rate = cosine_lr(lr, step, total) if schedule == "cosine" else lr
        out = method.step(x[idx], y[idx], rate)
        if not math.isfinite(out["loss"]):
            raise FloatingPointError(f"non-finite loss at step {step}")
        history.loss.append(out["loss"])
        history.lr.append(rate)
        history.forwards.append(method.forwards)
    history.seconds = time.perf_counter() - t0
    return history


def evaluate(method, x: torch.Tensor, y: torch.Tensor) -> float:
    """Test error (%) of ``method(x)``'s argmax."""
    return 100.0 - accuracy(method, x, y)
