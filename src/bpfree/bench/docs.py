"""Generate docs/BENCHMARKS.md from the result files in results/*.json.

Every number on that page comes from a result file written by :func:`run_benchmark`, never
from a hand-typed table. Output is deterministic: the same result files give the same bytes.
Sections are sorted by benchmark name; within a table, methods, settings and metrics keep
the order the benchmark emitted them in, because that order mirrors the paper's table.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bpfree.bench.claims import (KINDS, PAPERS, VERDICTS, claim_kind, claim_paper,
                                 verdict_text)
from bpfree.bench.runner import BenchmarkError, validate_result
from bpfree.io import atomic_write_text, check_output_path

DEFAULT_RESULTS_DIR = "results"
DEFAULT_OUT = "docs/BENCHMARKS.md"

# Rates are shown in scientific notation once large (1.23e9 values/s reads better than
# 1,234,567,890); plain large counts (parameters, bytes) keep thousands separators.
_RATE_RE = re.compile(r"(/s\b|per[ _-]?s(ec(ond)?)?\b|throughput|flops|hz\b)", re.IGNORECASE)
_MISSING = "—"

HEADER = """\
# Benchmarks

<!-- GENERATED FILE: do not edit by hand. Regenerate with `bpfree docs`. -->

> **This file is generated** by `bpfree docs` from the result files `results/*.json`;
> do not edit it by hand — every number here comes from a benchmark run.
> To update it, run `bpfree bench NAME` (see `bpfree bench --list`), then `bpfree docs`.
> The JSON contract and how to add a benchmark are described in `benchmarks/README.md`.

Each table gives our measured value for every cell of the paper's table; where the paper
reports a number for a cell, it is shown in the `(paper)` column beside ours.
Timings are medians of repeats. Quick runs (`--quick`) use reduced settings and are
marked as such; their numbers are not expected to match the paper's.
"""


@dataclass
class DocsReport:
    """What :func:`generate_docs` did: the page written, the inputs used, and the problems."""

    out: Path
    used: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- formatting


def _is_rate(metric: str) -> bool:
    return bool(_RATE_RE.search(metric or ""))


def _scientific(value: float) -> str:
    """3 significant digits with a compact exponent: 1.23e9, 4.50e-7."""
    mantissa, exponent = f"{value:.2e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def format_number(value: float | int | None, metric: str = "") -> str:
    """Readable, deterministic rendering of one value (3 significant digits by default).

    Integers keep every digit with thousands separators (counts, bytes); values of 1000 and
    more are rounded to integers with separators; rates of 1e6 and more, and anything of
    1e15 and more, use scientific notation; small values keep 3 significant digits.
    """
    if value is None:
        return _MISSING
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 1e15 or (magnitude >= 1e6 and _is_rate(metric)):
        return _scientific(value)
    if value.is_integer():
        return f"{int(value):,}"
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude < 1e-4:
        return _scientific(value)
    return f"{value:.3g}"


def format_seconds(seconds: float) -> str:
    """Wall time: seconds, with minutes added for long runs."""
    text = f"{format_number(seconds)} s"
    return text + f" ({seconds / 60:.1f} min)" if seconds >= 120 else text


def _cell(text: Any) -> str:
    """Make a value safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _markdown_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |"]
    lines.append("|" + "|".join("---" for _ in header) + "|")
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in body]
    return lines


def _ordered_unique(items) -> list:
    """First-appearance order without duplicates (keeps the paper's layout)."""
    return list(dict.fromkeys(items))


