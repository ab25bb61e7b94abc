"""Epoch snapshots that let a cut-off training run resume where it stopped, bit for bit.

A benchmark's full run is many training runs (tasks, :mod:`bpfree.bench.task_cache`), and
some single runs outlast a working session: TT-ZO's hybrid at the paper's 100 epochs takes
about 7 CPU hours. A task cache alone keeps only finished runs, so such a run would start
again from epoch 0 every session and never finish. So when a task runs under a task cache,
:func:`bpfree.bench.parallel.run_keyed` (or :func:`~bpfree.bench.task_cache.memoized`) makes
a :class:`FitSnapshots` folder active for it, and :func:`bpfree.harness.fit` saves the whole
training state at the end of every epoch and, when the task runs again, restores the last
one and goes on. A resumed run gives the same bits as one never stopped
(``tests/test_fit_resume.py``).

What a snapshot holds: the method object as pickled, with its model (and the model's
sub-modules, parameters and buffers) written as references, so that restoring copies the
saved values *into* the caller's live model, which the caller may hold elsewhere (and
evaluate after ``fit``); the :class:`~bpfree.harness.History`; the best validation weights
(``keep_best``); the global RNG states; the step count and the elapsed time. The batch
order needs no state: :func:`bpfree.harness.batches` is replayed from its seed.

Limits: state kept outside the method and its model (a caller's own counters, objects the
caller shares with the method other than the model) is not restored. A method that does not
pickle trains on without snapshots (one warning).

Snapshots are pickles that this library writes into the task cache's own folder, next to the
cache's results, signed with this user's key (:mod:`bpfree.signed_pickle`): a snapshot the
key did not sign is never unpickled, and the run starts that ``fit`` from epoch 0.
A task's folder is removed once its result is stored.
"""

from __future__ import annotations

import contextlib
import io
import logging
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .. import signed_pickle
from ..io import atomic_write_bytes

__all__ = ["FitSnapshot", "FitSnapshots", "active", "next_fit_snapshot"]

log = logging.getLogger(__name__)

_active: FitSnapshots | None = None


class FitSnapshots:
    """The snapshot folder of one task: :meth:`next_slot` hands one file to each ``fit`` call
    of the task, in call order (a task that trains twice resumes each in turn)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.calls = 0

    def next_slot(self) -> FitSnapshot:
        slot = FitSnapshot(self.directory / f"fit-{self.calls}.pkl")
        self.calls += 1
        return slot


@contextlib.contextmanager
def active(snapshots: FitSnapshots | None) -> Iterator[FitSnapshots | None]:
    """Make ``snapshots`` the folder that ``fit`` calls inside this block save to."""
    global _active
    previous, _active = _active, snapshots
    try:
        yield snapshots
    finally:
        _active = previous


def next_fit_snapshot() -> FitSnapshot | None:
    """The slot for a ``fit`` call starting now: None outside an active task."""
    return None if _active is None else _active.next_slot()


def _model_refs(model: torch.nn.Module) -> dict[int, tuple[str, str]]:
    """id -> reference of the model, its sub-modules, parameters and buffers."""
    refs: dict[int, tuple[str, str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        refs.setdefault(id(module), ("module", name))
    for name, p in model.named_parameters(remove_duplicate=False):
        refs.setdefault(id(p), ("parameter", name))
    for name, b in model.named_buffers(remove_duplicate=False):
        refs.setdefault(id(b), ("buffer", name))
    return refs


class _Pickler(pickle.Pickler):
    def __init__(self, file, refs: dict[int, tuple[str, str]]) -> None:
        super().__init__(file, protocol=4)
        self.refs = refs

    def persistent_id(self, obj: Any):
        return self.refs.get(id(obj))


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, model: torch.nn.Module) -> None:
        super().__init__(file)
        self.model = model

    def persistent_load(self, ref: Any):
        kind, name = ref
        if kind == "module":
            return self.model.get_submodule(name) if name else self.model
        if kind == "parameter":
            return self.model.get_parameter(name)
        return self.model.get_buffer(name)


#: Method kinds whose snapshot failed to pickle, already warned about in this process.
_UNPICKLABLE_WARNED: set[str] = set()


class FitSnapshot:
    """One ``fit`` call's snapshot file: :meth:`save` at an epoch's end, :meth:`load` on entry."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.broken = False

    def save(self, state: dict, method: Any, model: torch.nn.Module) -> None:
        """Write ``state`` (plain data: history, counters, RNG states, the best weights) and
        ``method`` (model by reference, its values in ``model_state``), atomically."""
        if self.broken:
            return
        buffer = io.BytesIO()
        try:
            _Pickler(buffer, _model_refs(model)).dump(method)
        except (pickle.PicklingError, TypeError, AttributeError) as err:
            kind = type(method).__name__
            if kind not in _UNPICKLABLE_WARNED:  # once per kind and process, not per fit
                _UNPICKLABLE_WARNED.add(kind)
                log.warning("fit: %s does not pickle (%s); its runs keep no epoch snapshots "
                            "and restart from epoch 0 if cut off", kind, err)
            self.broken = True
            return
        payload = {"state": state, "model_state": model.state_dict(),
                   "method": buffer.getvalue()}
        atomic_write_bytes(self.path, signed_pickle.dumps(payload), what="epoch snapshot")

    def load(self, method: Any, model: torch.nn.Module) -> dict | None:
        """The saved ``state``, after copying the saved model values into ``model`` and the
        saved method's attributes into ``method``; None (and nothing changed) when there is
        no readable snapshot."""
        try:
            # Signed by this user's key or refused before anything is unpickled; the method
            # blob inside is covered by the same signature.
            payload = signed_pickle.loads(self.path.read_bytes())
            state, model_state, blob = payload["state"], payload["model_state"], payload["method"]
        except FileNotFoundError:
            return None
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, KeyError, TypeError,
                ValueError) as err:
            log.warning("fit: the epoch snapshot %s is unreadable (%s); training from epoch 0",
                        self.path, err)
            return None
        with torch.no_grad():
            model.load_state_dict(model_state, strict=True)
        saved = _Unpickler(io.BytesIO(blob), model).load()
        if saved is not method:
            vars(method).clear()
            vars(method).update(vars(saved))
        return state
