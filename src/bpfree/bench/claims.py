"""The claim ledger: what a paper claims, what this run measured, and whether it holds.

A benchmark's ``run()`` may return ``(rows, {"claims": [...], ...})``; the runner lifts the
list to a top-level ``"claims"`` key of the result document, and ``bpfree docs`` opens
``docs/BENCHMARKS.md`` with a "Claim status" table built from every result file. A claim is
a plain dict::

    {"id": str, "paper_ref": str, "statement": str,
     "paper": str | float | None, "ours": str | float | None,
     "holds": bool | None,            # None: not measured in this run
     "note": str}                     # optional

``holds`` is computed by a rule written in the benchmark from that run's rows, never typed
by hand; build each entry with :func:`claim` so that a wrong type fails at the source.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

CLAIM_KEYS = ("id", "paper_ref", "statement", "paper", "ours", "holds")
_OPTIONAL_KEYS = ("note",)
_TEXT_KEYS = ("id", "paper_ref", "statement")


class ClaimError(ValueError):
    """A claim breaks the ledger's contract (the runner reports it as a BenchmarkError)."""


def _value(value: Any, key: str, where: str) -> str | float | None:
    """A paper or measured value: text, a finite real number (as float), or None."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ClaimError(f"{where}: {key!r} must be a string, a finite number or None, "
                             f"got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ClaimError(f"{where}: {key!r} must be finite, got {value!r}")
    return number


def _verdict(value: Any, where: str) -> bool | None:
    """``holds``: a real bool (numpy's converted) or None; 0/1 and strings are refused."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise ClaimError(f"{where}: 'holds' must be True, False or None (not measured), "
                         f"got {value!r} of type {type(value).__name__}")


def validate_claim(entry: Any, index: int = 0) -> dict:
    """Check one claim and return a normalised copy (floats, real bools)."""
    where = f"claim {index}"
    if not isinstance(entry, Mapping):
        raise ClaimError(f"{where}: a claim must be a dict with keys {list(CLAIM_KEYS)}, "
                             f"got {type(entry).__name__}")
    if isinstance(entry.get("id"), str):
        where = f"claim {index} ({entry['id']!r})"
    missing = [key for key in CLAIM_KEYS if key not in entry]
    if missing:
        raise ClaimError(f"{where}: missing keys {missing}; required: {list(CLAIM_KEYS)}")
    unknown = sorted(str(k) for k in entry if k not in CLAIM_KEYS + _OPTIONAL_KEYS)
    if unknown:
        raise ClaimError(f"{where}: unknown keys {unknown}; allowed: "
                             f"{list(CLAIM_KEYS + _OPTIONAL_KEYS)}")
    for key in _TEXT_KEYS:
        if not isinstance(entry[key], str) or not entry[key].strip():
            raise ClaimError(f"{where}: {key!r} must be a non-empty string, "
                                 f"got {entry[key]!r}")
    normalised = {key: entry[key] for key in _TEXT_KEYS}
    normalised["paper"] = _value(entry["paper"], "paper", where)
    normalised["ours"] = _value(entry["ours"], "ours", where)
    normalised["holds"] = _verdict(entry["holds"], where)
    if entry.get("note") is not None:
        if not isinstance(entry["note"], str):
            raise ClaimError(f"{where}: 'note' must be a string, got {entry['note']!r}")
        normalised["note"] = entry["note"]
    return normalised


def validate_claims(claims: Any) -> list[dict]:
    """Validate every claim (see :func:`validate_claim`); duplicate ids are an error."""
    if isinstance(claims, (str, bytes, Mapping)) or not isinstance(claims, Sequence):
        raise ClaimError(f"claims must be a list of dicts, got {type(claims).__name__}")
    normalised = [validate_claim(entry, index) for index, entry in enumerate(claims)]
    seen: dict[str, int] = {}
    for index, entry in enumerate(normalised):
        if entry["id"] in seen:
            raise ClaimError(f"claim {index}: duplicate id {entry['id']!r} "
                                 f"(also claim {seen[entry['id']]}); ids must be unique")
        seen[entry["id"]] = index
    return normalised


def claim(id: str, paper_ref: str, statement: str, *, paper: str | float | None,
          ours: str | float | None, holds: bool | None, note: str | None = None) -> dict:
    """One ledger entry, validated: ``holds`` None means "not measured in this run"."""
    entry = {"id": id, "paper_ref": paper_ref, "statement": statement, "paper": paper,
             "ours": ours, "holds": holds}
    if note is not None:
        entry["note"] = note
    return validate_claim(entry)


def verdict_text(holds: bool | None) -> str:
    """How the docs name a verdict."""
    return "not measured" if holds is None else ("holds" if holds else "fails")
