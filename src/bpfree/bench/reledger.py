"""Recompute the claim ledgers of committed result files from their rows, without training.

A verdict is a rule on a run's numbers. When a rule is repaired (a tolerance from the seed
spread, a figure taken from the linked program), the numbers need not change: a benchmark
module that defines ``ledger_from_result(document) -> list[dict]`` rebuilds its claims from
the rows and ``extra`` of a result document it wrote. :func:`reledger_results` does so for
every result file, rewrites only the ``claims`` key (adding ``claims_revision`` and
``claims_dirty``: the code that decided them), and reports every verdict that changed.
Rows, timings and the run's own revision are left untouched.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bpfree.bench import environment
from bpfree.bench.claims import verdict_text
from bpfree.bench.runner import (BenchmarkError, DirtyTreeError, _checked_claims,
                                 benchmarks_dir, discover, validate_result, write_json_atomic)

HOOK = "ledger_from_result"


@dataclass(frozen=True)
class Flip:
    """One claim whose verdict changed ("absent": the claim is new or was dropped)."""

    source: str
    benchmark: str
    claim: str
    before: str
    after: str


@dataclass
class ReledgerReport:
    """What :func:`reledger_results` did."""

    rewritten: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    without_rule: list[str] = field(default_factory=list)
    flips: list[Flip] = field(default_factory=list)


def _verdicts(claims: list[dict]) -> dict[str, str]:
    return {entry["id"]: verdict_text(entry["holds"]) for entry in claims}


def compare_ledgers(source: str, benchmark: str, before: list[dict],
                    after: list[dict]) -> list[Flip]:
    """Every claim id whose verdict differs between two ledgers, in ``after``'s order then
    the dropped ones."""
    old, new = _verdicts(before), _verdicts(after)
    ids = list(new) + [cid for cid in old if cid not in new]
    return [Flip(source, benchmark, cid, old.get(cid, "absent"), new.get(cid, "absent"))
            for cid in ids if old.get(cid, "absent") != new.get(cid, "absent")]


def _hooks(directory: str | os.PathLike | None) -> dict[str, Any]:
    """benchmark name -> its ``ledger_from_result`` (only modules that define one)."""
    hooks = {}
    for info in discover(directory):
        if info.error is not None:
            continue
        module = sys.modules.get(f"_bpfree_benchmark_{info.path.stem}")
        hook = getattr(module, HOOK, None)
        if callable(hook):
            hooks[info.name] = hook
    return hooks


def reledger_results(results_dir: str | os.PathLike, *, directory: str | os.PathLike | None = None,
                     allow_dirty: bool = False, dry_run: bool = False) -> ReledgerReport:
    """Rebuild the claims of every result file in ``results_dir`` whose benchmark defines
    ``ledger_from_result``; write the files whose ledger changed (unless ``dry_run``).

    Refuses a benchmarks checkout with uncommitted changes (:class:`DirtyTreeError`) unless
    ``allow_dirty``, as a benchmark run does: the claims name the revision that decided them.
    Invalid result files are left alone (``bpfree docs`` reports them).
    """
    folder = Path(results_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"results folder {str(folder)!r} does not exist")
    bench_folder = Path(directory) if directory is not None else benchmarks_dir()
    revision, dirty = environment.git_state(bench_folder)
    if dirty and not allow_dirty and not dry_run:
        raise DirtyTreeError(f"the checkout holding {bench_folder} has uncommitted changes to "
                             "tracked files; commit the ledger rules so the claims name their "
                             "revision, or pass --allow-dirty (the claims are then marked dirty)")
    hooks = _hooks(bench_folder)
    report = ReledgerReport()
    for path in sorted(folder.glob("*.json")):
        source = f"{folder.name}/{path.name}"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            document = validate_result(raw, source=source)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, BenchmarkError):
            continue
        hook = hooks.get(document["benchmark"])
        if hook is None:
            report.without_rule.append(source)
            continue
        try:
            claims = _checked_claims(hook(document))
        except BenchmarkError as exc:
            raise BenchmarkError(f"{source}: {HOOK}: {exc}") from None
        report.flips += compare_ledgers(source, document["benchmark"], document["claims"],
                                        claims)
        if claims == document["claims"]:
            report.unchanged.append(source)
            continue
        report.rewritten.append(source)
        if not dry_run:
            updated = {key: value for key, value in raw.items() if key not in ("claims", "rows")}
            updated.update(claims_revision=revision, claims_dirty=dirty, claims=claims,
                           rows=raw["rows"])
            write_json_atomic(updated, path)
    return report
