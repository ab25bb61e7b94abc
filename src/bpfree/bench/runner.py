"""Benchmark registry and runner: find modules in ``benchmarks/``, run one, write its JSON.

A benchmark is a module ``benchmarks/<file>.py`` exposing::

    NAME: str                 # what `bpfree bench NAME` calls it
    DESCRIPTION: str          # first line is shown by `bpfree bench --list`
    SEED: int = 0             # optional; seeds torch, numpy and random before run()
    def run(quick: bool) -> list[dict] | tuple[list[dict], dict]

Each row is one cell of the paper's table in tidy form::

    {"table": str, "method": str, "setting": str, "metric": str,
     "value": float, "paper": float | None}

and the optional second element ``extra`` is a JSON-serialisable dict stored under
``"extra"`` (``figures``: paths to embed in the docs, ``notes``: text, ``device``: overrides
the detected device string when the benchmark ran elsewhere, e.g. on the CPU beside a GPU;
``claims``: the claim ledger of :mod:`bpfree.bench.claims`, lifted to a top-level
``"claims"`` key).

A run is refused before it starts when the checkout holding the benchmarks has uncommitted
changes to tracked files, unless ``allow_dirty`` is given; such a result carries
``"dirty": true``.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import json
import math
import numbers
import os
import random
import re
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bpfree.bench import environment
from bpfree.bench.claims import ClaimError, validate_claims
from bpfree.io import check_output_path, write_json

ENV_VAR = "BPFREE_BENCHMARKS"
ROW_KEYS = ("table", "method", "setting", "metric", "value", "paper")
_ROW_STR_KEYS = ("table", "method", "setting", "metric")
# Keys every result document must carry, with the JSON types they must have.
RESULT_KEYS: dict[str, tuple[type, ...]] = {
    "benchmark": (str,),
    "quick": (bool,),
    "device": (str,),
    "seconds": (int, float),
    "versions": (dict,),
    "rows": (list,),
}
# Names become file names (results/<name>.json): keep them shell- and path-safe.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_DEFAULT_SEED = 0


class BenchmarkError(ValueError):
    """A benchmark module or its output breaks the contract (a user-facing error)."""


class DirtyTreeError(BenchmarkError):
    """The benchmarks' checkout has uncommitted changes and ``allow_dirty`` was not given."""


class UnknownBenchmarkError(BenchmarkError):
    """The requested benchmark name is not in the registry."""


@dataclass(frozen=True)
class BenchmarkInfo:
    """One entry of the registry; ``error`` is set (and ``run`` None) for a broken module."""

    name: str
    path: Path
    description: str = ""
    seed: int = _DEFAULT_SEED
    run: Callable[[bool], Any] | None = None
    error: str | None = None

    @property
    def summary(self) -> str:
        """First line of the description, or the error, for one-line listings."""
        if self.error is not None:
            return f"error: {self.error}"
        return self.description.strip().splitlines()[0] if self.description.strip() else ""


# ----------------------------------------------------------------------------- discovery


def benchmarks_dir() -> Path:
    """The folder holding benchmark modules: ``$BPFREE_BENCHMARKS`` or ``<repo>/benchmarks``.

    Benchmarks are not shipped in the wheel, so without the variable this needs a source
    checkout (src/bpfree/bench/runner.py -> parents[3] is the repository root).
    """
    override = os.environ.get(ENV_VAR)
    if override:
        path = Path(override).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"{ENV_VAR}={override!r} is not a directory")
        return path
    path = Path(__file__).resolve().parents[3] / "benchmarks"
    if not path.is_dir():
        raise FileNotFoundError(
            f"benchmarks folder not found at {path}; run from a source checkout of bpfree "
            f"or set {ENV_VAR} to the folder holding the benchmark modules"
        )
    return path


def _import_file(path: Path):
    """Import a module from its file path under a private name (no package needed)."""
    module_name = f"_bpfree_benchmark_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    # Registered before exec: dataclasses and pickling look the module up by name.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def load_module(stem: str, directory: str | os.PathLike | None = None):
    """The benchmark module ``<directory>/<stem>.py`` itself (default :func:`benchmarks_dir`),
    imported afresh, for tests of a benchmark's own helpers and settings."""
    folder = Path(directory) if directory is not None else benchmarks_dir()
    path = folder / f"{stem}.py"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in folder.glob("*.py"))) or "(none)"
        raise FileNotFoundError(f"no benchmark file {path}; files there: {known}")
    share_helpers(folder)
    return _import_file(path)


