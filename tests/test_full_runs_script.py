"""benchmarks/full_runs.sh: the resumable queue of full benchmark runs at one revision.

The script is exercised in a throw-away git repository with a stand-in Python that records
how it was called, so the queue's contract (one clean worktree of the revision, one cache per
revision, finished benchmarks skipped, clear refusals) is checked without training anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from queue_script_repo import NEEDS, git as _git, make_repo, run_script

pytestmark = pytest.mark.skipif(NEEDS, reason="needs git and bash")

# Stands in for `python -m bpfree.cli bench NAME ... --json results/NAME.json`: writes the
# JSON and logs its arguments and the cache folder it was given.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$* cache=$BPFREE_TASK_CACHE pythonpath=$PYTHONPATH" >> "$CALLS"
[ -n "${FAIL_BENCH:-}" ] && [ "$4" = "$FAIL_BENCH" ] && exit 3
out="${@: -1}"
mkdir -p "$(dirname "$out")"
echo "{\\"benchmark\\": \\"$4\\"}" > "$out"
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "repo" / "src").mkdir(parents=True)
    (tmp_path / "repo" / "src" / "mod.py").write_text("x = 1\n")
    return make_repo(tmp_path / "repo", "full_runs.sh")


def _run(repo: Path, tmp_path: Path, *args: str, **env: str):
    return run_script(repo, tmp_path, "full_runs.sh", FAKE_PYTHON, *args, **env)


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
