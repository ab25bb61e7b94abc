"""The benchmark harness: registry, runner, JSON contract and docs generation."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest

from bpfree.bench import docs, runner

REQUIRED = {"benchmark": str, "quick": bool, "device": str, "seconds": float,
            "versions": dict, "rows": list}
ROW_TYPES = {"table": str, "method": str, "setting": str, "metric": str, "value": float}


def _write_module(folder: Path, filename: str, body: str) -> Path:
    path = folder / filename
    path.write_text(textwrap.dedent(body))
    return path


def _good_row(**changes) -> dict:
    row = {"table": "T1", "method": "MeZO", "setting": "SST-2", "metric": "acc",
           "value": 90.5, "paper": 91.4}
    row.update(changes)
    return row


@pytest.fixture
def bench_dir(tmp_path: Path) -> Path:
    """A benchmarks folder with a seeded good module, a broken one and a bad-rows one."""
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    _write_module(folder, "good.py", """
        import random
        import torch
        NAME = "good"
        DESCRIPTION = "A good one.\\nSecond line."
        SEED = 7
        def run(quick):
            rows = [{"table": "t", "method": "m", "setting": "s", "metric": "draw",
                     "value": float(torch.rand(())) + random.random(), "paper": None}]
            return rows, {"notes": "hello", "quick_seen": quick}
    """)
    _write_module(folder, "broken.py", "raise RuntimeError('boom at import')\n")
    _write_module(folder, "badrows.py", """
        NAME = "badrows"
        DESCRIPTION = "Returns an invalid row."
        def run(quick):
            return [{"table": "t", "method": "m", "setting": "s", "metric": "x",
                     "value": 1.0, "paper": None},
                    {"table": "t", "method": "culprit", "setting": "s", "metric": "x",
                     "value": float("nan"), "paper": None}]
    """)
    _write_module(folder, "_helper.py", "raise RuntimeError('helpers are not benchmarks')\n")
    return folder


# ----------------------------------------------------------------------------- registry


def test_repo_benchmarks_folder_lists_smoke():
    names = {info.name: info for info in runner.discover()}
    assert "smoke" in names
    assert names["smoke"].error is None
    assert "self-test" in names["smoke"].description.lower()


def test_every_module_of_the_repo_benchmarks_folder_loads():
    """`bpfree bench --list` on the repository shows no error line: a helper module that is
    not a benchmark starts with '_' (the loader skips it)."""
    broken = {info.name: info.summary for info in runner.discover() if info.error is not None}
    assert broken == {}


def test_broken_module_does_not_hide_the_others(bench_dir):
    registry = {info.name: info for info in runner.discover(bench_dir)}
    assert set(registry) == {"good", "broken", "badrows"}  # _helper.py skipped
    assert registry["good"].error is None and registry["good"].seed == 7
    assert registry["good"].summary == "A good one."
    assert "boom at import" in registry["broken"].summary
    assert registry["broken"].summary.startswith("error:")


def test_env_var_selects_folder(bench_dir, monkeypatch):
    monkeypatch.setenv(runner.ENV_VAR, str(bench_dir))
    assert runner.benchmarks_dir() == bench_dir
    monkeypatch.setenv(runner.ENV_VAR, str(bench_dir / "missing"))
    with pytest.raises(FileNotFoundError, match=runner.ENV_VAR):
        runner.benchmarks_dir()


def test_unknown_benchmark_lists_known_names(bench_dir):
    with pytest.raises(runner.UnknownBenchmarkError) as info:
        runner.run_benchmark("nope", quick=True, directory=bench_dir)
    message = str(info.value)
    assert "'nope'" in message and "badrows" in message and "good" in message
    assert isinstance(info.value, ValueError)


def test_running_a_broken_module_says_why(bench_dir):
    with pytest.raises(runner.BenchmarkError, match="boom at import"):
        runner.run_benchmark("broken", quick=True, directory=bench_dir)


# ----------------------------------------------------------------------------- runner


def _check_contract(document: dict) -> None:
    for key, kind in REQUIRED.items():
        assert key in document, key
        assert type(document[key]) is kind, (key, type(document[key]))
    assert document["rows"], "smoke produces rows"
    for row in document["rows"]:
        assert set(row) == set(runner.ROW_KEYS)
        for key, kind in ROW_TYPES.items():
            assert type(row[key]) is kind, (key, row)
        assert math.isfinite(row["value"])
        assert row["paper"] is None or type(row["paper"]) is float
    for key in ("python", "torch", "numpy", "numba", "bpfree", "platform"):
        assert isinstance(document["versions"][key], str) and document["versions"][key]
    assert isinstance(document["seed"], int)
    assert document["timestamp"].endswith("+00:00")
    assert document["command"].startswith("bpfree bench")


def test_smoke_writes_a_valid_json_document(tmp_path):
    out = tmp_path / "nested" / "smoke.json"
    returned = runner.run_benchmark("smoke", quick=True, json_path=out, allow_dirty=True)
    on_disk = json.loads(out.read_text())
    _check_contract(on_disk)
    assert on_disk == json.loads(json.dumps(returned))
    assert on_disk["benchmark"] == "smoke" and on_disk["quick"] is True
    assert on_disk["seconds"] > 0
    assert on_disk["device"].startswith(("cpu: ", "cuda: "))
    assert any(row["paper"] is not None for row in on_disk["rows"])
    assert runner.validate_result(on_disk, source=str(out))["rows"] == on_disk["rows"]
    assert [p.name for p in out.parent.iterdir()] == ["smoke.json"]  # no temp files left


def test_default_json_path_names_quick_runs():
    assert runner.default_json_path("x", quick=True) == Path("results/x-quick.json")
    assert runner.default_json_path("x", quick=False) == Path("results/x.json")


def test_seed_makes_runs_repeatable_and_extra_is_kept(bench_dir, tmp_path):
    first = runner.run_benchmark("good", quick=True, json_path=tmp_path / "a.json",
                                 directory=bench_dir)
    second = runner.run_benchmark("good", quick=True, json_path=tmp_path / "b.json",
                                  directory=bench_dir)
    other = runner.run_benchmark("good", quick=False, seed=8, json_path=tmp_path / "c.json",
                                 directory=bench_dir)
    assert first["seed"] == 7 and other["seed"] == 8
    assert first["rows"] == second["rows"]
    assert first["rows"] != other["rows"]
    assert first["extra"] == {"notes": "hello", "quick_seen": True}
    assert other["extra"]["quick_seen"] is False
    assert "--seed 8" in other["command"]


def test_invalid_rows_are_rejected_naming_the_row(bench_dir, tmp_path):
    out = tmp_path / "bad.json"
    with pytest.raises(runner.BenchmarkError) as info:
        runner.run_benchmark("badrows", quick=True, json_path=out, directory=bench_dir)
    message = str(info.value)
    assert "row 1" in message and "culprit" in message and "'value'" in message
    assert not out.exists()


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ({k: v for k, v in _good_row().items() if k != "metric"}, "missing keys ['metric']"),
        (_good_row(extra=1), "unknown keys ['extra']"),
        (_good_row(value=True), "'value' must be a finite number"),
        (_good_row(value="90"), "'value' must be a finite number"),
        (_good_row(value=float("inf")), "'value' must be a finite number"),
        (_good_row(paper="91.4"), "'paper' must be a finite number or None"),
        (_good_row(method=3), "'method' must be a string"),
        (_good_row(table=" "), "'table' must not be empty"),
        (["not", "a", "dict"], "a row must be a dict"),
    ],
)
def test_validate_row_errors(row, fragment):
    with pytest.raises(runner.BenchmarkError) as info:
        runner.validate_rows([_good_row(method="first"), row])
    assert fragment in str(info.value)
    assert str(info.value).startswith("row 1 ")


def test_validate_rows_normalises_numbers_and_rejects_duplicates():
    rows = runner.validate_rows([_good_row(value=np.float32(0.5), paper=3)])
    assert rows[0]["value"] == 0.5 and type(rows[0]["value"]) is float
    assert rows[0]["paper"] == 3.0 and type(rows[0]["paper"]) is float
    with pytest.raises(runner.BenchmarkError, match="row 1 .*same \\(table, method"):
        runner.validate_rows([_good_row(), _good_row(value=1.0)])
    with pytest.raises(runner.BenchmarkError, match="list of dicts"):
        runner.validate_rows({"table": "x"})


def test_validate_result_names_the_missing_key():
    document = {"benchmark": "b", "quick": False, "device": "cpu", "seconds": 1.0,
                "versions": {}, "rows": [_good_row()]}
    assert runner.validate_result(document)["rows"][0]["value"] == 90.5
    with pytest.raises(runner.BenchmarkError, match="missing key 'device'"):
        runner.validate_result({k: v for k, v in document.items() if k != "device"})
    with pytest.raises(runner.BenchmarkError, match="'quick' must be bool"):
        runner.validate_result({**document, "quick": "yes"})


# ----------------------------------------------------------------------------- docs


def _result(benchmark: str, rows: list[dict], **extra) -> dict:
    return {
        "benchmark": benchmark, "description": f"About {benchmark}.", "quick": False,
        "seed": 0, "device": "cpu: Test CPU, 2 threads", "seconds": 12.5,
        "timestamp": "2025-01-01T00:00:00+00:00", "command": f"bpfree bench {benchmark}",
        "versions": {"python": "3.11", "torch": "2.13"}, "rows": rows, **extra,
    }


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "results"
    folder.mkdir()
    zo_rows = [
        _good_row(method="MeZO", metric="acc", value=90.5, paper=91.4),
        _good_row(method="MeZO", metric="memory (GB)", value=4.25, paper=None),
        _good_row(method="FO-SGD", metric="acc", value=93.125, paper=93.6),
    ]
    (folder / "zo.json").write_text(json.dumps(_result(
        "zo", zo_rows, extra={"figures": ["results/curve.png"], "notes": ["a note"]})))
    rate_rows = [
        {"table": "Throughput", "method": "xorshift32", "setting": "1 core",
         "metric": "values/s", "value": 23456789.0, "paper": 20000000.0},
        {"table": "Parameters", "method": "resnet", "setting": "",
         "metric": "count", "value": 11689512.0, "paper": None},
    ]
    (folder / "rng.json").write_text(json.dumps(_result("rng", rate_rows)))
    (folder / "curve.png").write_bytes(b"\x89PNG")
    return folder


def test_generate_docs_tables_numbers_and_determinism(results_dir, tmp_path):
    out = tmp_path / "docs" / "BENCHMARKS.md"
    report = docs.generate_docs(results_dir, out)
    first = out.read_bytes()
    text = first.decode()
    assert report.used == ["results/rng.json", "results/zo.json"] and not report.skipped
    assert "generated** by `bpfree docs`" in text and "do not edit it by hand" in text
    # our numbers beside the paper's
    assert "| MeZO | SST-2 | 90.5 | 91.4 | 4.25 |" in text
    assert "| FO-SGD | SST-2 | 93.1 | 93.6 | — |" in text
    assert "| acc | acc (paper) | memory (GB) |" in text
    assert "2.35e7" in text and "2.00e7" in text  # rates: scientific
    assert "11,689,512" in text  # counts: separators
    # metadata and sections sorted by benchmark
    assert text.index("## rng (full)") < text.index("## zo (full)")
    assert "`bpfree bench zo`" in text and "cpu: Test CPU, 2 threads" in text
    assert "12.5 s" in text and "python 3.11, torch 2.13" in text
    assert "![curve](../results/curve.png)" in text and "- a note" in text
    assert not report.warnings
    docs.generate_docs(results_dir, out)
    assert out.read_bytes() == first


def test_generate_docs_flags_invalid_files(results_dir, tmp_path):
    (results_dir / "broken.json").write_text("{not json")
    bad = _result("bad", [_good_row(value="high")])
    (results_dir / "bad.json").write_text(json.dumps(bad))
    report = docs.generate_docs(results_dir, tmp_path / "B.md")
    skipped = dict(report.skipped)
    assert set(skipped) == {"results/bad.json", "results/broken.json"}
    assert "row 0" in skipped["results/bad.json"]
    text = (tmp_path / "B.md").read_text()
    assert "## Skipped result files" in text and "`results/broken.json`" in text
    assert "## zo (full)" in text


def test_generate_docs_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        docs.generate_docs(tmp_path / "nope", tmp_path / "B.md")


@pytest.mark.parametrize(
    ("value", "metric", "expected"),
    [
        (0.91234, "acc", "0.912"),
        (64.0, "trace", "64"),
        (1234.5, "ms", "1,234"),
        (11689512.0, "params", "11,689,512"),
        (1.5e9, "values/s", "1.50e9"),
        (2.5e-6, "lr", "2.50e-6"),
        (None, "acc", "—"),
    ],
)
def test_format_number(value, metric, expected):
    assert docs.format_number(value, metric) == expected


def test_load_module_imports_a_benchmark_file_and_names_the_known_ones(tmp_path):
    from bpfree.bench.runner import load_module

    (tmp_path / "tiny.py").write_text("NAME = 'tiny'\nVALUE = 3\n")
    assert load_module("tiny", tmp_path).VALUE == 3
    with pytest.raises(FileNotFoundError, match="files there: tiny"):
        load_module("absent", tmp_path)


@pytest.mark.parametrize("seconds", ["NaN", "1e999", "-Infinity", "-1"])
def test_docs_refuse_non_finite_seconds_naming_the_file(results_dir, tmp_path, seconds):
    text = json.dumps(_result("slow", [_good_row()])).replace('"seconds": 12.5',
                                                               f'"seconds": {seconds}')
    (results_dir / "slow.json").write_text(text)
    report = docs.generate_docs(results_dir, tmp_path / "B.md")
    reason = dict(report.skipped)["results/slow.json"]
    assert reason.startswith("results/slow.json: 'seconds' must be a finite number >= 0")
    page = (tmp_path / "B.md").read_text()
    assert "## slow" not in page and " nan s" not in page and " inf s" not in page


def test_a_part_the_run_could_not_do_is_said_on_the_terminal(bench_dir, monkeypatch, tmp_path,
                                                             capsys):
    """Issue 35: `bench tflite --quick` without MNIST said so only inside the JSON."""
    from bpfree.bench.claims import claim
    from bpfree.cli import main

    _write_module(bench_dir, "partial.py", """
        from bpfree.bench.claims import claim
        NAME = "partial"
        DESCRIPTION = "Runs one part of two."
        def run(quick):
            rows = [{"table": "t", "method": "m", "setting": "s", "metric": "x",
                     "value": 1.0, "paper": None}]
            return rows, {"notes": ["adaptation rows skipped: no MNIST in data/mnist",
                                    "an ordinary note"],
                          "claims": [claim("c-done", "ref", "measured", paper=None, ours=1.0,
                                           holds=True),
                                     claim("c-open", "ref", "adapting raises accuracy",
                                           paper=None, ours=None, holds=None)]}
    """)
    monkeypatch.setenv(runner.ENV_VAR, str(bench_dir))
    assert main(["bench", "partial", "--quick", "--allow-dirty", "--json",
                 str(tmp_path / "p.json")]) == 0
    err = capsys.readouterr().err
    assert "warning: partial: adaptation rows skipped: no MNIST" in err
    assert "claim 'c-open' not measured in this run: adapting raises accuracy" in err
    assert "c-done" not in err and "ordinary note" not in err
    doc = {"claims": [claim("a", "r", "s", paper=None, ours=None, holds=None)]}
    assert runner.unmeasured(doc) == ["claim 'a' not measured in this run: s"]


def test_docs_mark_a_partial_report_with_its_runs_progress(results_dir, tmp_path):
    """A result written from part of a run (extra.partial, $BPFREE_TASK_CACHE_REPORT) says so
    in its title, the overview and its mode line; a finished one reads as a full run."""
    partial = {"revision": "abc1234", "finished": 208, "tasks": 363,
               "progress": "208 of 363 training runs of revision abc1234 had finished"}
    (results_dir / "zo.json").write_text(json.dumps(_result(
        "zo", [_good_row()], extra={"partial": partial})))
    out = tmp_path / "BENCHMARKS.md"
    docs.generate_docs(results_dir, out)
    text = out.read_text()
    assert "## zo (full, partial: 208 of 363 runs of abc1234)" in text
    assert "| zo | full, partial: 208 of 363 runs of abc1234 |" in text
    assert ("**Mode:** full run, partial report: 208 of 363 training runs of revision "
            "abc1234 had finished (see the notes)") in text
    partial.update(finished=363)
    (results_dir / "zo.json").write_text(json.dumps(_result(
        "zo", [_good_row()], extra={"partial": partial})))
    docs.generate_docs(results_dir, out)
    assert "## zo (full)" in out.read_text()
