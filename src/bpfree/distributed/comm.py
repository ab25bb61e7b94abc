"""The one collective a data-parallel zeroth-order step needs: a summing ``all_reduce``.

:class:`Communicator` wraps ``torch.distributed`` (gloo on the CPU, NCCL where a GPU is
present) and counts the payload each worker hands to the collective, so the bytes a step
communicates are measured, not assumed. :class:`SingleProcess` is the same interface for one
process (the reference run and ``--workers 1``): the sum over one worker is the identity.

A peer that dies makes gloo fail the pending collective (a closed connection at once, or the
process group's timeout when the peer hangs); :meth:`Communicator.all_reduce` turns that into
:class:`WorkerLost`, naming this rank and the collective, so no worker waits forever.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import time

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 30.0


class WorkerLost(RuntimeError):
    """A collective failed because another worker stopped (died, hung past the timeout)."""


class SingleProcess:
    """One worker: ``all_reduce`` leaves the tensor as it is, but still counts its bytes."""

    rank, world_size = 0, 1

    def __init__(self) -> None:
        self.bytes_reduced = 0
        self.collectives = 0
        self.bytes_by_what: dict[str, int] = {}

    def all_reduce(self, tensor: torch.Tensor, what: str = "scalars") -> torch.Tensor:
        size = tensor.numel() * tensor.element_size()
        self.bytes_reduced += size
        self.bytes_by_what[what] = self.bytes_by_what.get(what, 0) + size
        self.collectives += 1
        return tensor

    def close(self) -> None:
        pass


class Communicator(SingleProcess):
    """A member of an initialised ``torch.distributed`` process group."""

    def __init__(self) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised; call init_group() first")
        self._dist = dist
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()

    def all_reduce(self, tensor: torch.Tensor, what: str = "scalars") -> torch.Tensor:
        """Sum ``tensor`` over all workers, in place; every rank receives the same bytes."""
        super().all_reduce(tensor, what)
        start = time.monotonic()
        try:
            self._dist.all_reduce(tensor, op=self._dist.ReduceOp.SUM)
        except Exception as exc:  # gloo raises RuntimeError / DistBackendError subclasses
            raise WorkerLost(
                f"worker {self.rank} of {self.world_size}: the all_reduce of the step's {what} "
                f"failed after {time.monotonic() - start:.1f} s, another worker stopped or "
                "timed out; stopping this one too "
                f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]})") from exc
        return tensor

    def close(self) -> None:
        if self._dist.is_initialized():
            self._dist.destroy_process_group()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the rendezvous of a one-machine fleet)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def init_group(*, rank: int | None = None, world_size: int | None = None,
               init_method: str = "env://", timeout_s: float = DEFAULT_TIMEOUT_S,
               backend: str | None = None) -> Communicator:
    """Join the process group (torchrun sets the ``env://`` variables) and return its comm.

    ``backend`` defaults to NCCL when CUDA is available and gloo otherwise. ``timeout_s``
    bounds every collective: a worker that stops makes the others fail within it.
    """
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < 86400):
        raise ValueError(f"timeout_s must be a number of seconds in (0, 86400), got {timeout_s!r}")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "gloo" and init_method.startswith("tcp://127.0.0.1"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # a loopback fleet stays on lo
    kwargs = {} if rank is None else {"rank": rank, "world_size": world_size}
    dist.init_process_group(backend, init_method=init_method,
                            timeout=_dt.timedelta(seconds=timeout_s), **kwargs)
    return Communicator()
