"""Process pools for benchmarks: independent training runs spread over the CPU cores.

Benchmarks pin one torch thread per worker (the runs are small, so a process per core beats
intra-op threads) and use the ``spawn`` start method, because forking a process that has
already started torch's thread pools can deadlock.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import ctypes
import functools
import heapq
import itertools
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import torch

from ..progress import progress_bar
from .environment import cpu_model
from .task_cache import PartialRunError, TaskCache, run_resumable, snapshots_of

__all__ = ["default_workers", "spawn_pool", "run_keyed", "cached_submit", "PrioritySubmitter"]


def default_workers(limit: int = 2) -> int:
    """Worker processes for a CPU benchmark: the cores there are, at most ``limit`` (the CI
    machine and the ``--quick`` budgets assume 2)."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    return max(1, min(limit, os.cpu_count() or 1))


def _die_with_parent() -> None:
    """Worker initializer: on Linux, ask the kernel to SIGTERM this worker when its parent
    dies. Without it, killing a benchmark (SIGTERM or SIGKILL to the parent alone) left its
    workers computing for an hour; elsewhere it does nothing."""
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


_PR_SET_PDEATHSIG = 1


def spawn_pool(workers: int) -> cf.ProcessPoolExecutor:
    """A ``ProcessPoolExecutor`` of ``workers`` processes started with ``spawn``; the workers
    end when the parent process dies (Linux)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return cf.ProcessPoolExecutor(max_workers=workers, initializer=_die_with_parent,
                                  mp_context=multiprocessing.get_context("spawn"))


def _resumable(fn: Callable[[Any], Any], path) -> Callable[[Any], Any]:
    """``fn`` run with epoch snapshots beside its task-cache file ``path``
    (:func:`~bpfree.bench.task_cache.run_resumable`), so a task cut off mid-run resumes
    inside itself, not only at the next task. Shared by :func:`run_keyed` and
    :func:`cached_submit`, the two ways a benchmark submits cached tasks."""
    return functools.partial(run_resumable, fn, snapshots_of(path))


def run_keyed(fn: Callable[[Any], Any], tasks: Mapping[Hashable, Any], workers: int,
              order: list | None = None, progress: str | None = None,
              cache: TaskCache | None = None, partial: bool = False) -> dict:
    """``{key: fn(task)}`` for every item of ``tasks``.

    ``workers`` ≤ 1 runs them in this process (easier to debug and profile). Otherwise they
    are submitted in ``order`` (default: as given; put the longest first so the pool does not
    end on one long straggler) to a spawn pool; ``fn`` and the tasks must pickle. The first
    task that raises propagates its exception. ``progress``: a label for a progress bar of
    finished tasks on stderr (hours-long benchmarks need one). ``cache``: a
    :class:`~bpfree.bench.task_cache.TaskCache`; tasks it holds are not run again, and each
    task that finishes is stored in it at once (a run cut off resumes where it stopped).

    A report-only cache (``cache.report_only``, ``$BPFREE_TASK_CACHE_REPORT``) runs nothing:
    with ``partial`` the result holds the finished tasks only (``cache.missing`` counts the
    others); without it, any unfinished task raises :class:`PartialRunError`, since the
    caller cannot report without it.
    """
    keys = list(tasks) if order is None else list(order)
    if set(keys) != set(tasks):
        raise ValueError("order must list every task key exactly once")
    results = {}
    # Each task's cache file, digested once (the digest hashes the task's data and model).
    # (cache.find: this revision's result, or a reused earlier revision's.)
    paths = {}
    for k in keys if cache is not None else ():
        paths[k], found, value = cache.find(fn, tasks[k])
        if found:
            results[k] = value
    keys = [k for k in keys if k not in results]
    if cache is not None and cache.report_only:
        if keys and not partial:
            raise PartialRunError(
                f"{len(keys)} of {len(paths)} tasks{f' of {progress}' if progress else ''} "
                f"have not finished in the run of {cache.salt} (report-only cache, "
                f"{cache.directory}); this part cannot be reported until they have")
        cache.missing += len(keys)
        return results

    def runnable(k) -> tuple[Callable, Any]:
        # Under a cache, each task saves epoch snapshots, so a cut-off long run resumes
        # inside itself, not only at the next task (checkpoint.resume).
        if cache is None:
            return fn, tasks[k]
        return _resumable(fn, paths[k]), tasks[k]

    def finished(k, value) -> None:
        results[k] = value
        if cache is not None:
            cache.write(paths[k], value)
        bar.update(1)

    bar = progress_bar(len(keys), "tasks", progress or False, unit="task")
    try:
        if workers <= 1:
            for k in keys:
                call, task = runnable(k)
                finished(k, call(task))
            return results
        # At most two tasks per worker in flight: each submitted task's tensors are shared
        # through a file descriptor until a worker unpickles it, and a hundred queued tasks
        # exhaust the sharer (ConnectionRefusedError in the workers).
        pending = iter(keys)
        with spawn_pool(workers) as pool:
            futures: dict = {}

            def submit_next() -> None:
                key = next(pending, None)
                if key is not None:
                    futures[pool.submit(*runnable(key))] = key

            for _ in range(2 * workers):
                submit_next()
            while futures:
                done, _ = cf.wait(futures, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    key = futures.pop(fut)
                    finished(key, fut.result())
                    submit_next()
        return results
    finally:
        bar.close()


def cached_submit(pool: cf.Executor, cache: TaskCache | None, fn: Callable[[Any], Any],
                  task: Any) -> cf.Future:
    """``pool.submit(fn, task)`` through ``cache``, for benchmarks that schedule their tasks
    themselves (a task submitted when another finishes) rather than through
    :func:`run_keyed`: a task the cache holds comes back as a finished future without
    running; any other runs with epoch snapshots beside its cache file
    (:func:`~bpfree.bench.task_cache.run_resumable`) and its result is stored the moment it
    arrives, so a run cut off resumes where it stopped. A report-only cache raises
    :class:`PartialRunError` for a task it lacks (the caller cannot report without it).

    The task digest sees object sharing (:func:`~bpfree.bench.task_cache.task_digest`):
    build a task from the same kinds of objects whether its inputs were computed or read
    back from the cache (a state dict, not a module)."""
    if cache is None:
        return pool.submit(fn, task)
    path, found, value = cache.find(fn, task)
    if found:
        done: cf.Future = cf.Future()
        done.set_result(value)
        return done
    if cache.report_only:
        cache.missing += 1
        raise PartialRunError(f"a task of {getattr(fn, '__qualname__', fn)} has not finished "
                              f"in the run of {cache.salt} (report-only cache, "
                              f"{cache.directory})")
    future = pool.submit(_resumable(fn, path), task)

    def store(f: cf.Future) -> None:
        if not f.cancelled() and f.exception() is None:
            cache.write(path, f.result())

    future.add_done_callback(store)
    return future


class PrioritySubmitter:
    """Feeds ``pool`` through ``cache`` (:func:`cached_submit`) at most ``limit`` unfinished
    tasks at a time, the lowest ``priority`` first (ties: the order they were added).

    A pool's own queue is first come, first served, so a task that becomes ready late (a
    test run waiting for its rate search) queues behind everything submitted before it. Held
    here instead, it overtakes lower-priority work that has not started: a benchmark can run
    the parts a partial report needs most before the longest ones. A task the cache holds
    completes at once and takes no slot.

    ``optional=True`` marks a task whose absence a report-only cache
    (``$BPFREE_TASK_CACHE_REPORT``) tolerates: it is listed in :attr:`missing` instead of
    raising :class:`~bpfree.bench.task_cache.PartialRunError`. ``on_add`` is called with each
    task's key when it is added (a progress bar's total)."""

    def __init__(self, pool: cf.Executor, cache: TaskCache | None, limit: int,
                 on_add: Callable[[Hashable], None] | None = None) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.pool, self.cache, self.limit, self.on_add = pool, cache, limit, on_add
        self._heap: list = []
        self._order = itertools.count()
        self.futures: dict[cf.Future, Hashable] = {}
        self.missing: list[Hashable] = []

    def add(self, fn: Callable[[Any], Any], task: Any, key: Hashable, *, priority: int = 0,
            optional: bool = False) -> None:
        """Queue ``fn(task)``, reported under ``key`` by :meth:`completed`."""
        heapq.heappush(self._heap, (priority, next(self._order), fn, task, key, optional))
        if self.on_add is not None:
            self.on_add(key)
        self._fill()

    def _fill(self) -> None:
        while self._heap and sum(not f.done() for f in self.futures) < self.limit:
            *_, fn, task, key, optional = heapq.heappop(self._heap)
            try:
                self.futures[cached_submit(self.pool, self.cache, fn, task)] = key
            except PartialRunError:
                if not optional:
                    raise
                self.missing.append(key)

    def __bool__(self) -> bool:
        return bool(self.futures or self._heap)

    def completed(self) -> list[tuple[Hashable, Any]]:
        """Waits for at least one task; returns ``(key, result)`` of each one finished (a
        task's exception is raised here), and refills the free slots."""
        self._fill()
        if not self.futures:
            return []
        done, _ = cf.wait(self.futures, return_when=cf.FIRST_COMPLETED)
        out = [(self.futures.pop(f), f.result()) for f in done]
        self._fill()
        return out


def pool_device(workers: int) -> str:
    """The ``device`` line of a benchmark whose work ran in ``workers`` single-thread
    processes: the CPU model and the real layout (the parent's own thread count says
    nothing about it)."""
    return f"cpu: {cpu_model()}, {workers} worker processes x 1 thread"


def run_named_task(tasks: Mapping[str, Callable[..., dict]], task: tuple[str, dict], *,
                   seconds_key: str) -> dict:
    """Process-pool entry point shared by experiment drivers: ``task = (kind, kwargs)`` runs
    ``tasks[kind](**kwargs)`` on one CPU thread (the pool supplies the parallelism) and adds
    its wall time under ``seconds_key``.

    The task runs on its own deep copy of ``kwargs``. A tensor sent to a spawn pool keeps
    its storage in shared memory, one storage for the parent and for every task that got the
    same tensor (torch.multiprocessing), so an in-place change (a weight perturbed and
    restored, as PMT's Fig. 5 cosines do) would race with the tasks running beside it: two
    such tasks made each other's estimates wrong. A copy costs milliseconds here."""
    torch.set_num_threads(1)
    kind, kwargs = task
    if kind not in tasks:
        raise ValueError(f"unknown task kind {kind!r}; expected one of {sorted(tasks)}")
    t0 = time.perf_counter()
    out = tasks[kind](**copy.deepcopy(kwargs))
    out[seconds_key] = time.perf_counter() - t0
    return out
