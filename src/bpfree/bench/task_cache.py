"""Finished benchmark tasks kept on disk, so a full run that was cut off resumes where it stopped.

A full benchmark is many independent training runs (tasks) spread over a process pool
(:func:`bpfree.bench.parallel.run_keyed`). When a run of several hours is stopped (the end of
a working session, a crash, a reboot), the tasks it had finished are lost with it. With
``BPFREE_TASK_CACHE=DIR`` set, each finished task's result is written to ``DIR`` as soon as
it arrives, and a later run of the same benchmark takes it from there instead of training it
again.

A result is only reused by the same code on the same task: its file name is a SHA-256 of the
checkout's git revision, the task function's qualified name and the task's
:func:`task_digest`. That digest must be the same in every process: a plain
``pickle.dumps`` of a task holding a model is not, because torch pickles each tensor's
storage through ``torch.save``, whose archive carries a fresh serialization id, so a resumed
run would never find its own results. Tensors are therefore digested by their dtype, shape
and bytes. A dirty
checkout is refused, because the stored results could not be traced to any revision. The
benchmark's JSON then holds the revision, as always; its ``seconds`` count only the resumed
run, while each task keeps its own measured time.

A run of many hours can be reported before it ends: with ``BPFREE_TASK_CACHE_REPORT=REV``
also set, a benchmark that supports it reads the results the cache holds for committed
revision ``REV`` (the run still in progress), trains nothing, and reports what finished
(:attr:`TaskCache.report_only`; :func:`~bpfree.bench.parallel.run_keyed` with
``partial=True``). The report's own code may be newer than ``REV``; a task whose definition
changed since has another key, so it reads as unfinished, never as a wrong result.

Results are signed pickles (:mod:`bpfree.signed_pickle`): a file this user's key did not
sign (a cache folder copied from elsewhere, an altered file) is never unpickled; it counts
as missing and the task runs again.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import signed_pickle
from ..checkpoint.resume import FitSnapshots, active
from ..io import atomic_write_bytes
from .environment import git_state

__all__ = ["ENV", "REPORT_ENV", "PartialRunError", "TaskCache", "from_environment", "memoized", "run_resumable", "snapshots_of", "task_digest"]

#: The environment variable that names the cache folder (unset or empty: no cache).
ENV = "BPFREE_TASK_CACHE"
#: Set to a committed revision: report what the cache holds for that revision's run and
#: train nothing (a partial report of a run still in progress).
REPORT_ENV = "BPFREE_TASK_CACHE_REPORT"


class PartialRunError(RuntimeError):
    """A report-only run (``$BPFREE_TASK_CACHE_REPORT``) met work that has not finished and
    that the benchmark cannot report without."""


@dataclass
class TaskCache:
    """Results of finished tasks under ``directory``, valid for code revision ``salt``.

    ``hits`` counts the results :meth:`load` found (what a benchmark reports as resumed).
    ``report_only``: tasks the cache lacks are not run (``$BPFREE_TASK_CACHE_REPORT``);
    ``missing`` counts the keys :func:`~bpfree.bench.parallel.run_keyed` left out for it.
    """

    directory: Path
    salt: str
    hits: int = field(default=0)
    report_only: bool = field(default=False)
    missing: int = field(default=0)

    def path(self, fn: Callable, task: Any) -> Path:
        name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
        digest = hashlib.sha256()
        for part in (self.salt.encode(), name.encode(), task_digest(task).encode()):
            digest.update(len(part).to_bytes(8, "little") + part)
        return self.directory / f"{digest.hexdigest()}.pkl"

    def load(self, fn: Callable, task: Any) -> tuple[bool, Any]:
        """``(True, result)`` when ``fn(task)`` finished before at this revision, else
        ``(False, None)``. An unreadable file (cut off, corrupt) counts as missing."""
        return self.read(self.path(fn, task))

    def store(self, fn: Callable, task: Any, value: Any) -> None:
        """Keep ``fn(task)``'s result (:meth:`write`)."""
        self.write(self.path(fn, task), value)

    def snapshot_dir(self, fn: Callable, task: Any) -> Path:
        """The folder of ``fn(task)``'s epoch snapshots (:mod:`bpfree.checkpoint.resume`)."""
        return snapshots_of(self.path(fn, task))

    # The same three on a path from :meth:`path`, for callers that hold it: a task's digest
    # pickles and hashes the whole task (its data and model), so it is computed once per task.

    def read(self, path: Path) -> tuple[bool, Any]:
        """:meth:`load` of the result stored at ``path``."""
        try:
            value = signed_pickle.loads(path.read_bytes())  # unsigned or foreign: missing
        except FileNotFoundError:
            return False, None
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ValueError):
            return False, None
        self.hits += 1
        return True, value

    def write(self, path: Path, value: Any) -> None:
        """Keep a result at ``path``, written atomically (a kill leaves no partial file), and
        drop its epoch snapshots, which only a cut-off run needs."""
        atomic_write_bytes(path, signed_pickle.dumps(value), what=f"${ENV}")
        shutil.rmtree(snapshots_of(path), ignore_errors=True)


