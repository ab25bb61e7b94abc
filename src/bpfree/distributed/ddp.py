"""What data-parallel BP communicates, measured: DDP's gradient buckets on the same model.

A communication hook (``DistributedDataParallel.register_comm_hook``) sees every bucket DDP
all-reduces; :func:`ddp_bytes_per_step` sums their bytes over one backward pass and then
runs the default all-reduce, so the figure is what DDP really hands to gloo, not ``4 d``
assumed. A one-worker group on the loopback suffices: DDP reduces the same buckets for any
W, and each worker's payload does not depend on W.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .comm import free_port


def ddp_bytes_per_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Bytes DDP all-reduces for one BP step of ``model`` on ``(x, y)`` (cross-entropy)."""
    if dist.is_initialized():
        raise RuntimeError("ddp_bytes_per_step starts its own one-worker group; a process "
                           "group is already initialised")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        seen = []

        def counting(state, bucket):
            buffer = bucket.buffer()
            seen.append(buffer.numel() * buffer.element_size())
            fut = dist.all_reduce(buffer, async_op=True).get_future()
            return fut.then(lambda f: f.value()[0])

        ddp = DistributedDataParallel(model)
        ddp.register_comm_hook(None, counting)
        nn.functional.cross_entropy(ddp(x), y).backward()
        return int(sum(seen))
    finally:
        dist.destroy_process_group()
