"""An append-only, atomically checkpointed seed ledger (after FedKSeed and DeComFL).

Every committed federated round is one record: the round's seed, its learning rate and the
aggregated projected-gradient scalars (int64 fixed-point sums and the sample count). The
weights after round r are a pure function of the initial weights and records 0..r, so the
ledger *is* the training state: a client that missed rounds, or a server that restarts,
replays it (DeComFL's history replay; FedKSeed's seed-scalar pairs).

Each append rewrites the whole file through :func:`bpfree.io.write_json` (temporary file,
fsync, ``os.replace``): a kill at any instant leaves either the ledger before the round or
the ledger with it, never a torn record. Appending checks that the round number is the next
one; opening checks that the rounds run 0, 1, 2, ... and that the ledger belongs to the
same run (its header).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..io import write_json

FORMAT = "bpfree-seed-ledger/1"
RECORD_KEYS = ("round", "seed", "lr", "count", "sums")


class LedgerError(ValueError):
    """A ledger file that is not ours, is corrupt, or belongs to another run."""


def _check_record(record: dict, expected_round: int, where: str) -> None:
    if not isinstance(record, dict) or tuple(sorted(record)) != tuple(sorted(RECORD_KEYS)):
        raise LedgerError(f"{where}: a record must hold exactly {RECORD_KEYS}, got {record!r}")
    if record["round"] != expected_round:
        raise LedgerError(f"{where}: round {record['round']!r} where round {expected_round} "
                          "comes next (the ledger is append-only, rounds 0, 1, 2, ...)")
    ints = [record["seed"], record["count"], *record["sums"]]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints) or record["count"] < 1:
        raise LedgerError(f"{where}: seed, count (>= 1) and sums must be integers")


class SeedLedger:
    """The ledger at ``path``; ``header`` identifies the run (model, config, seed)."""

    def __init__(self, path: str | os.PathLike, header: dict) -> None:
        self.path = Path(path)
        self.header = dict(header)
        self.records: list[dict] = []
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise LedgerError(f"{self.path}: not a readable JSON ledger ({exc})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise LedgerError(f"{self.path}: not a seed ledger (format {FORMAT!r} expected)")
        if doc.get("header") != self.header:
            raise LedgerError(f"{self.path}: the ledger belongs to another run; its header "
                              f"{doc.get('header')!r} differs from this run's {self.header!r}")
        for r, record in enumerate(doc.get("rounds", [])):
            _check_record(record, r, str(self.path))
        self.records = list(doc["rounds"])

    def __len__(self) -> int:
        return len(self.records)

    def append(self, record: dict) -> None:
        """Commit one round: atomic, and only as the next round."""
        _check_record(record, len(self.records), str(self.path))
        doc = {"format": FORMAT, "header": self.header, "rounds": [*self.records, record]}
        write_json(doc, self.path, what="seed ledger")
        self.records.append(record)

    def since(self, first_round: int) -> list[dict]:
        """The records a client that holds the weights after ``first_round - 1`` replays."""
        if not 0 <= first_round <= len(self.records):
            raise ValueError(f"first_round must be in [0, {len(self.records)}], "
                             f"got {first_round}")
        return self.records[first_round:]
