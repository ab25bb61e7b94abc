"""benchmarks/full_runs.sh: the resumable queue of full benchmark runs at one revision.

The script is exercised in a throw-away git repository with a stand-in Python that records
how it was called, so the queue's contract (one clean worktree of the revision, one cache per
revision, finished benchmarks skipped, clear refusals) is checked without training anything.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "full_runs.sh"

pytestmark = pytest.mark.skipif(shutil.which("git") is None or shutil.which("bash") is None,
                                reason="needs git and bash")

# Stands in for `python -m bpfree.cli bench NAME ... --json results/NAME.json`: writes the
# JSON and logs its arguments and the cache folder it was given.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$* cache=$BPFREE_TASK_CACHE pythonpath=$PYTHONPATH" >> "$CALLS"
[ -n "${FAIL_BENCH:-}" ] && [ "$4" = "$FAIL_BENCH" ] && exit 3
out="${@: -1}"
mkdir -p "$(dirname "$out")"
echo "{\\"benchmark\\": \\"$4\\"}" > "$out"
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    (repo / "src").mkdir()
    (repo / "src" / "mod.py").write_text("x = 1\n")
    shutil.copy(SCRIPT, repo / "benchmarks" / "full_runs.sh")
    shutil.copy(SCRIPT.with_name("_runs_common.sh"), repo / "benchmarks")
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return repo


def _run(repo: Path, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    environ = dict(os.environ, BPFREE_RUNS=str(tmp_path / "runs"), PYTHON=str(fake),
                   CALLS=str(tmp_path / "calls.log"), **env)
    return subprocess.run(["bash", str(repo / "benchmarks" / "full_runs.sh"), *args],
                          capture_output=True, text=True, env=environ)


def test_usage_errors_exit_2_and_help_exits_0(repo: Path, tmp_path: Path) -> None:
    none = _run(repo, tmp_path)
    assert none.returncode == 2 and "give a revision and at least one benchmark" in none.stderr
    assert _run(repo, tmp_path, "--help").returncode == 0
    bad = _run(repo, tmp_path, "not-a-revision", "pmt")
    assert bad.returncode == 2 and "'not-a-revision' is not a commit" in bad.stderr


def test_queue_runs_in_order_shares_one_cache_and_skips_what_is_done(
        repo: Path, tmp_path: Path) -> None:
    rev = _git(repo, "rev-parse", "--short", "HEAD")
    first = _run(repo, tmp_path, rev, "pmt", "pinn --threads 2")
    assert first.returncode == 0, first.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    runs = tmp_path / "runs"
    assert [c.split()[3] for c in calls] == ["pmt", "pinn"]
    assert "--threads 2 --json results/pinn.json" in calls[1]
    assert all(f"cache={runs}/cache/{rev}" in c for c in calls)
    assert all(f"pythonpath={runs}/worktrees/{rev}/src" in c for c in calls)
    assert (runs / "done" / f"pmt-{rev}.json").read_text().strip() == '{"benchmark": "pmt"}'
    assert (runs / "done" / f"pinn-{rev}.json").exists()

    again = _run(repo, tmp_path, rev, "pmt", "tinyfoa")
    assert again.returncode == 0, again.stderr
    assert "pmt at" in again.stdout and "already done" in again.stdout
    new_calls = (tmp_path / "calls.log").read_text().splitlines()[2:]
    assert [c.split()[3] for c in new_calls] == ["tinyfoa"]


def test_a_failing_benchmark_stops_the_queue_without_a_done_file(
        repo: Path, tmp_path: Path) -> None:
    rev = _git(repo, "rev-parse", "--short", "HEAD")
    run = _run(repo, tmp_path, rev, "pmt", "pinn", FAIL_BENCH="pmt")
    assert run.returncode != 0
    assert not list((tmp_path / "runs" / "done").iterdir())
    assert len((tmp_path / "calls.log").read_text().splitlines()) == 1


def test_a_worktree_with_changed_sources_is_refused(repo: Path, tmp_path: Path) -> None:
    rev = _git(repo, "rev-parse", "--short", "HEAD")
    assert _run(repo, tmp_path, rev, "pmt").returncode == 0
    (tmp_path / "runs" / "worktrees" / rev / "src" / "mod.py").write_text("x = 2\n")
    refused = _run(repo, tmp_path, rev, "pinn")
    assert refused.returncode == 2 and "has changes outside results/" in refused.stderr
