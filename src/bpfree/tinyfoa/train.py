"""Training loop: :func:`bpfree.harness.fit` with TinyFoA's slice
schedule (``F`` data exchanges spread evenly over training, §4.2)."""

from __future__ import annotations

import torch

from ..harness import History, accuracy, fit

__all__ = ["evaluate", "fit_epochs"]


def fit_epochs(method, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
               lr: float, exchanges: int | None = None, schedule: str = "constant",
               seed: int = 0, progress: bool | str | None = None, quiet: bool = False
               ) -> History:
    """Train ``method`` (any Method: ``step`` + ``forwards``) for ``epochs``.

    ``exchanges`` is ``F``: how many times the active slice changes over training
    (default ``E``, once per epoch as in the paper); ignored by methods without
    ``set_progress``. ``progress`` / ``quiet``: :func:`~bpfree.harness.fit`'s bar (by
    default only on a terminal).
    """
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1, got {epochs} and {batch_size}")
    f = epochs if exchanges is None else int(exchanges)
    if f < 1:
        raise ValueError(f"the number of data exchanges F must be >= 1, got {f}")
    set_progress = getattr(method, "set_progress", None)
    hook = None if set_progress is None else (lambda step, total: set_progress(step, total, f))
    return fit(method, x, y, epochs=epochs, batch_size=batch_size, lr=lr, schedule=schedule,
               seed=seed, before_step=hook, progress=progress, quiet=quiet)


def evaluate(method, x: torch.Tensor, y: torch.Tensor) -> float:
    """Test error (%) of ``method(x)``'s argmax."""
    return 100.0 - accuracy(method, x, y)