def share_helpers(folder: Path) -> None:
    """Let benchmarks import the folder's helper modules (``_pmt_experiment.py``) by a plain
    import, here and in spawned workers (which inherit ``sys.path``); appended so that
    installed packages always win over a same-named file here."""
    if str(folder) not in sys.path:
        sys.path.append(str(folder))


def _describe_module(path: Path, module) -> BenchmarkInfo:
    """Check a module's attributes against the contract and turn them into a registry entry."""
    name = getattr(module, "NAME", None)
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise BenchmarkError(
            f"NAME must be a string of letters, digits, '_', '.', '-', got {name!r}"
        )
    description = getattr(module, "DESCRIPTION", None)
    if not isinstance(description, str) or not description.strip():
        raise BenchmarkError(f"DESCRIPTION must be a non-empty string, got {description!r}")
    seed = getattr(module, "SEED", _DEFAULT_SEED)
    _check_seed(seed, what="SEED")
    run = getattr(module, "run", None)
    if not callable(run):
        raise BenchmarkError("missing a callable run(quick: bool)")
    return BenchmarkInfo(name=name, path=path, description=description, seed=seed, run=run)


def discover(directory: str | os.PathLike | None = None) -> list[BenchmarkInfo]:
    """All benchmark modules in ``directory`` (default :func:`benchmarks_dir`), sorted by name.

    Files starting with ``_`` are helpers, not benchmarks. A module that fails to import or
    breaks the contract is listed with ``error`` set (named after its file) instead of
    hiding the others.
    """
    folder = Path(directory) if directory is not None else benchmarks_dir()
    if not folder.is_dir():
        raise FileNotFoundError(f"benchmarks folder {str(folder)!r} is not a directory")
    share_helpers(folder)
    entries: dict[str, BenchmarkInfo] = {}
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        try:
            info = _describe_module(path, _import_file(path))
        except Exception as exc:  # any failure must stay local to its own module
            info = BenchmarkInfo(name=path.stem, path=path, error=f"{path.name}: {_one_line(exc)}")
        if info.name in entries:
            first = entries[info.name].path.name
            info = BenchmarkInfo(
                name=f"{info.name} ({path.name})", path=path,
                error=f"{path.name}: duplicate NAME {info.name!r} (also in {first})",
            )
        entries[info.name] = info
    return sorted(entries.values(), key=lambda info: info.name)


def _one_line(exc: BaseException) -> str:
    """``Type: message`` on one line, for listings."""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def get_benchmark(name: str, directory: str | os.PathLike | None = None) -> BenchmarkInfo:
    """The registry entry called ``name``; raises :class:`UnknownBenchmarkError` listing names."""
    registry = discover(directory)
    for info in registry:
        if info.name == name:
            if info.error is not None:
                raise BenchmarkError(f"benchmark {name!r} cannot be loaded: {info.error}")
            return info
    known = ", ".join(info.name for info in registry if info.error is None) or "(none)"
    raise UnknownBenchmarkError(f"unknown benchmark {name!r}; known benchmarks: {known}")


# ----------------------------------------------------------------------------- validation


def _describe_row(row: Any, index: int) -> str:
    """How errors name a row: its position and (shortened) content."""
    text = repr(row)
    if len(text) > 200:
        text = text[:197] + "..."
    return f"row {index} {text}"


