"""The global RNG states a training loop draws from, to keep in a checkpoint's ``extra``:
resuming is bit-identical to never stopping only if they are saved too."""

from __future__ import annotations

import random
from collections.abc import Mapping

import numpy as np
import torch

__all__ = ["capture_rng_state", "restore_rng_state"]


def capture_rng_state() -> dict:
    """The global RNG states a training loop usually draws from: torch (CPU, and CUDA when
    available), numpy's legacy global generator and Python's ``random``; save it in
    ``extra`` and hand it back to :func:`restore_rng_state` on resume."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
             "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping) -> None:
    """Undo :func:`capture_rng_state`: set every global RNG present in ``state``."""
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be the dict from capture_rng_state(), got {type(state).__name__}")
    if "torch" in state:
        torch.set_rng_state(state["torch"].cpu())
    if "numpy" in state:
        np.random.set_state(tuple(state["numpy"]))
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([t.cpu() for t in state["cuda"]])
