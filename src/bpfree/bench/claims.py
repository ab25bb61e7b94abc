"""The claim ledger: a paper's claims with verdicts computed from a benchmark's own rows.

A benchmark returns ``extra["claims"]``, a list of :func:`claim` dicts; the runner stores it as
the result document's top-level ``"claims"`` and ``bpfree docs`` lists every claim of every
result in a "Claim status" table. ``holds`` must come from a rule the benchmark evaluates on
its numbers, never typed by hand (``None``: not measured in this run).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

CLAIM_KEYS = ("id", "paper_ref", "statement", "paper", "ours", "holds")


def _value(v: Any, what: str):
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        return float(v)
    raise ValueError(f"claim {what} must be a string, a number or None, got {v!r}")


def claim(id: str, paper_ref: str, statement: str, *, paper: Any, ours: Any,
          holds: bool | None, note: str | None = None) -> dict:
    """One ledger entry; ``holds`` is a bool (numpy bools accepted) or None."""
    for name, text in (("id", id), ("paper_ref", paper_ref), ("statement", statement)):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"claim {name} must be a non-empty string, got {text!r}")
    if holds is not None:
        if isinstance(holds, np.bool_):
            holds = bool(holds)
        if not isinstance(holds, bool):
            raise ValueError(f"claim {id!r}: holds must be True, False or None, got {holds!r}")
    out = {"id": id, "paper_ref": paper_ref, "statement": statement,
           "paper": _value(paper, "paper"), "ours": _value(ours, "ours"), "holds": holds}
    if note is not None:
        if not isinstance(note, str):
            raise ValueError(f"claim {id!r}: note must be a string, got {note!r}")
        out["note"] = note
    return out


def validate_claims(claims: Any) -> list[dict]:
    """Check a ledger (a list of claim dicts with unique ids); returns normalised copies."""
    if not isinstance(claims, list):
        raise ValueError(f"claims must be a list, got {type(claims).__name__}")
    out, seen = [], set()
    for i, c in enumerate(claims):
        if not isinstance(c, dict) or any(k not in c for k in CLAIM_KEYS):
            raise ValueError(f"claim {i} must be a dict with keys {CLAIM_KEYS}, got {c!r}")
        if c["id"] in seen:
            raise ValueError(f"duplicate claim id {c['id']!r}")
        seen.add(c["id"])
        out.append(claim(c["id"], c["paper_ref"], c["statement"], paper=c["paper"],
                         ours=c["ours"], holds=c["holds"], note=c.get("note")))
    return out
