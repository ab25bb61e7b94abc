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

A run can also go on at a newer revision from what an earlier one finished: with
``BPFREE_TASK_CACHE_REUSE=REV`` (an ancestor of the checkout), a task this revision has no
result for is taken from REV's result in the same folder, if there is one
(:meth:`TaskCache.find`), and only the rest is trained (under this revision's keys). It is
for a revision whose task code computes the same bits as REV's, e.g. one that adds tasks (a
widened rate grid) to a run of many hours; :attr:`TaskCache.reused` counts what came from
each revision, for the benchmark's JSON, and a benchmark can recompute one reused task to
show the bits agree (:func:`same_result`).

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

__all__ = ["ENV", "REPORT_ENV", "REUSE_ENV", "same_result", "PartialRunError", "TaskCache", "from_environment", "memoized", "run_resumable", "snapshots_of", "task_digest"]

#: The environment variable that names the cache folder (unset or empty: no cache).
ENV = "BPFREE_TASK_CACHE"
#: Set to a committed revision: report what the cache holds for that revision's run and
#: train nothing (a partial report of a run still in progress).
REPORT_ENV = "BPFREE_TASK_CACHE_REPORT"
#: Committed ancestor revisions (comma-separated) whose results this run takes where it has
#: none of its own: a long run continued at a newer revision.
REUSE_ENV = "BPFREE_TASK_CACHE_REUSE"


class PartialRunError(RuntimeError):
    """A report-only run (``$BPFREE_TASK_CACHE_REPORT``) met work that has not finished and
    that the benchmark cannot report without."""


