"""Federated PMT with a seed ledger: clients send (seed, scalar) pairs, never weights.

After FedKSeed (arXiv 2312.06353) and DeComFL (ICLR 2025), with PMT's integer weight
perturbation (Eq. 6) as the client's estimator. Round ``r``:

1. the server names the round: its seed is ``derive_seed(seed, r, 0)`` (the step seed of
   :class:`bpfree.pmt.PMTTrainer`), which a client can also compute itself;
2. each client draws a mini-batch from its private data and returns, per WP layer and query,
   the int64 fixed-point sum of its per-sample loss differences, plus its sample count
   (:meth:`DataParallelPMT.shard_scalars`): (seed, scalar) pairs, the direction seed being
   ``derive_seed(round seed, layer, query)``;
3. the server sums them (exactly: integers), appends the round to the :class:`SeedLedger`
   (an atomic commit) and only then applies it; clients apply the same record.

Everything a replica needs is in the ledger: a late client replays the records it missed
(:func:`replay`) and ends bit-identical; a server killed mid-round restarts from the initial
weights plus the committed records, and redoes only the uncommitted round. The round's
clients are simulated in the server's process here (the protocol, not a transport, is the
point); their messages are the tensors counted by :func:`bytes_per_round`.
"""

from __future__ import annotations

import copy
import os
import signal

import torch

from ..harness import cosine_lr
from ..perturb import derive_seed
from ..pmt.trainer import PMTConfig
from .ledger import SeedLedger
from .pmt import DataParallelPMT

#: Test hook: kill the server (SIGKILL) after round r's clients answered, before the commit.
KILL_ENV = "BPFREE_FLEET_KILL_AT_ROUND"


def _replica(model, config: PMTConfig, example: torch.Tensor) -> DataParallelPMT:
    replica = DataParallelPMT(model, config, example=example)
    if replica.np:
        raise ValueError("federated mode sends Q scalars per layer, so every layer must use "
                         "weight perturbation: use perturbation='wp' (node perturbation would "
                         f"send dense gradients for {[l.name for l in replica.np]})")
    return replica


def apply_record(replica: DataParallelPMT, record: dict) -> None:
    """Apply one committed round to a replica whose step counter is that round."""
    if record["round"] != replica.steps:
        raise ValueError(f"the replica is at round {replica.steps}, the record is round "
                         f"{record['round']}: replay the ledger in order")
    expected = derive_seed(replica.trainer.config.seed, replica.steps, 0)
    if record["seed"] != expected:
        raise ValueError(f"round {record['round']} was run with seed {record['seed']}, this "
                         f"replica derives {expected}: another base seed or config")
    fixed = torch.tensor([*record["sums"], record["count"]], dtype=torch.int64)
    replica.apply_reduced(fixed, [], record["lr"])


def replay(replica: DataParallelPMT, ledger: SeedLedger) -> int:
    """Bring ``replica`` up to date from its own round; returns how many rounds it replayed.
    No forward pass: each round regenerates L·Q directions and applies Eq. 8."""
    records = ledger.since(replica.steps)
    for record in records:
        apply_record(replica, record)
    return len(records)


def client_batch(n: int, batch_size: int, seed: int, round_: int, client: int) -> torch.Tensor:
    """The indices of client ``client``'s round-``round_`` mini-batch in its own data."""
    g = torch.Generator().manual_seed(derive_seed(seed, round_, client + 1))
    return torch.randperm(n, generator=g)[:batch_size]


def split_clients(n: int, clients: int) -> list[torch.Tensor]:
    """Contiguous, near-equal private shards of ``n`` training samples."""
    if not isinstance(clients, int) or isinstance(clients, bool) or not 1 <= clients <= n:
        raise ValueError(f"clients must be an integer in [1, {n}] (the training samples), "
                         f"got {clients!r}")
    return list(torch.arange(n).tensor_split(clients))


def bytes_per_round(layers: int, queries: int, trainable_values: int, clients: int) -> dict:
    """Per-round traffic of one client each way, and of the server, against FedAvg.

    Up: L·Q int64 sums and the sample count. Down: the committed record (round seed, lr,
    count and L·Q sums; a client may instead derive the seed and receive the record later).
    FedAvg sends the d float32 weights each way.
    """
    up = 8 * (layers * queries + 1)
    down = 8 * (layers * queries + 3)
    return {"up_per_client": up, "down_per_client": down,
            "server_total": clients * (up + down),
            "fedavg_up_per_client": 4 * trainable_values,
            "fedavg_down_per_client": 4 * trainable_values,
            "fedavg_server_total": clients * 8 * trainable_values}


def run_federated(model, config: PMTConfig, x: torch.Tensor, y: torch.Tensor, *, clients: int,
                  rounds: int, batch_size: int, lr: float, ledger_path, header: dict,
                  schedule: str = "cosine") -> dict:
    """Run (or resume) a federated run whose state is the ledger at ``ledger_path``.

    ``model`` holds the *initial* weights; committed rounds are replayed onto it first, so a
    restarted server continues where the last commit left it. Returns ``{"replica", "ledger",
    "replayed", "rounds_run"}``.
    """
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    shards = split_clients(x.shape[0], clients)
    replica = _replica(model, config, x[:1])
    ledger = SeedLedger(ledger_path, header)
    if len(ledger) > rounds:
        raise ValueError(f"the ledger already holds {len(ledger)} rounds, more than --rounds "
                         f"{rounds}")
    replayed = replay(replica, ledger)
    kill_at = os.environ.get(KILL_ENV)
    run = 0
    for r in range(len(ledger), rounds):
        rate = cosine_lr(lr, r, rounds) if schedule == "cosine" else lr
        total = torch.zeros(len(replica.wp) * config.queries + 1, dtype=torch.int64)
        for c, shard in enumerate(shards):
            idx = shard[client_batch(len(shard), batch_size, config.seed, r, c)]
            fixed, _, _ = replica.shard_scalars(x[idx], y[idx])
            total += fixed  # the server's aggregation: exact integer sums
        if kill_at is not None and int(kill_at) == r:
            os.kill(os.getpid(), signal.SIGKILL)
        record = {"round": r, "seed": derive_seed(config.seed, r, 0), "lr": float(rate),
                  "count": int(total[-1]), "sums": [int(v) for v in total[:-1]]}
        ledger.append(record)  # commit first: a crash after this point loses nothing
        apply_record(replica, record)
        run += 1
    return {"replica": replica, "ledger": ledger, "replayed": replayed, "rounds_run": run}


def late_client(initial_model, config: PMTConfig, example: torch.Tensor,
                ledger: SeedLedger, *, joined_at: int = 0) -> DataParallelPMT:
    """A client that holds the weights after round ``joined_at - 1`` (here: replays rounds
    before ``joined_at`` to get them, then the rest) and catches up from the ledger."""
    replica = _replica(copy.deepcopy(initial_model), config, example)
    for record in ledger.records[:joined_at]:
        apply_record(replica, record)
    replay(replica, ledger)
    return replica