def _as_finite_float(value: Any) -> float | None:
    """``value`` as a Python float if it is a finite real number (not a bool), else None."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return None
    result = float(value)
    return result if math.isfinite(result) else None


def validate_row(row: Any, index: int = 0) -> dict:
    """Check one row against the contract and return a normalised copy (plain floats).

    Raises :class:`BenchmarkError` naming the row and what is wrong with it.
    """
    where = _describe_row(row, index)
    if not isinstance(row, Mapping):
        raise BenchmarkError(f"{where}: a row must be a dict with keys {list(ROW_KEYS)}")
    missing = [key for key in ROW_KEYS if key not in row]
    if missing:
        raise BenchmarkError(f"{where}: missing keys {missing}; required: {list(ROW_KEYS)}")
    unknown = sorted(str(key) for key in row if key not in ROW_KEYS)
    if unknown:
        raise BenchmarkError(
            f"{where}: unknown keys {unknown}; allowed: {list(ROW_KEYS)} "
            "(put anything else in the extra dict)"
        )
    for key in _ROW_STR_KEYS:
        if not isinstance(row[key], str):
            raise BenchmarkError(f"{where}: {key!r} must be a string, got {type(row[key]).__name__}")
    for key in ("table", "method", "metric"):
        if not row[key].strip():
            raise BenchmarkError(f"{where}: {key!r} must not be empty")
    value = _as_finite_float(row["value"])
    if value is None:
        raise BenchmarkError(
            f"{where}: 'value' must be a finite number (int or float, not bool), "
            f"got {row['value']!r}"
        )
    paper = None
    if row["paper"] is not None:
        paper = _as_finite_float(row["paper"])
        if paper is None:
            raise BenchmarkError(
                f"{where}: 'paper' must be a finite number or None, got {row['paper']!r}"
            )
    normalised = {key: row[key] for key in _ROW_STR_KEYS}
    normalised.update(value=value, paper=paper)
    return normalised


def validate_rows(rows: Any) -> list[dict]:
    """Validate every row (see :func:`validate_row`) and reject duplicate table cells."""
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Sequence):
        raise BenchmarkError(f"rows must be a list of dicts, got {type(rows).__name__}")
    normalised = [validate_row(row, index) for index, row in enumerate(rows)]
    seen: dict[tuple[str, ...], int] = {}
    for index, row in enumerate(normalised):
        cell = tuple(row[key] for key in _ROW_STR_KEYS)
        if cell in seen:
            raise BenchmarkError(
                f"{_describe_row(row, index)}: same (table, method, setting, metric) as "
                f"row {seen[cell]}; each cell of a table must appear once"
            )
        seen[cell] = index
    return normalised


def validate_result(document: Any, source: str = "result") -> dict:
    """Check a whole result document (as read from JSON); returns it with rows normalised."""
    if not isinstance(document, Mapping):
        raise BenchmarkError(f"{source}: expected a JSON object, got {type(document).__name__}")
    for key, types in RESULT_KEYS.items():
        if key not in document:
            raise BenchmarkError(f"{source}: missing key {key!r}; required: {list(RESULT_KEYS)}")
        value = document[key]
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            allowed = " or ".join(t.__name__ for t in types)
            raise BenchmarkError(
                f"{source}: {key!r} must be {allowed}, got {type(value).__name__}"
            )
    if not math.isfinite(document["seconds"]) or document["seconds"] < 0:
        raise BenchmarkError(f"{source}: 'seconds' must be a finite number >= 0, "
                             f"got {document['seconds']!r}")
    if document.get("dirty") not in (None, True, False):
        raise BenchmarkError(f"{source}: 'dirty' must be true, false or null, "
                             f"got {document['dirty']!r}")
    try:
        rows = validate_rows(document["rows"])
        claims = _checked_claims(document.get("claims", []))
    except BenchmarkError as exc:
        raise BenchmarkError(f"{source}: {exc}") from None
    return {**document, "claims": claims, "rows": rows}


def unmeasured(document: dict) -> list[str]:
    """What a run could not do, one line each, for the terminal: the notes that say a part
    was skipped, and every claim left "not measured" (``holds`` None) by this run."""
    notes = (document.get("extra") or {}).get("notes") or []
    lines = [n for n in notes if isinstance(n, str) and "skipped" in n.lower()]
    lines += [f"claim {c['id']!r} not measured in this run: {c['statement']}"
              for c in document.get("claims", []) if c.get("holds") is None]
    return lines


def _checked_claims(claims: Any) -> list[dict]:
    """:func:`validate_claims`, its errors as :class:`BenchmarkError`."""
    try:
        return validate_claims(claims)
    except ClaimError as exc:
        raise BenchmarkError(str(exc)) from None


# ----------------------------------------------------------------------------- running


def _check_seed(seed: Any, what: str = "seed") -> None:
    """numpy accepts seeds in [0, 2**32); refuse anything else up front."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**32:
        raise BenchmarkError(f"{what} must be an integer in [0, 2**32), got {seed!r}")


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's (CPU and CUDA) global generators."""
    _check_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def default_json_path(name: str, quick: bool) -> Path:
    """``results/<name>.json``, or ``results/<name>-quick.json`` for quick runs."""
    return Path("results") / f"{name}{'-quick' if quick else ''}.json"