def snapshots_of(path: Path) -> Path:
    """The epoch snapshot folder that belongs to the result file ``path``."""
    return path.with_suffix(".epochs")


def run_resumable(fn: Callable, snapshot_dir: str | os.PathLike, task: Any) -> Any:
    """``fn(task)`` with ``snapshot_dir`` as its epoch snapshot folder: every
    :func:`bpfree.harness.fit` inside saves each epoch there and resumes from it (a pool
    worker's entry point; module-level so that it pickles)."""
    with active(FitSnapshots(snapshot_dir)):
        return fn(task)


class _DigestPickler(pickle._Pickler):  # the Python pickler: it asks reducer_override for sets
    """A pickler that writes each tensor (and storage) as a reference to its content's digest
    instead of pickling it, and sets in sorted order, so equal tasks give equal bytes in any
    process."""

    def persistent_id(self, obj: Any):
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            if t.is_sparse or t.layout != torch.strided:
                t = t.to_dense()
            data = t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes() \
                if t.numel() else b""
            return ("tensor", type(obj).__qualname__, str(t.dtype), tuple(t.shape),
                    bool(obj.requires_grad), hashlib.sha256(data).hexdigest())
        if isinstance(obj, (torch.UntypedStorage, torch.TypedStorage)):
            untyped = obj.untyped() if isinstance(obj, torch.TypedStorage) else obj
            data = bytes(untyped.cpu()) if untyped.nbytes() else b""
            return ("storage", type(obj).__qualname__, hashlib.sha256(data).hexdigest())
        return None

    def reducer_override(self, obj: Any):
        # A set pickles in hash order, which string hashing randomizes per process.
        if type(obj) in (set, frozenset):
            return type(obj), (sorted(obj, key=repr),)
        return NotImplemented


def task_digest(task: Any) -> str:
    """A SHA-256 of ``task`` that is the same in every process for equal tasks: the task
    pickled, with every tensor replaced by its dtype, shape and a digest of its bytes."""
    buffer = io.BytesIO()
    _DigestPickler(buffer, protocol=4).dump(task)
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def memoized(cache: TaskCache | None, fn: Callable, task: Any, compute: Callable[[], Any]) -> Any:
    """``compute()``, the result of ``fn`` on ``task``, kept in ``cache`` (None: no cache).

    For benchmarks that train one run after another in the parent process rather than
    through :func:`~bpfree.bench.parallel.run_keyed`: ``task`` names the run (what it
    depends on besides the revision, e.g. ``(kind, network, seed, config)``) and must pickle;
    ``compute`` is not called when the cache holds it.
    """
    if cache is None:
        return compute()
    path = cache.path(fn, task)
    found, value = cache.read(path)
    if found:
        return value
    with active(FitSnapshots(snapshots_of(path))):
        value = compute()
    cache.write(path, value)
    return value


def from_environment(checkout: str | os.PathLike | None = None) -> TaskCache | None:
    """The cache ``$BPFREE_TASK_CACHE`` names, for the git revision of ``checkout`` (default:
    the working directory), or None when the variable is unset or empty.

    With ``$BPFREE_TASK_CACHE_REPORT=REV`` also set, the cache is read-only and keyed by
    ``REV`` instead (:func:`report_revision`): a partial report of REV's run.

    Raises ValueError outside a git checkout or in a dirty one: a resumed run must be
    traceable to one committed revision; and for a report revision that is not a commit, or
    a report folder that does not exist.
    """
    directory = os.environ.get(ENV, "")
    report = os.environ.get(REPORT_ENV, "")
    if not directory:
        if report:
            raise ValueError(f"${REPORT_ENV} is set but ${ENV} is not: name the cache folder "
                             "of the run to report")
        return None
    revision, dirty = git_state(checkout)
    if revision is None or dirty:
        raise ValueError(
            f"${ENV} is set, but the checkout is {'dirty' if dirty else 'not a git checkout'}: "
            "finished tasks are reused only by the same committed revision; commit (or unset "
            f"{ENV}) first")
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise ValueError(f"${ENV}: {directory!r} is not a directory")
    if report:
        if not path.is_dir():
            raise ValueError(f"${ENV}: {directory!r} does not exist; nothing to report")
        return TaskCache(path, report_revision(report, checkout), report_only=True)
    path.mkdir(parents=True, exist_ok=True)
    return TaskCache(path, revision)


def report_revision(revision: str, checkout: str | os.PathLike | None = None) -> str:
    """``revision`` as a run's cache keys name it: the short hash :func:`git_state` gives
    (ValueError when it is not a commit of ``checkout``'s repository)."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", "--short", f"{revision}^{{commit}}"],
            cwd=Path(checkout) if checkout is not None else None, capture_output=True,
            text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        raise ValueError(f"${REPORT_ENV}={revision!r} is not a commit of this repository "
                         "(give the revision whose run the cache holds)") from None