@dataclass
class TaskCache:
    """Results of finished tasks under ``directory``, valid for code revision ``salt``.

    ``hits`` counts the results :meth:`read` found (what a benchmark reports as resumed).
    ``report_only``: tasks the cache lacks are not run (``$BPFREE_TASK_CACHE_REPORT``);
    ``missing`` counts the keys :func:`~bpfree.bench.parallel.run_keyed` left out for it.
    ``reuse``: earlier revisions whose results :meth:`find` takes where ``salt`` has none
    (``$BPFREE_TASK_CACHE_REUSE``); ``reused`` counts them per revision, and ``origin``
    maps each such result's own path (:meth:`path`) to the revision it came from.
    """

    directory: Path
    salt: str
    hits: int = field(default=0)
    report_only: bool = field(default=False)
    missing: int = field(default=0)
    reuse: tuple[str, ...] = field(default=())
    reused: dict[str, int] = field(default_factory=dict)
    origin: dict[Path, str] = field(default_factory=dict)

    def path(self, fn: Callable, task: Any, *, salt: str | None = None,
             digest: str | None = None) -> Path:
        """The file of ``fn(task)``'s result at revision ``salt`` (default: this cache's);
        ``digest``: the task's :func:`task_digest`, when the caller has it."""
        name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
        digest = task_digest(task) if digest is None else digest
        h = hashlib.sha256()
        for part in ((self.salt if salt is None else salt).encode(), name.encode(),
                     digest.encode()):
            h.update(len(part).to_bytes(8, "little") + part)
        return self.directory / f"{h.hexdigest()}.pkl"

    def find(self, fn: Callable, task: Any) -> tuple[Path, bool, Any]:
        """``(path, found, result)``: ``path`` where this revision keeps ``fn(task)``, and
        its result from there or else from the first :attr:`reuse` revision that has one."""
        digest = task_digest(task)
        own = self.path(fn, task, digest=digest)
        found, value = self.read(own)
        if found:
            return own, True, value
        for earlier in self.reuse:
            found, value = self.read(self.path(fn, task, salt=earlier, digest=digest))
            if found:
                self.reused[earlier] = self.reused.get(earlier, 0) + 1
                self.origin[own] = earlier
                return own, True, value
        return own, False, None

    def load(self, fn: Callable, task: Any) -> tuple[bool, Any]:
        """``(True, result)`` when ``fn(task)`` finished before (:meth:`find`), else
        ``(False, None)``."""
        return self.find(fn, task)[1:]

    def store(self, fn: Callable, task: Any, value: Any) -> None:
        """Keep ``fn(task)``'s result (:meth:`write`)."""
        self.write(self.path(fn, task), value)

    def snapshot_dir(self, fn: Callable, task: Any) -> Path:
        """The folder of ``fn(task)``'s epoch snapshots (:mod:`bpfree.checkpoint.resume`)."""
        return snapshots_of(self.path(fn, task))

    def read(self, path: Path) -> tuple[bool, Any]:
        """``(True, result)`` for the result stored at ``path``, else ``(False, None)``. An
        unreadable file (cut off, corrupt, unsigned) counts as missing."""
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
    pickled, with every tensor replaced by its dtype, shape and a digest of its bytes.

    Like pickle, it writes an object met twice as a back-reference, so it sees sharing: a
    module read back from a pickle shares its equal strings where one built by its
    constructor does not, and the two digest differently. Build what a task holds the same
    way in every process (``benchmarks/pmt.py``'s ``_pretrained`` keeps weights, not the
    module, for that reason)."""
    buffer = io.BytesIO()
    _DigestPickler(buffer, protocol=4).dump(task)
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def memoized(cache: TaskCache | None, fn: Callable, task: Any, compute: Callable[[], Any]) -> Any:
    """``compute()``, the result of ``fn`` on ``task``, kept in ``cache`` (None: no cache).

    For benchmarks that train one run after another in the parent process rather than
    through :func:`~bpfree.bench.parallel.run_keyed`: ``task`` names the run (what it
    depends on besides the revision, e.g. ``(kind, network, seed, config)``) and must pickle;
    ``compute`` is not called when the cache holds it. A report-only cache
    (``$BPFREE_TASK_CACHE_REPORT``) is read, never written: what this revision computes is
    not the reported revision's result.
    """
    if cache is None:
        return compute()
    path, found, value = cache.find(fn, task)
    if found:
        return value
    if cache.report_only:
        return compute()
    value = run_resumable(lambda _task: compute(), snapshots_of(path), task)
    cache.write(path, value)
    return value


def from_environment(checkout: str | os.PathLike | None = None) -> TaskCache | None:
    """The cache ``$BPFREE_TASK_CACHE`` names, for the git revision of ``checkout`` (default:
    the working directory), or None when the variable is unset or empty.

    With ``$BPFREE_TASK_CACHE_REPORT=REV`` also set, the cache is read-only and keyed by
    ``REV`` instead (:func:`report_revision`): a partial report of REV's run. With
    ``$BPFREE_TASK_CACHE_REUSE=REV[,REV...]``, results those ancestor revisions (of this
    checkout, or of the reported revision) stored in the folder stand in for missing ones
    (:meth:`TaskCache.find`).

    Raises ValueError outside a git checkout or in a dirty one: a resumed run must be
    traceable to one committed revision; and for a report revision that is not a commit, or
    a report folder that does not exist; for a reuse revision that is not an ancestor.
    """
    directory = os.environ.get(ENV, "")
    report = os.environ.get(REPORT_ENV, "")
    reuse = [r.strip() for r in os.environ.get(REUSE_ENV, "").split(",") if r.strip()]
    if not directory:
        for name, value in ((REPORT_ENV, report), (REUSE_ENV, reuse)):
            if value:
                raise ValueError(f"${name} is set but ${ENV} is not: name the cache folder "
                                 "of the run")
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
        revision = report_revision(report, checkout)
    else:
        path.mkdir(parents=True, exist_ok=True)
    earlier = tuple(reuse_revision(r, revision, checkout) for r in reuse)
    return TaskCache(path, revision, report_only=bool(report),
                     reuse=tuple(r for r in earlier if r != revision))


def reuse_revision(revision: str, head: str, checkout: str | os.PathLike | None = None) -> str:
    """``revision`` as cache keys name it, checked to be an ancestor of ``head`` (a run goes
    on at a newer revision, never an unrelated one); ValueError otherwise."""
    short = report_revision(revision, checkout, env=REUSE_ENV)
    try:
        subprocess.run(["git", "merge-base", "--is-ancestor", short, head],
                       cwd=Path(checkout) if checkout is not None else None,
                       capture_output=True, timeout=5, check=True)
    except (OSError, subprocess.SubprocessError):
        raise ValueError(f"${REUSE_ENV}={revision!r} is not an ancestor of this checkout's "
                         f"revision {head}: results are reused only from an earlier revision "
                         "of the same history") from None
    return short


def same_result(a: Any, b: Any, *, ignore: Callable[[str], bool] = lambda key: "seconds" in key,
                path: str = "result") -> list[str]:
    """Where two task results differ (empty: the same), comparing dicts, lists, tensors and
    numbers exactly, and skipping the dict keys ``ignore`` names (default: timings, which
    no two runs share). For checking that a result reused from an earlier revision is what
    this revision computes."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=repr):
            if isinstance(key, str) and ignore(key):
                continue
            if key not in a or key not in b:
                out.append(f"{path}[{key!r}] only in {'the second' if key in b else 'the first'}")
            else:
                out += same_result(a[key], b[key], ignore=ignore, path=f"{path}[{key!r}]")
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: lengths {len(a)} and {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b))
                for d in same_result(x, y, ignore=ignore, path=f"{path}[{i}]")]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return [] if same else [f"{path}: tensors differ"]
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return []  # NaN in both
    return [] if type(a) is type(b) and a == b else [f"{path}: {a!r} != {b!r}"]


def report_revision(revision: str, checkout: str | os.PathLike | None = None, *,
                    env: str = REPORT_ENV) -> str:
    """``revision`` as a run's cache keys name it: the short hash :func:`git_state` gives
    (ValueError when it is not a commit of ``checkout``'s repository)."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", "--short", f"{revision}^{{commit}}"],
            cwd=Path(checkout) if checkout is not None else None, capture_output=True,
            text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        raise ValueError(f"${env}={revision!r} is not a commit of this repository "
                         "(give the revision whose run the cache holds)") from None
