"""TT-ZO §5.1's schedule on the shared :func:`bpfree.harness.fit`: batch 64, lr 1e-3 × 0.9
every 10 epochs, per-epoch validation, the hybrid's phase switch at each epoch's end.

:func:`train` runs any Method-protocol trainer (``step(x, y, lr)``, ``forwards``) epoch by
epoch on the reproducible batches of :func:`bpfree.harness.batches`, calls the method's
``end_epoch(loss)`` when it has one (:class:`~bpfree.ttzo.HybridZO` switches there), and
returns the :class:`~bpfree.harness.History`, whose per-epoch record (mean training loss,
validation accuracy, cumulative forward counts) gives "forward evaluations to reach X%
validation accuracy" (the paper's 340K vs 11M) through :func:`queries_to_accuracy`.
"""

from __future__ import annotations

import torch

from ..harness import History, fit
from ..transforms import exponential

__all__ = ["TrainLog", "train", "queries_to_accuracy"]

#: The record :func:`train` returns: the shared :class:`~bpfree.harness.History` (its
#: per-epoch lists are ``epoch_loss``, ``epoch_lr``, ``epoch_forwards``,
#: ``epoch_batch_forwards``, ``epoch_phase`` and ``val_acc``; ``loss`` is the per-step loss).
TrainLog = History


def train(method, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int = 64,
          lr: float = 1e-3, gamma: float = 0.9, decay_every: int = 10,
          x_val: torch.Tensor | None = None, y_val: torch.Tensor | None = None,
          seed: int = 0, max_steps_per_epoch: int | None = None,
          on_nonfinite: str = "raise", keep_best: bool = False,
          progress: bool | str | None = None, quiet: bool = False) -> History:
    """Train for ``epochs`` with ``lr·gamma^(epoch // decay_every)`` (TT-ZO §5.1).

    :func:`bpfree.harness.fit` with that schedule, per epoch; see it for
    ``max_steps_per_epoch`` (quick runs), ``on_nonfinite`` (``"stop"`` returns the history so
    far with ``diverged`` set, so a benchmark reports the run as diverged instead of losing
    every other run) and ``keep_best`` (needs ``x_val``: ``method.model`` ends with the
    weights of the best validation epoch, ``best_epoch``). A non-finite loss from CGE is
    allowed: central CGE reports NaN by design. ``switch_epoch`` is the hybrid's.
    ``progress`` / ``quiet``: :func:`~bpfree.harness.fit`'s bar (by default on a terminal).
    """
    end_epoch = getattr(method, "end_epoch", None)

    def close_epoch(epoch: int, history: History) -> None:
        end_epoch(history.epoch_loss[-1])
        if history.switch_epoch is None:
            history.switch_epoch = getattr(method, "history", {}).get("switch_epoch")

    def cge_nan(out: dict) -> bool:
        return getattr(method, "name", "") == "cge" or out.get("phase") == "cge"

    return fit(method, x, y, epochs=epochs, batch_size=batch_size, lr=lr,
               schedule=exponential(gamma, decay_every), schedule_unit="epoch", seed=seed,
               x_val=x_val, y_val=y_val, keep_best=keep_best,
               max_steps_per_epoch=max_steps_per_epoch, on_nonfinite=on_nonfinite,
               nonfinite_ok=cge_nan, on_epoch_end=None if end_epoch is None else close_epoch,
               progress=progress, quiet=quiet)


def queries_to_accuracy(log, target: float, *, unit: str = "batch_forwards") -> int | None:
    """Cumulative ``unit`` count (``"batch_forwards"`` or ``"forwards"``) at the end of the
    first epoch whose validation accuracy reaches ``target`` (%), or None (epoch
    granularity). ``log`` is a :class:`~bpfree.harness.History` (``epoch_<unit>``) or a
    tt-zo results record, whose per-epoch keys have no ``epoch_`` prefix."""
    if unit not in ("batch_forwards", "forwards"):
        raise ValueError(f"unit must be 'batch_forwards' or 'forwards', got {unit!r}")
    counts = getattr(log, f"epoch_{unit}", None)
    if counts is None:
        counts = getattr(log, unit)
    for acc, c in zip(log.val_acc, counts):
        if acc >= target:
            return c
    return None
