"""Federated PMT over Flower (``flwr``): the seed-ledger protocol of :mod:`.federated` as a
Flower client and strategy. Clients send seeds' scalars, never weights.

Round ``r`` (Flower's round ``r + 1``), in Flower's own terms:

* :meth:`SeedStrategy.configure_fit` sends every client the round's config (``round``,
  ``seed`` = ``derive_seed(seed, r, 0)``) and, as the ``Parameters``, the record the server
  committed last round (:func:`encode_record`: round, seed, the rate's float64 bits, count and
  the L·Q int64 sums), not weights;
* :meth:`SeedClient.fit` applies that record to its own replica (Eq. 8, directions
  regenerated from the seeds), draws its round batch from its private shard exactly as
  :func:`~bpfree.distributed.federated.run_federated` does, and returns the L·Q int64
  loss-difference sums and its sample count (:meth:`DataParallelPMT.shard_scalars`);
* :meth:`SeedStrategy.aggregate_fit` sums them (integers: exact in any order), commits the
  record to the :class:`~bpfree.distributed.ledger.SeedLedger` when one is given, applies it to
  the server's replica and hands it on as the round's ``Parameters``;
* the evaluate round delivers the record at once (:meth:`SeedClient.evaluate` applies it) and
  collects each client's weight digest, so :meth:`SeedStrategy.aggregate_evaluate` reports
  whether every client holds the server's weights, bit for bit.

So a run trains the same weights as ``bpfree fleet --federated`` with the same options, clients
and rounds: same round seeds, batches, sums, rates and update (tests/test_flower.py compares
the digests).

**Why not Flower's simulation engine.** ``flwr.simulation`` runs clients as Ray actors and
needs the ``flwr[simulation]`` extra (Ray, hundreds of MB, no wheel for every platform); it is
not installed here. :func:`run_flower` instead drives Flower's own server loop
(``flwr.server.Server.fit``: configure, fit on every client in a thread pool, aggregate,
evaluate) with clients that live in this process behind :class:`InProcessClientProxy`, the role
Ray's actor proxy plays in a simulation. The strategy and client are plain ``flwr`` objects:
``SeedClient(...).to_client()`` serves as a real Flower client, and :class:`SeedStrategy` runs
in a real Flower server (``flwr.server.ServerApp``'s legacy ``server_fn``), unchanged.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

try:
    import flwr  # noqa: F401  (the optional "flower" extra)
    from flwr.client import NumPyClient
    from flwr.common import (EvaluateIns, FitIns, Parameters, ndarrays_to_parameters,
                             parameters_to_ndarrays)
    from flwr.server import Server
    from flwr.server.client_manager import SimpleClientManager
    from flwr.server.client_proxy import ClientProxy
    from flwr.server.strategy import Strategy
except ImportError as err:  # pragma: no cover - the extra is installed by `make venv`
    raise ImportError("bpfree.distributed.flower needs Flower: pip install 'bpfree[flower]' "
                      f"(or pip install 'flwr>=1.20'); {err}") from None

from ..harness import cosine_lr
from ..perturb import derive_seed
from ..pmt.trainer import PMTConfig
from .federated import _replica, apply_record, client_batch, split_clients
from .fleet import weights_digest
from .ledger import SeedLedger

#: Fields of an encoded record ahead of its sums: round, seed, float64 bits of lr, count.
RECORD_HEAD = 4


def encode_record(record: dict) -> np.ndarray:
    """A committed round as one int64 array (the rate as its float64 bits: exact)."""
    lr_bits = int(np.array(record["lr"], dtype=np.float64).view(np.int64))
    return np.array([record["round"], record["seed"], lr_bits, record["count"],
                     *record["sums"]], dtype=np.int64)


def decode_record(array: np.ndarray) -> dict:
    """The inverse of :func:`encode_record` (ValueError for a malformed array)."""
    if array.dtype != np.int64 or array.ndim != 1 or array.size < RECORD_HEAD:
        raise ValueError(f"a round record is a 1-D int64 array of at least {RECORD_HEAD} "
                         f"values, got dtype {array.dtype}, shape {array.shape}")
    lr = float(array[2:3].view(np.float64)[0])
    return {"round": int(array[0]), "seed": int(array[1]), "lr": lr, "count": int(array[3]),
            "sums": [int(v) for v in array[RECORD_HEAD:]]}


def _record_of(parameters) -> dict | None:
    arrays = parameters_to_ndarrays(parameters) if isinstance(parameters, Parameters) \
        else parameters
    return decode_record(arrays[0]) if len(arrays) else None


class SeedClient(NumPyClient):
    """Client ``index`` of ``clients`` over its private shard of ``(x, y)``: a replica of the
    initial model that receives committed records and returns round scalars."""

    def __init__(self, index: int, model, config: PMTConfig, x: torch.Tensor, y: torch.Tensor,
                 *, clients: int, batch_size: int):
        shards = split_clients(x.shape[0], clients)
        self.index, self.batch_size = index, batch_size
        self.x, self.y = x[shards[index]], y[shards[index]]
        self.replica = _replica(copy.deepcopy(model), config, x[:1])

    def _catch_up(self, record: dict | None) -> None:
        """Apply the record unless this replica already holds it (the evaluate round
        delivered it)."""
        if record is not None and record["round"] == self.replica.steps:
            apply_record(self.replica, record)

    def get_parameters(self, config):
        return []  # weights never leave a client

    def fit(self, parameters, config):
        self._catch_up(_record_of(parameters))
        r, cfg = int(config["round"]), self.replica.trainer.config
        if r != self.replica.steps or int(config["seed"]) != derive_seed(cfg.seed, r, 0):
            raise ValueError(f"client {self.index} is at round {self.replica.steps} (seed "
                             f"{derive_seed(cfg.seed, self.replica.steps, 0)}), asked for round "
                             f"{r} with seed {config['seed']}: another run or a missed record")
        idx = client_batch(len(self.x), self.batch_size, cfg.seed, r, self.index)
        fixed, _, _ = self.replica.shard_scalars(self.x[idx], self.y[idx])
        return [fixed.numpy()], int(fixed[-1]), {}

    def evaluate(self, parameters, config):
        self._catch_up(_record_of(parameters))
        return 0.0, len(self.x), {"sha256": weights_digest(self.replica.trainer.model),
                                  "round": self.replica.steps}


class SeedStrategy(Strategy):
    """The server of the seed-ledger protocol as a Flower strategy: it holds the server
    replica and, optionally, the ledger; every round takes all ``clients`` clients."""

    def __init__(self, model, config: PMTConfig, example: torch.Tensor, *, clients: int,
                 rounds: int, lr: float, schedule: str = "cosine",
                 ledger: SeedLedger | None = None):
        if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
            raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
        if schedule not in ("cosine", "constant"):
            raise ValueError(f"schedule must be 'cosine' or 'constant', got {schedule!r}")
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
            raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
        self.replica = _replica(copy.deepcopy(model), config, example)
        self.clients, self.rounds, self.lr, self.schedule = clients, rounds, lr, schedule
        self.ledger = ledger
        self.records: list[dict] = []
        self.agree: list[bool] = []

    def __repr__(self) -> str:
        return f"SeedStrategy(clients={self.clients}, rounds={self.rounds})"

    def _all(self, client_manager) -> list:
        available = client_manager.all()
        if len(available) != self.clients:
            raise ValueError(f"the strategy expects {self.clients} clients, {len(available)} "
                             "are connected")
        return [available[cid] for cid in sorted(available)]

    def _last(self) -> Parameters:
        return ndarrays_to_parameters([encode_record(self.records[-1])] if self.records
                                      else [])

    def initialize_parameters(self, client_manager):
        return self._last()  # no weights: the record of the last round (none yet)

    def configure_fit(self, server_round, parameters, client_manager):
        r = server_round - 1
        config = {"round": r, "seed": derive_seed(self.replica.trainer.config.seed, r, 0)}
        return [(proxy, FitIns(self._last(), dict(config))) for proxy in
                self._all(client_manager)]

    def aggregate_fit(self, server_round, results, failures):
        if failures:
            raise RuntimeError(f"round {server_round - 1}: {len(failures)} client(s) failed "
                               f"({failures[0]!r}); the round is not committed")
        r, cfg = server_round - 1, self.replica.trainer.config
        total = np.zeros(len(self.replica.wp) * cfg.queries + 1, dtype=np.int64)
        for _, res in results:
            (fixed,) = parameters_to_ndarrays(res.parameters)
            total += fixed.astype(np.int64, casting="equiv")  # exact integer sums
        rate = cosine_lr(self.lr, r, self.rounds) if self.schedule == "cosine" else self.lr
        record = {"round": r, "seed": derive_seed(cfg.seed, r, 0), "lr": float(rate),
                  "count": int(total[-1]), "sums": [int(v) for v in total[:-1]]}
        if self.ledger is not None:
            self.ledger.append(record)  # commit first, as run_federated does
        apply_record(self.replica, record)
        self.records.append(record)
        return self._last(), {"count": record["count"]}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return [(proxy, EvaluateIns(parameters, {})) for proxy in self._all(client_manager)]

    def aggregate_evaluate(self, server_round, results, failures):
        mine = weights_digest(self.replica.trainer.model)
        agree = not failures and all(res.metrics["sha256"] == mine for _, res in results)
        self.agree.append(agree)
        return 0.0, {"clients_agree": agree}

    def evaluate(self, server_round, parameters):
        return None  # no centralized evaluation


class InProcessClientProxy(ClientProxy):
    """A Flower client in this process (what Ray's actor proxy is in a simulation)."""

    def __init__(self, cid: str, client):
        super().__init__(cid)
        self.client = client

    def get_properties(self, ins, timeout, group_id):
        return self.client.get_properties(ins)

    def get_parameters(self, ins, timeout, group_id):
        return self.client.get_parameters(ins)

    def fit(self, ins, timeout, group_id):
        return self.client.fit(ins)

    def evaluate(self, ins, timeout, group_id):
        return self.client.evaluate(ins)

    def reconnect(self, ins, timeout, group_id):
        raise NotImplementedError("in-process clients do not reconnect")


def run_flower(model, config: PMTConfig, x: torch.Tensor, y: torch.Tensor, *, clients: int,
               rounds: int, batch_size: int, lr: float, schedule: str = "cosine",
               ledger: SeedLedger | None = None) -> SeedStrategy:
    """Train ``model`` (its initial weights; left unchanged) for ``rounds`` Flower rounds with
    ``clients`` :class:`SeedClient` s under :class:`SeedStrategy`; returns the strategy (its
    ``replica`` holds the trained weights, ``records`` the rounds, ``agree`` each round's
    client check)."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    strategy = SeedStrategy(model, config, x[:1], clients=clients, rounds=rounds, lr=lr,
                            schedule=schedule, ledger=ledger)
    manager = SimpleClientManager()
    for c in range(clients):
        client = SeedClient(c, model, config, x, y, clients=clients, batch_size=batch_size)
        manager.register(InProcessClientProxy(f"{c:06d}", client.to_client()))
    Server(client_manager=manager, strategy=strategy).fit(num_rounds=rounds, timeout=None)
    return strategy


__all__ = ["InProcessClientProxy", "SeedClient", "SeedStrategy", "decode_record",
           "encode_record", "run_flower"]
