"""Beyond one machine: data-parallel and federated zeroth-order training on torch.distributed.

A zeroth-order step is fully described by its seeds and its projected-gradient scalars, so
workers exchange those instead of gradients (MeZO's observation; FedKSeed, DeComFL):

* :mod:`.comm`: the summing ``all_reduce`` (gloo on the CPU, NCCL on a GPU), with the bytes
  counted and a dead peer turned into :class:`WorkerLost` within the group's timeout.
* :mod:`.exact`: int64 fixed-point sums of loss differences, exact in any reduction order.
* :mod:`.pmt`: :class:`DataParallelPMT`, PMT's integer layer-wise WP / NP on W workers.
* :mod:`.zo`: :class:`DataParallelZO`, float weight-perturbation ZO (:class:`ZOOptimizer`).
* :mod:`.ledger` and :mod:`.federated`: federated rounds with an append-only seed ledger.
* :mod:`.fleet`: one fleet run (the demo's drift adaptation) as worker ``rank`` of ``W``;
  :mod:`.launch`, :mod:`.cli`: ``bpfree fleet`` (spawned loopback workers) and
  ``torchrun -m bpfree.distributed`` (:mod:`.__main__`).
* :mod:`.projection`: bytes per step and round on paper, against BP and FedAvg.
"""

from .comm import Communicator, SingleProcess, WorkerLost, init_group
from .exact import FRACTION_BITS, fixed_sum, from_fixed, to_fixed
from .federated import apply_record, late_client, replay, run_federated
from .ledger import LedgerError, SeedLedger
from .pmt import DataParallelPMT
from .zo import DataParallelZO

__all__ = [
    "FRACTION_BITS", "Communicator", "DataParallelPMT", "DataParallelZO", "LedgerError",
    "SeedLedger", "SingleProcess", "WorkerLost", "apply_record", "fixed_sum", "from_fixed",
    "init_group", "late_client", "replay", "run_federated", "to_fixed",
]