def _equivalent_command(name: str, quick: bool, json_path, seed) -> str:
    """The CLI line that reproduces a library call, for the record."""
    parts = ["bpfree", "bench", name]
    if quick:
        parts.append("--quick")
    if seed is not None:
        parts += ["--seed", str(seed)]
    if json_path is not None:
        parts += ["--json", str(json_path)]
    return shlex.join(parts)


def _split_output(output: Any, name: str) -> tuple[Any, dict]:
    """run() may return rows or (rows, extra); separate them and check extra's type."""
    if isinstance(output, tuple):
        if len(output) != 2:
            raise BenchmarkError(
                f"benchmark {name!r}: run() returned a tuple of {len(output)} items; "
                "expected rows or (rows, extra)"
            )
        rows, extra = output
        if not isinstance(extra, Mapping):
            raise BenchmarkError(
                f"benchmark {name!r}: extra must be a dict, got {type(extra).__name__}"
            )
        return rows, dict(extra)
    return output, {}


def _json_default(obj: Any) -> Any:
    """Convert the numpy/torch/path values benchmarks naturally produce into JSON types."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def write_json_atomic(document: Any, path: str | os.PathLike) -> Path:
    """Serialise ``document`` (strict JSON, indented) and write it atomically."""
    try:
        return write_json(document, path, default=_json_default)
    except ValueError as exc:
        raise BenchmarkError(str(exc)) from None


def run_benchmark(
    name: str,
    *,
    quick: bool,
    json_path: str | os.PathLike | None = None,
    seed: int | None = None,
    directory: str | os.PathLike | None = None,
    command: str | None = None,
    allow_dirty: bool = False,
) -> dict:
    """Run benchmark ``name``, write its result document to JSON and return the document.

    ``seed`` defaults to the module's ``SEED`` (else 0); ``json_path`` to
    :func:`default_json_path`; ``command`` (what is recorded as the reproducing command
    line) to the equivalent ``bpfree bench`` call. Raises :class:`UnknownBenchmarkError`
    for an unknown name and :class:`BenchmarkError` when the output breaks the contract;
    nothing is written in either case. Before the benchmark runs, the output path is checked
    (``ValueError``) and a checkout with uncommitted changes to tracked files is refused
    (:class:`DirtyTreeError`) unless ``allow_dirty``; the result then says ``"dirty": true``.
    """
    info = get_benchmark(name, directory)
    if seed is not None:
        _check_seed(seed)
    used_seed = info.seed if seed is None else seed
    target = check_output_path(
        json_path if json_path is not None else default_json_path(info.name, quick), what="--json")
    recorded_command = command or _equivalent_command(name, quick, json_path, seed)
    revision, dirty = environment.git_state(info.path.parent)
    if dirty and not allow_dirty:
        raise DirtyTreeError(
            f"the checkout holding {info.path.parent} has uncommitted changes to tracked files; "
            "commit them so the result names its revision, or pass --allow-dirty "
            "(the result is then marked dirty)"
        )

    seed_everything(used_seed)
    start = time.perf_counter()
    output = info.run(bool(quick))
    seconds = time.perf_counter() - start

    raw_rows, extra = _split_output(output, info.name)
    try:
        rows = validate_rows(raw_rows)
    except BenchmarkError as exc:
        raise BenchmarkError(f"benchmark {info.name!r} ({info.path.name}): {exc}") from None
    device = extra.pop("device", None)
    if device is not None and not isinstance(device, str):
        raise BenchmarkError(f"benchmark {info.name!r}: extra['device'] must be a string")
    try:
        claims = _checked_claims(extra.pop("claims", []))
    except BenchmarkError as exc:
        raise BenchmarkError(f"benchmark {info.name!r} ({info.path.name}): {exc}") from None

    document: dict[str, Any] = {
        "benchmark": info.name,
        "description": info.description.strip(),
        "quick": bool(quick),
        "seed": used_seed,
        "device": device or environment.describe_device(),
        "seconds": seconds,
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": recorded_command,
        "git_revision": revision,
        "dirty": dirty,
        "versions": environment.library_versions(),
    }
    if extra:
        document["extra"] = extra
    if claims:
        document["claims"] = claims
    document["rows"] = rows
    write_json_atomic(document, target)
    return document
