"""Epoch loop with TT-ZO §5.1's schedule: batch 64, lr 1e-3 × 0.9 every 10 epochs.

:func:`train` runs any Method-protocol trainer (``step(x, y, lr)``, ``forwards``) epoch by
epoch on the reproducible batches of :func:`bpfree.harness.batches`, calls the method's
``end_epoch(loss)`` when it has one (:class:`~bpfree.ttzo.HybridZO` switches there), and logs
per epoch the mean training loss, the validation accuracy and the cumulative forward counts,
so "forward evaluations to reach X% validation accuracy" (the paper's 340K vs 11M) can be
read off the log with :func:`queries_to_accuracy`.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field

import torch

from ..harness import accuracy, batches
from ..transforms import exponential

__all__ = ["TrainLog", "train", "queries_to_accuracy"]


@dataclass
class TrainLog:
    """Per-epoch record; ``batch_forwards`` is None for methods that do not count them."""

    epoch_loss: list[float] = field(default_factory=list)
    val_acc: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    forwards: list[int] = field(default_factory=list)
    batch_forwards: list[int | None] = field(default_factory=list)
    phase: list[str | None] = field(default_factory=list)
    step_loss: list[float] = field(default_factory=list)
    switch_epoch: int | None = None
    diverged: str | None = None
    best_epoch: int | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def train(method, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int = 64,
          lr: float = 1e-3, gamma: float = 0.9, decay_every: int = 10,
          x_val: torch.Tensor | None = None, y_val: torch.Tensor | None = None,
          seed: int = 0, max_steps_per_epoch: int | None = None,
          on_nonfinite: str = "raise", keep_best: bool = False) -> TrainLog:
    """Train for ``epochs`` with ``lr·gamma^(epoch // decay_every)`` (TT-ZO §5.1).

    ``max_steps_per_epoch`` truncates every epoch (quick runs). A non-finite step loss
    (central CGE reports NaN by design and is allowed) raises FloatingPointError, or with
    ``on_nonfinite="stop"`` ends training and returns the log so far with ``diverged`` set
    (a benchmark then reports the run as diverged instead of losing every other run).

    ``keep_best`` (needs ``x_val``): at the end, ``method.model`` holds its weights from the
    epoch with the best validation accuracy (the earliest on ties), i.e. early stopping
    decided on validation data only; ``log.best_epoch`` says which.
    """
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1, got {epochs} and {batch_size}")
    if on_nonfinite not in ("raise", "stop"):
        raise ValueError(f"on_nonfinite must be 'raise' or 'stop', got {on_nonfinite!r}")
    if keep_best and (x_val is None or y_val is None):
        raise ValueError("keep_best needs a validation split (x_val, y_val)")
    schedule = exponential(gamma, decay_every)
    log = TrainLog()
    n = x.shape[0]
    steps = math.ceil(n / batch_size)
    if max_steps_per_epoch is not None:
        steps = min(steps, max_steps_per_epoch)
    stream = batches(n, batch_size, epochs, seed)
    per_epoch = math.ceil(n / batch_size)
    t0 = time.perf_counter()
    for epoch in range(epochs):
        rate = lr * schedule(epoch)
        losses = []
        for k in range(per_epoch):
            idx = next(stream)
            if k >= steps:
                continue
            out = method.step(x[idx], y[idx], rate)
            loss = float(out["loss"])
            if not math.isfinite(loss) and not (getattr(method, "name", "") == "cge"
                                                or out.get("phase") == "cge"):
                message = f"non-finite loss at epoch {epoch}, step {k}"
                if on_nonfinite == "raise":
                    raise FloatingPointError(message)
                log.diverged = message
                break
            log.step_loss.append(loss)
            if math.isfinite(loss):
                losses.append(loss)
        epoch_loss = sum(losses) / len(losses) if losses else float("nan")
        phase = getattr(method, "phase", getattr(method, "name", None))
        if hasattr(method, "end_epoch"):
            method.end_epoch(epoch_loss)
            if log.switch_epoch is None and getattr(method, "history", {}).get("switch_epoch") \
                    is not None:
                log.switch_epoch = method.history["switch_epoch"]
        log.epoch_loss.append(epoch_loss)
        log.lr.append(rate)
        log.forwards.append(int(method.forwards))
        log.batch_forwards.append(getattr(method, "batch_forwards", None))
        log.phase.append(phase)
        if x_val is not None and y_val is not None:
            log.val_acc.append(accuracy(method.model, x_val, y_val))
            if keep_best and log.val_acc[-1] > max(log.val_acc[:-1], default=-math.inf):
                best_state = copy.deepcopy(method.model.state_dict())
                log.best_epoch = len(log.val_acc) - 1
        if log.diverged is not None:
            break
    if keep_best and log.best_epoch is not None:
        method.model.load_state_dict(best_state)
    log.seconds = time.perf_counter() - t0
    return log


def queries_to_accuracy(log: TrainLog, target: float, *, unit: str = "batch_forwards"
                        ) -> int | None:
    """Cumulative ``unit`` count at the end of the first epoch whose validation accuracy
    reaches ``target`` (%), or None (epoch granularity)."""
    counts = getattr(log, unit)
    for acc, c in zip(log.val_acc, counts):
        if acc >= target:
            return c
    return None
