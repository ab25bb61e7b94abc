"""Measured memory: the peak tensor storage a function allocates while it runs.

PyTorch's CPU allocator keeps no peak counter, so :class:`PeakMemoryTracker` watches every
aten op through a ``TorchDispatchMode``: after each op it adds the bytes of output
storages it has not seen (and that are not one of the op's inputs, i.e. not views,
in-place results or ``out=`` buffers), and before each op it drops storages whose last
reference has died (checked with weak references). The running maximum is the peak.

Accuracy: exact storage ``nbytes`` at op granularity, for every device. Not seen:
workspaces a kernel allocates and frees inside one op (e.g. oneDNN scratch), tensors made
outside the dispatcher (``torch.from_numpy`` / ``frombuffer`` memory is numpy's or the
buffer's and is skipped on purpose), ops run on threads that did not inherit the mode
(DataLoader workers), and storages that existed at entry (they are the baseline; growing
one with ``resize_`` counts the growth). numpy buffers — including ``tensor.numpy()``,
which shares the tensor's storage and so needs nothing — are reported separately through
``tracemalloc`` (numpy registers its buffers there), which also counts Python objects.
On CUDA the caching allocator's own ``max_memory_allocated`` is reported too.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .report import format_bytes

__all__ = ["MeasuredMemory", "PeakMemoryTracker", "measure_peak", "peak_extra_bytes"]

# Ops whose output *is* their input tensor but whose memory was allocated just before,
# outside the dispatcher (``torch.tensor([...])`` builds the tensor, then lifts it).
_FRESH_OPS = frozenset({"aten.lift_fresh.default", "aten.lift_fresh_copy.default"})


@dataclass(frozen=True)
class MeasuredMemory:
    """What :func:`measure_peak` saw.

    ``peak_bytes``: max over the run of bytes in tensor storages allocated since entry and
    still alive (all devices). ``held_bytes``: those still alive at exit (returned tensors,
    new ``.grad`` buffers). ``numpy_*``: tracemalloc's peak / net growth over entry —
    numpy buffers plus Python objects (a few KiB of which are this tracker's own
    bookkeeping); None when not tracked. ``cuda_*``: the CUDA caching allocator's peak /
    net growth on the current device (rounded to its 512-byte blocks); None without CUDA.
    ``ops``: aten ops observed.
    """

    peak_bytes: int
    held_bytes: int
    numpy_peak_bytes: int | None = None
    numpy_held_bytes: int | None = None
    cuda_peak_bytes: int | None = None
    cuda_held_bytes: int | None = None
    ops: int = 0

    @property
    def torch_peak_bytes(self) -> int:
        """Alias of :attr:`peak_bytes` (torch tensor storages)."""
        return self.peak_bytes

    def __str__(self) -> str:
        text = f"peak {format_bytes(self.peak_bytes)}, held {format_bytes(self.held_bytes)}"
        if self.numpy_peak_bytes is not None:
            text += f"; numpy/python peak {format_bytes(self.numpy_peak_bytes)}"
        if self.cuda_peak_bytes is not None:
            text += f"; cuda allocator peak {format_bytes(self.cuda_peak_bytes)}"
        return text


def _storage(t: torch.Tensor):
    if t.device.type == "meta":
        return None
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse, nested, storage-less subclasses
        return None


class _StorageCounter(TorchDispatchMode):
    """Dispatch mode that keeps the live total of storages allocated since it was entered."""

    def __init__(self) -> None:
        super().__init__()
        # storage pointer -> [weak ref, bytes counted, bytes it had when first seen]
        self._tracked: dict[int, list] = {}
        self.live = 0
        self.peak = 0
        self.ops = 0

    def sweep(self) -> None:
        """Drop storages whose last reference died since the previous op."""
        dead = [key for key, entry in self._tracked.items() if entry[0].expired()]
        for key in dead:
            self.live -= self._tracked.pop(key)[1]

    def _track(self, storage, base: int) -> None:
        key = storage._cdata
        nbytes = storage.nbytes()
        entry = self._tracked.get(key)
        if entry is None:
            if nbytes <= base:
                return
            # Holding the weak ref keeps the StorageImpl's address from being reused, so the
            # pointer stays a valid identity for as long as the entry exists.
            entry = self._tracked[key] = [StorageWeakRef(storage), 0, base]
        counted = max(0, nbytes - entry[2])
        self.live += counted - entry[1]
        entry[1] = counted

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.sweep()
        inputs: dict[int, int] = {}
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and (st := _storage(t)) is not None:
                inputs[st._cdata] = st.nbytes()
        out = func(*args, **kwargs)
        self.ops += 1
        fresh = str(func) in _FRESH_OPS
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or (st := _storage(t)) is None:
                continue
            key = st._cdata
            if key in self._tracked:
                self._track(st, 0)  # base is already in the entry; catches resize_
            elif key in inputs:
                # A view / in-place / out= result of a storage older than this op: only
                # growth counts, unless it is a just-built torch tensor being lifted.
                owned_by_torch = st.resizable()  # from_numpy / frombuffer memory is not
                self._track(st, 0 if (fresh and owned_by_torch) else inputs[key])
            else:
                self._track(st, 0)
        self.peak = max(self.peak, self.live)
        return out


_WARM = False


def _warm_up() -> None:
    # The first op under a dispatch mode imports tens of MiB of torch modules; do it once
    # before tracemalloc starts so it does not land in the first measurement.
    global _WARM
    if not _WARM:
        with _StorageCounter():
            (torch.zeros(2) + 1).relu_()
        _WARM = True


class PeakMemoryTracker:
    """Context manager measuring memory allocated inside its ``with`` block.

    >>> with PeakMemoryTracker() as tracker:
    ...     y = model(x)
    >>> tracker.result.peak_bytes

    ``track_numpy`` turns on ``tracemalloc`` for the block (numpy buffers and Python
    objects; it slows Python allocation); if tracemalloc was already tracing it is left
    on, but its peak is reset. ``track_cuda`` (default: when CUDA is available) also reads
    the CUDA caching allocator's peak on the current device.
    """

    def __init__(self, *, track_numpy: bool = True, track_cuda: bool | None = None) -> None:
        self.track_numpy = bool(track_numpy)
        self.track_cuda = torch.cuda.is_available() if track_cuda is None else bool(track_cuda)
        self.result: MeasuredMemory | None = None
        self._counter: _StorageCounter | None = None

    def __enter__(self) -> PeakMemoryTracker:
        self.result = None
        _warm_up()
        if self.track_numpy:
            self._started_tracemalloc = not tracemalloc.is_tracing()
            if self._started_tracemalloc:
                tracemalloc.start()
            tracemalloc.reset_peak()
            self._np_base = tracemalloc.get_traced_memory()[0]
        self._cuda_base = None
        if self.track_cuda and torch.cuda.is_initialized():
            torch.cuda.synchronize()
            self._cuda_base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        self._counter = _StorageCounter()
        self._counter.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        counter = self._counter
        counter.__exit__(exc_type, exc, tb)
        counter.sweep()  # frees after the last op (e.g. fn's locals) count as freed
        np_peak = np_held = cuda_peak = cuda_held = None
        if self.track_cuda and torch.cuda.is_initialized():
            torch.cuda.synchronize()
            base = self._cuda_base or 0  # initialized inside the block: stats start at 0
            cuda_peak = max(0, torch.cuda.max_memory_allocated() - base)
            cuda_held = max(0, torch.cuda.memory_allocated() - base)
        if self.track_numpy:
            current, peak = tracemalloc.get_traced_memory()
            np_peak = max(0, peak - self._np_base)
            np_held = max(0, current - self._np_base)
            if self._started_tracemalloc:
                tracemalloc.stop()
        self.result = MeasuredMemory(
            peak_bytes=counter.peak,
            held_bytes=counter.live,
            numpy_peak_bytes=np_peak,
            numpy_held_bytes=np_held,
            cuda_peak_bytes=cuda_peak,
            cuda_held_bytes=cuda_held,
            ops=counter.ops,
        )
        self._counter = None


def measure_peak(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, MeasuredMemory]:
    """Call ``fn(*args, **kwargs)`` and return ``(result, MeasuredMemory)``.

    Memory alive at entry (model parameters, the batch, existing ``.grad``) is the
    baseline and not counted; the returned result stays alive, so it shows up in
    ``held_bytes``. Run the step once before measuring if it allocates lazily (first
    ``.grad``, optimizer state), or call ``zero_grad(set_to_none=True)`` to count grads.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    with PeakMemoryTracker() as tracker:
        result = fn(*args, **kwargs)
    return result, tracker.result


def peak_extra_bytes(train_step: Callable[..., Any], inference_step: Callable[..., Any],
                     *args: Any, **kwargs: Any) -> int:
    """Peak of ``train_step(*args, **kwargs)`` minus peak of ``inference_step(*args, **kwargs)``.

    The "peak extra memory of the training step over plain inference" on the same batch.
    Inference runs first; results of both calls are dropped before the next one runs.
    """
    _, inference = measure_peak(inference_step, *args, **kwargs)
    _, train = measure_peak(train_step, *args, **kwargs)
    return train.peak_bytes - inference.peak_bytes