def format_rows_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """A plain-text, column-aligned table of rows (for terminals)."""
    header = ("table", "method", "setting", "metric", "value", "paper")
    body = [
        (
            str(r["table"]), str(r["method"]), str(r["setting"]), str(r["metric"]),
            format_number(r["value"], r["metric"]),
            format_number(r["paper"], r["metric"]) if r["paper"] is not None else "",
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
             for row in [header, *body]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- sections


def render_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One Markdown table: a row per (method, setting), a column per metric.

    A metric gets a ``metric (paper)`` column right after it when any row has a paper
    number for it; the setting column is dropped when every setting is empty.
    """
    keys = _ordered_unique((r["method"], r["setting"]) for r in rows)
    metrics = _ordered_unique(r["metric"] for r in rows)
    cells = {(r["method"], r["setting"], r["metric"]): r for r in rows}
    with_paper = {r["metric"] for r in rows if r["paper"] is not None}
    show_setting = any(setting for _, setting in keys)

    header = ["method"] + (["setting"] if show_setting else [])
    for metric in metrics:
        header.append(metric)
        if metric in with_paper:
            header.append(f"{metric} (paper)")
    body = []
    for method, setting in keys:
        line = [method] + ([setting] if show_setting else [])
        for metric in metrics:
            row = cells.get((method, setting, metric))
            line.append(format_number(row["value"], metric) if row else _MISSING)
            if metric in with_paper:
                line.append(format_number(row["paper"], metric) if row else _MISSING)
        body.append(line)
    return _markdown_table(header, body)


def _figure_entries(figures: Any) -> list[tuple[str, str]]:
    """(path, caption) pairs from extra['figures']: strings or {'path', 'caption'} dicts."""
    if isinstance(figures, (str, Mapping)):
        figures = [figures]
    if not isinstance(figures, Sequence):
        raise BenchmarkError("extra['figures'] must be a list of paths or {path, caption} dicts")
    entries = []
    for item in figures:
        if isinstance(item, str):
            entries.append((item, Path(item).stem.replace("_", " ")))
        elif isinstance(item, Mapping) and isinstance(item.get("path"), str):
            entries.append((item["path"], str(item.get("caption") or Path(item["path"]).stem)))
        else:
            raise BenchmarkError(
                f"extra['figures'] entry {item!r} must be a path or a {{path, caption}} dict"
            )
    return entries


def _figure_link(path: str, base: Path, out_dir: Path) -> tuple[str, bool]:
    """Figure paths are relative to the project root (results/'s parent); links are
    relative to the generated page so that they work on GitHub and locally."""
    target = Path(path) if Path(path).is_absolute() else base / path
    link = os.path.relpath(target.resolve(), out_dir.resolve())
    return Path(link).as_posix(), target.is_file()


def _render_extra(extra: Mapping[str, Any], base: Path, out_dir: Path, source: str,
                  report: DocsReport) -> list[str]:
    """Notes, figures and any other scalar details a benchmark attached."""
    lines: list[str] = []
    notes = extra.get("notes")
    if notes:
        lines += ["", "**Notes**", ""]
        lines += [f"- {' '.join(str(n).split())}" for n in ([notes] if isinstance(notes, str) else notes)]
    others = {k: v for k, v in extra.items() if k not in ("notes", "figures")}
    scalars = {k: v for k, v in others.items() if isinstance(v, (str, int, float, bool)) or v is None}
    if scalars:
        lines += ["", "**Details**", ""]
        for key in sorted(scalars):
            value = scalars[key]
            shown = format_number(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
            lines.append(f"- {key}: {' '.join(str(shown).split())}")
    nested = sorted(set(others) - set(scalars))
    if nested:
        lines += ["", f"Further details ({', '.join(nested)}) are in `{source}`."]
    if "figures" in extra:
        try:
            figures = _figure_entries(extra["figures"])
        except BenchmarkError as exc:
            report.warnings.append(f"{source}: {exc}")
            figures = []
        for path, caption in figures:
            link, exists = _figure_link(path, base, out_dir)
            if not exists:
                report.warnings.append(f"{source}: figure {path!r} not found")
            lines += ["", f"![{_cell(caption)}]({link})"]
    return lines


def _is_dirty(document: Mapping[str, Any]) -> bool:
    """Recorded from a tree with uncommitted changes (older files: a ``-dirty`` revision)."""
    return document.get("dirty") is True or str(document.get("git_revision")).endswith("-dirty")


def _revision_text(document: Mapping[str, Any]) -> str | None:
    revision = document.get("git_revision")
    if revision is None:
        return None
    return f"{str(revision).removesuffix('-dirty')} (dirty tree)" if _is_dirty(document) else revision


def _reledger_text(document: Mapping[str, Any]) -> str | None:
    """Where the ledger was recomputed from the committed rows (``bpfree docs --reledger``)."""
    revision = document.get("claims_revision")
    if revision is None:
        return None
    dirty = " (dirty tree)" if document.get("claims_dirty") else ""
    return (f"from this run's rows at revision {revision}{dirty} (the rows are the run's; "
            "only the verdict rules are newer)")


def _claim_value(value: str | float | None) -> str:
    return value if isinstance(value, str) else format_number(value)


_CLAIM_HEADER = ("claim", "paper ref", "statement", "paper", "ours", "verdict")


def _claim_cells(entry: Mapping[str, Any]) -> list[str]:
    statement = entry["statement"] + (f" ({entry['note']})" if entry.get("note") else "")
    return [entry["id"], entry["paper_ref"], statement, _claim_value(entry["paper"]),
            _claim_value(entry["ours"]), verdict_text(entry["holds"])]


def _claim_counts(claims: Sequence[Mapping[str, Any]]) -> str:
    verdicts = [verdict_text(entry["holds"]) for entry in claims]
    words = {"holds": "hold", "fails": "fail"}
    return ", ".join(f"{verdicts.count(v)} {words.get(v, v)}" for v in VERDICTS
                     if verdicts.count(v) or v in words)


def headline_claims(entries: Sequence[tuple[str, Mapping[str, Any]]]
                    ) -> list[tuple[str, str, Mapping[str, Any]]]:
    """One (benchmark, run, claim) per claim: the full run's verdict where a full run of
    that benchmark carries the claim, else the quick run's (run "quick (no full run)")."""
    in_full = {(doc["benchmark"], entry["id"]) for _, doc in entries if not doc["quick"]
               for entry in doc.get("claims") or []}
    out, seen = [], set()
    for _, doc in entries:
        for entry in doc.get("claims") or []:
            key = (doc["benchmark"], entry["id"])
            if key in seen or (doc["quick"] and key in in_full):
                continue
            seen.add(key)
            run = "full" if not doc["quick"] else "quick (no full run)"
            out.append((doc["benchmark"], run + (" (dirty tree)" if _is_dirty(doc) else ""),
                        entry))
    return out


_KIND_LABELS = {"paper": "paper-linked", "sanity": "baseline sanity",
                "engineering": "bpfree engineering"}


def claim_tally(headline: Sequence[tuple[str, str, Mapping[str, Any]]]) -> dict:
    """{(paper or None, kind): [claims]} over the headline, in PAPERS then KINDS order."""
    groups: dict = {}
    for benchmark, _, entry in headline:
        groups.setdefault((claim_paper(benchmark, entry), claim_kind(entry)), []).append(entry)
    order = {paper: i for i, paper in enumerate(PAPERS)}
    return dict(sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], len(order)),
                                                       KINDS.index(kv[0][1]))))


