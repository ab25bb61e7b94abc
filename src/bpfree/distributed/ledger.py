"""An append-only, atomically checkpointed seed ledger (after FedKSeed and DeComFL).

Every committed federated round is one record: the round's seed, its learning rate and the
aggregated projected-gradient scalars (int64 fixed-point sums and the sample count). The
weights after round r are a pure function of the initial weights and records 0..r, so the
ledger *is* the training state: a client that missed rounds, or a server that restarts,
replays it (DeComFL's history replay; FedKSeed's seed-scalar pairs).

Each append rewrites the whole file through :func:`bpfree.io.write_json` (temporary file,
fsync, ``os.replace``): a kill at any instant leaves either the ledger before the round or
the ledger with it, never a torn record. Appending checks that the round number is the next
one; opening checks the SHA-256 digest over the header and rounds (a flipped sum would
otherwise replay silently), that the rounds run 0, 1, 2, ... and that the ledger belongs to
the same run (its header). Every error is a :class:`LedgerError` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..io import check_input_file, write_json

FORMAT = "bpfree-seed-ledger/2"
RECORD_KEYS = ("round", "seed", "lr", "count", "sums")
#: A ledger is a few hundred bytes a round; anything far larger is not one of ours.
MAX_BYTES = 256 << 20


class LedgerError(ValueError):
    """A ledger file that is not ours, is corrupt, or belongs to another run."""


def digest(header: dict, rounds: list[dict]) -> str:
    """SHA-256 of the canonical JSON (sorted keys, no spaces) of the header and rounds."""
    text = json.dumps({"header": header, "rounds": rounds}, sort_keys=True,
                      separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _check_record(record: dict, expected_round: int, where: str) -> None:
    if not isinstance(record, dict) or tuple(sorted(record)) != tuple(sorted(RECORD_KEYS)):
        raise LedgerError(f"{where}: a record must hold exactly {RECORD_KEYS}, got "
                          f"{str(record)[:200]}")
    if not isinstance(record["sums"], list):
        raise LedgerError(f"{where}: round {expected_round}: 'sums' must be a list of integers")
    if not isinstance(record["lr"], (int, float)) or isinstance(record["lr"], bool):
        raise LedgerError(f"{where}: round {expected_round}: 'lr' must be a number")
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
            check_input_file(self.path, "seed ledger")
            if self.path.stat().st_size > MAX_BYTES:
                raise ValueError(f"larger than {MAX_BYTES >> 20} MiB")
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError, RecursionError) as exc:
            # (RecursionError: deeply nested JSON)
            raise LedgerError(f"{self.path}: not a readable JSON ledger ({exc})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            found = doc.get("format") if isinstance(doc, dict) else None
            raise LedgerError(f"{self.path}: not a seed ledger (format {FORMAT!r} expected, "
                              f"found {str(found)[:80]!r})")
        rounds = doc.get("rounds")
        if not isinstance(rounds, list):
            raise LedgerError(f"{self.path}: 'rounds' must be a list of records")
        try:
            expected = digest(doc.get("header"), rounds)
        except (TypeError, ValueError, RecursionError) as exc:
            raise LedgerError(f"{self.path}: the ledger cannot be checked ({exc})") from None
        if doc.get("digest") != expected:
            raise LedgerError(f"{self.path}: the checksum does not match its contents (the file "
                              "was edited or corrupted); refusing to replay it")
        if doc.get("header") != self.header:
            raise LedgerError(f"{self.path}: the ledger belongs to another run; its header "
                              f"{doc.get('header')!r} differs from this run's {self.header!r}")
        for r, record in enumerate(rounds):
            _check_record(record, r, str(self.path))
        self.records = list(rounds)

    def __len__(self) -> int:
        return len(self.records)

    def append(self, record: dict) -> None:
        """Commit one round: atomic, and only as the next round."""
        _check_record(record, len(self.records), str(self.path))
        rounds = [*self.records, record]
        doc = {"format": FORMAT, "header": self.header, "rounds": rounds,
               "digest": digest(self.header, rounds)}
        write_json(doc, self.path, what="seed ledger")
        self.records.append(record)

    def since(self, first_round: int) -> list[dict]:
        """The records a client that holds the weights after ``first_round - 1`` replays."""
        if not 0 <= first_round <= len(self.records):
            raise ValueError(f"first_round must be in [0, {len(self.records)}], "
                             f"got {first_round}")
        return self.records[first_round:]
