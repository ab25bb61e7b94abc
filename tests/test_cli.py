"""The `bpfree` command line: parsing, exit codes and error reporting."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from bpfree import __version__, cli
from bpfree.bench import runner


def _subcommands() -> list[str]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(action.choices)


def _exit_code(argv: list[str]) -> int:
    """main()'s status, including argparse's SystemExit for --help/--version."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return exc.code


def test_console_script_help():
    bpfree = Path(sys.executable).with_name("bpfree")
    command = [str(bpfree)] if bpfree.exists() else [sys.executable, "-m", "bpfree.cli"]
    done = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "without back-propagation" in done.stdout
    for name in ("bench", "docs", "demo"):
        assert name in done.stdout


def test_version(capsys):
    assert _exit_code(["--version"]) == 0
    assert __version__ in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--help"]] + [[name, "--help"] for name in _subcommands()])
def test_every_help_exits_zero(argv, capsys):
    assert _exit_code(argv) == 0
    assert "usage: bpfree" in capsys.readouterr().out


def test_bench_help_shows_defaults_and_example(capsys):
    _exit_code(["docs", "--help"])
    out = capsys.readouterr().out
    assert "(default: results)" in out and "example" in out


def test_no_command_prints_help_and_fails(capsys):
    assert cli.main([]) == 2
    assert "usage: bpfree" in capsys.readouterr().err


def test_bench_list_names_smoke(capsys):
    assert cli.main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    assert any(line.startswith("smoke ") and "self-test" in line.lower()
               for line in out.splitlines())


def test_bench_list_shows_broken_modules(tmp_path, monkeypatch, capsys):
    (tmp_path / "ok.py").write_text(
        "NAME = 'ok'\nDESCRIPTION = 'fine'\ndef run(quick):\n    return []\n")
    (tmp_path / "bad.py").write_text("import does_not_exist_anywhere\n")
    monkeypatch.setenv(runner.ENV_VAR, str(tmp_path))
    assert cli.main(["bench", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("ok ") and line.endswith("fine") for line in lines)
    assert any(line.startswith("bad ") and "error:" in line and "does_not_exist_anywhere" in line
               for line in lines)


def test_bench_smoke_writes_json_and_prints_rows(tmp_path, capsys):
    out = tmp_path / "smoke.json"
    argv = ["bench", "smoke", "--quick", "--json", str(out), "--seed", "3", "--allow-dirty"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    document = json.loads(out.read_text())
    assert document["seed"] == 3 and document["quick"] is True
    assert document["command"] == f"bpfree bench smoke --quick --json {out} --seed 3 --allow-dirty"
    assert f"wrote {out}" in printed and "median time (us)" in printed


def test_unknown_benchmark_exits_2_with_known_names(capsys):
    assert cli.main(["bench", "no-such-benchmark"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bpfree: error: unknown benchmark 'no-such-benchmark'")
    assert "smoke" in err


def test_library_value_error_becomes_exit_2(monkeypatch, capsys):
    def explode(*args, **kwargs):
        raise ValueError("the library said no")

    monkeypatch.setattr(runner, "run_benchmark", explode)
    monkeypatch.delenv("BPFREE_DEBUG", raising=False)
    assert cli.main(["bench", "smoke"]) == 2
    err = capsys.readouterr().err
    assert err == "bpfree: error: the library said no\n"
    with pytest.raises(ValueError, match="the library said no"):
        cli.main(["bench", "smoke", "--debug"])
    monkeypatch.setenv("BPFREE_DEBUG", "1")
    with pytest.raises(ValueError):
        cli.main(["bench", "smoke"])


def test_docs_command(tmp_path, capsys):
    results = tmp_path / "results"
    runner.run_benchmark("smoke", quick=True, json_path=results / "smoke-quick.json",
                         allow_dirty=True)
    out = tmp_path / "BENCHMARKS.md"
    assert cli.main(["docs", "--results", str(results), "--out", str(out)]) == 0
    assert "## smoke (quick)" in out.read_text()
    assert f"wrote {out} from 1 result file(s)" in capsys.readouterr().out
    (results / "junk.json").write_text("[]")
    assert cli.main(["docs", "--results", str(results), "--out", str(out)]) == 1
    assert "bpfree: warning: skipped results/junk.json" in capsys.readouterr().err


def test_docs_missing_results_exits_2(tmp_path, capsys):
    assert cli.main(["docs", "--results", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.startswith("bpfree: error: results folder")


def test_delegated_commands(monkeypatch, capsys):
    fake = types.ModuleType("fake_bpfree_command")
    fake.add_arguments = lambda p: p.add_argument("--steps", type=int, default=5, help="steps")
    fake.main = lambda args: 40 + args.steps
    monkeypatch.setitem(sys.modules, "fake_bpfree_command", fake)
    monkeypatch.setattr(cli, "DELEGATED", [
        ("fake", "fake_bpfree_command", "a fake command"),
        ("ghost", "bpfree.no_such_module_here", "never there"),
    ])
    assert cli.main(["fake", "--steps", "2"]) == 42
    assert _exit_code(["fake", "--help"]) == 0
    assert "(default: 5)" in capsys.readouterr().out
    assert _exit_code(["--help"]) == 0
    listing = " ".join(capsys.readouterr().out.split())
    assert "ghost not available" in listing and "fake a fake command" in listing
    assert cli.main(["ghost"]) == 1
    assert "not available" in capsys.readouterr().err