def _tally_table(tally: Mapping[tuple, list]) -> list[str]:
    body = []
    for (paper, kind), claims in tally.items():
        verdicts = [verdict_text(c["holds"]) for c in claims]
        body.append([paper or "bpfree (no paper)", _KIND_LABELS[kind], str(len(claims)),
                     *(str(verdicts.count(v)) for v in VERDICTS)])
    return _markdown_table(("paper", "claims of", "claims", *VERDICTS), body)


def render_claim_status(entries: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """The "Claim status" section: one verdict per claim (the full run's where there is one),
    counted per paper and kind, then the table of every headline claim."""
    headline = headline_claims(entries)
    lines = ["## Claim status", ""]
    if not headline:
        return lines + ["_No result file carries claims yet._", ""]
    claims = [entry for _, _, entry in headline]
    linked = [entry for _, _, entry in headline if claim_kind(entry) == "paper"]
    n_quick = sum(run.startswith("quick") for _, run, _ in headline)
    lines += [f"**{len(claims)} claims: {_claim_counts(claims)}.** Paper-linked (a paper's "
              f"number or ordering, leaving out baseline sanity checks and bpfree's own "
              f"engineering claims): **{len(linked)} claims: {_claim_counts(linked)}.**", "",
              "One verdict per claim: the full run's where one exists; "
              + (f"{n_quick} claim(s) have only a quick run (reduced settings), marked "
                 "\"quick (no full run)\"." if n_quick else "every claim here has a full run.")
              + " A comparison inside the seed noise (2 standard errors "
              "of the difference unless the claim says otherwise) is \"not decided\". "
              "Quick runs' own verdicts are in their sections below.", ""]
    lines += _tally_table(claim_tally(headline)) + [""]
    body = [[benchmark, run, *_claim_cells(entry)] for benchmark, run, entry in headline]
    return lines + _markdown_table(("benchmark", "run", *_CLAIM_HEADER), body) + [""]


def _versions_text(versions: Mapping[str, Any]) -> str:
    return ", ".join(f"{name} {versions[name]}" for name in versions)


def _unfinished(document: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``extra.partial`` of a partial report of a run in progress
    (``$BPFREE_TASK_CACHE_REPORT``) whose runs had not all finished, else None."""
    partial = (document.get("extra") or {}).get("partial")
    if isinstance(partial, Mapping) and partial.get("finished") != partial.get("tasks"):
        return partial
    return None


def _mode(document: Mapping[str, Any]) -> str:
    """"quick" or "full", and for a partial report how far that run had come."""
    mode = "quick" if document["quick"] else "full"
    partial = _unfinished(document)
    if partial is not None:
        mode += (f", partial: {partial.get('finished')} of {partial.get('tasks')} runs of "
                 f"{partial.get('revision')}")
    return mode


def _mode_line(document: Mapping[str, Any]) -> str:
    base = "quick" if document["quick"] else "full"
    line = f"{base} run" + (" (reduced settings: `--quick`)" if document["quick"] else "")
    partial = _unfinished(document)
    if partial is not None:
        line += f", partial report: {partial.get('progress') or ''} (see the notes)"
    return line


def render_section(document: Mapping[str, Any], source: str, base: Path, out_dir: Path,
                   report: DocsReport) -> list[str]:
    """One benchmark run: title, description, run metadata, then one table per `table`."""
    mode = _mode(document)
    lines = [f"## {document['benchmark']} ({mode})", ""]
    if document.get("description"):
        lines += [str(document["description"]).strip(), ""]
    meta = [
        ("Mode", _mode_line(document)),
        ("Command", f"`{document['command']}`" if document.get("command") else None),
        ("Device", document["device"]),
        ("Seed", document.get("seed")),
        ("Wall time", format_seconds(float(document["seconds"]))),
        ("Versions", _versions_text(document["versions"])),
        ("Git revision", _revision_text(document)),
        ("Claims re-derived", _reledger_text(document)),
        ("Recorded", document.get("timestamp")),
        ("Source", f"`{source}`"),
    ]
    lines += [f"- **{key}:** {value}" for key, value in meta if value is not None]
    for table in _ordered_unique(r["table"] for r in document["rows"]):
        rows = [r for r in document["rows"] if r["table"] == table]
        lines += ["", f"### {document['benchmark']}: {table}", ""]
        lines += render_table(rows)
    if not document["rows"]:
        lines += ["", "_This run produced no rows._"]
    claims = document.get("claims") or []
    if claims:
        lines += ["", f"### {document['benchmark']}: claims ({_claim_counts(claims)})", ""]
        lines += _markdown_table(_CLAIM_HEADER, [_claim_cells(entry) for entry in claims])
    lines += _render_extra(document.get("extra") or {}, base, out_dir, source, report)
    return lines + [""]


def _overview(entries: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
    body = [
        (doc["benchmark"], _mode(doc), doc["device"],
         format_seconds(float(doc["seconds"])), f"`{source}`")
        for source, doc in entries
    ]
    return _markdown_table(("benchmark", "mode", "device", "wall time", "source"), body)


def render_page(entries: Sequence[tuple[str, Mapping[str, Any]]], report: DocsReport,
                base: Path, out_dir: Path) -> str:
    """The whole page: header, overview, skipped files (loudly), then one section per run."""
    lines = [HEADER.rstrip("\n"), ""]
    lines += render_claim_status(entries)
    if entries:
        lines += ["## Overview", ""] + _overview(entries) + [""]
    else:
        lines += ["_No results yet: run `bpfree bench NAME`, then `bpfree docs`._", ""]
    if report.skipped:
        lines += ["## Skipped result files", "",
                  "These files in the results folder are not valid result documents:", ""]
        lines += [f"- `{source}`: {' '.join(reason.split())}" for source, reason in report.skipped]
        lines.append("")
    for source, document in entries:
        lines += render_section(document, source, base, out_dir, report)
    return "\n".join(lines).rstrip("\n") + "\n"


# ----------------------------------------------------------------------------- entry point


def load_results(results_dir: str | os.PathLike, report: DocsReport) -> list[tuple[str, dict]]:
    """Valid result documents in ``results_dir`` as (display path, document), sorted by
    (benchmark, quick, file name); invalid files are recorded in ``report.skipped``."""
    folder = Path(results_dir)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"results folder {str(folder)!r} does not exist; run `bpfree bench NAME` first "
            "or pass --results DIR"
        )
    entries = []
    for path in sorted(folder.glob("*.json")):
        source = f"{folder.name}/{path.name}"  # stable across machines, unlike absolute paths
        try:
            with path.open(encoding="utf-8") as fh:
                document = validate_result(json.load(fh), source=source)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, BenchmarkError) as exc:
            report.skipped.append((source, str(exc)))
            continue
        report.used.append(source)
        entries.append((source, document))
    entries.sort(key=lambda e: (e[1]["benchmark"], e[1]["quick"], e[0]))
    return entries


def generate_docs(results_dir: str | os.PathLike = DEFAULT_RESULTS_DIR,
                  out: str | os.PathLike = DEFAULT_OUT) -> DocsReport:
    """Write the benchmarks page ``out`` from ``results_dir/*.json``; returns a report.

    Invalid result files do not stop the page: they are listed at its top and in
    ``report.skipped`` so that the caller can fail loudly.
    """
    out_path = check_output_path(out, what="--out")
    report = DocsReport(out=out_path)
    entries = load_results(results_dir, report)
    base = Path(results_dir).parent
    text = render_page(entries, report, base, out_path.parent)
    atomic_write_text(text, out_path, what="--out")
    return report
