"""Starting a fleet: spawned workers on the loopback interface, or torchrun's processes.

:func:`launch` builds the experiment once (the BP-pretrained factory model, the drifted data),
saves it, and starts W worker processes (``spawn``) that join a gloo process group on
``127.0.0.1`` with one thread each. Each writes its result, or the error that stopped it, to
a file the parent reads. A worker that dies makes the others' next ``all_reduce`` fail
(:class:`~.comm.WorkerLost`) within the group's timeout; the parent waits at most that long
(plus a margin) for the others to stop by themselves, then terminates them (SIGTERM, then
SIGKILL for any still alive a few seconds later: a stopped worker too), and raises
:class:`FleetError` naming what each worker did. Nothing waits forever.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
import traceback
from pathlib import Path
from tempfile import TemporaryDirectory

import torch
from torch import nn

from ..device.model_file import SAFE_CLASSES
from ..restricted_load import UnsafeFileError, load_restricted
from .comm import DEFAULT_TIMEOUT_S, free_port, init_group
from .fleet import FleetOptions, train

#: What the shared setup may contain: the INT8 model's classes and the float digits MLP's.
SETUP_CLASSES = (*SAFE_CLASSES, nn.Linear, nn.ReLU)
#: The keys :func:`~.fleet.train` reads.
SETUP_KEYS = frozenset({"model", "x", "y", "x_test", "y_test"})


class FleetError(RuntimeError):
    """A worker of the fleet failed; the message says which and why, for every worker."""


def _result_path(folder: str, rank: int) -> Path:
    return Path(folder) / f"rank{rank}.json"


def load_setup(path: str | os.PathLike) -> dict:
    """The fleet's shared setup saved at ``path`` (:func:`~.fleet.build_setup`'s dict), read
    with the restricted unpickler: the file sits in a private temporary folder, but a worker
    still never runs code from a file (issue 34); anything else is an ``UnsafeFileError``."""
    setup = load_restricted(path, SETUP_CLASSES, "fleet setup", "fleet setup")
    if not isinstance(setup, dict) or not SETUP_KEYS <= set(setup):
        got = sorted(map(repr, setup)) if isinstance(setup, dict) else type(setup).__name__
        raise UnsafeFileError(f"fleet setup: {path} must hold a dict with the keys "
                              f"{sorted(SETUP_KEYS)}, got {got}")
    return setup


def _worker(rank: int, world: int, port: int, folder: str, options: dict,
            timeout_s: float) -> None:
    """Body of one spawned worker: join, load the shared setup, train, report."""
    torch.set_num_threads(1)
    out = _result_path(folder, rank)
    comm = None
    try:
        # Load before joining: the rendezvous shares the collectives' timeout, so the slow
        # part of start-up must not sit between one worker's join and the other's.
        setup = load_setup(Path(folder) / "setup.pt")
        comm = init_group(rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                          timeout_s=timeout_s, backend="gloo")
        result = train(setup, FleetOptions(**options), comm)
        out.write_text(json.dumps({"ok": True, **result}))
    except BaseException as exc:  # report every failure to the parent, then exit non-zero
        out.write_text(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}",
                                   "traceback": traceback.format_exc()[-4000:]}))
        raise SystemExit(1) from None
    finally:
        if comm is not None:
            try:
                comm.close()
            except Exception:  # the group may be broken after a peer died
                pass


def check_launch(workers: int, timeout_s: float) -> None:
    """Refuse a fleet size or timeout that cannot work, before any work is done."""
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 64:
        raise ValueError(f"--workers must be an integer in [1, 64] on one machine, "
                         f"got {workers!r}")
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < 86400):
        raise ValueError(f"--timeout must be a number of seconds in (0, 86400), "
                         f"got {timeout_s!r}")


def launch(workers: int, options: FleetOptions, setup: dict, *,
           timeout_s: float = DEFAULT_TIMEOUT_S) -> list[dict]:
    """Run ``options`` on ``workers`` spawned processes; returns each worker's result.

    Raises :class:`FleetError` when any worker fails or does not stop in time.
    """
    check_launch(workers, timeout_s)
    ctx = mp.get_context("spawn")
    with TemporaryDirectory(prefix="bpfree-fleet-") as folder:
        torch.save(setup, Path(folder) / "setup.pt")
        port = free_port()
        procs = [ctx.Process(target=_worker, args=(r, workers, port, folder,
                                                   options.as_dict(), timeout_s), daemon=True)
                 for r in range(workers)]
        for p in procs:
            p.start()
        _wait(procs, timeout_s)
        results, problems = [], []
        for r, p in enumerate(procs):
            path = _result_path(folder, r)
            report = json.loads(path.read_text()) if path.exists() else None
            if report is not None and report.get("ok") and p.exitcode == 0:
                report.pop("ok")
                results.append(report)
                continue
            why = (report["error"] if report is not None and not report.get("ok")
                   else "killed: did not stop in time" if p.exitcode is not None and p.exitcode < 0
                   else "died without a report")
            problems.append(f"worker {r} (exit code {p.exitcode}): {why}")
        if problems:
            raise FleetError(f"{len(problems)} of {workers} workers failed: "
                             + "; ".join(problems))
        return results


def _wait(procs, timeout_s: float, *, margin_s: float = 15.0, grace_s: float = 5.0) -> None:
    """Join all; once one has failed, give the rest ``timeout_s`` + ``margin_s`` to notice,
    then SIGTERM them, and SIGKILL whichever is still alive ``grace_s`` later: a hung
    collective must not hang the launcher, and neither may a stopped (SIGSTOP) or
    SIGTERM-ignoring worker, which multiprocessing's exit handler would join for ever."""
    deadline = None
    while any(p.is_alive() for p in procs):
        if deadline is None and any(p.exitcode not in (None, 0) for p in procs):
            deadline = time.monotonic() + timeout_s + margin_s
        if deadline is not None and time.monotonic() > deadline:
            for stop in ("terminate", "kill"):
                for p in procs:
                    if p.is_alive():
                        getattr(p, stop)()
                end = time.monotonic() + grace_s
                for p in procs:
                    p.join(max(0.0, end - time.monotonic()))
            return
        for p in procs:
            p.join(0.1)
