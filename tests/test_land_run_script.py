"""benchmarks/land_run.sh: landing one finished full run of the queue in a checkout.

Exercised in a throw-away git repository with a stand-in Python: the JSON check runs on the
real interpreter, `bpfree docs --reledger` and the ledger tests are recorded (the reledger
stand-in rewrites docs/BENCHMARKS.md). Checked: what is copied and committed, and the
refusals (dirty checkout, missing JSON, a JSON of another revision, of a dirty tree or of a
quick run) that leave the checkout untouched.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from queue_script_repo import NEEDS, git as _git, make_repo, run_script

pytestmark = pytest.mark.skipif(NEEDS, reason="needs git and bash")

FAKE_PYTHON = f"""#!/usr/bin/env bash
[ "$1" = "-" ] && exec "{sys.executable}" "$@"
echo "$*" >> "$CALLS"
if [ "$2" = "bpfree.cli" ]; then
    [ -n "${{FAIL_RELEDGER:-}}" ] && exit 4
    echo "regenerated $RANDOM" > docs/BENCHMARKS.md
fi
if [ "$2" = "pytest" ] && [ -n "${{FAIL_TESTS:-}}" ]; then exit 1; fi
exit 0
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    for d in ("results/figures", "docs", "tests"):
        (repo / d).mkdir(parents=True)
    (repo / "results" / "pmt.json").write_text('{"old": true}\n')
    (repo / "results" / "figures" / "kept.png").write_bytes(b"old")
    (repo / "docs" / "BENCHMARKS.md").write_text("old\n")
    (repo / "tests" / "test_ledgers_pmt_mcunet.py").write_text("")
    return make_repo(repo, "land_run.sh")


def _queue_output(repo: Path, runs: Path, rev: str, **doc) -> Path:
    """What full_runs.sh leaves: the done JSON and a worktree whose figures the run wrote."""
    done = runs / "done"
    done.mkdir(parents=True, exist_ok=True)
    document = {"benchmark": "pmt", "git_revision": rev, "dirty": False, "quick": False,
                "rows": [1]}
    document.update(doc)
    path = done / f"pmt-{rev}.json"
    path.write_text(json.dumps(document))
    wt = runs / "worktrees" / rev
    if not wt.exists():
        _git(repo, "worktree", "add", "--detach", str(wt), rev)
        (wt / "results" / "figures" / "new.png").write_bytes(b"new")
        (wt / "results" / "figures" / "kept.png").write_bytes(b"changed")
    return path


def _run(repo: Path, tmp_path: Path, *args: str, **env: str):
    return run_script(repo, tmp_path, "land_run.sh", FAKE_PYTHON, *args, **env)


def test_usage_errors_exit_2_and_help_exits_0(repo: Path, tmp_path: Path) -> None:
    assert _run(repo, tmp_path, "--help").returncode == 0
    none = _run(repo, tmp_path)
    assert none.returncode == 2 and "give a benchmark name and the revision" in none.stderr
    bad = _run(repo, tmp_path, "pmt", "not-a-revision")
    assert bad.returncode == 2 and "'not-a-revision' is not a commit" in bad.stderr
    missing = _run(repo, tmp_path, "pmt", "HEAD")
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_lands_the_json_and_the_figures_then_reledgers_and_commits(
        repo: Path, tmp_path: Path) -> None:
    rev = _git(repo, "rev-parse", "--short", "HEAD")
    done = _queue_output(repo, tmp_path / "runs", rev)
    run = _run(repo, tmp_path, "pmt", rev)
    assert run.returncode == 0, run.stderr
    assert (repo / "results" / "pmt.json").read_text() == done.read_text()
    assert (repo / "results" / "figures" / "new.png").read_bytes() == b"new"
    assert (repo / "results" / "figures" / "kept.png").read_bytes() == b"changed"
    log = _git(repo, "log", "--format=%s").splitlines()
    assert log[0].startswith("docs/BENCHMARKS.md regenerated") and f"pmt run at {rev}" in log[0]
    assert log[1] == f"results/pmt.json: the full run at {rev} (benchmarks/land_run.sh)"
    assert _git(repo, "status", "--porcelain") == ""
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls[0] == "-m bpfree.cli docs --reledger"
    assert calls[1] == "-m pytest -q tests/test_ledgers_pmt_mcunet.py"


@pytest.mark.parametrize("doc, message", [
    ({"git_revision": "0123456"}, "was made at revision '0123456'"),
    ({"dirty": True}, "comes from a dirty tree"),
    ({"quick": True}, "is a quick run"),
])
def test_a_json_that_is_not_a_clean_full_run_of_rev_is_refused(
        repo: Path, tmp_path: Path, doc: dict, message: str) -> None:
    rev = _git(repo, "rev-parse", "--short", "HEAD")
    _queue_output(repo, tmp_path / "runs", rev, **doc)
    run = _run(repo, tmp_path, "pmt", rev)
    assert run.returncode == 2 and message in run.stderr
    assert (repo / "results" / "pmt.json").read_text() == '{"old": true}\n'
    assert _git(repo, "log", "--format=%s") == "init"


def test_a_corrupt_json_is_refused(repo: Path, tmp_path: Path) -> None:
    rev = _git(repo, "rev-parse", "--short", "HEAD")
    _queue_output(repo, tmp_path / "runs", rev).write_text("{not json")
    run = _run(repo, tmp_path, "pmt", rev)
    assert run.returncode == 2 and "is not a readable JSON document" in run.stderr
    assert _git(repo, "log", "--format=%s") == "init"


def test_a_checkout_with_uncommitted_changes_is_refused(repo: Path, tmp_path: Path) -> None:
    rev = _git(repo, "rev-parse", "--short", "HEAD")
    _queue_output(repo, tmp_path / "runs", rev)
    (repo / "docs" / "BENCHMARKS.md").write_text("hand edit\n")
    run = _run(repo, tmp_path, "pmt", rev)
    assert run.returncode == 2 and "uncommitted changes" in run.stderr
    assert (repo / "results" / "pmt.json").read_text() == '{"old": true}\n'
    assert (repo / "docs" / "BENCHMARKS.md").read_text() == "hand edit\n"


def test_failing_ledger_tests_keep_the_results_commit_and_leave_docs_uncommitted(
        repo: Path, tmp_path: Path) -> None:
    rev = _git(repo, "rev-parse", "--short", "HEAD")
    _queue_output(repo, tmp_path / "runs", rev)
    run = _run(repo, tmp_path, "pmt", rev, FAIL_TESTS="1")
    assert run.returncode == 1 and "the ledger tests failed" in run.stderr
    assert _git(repo, "log", "--format=%s").splitlines()[0].startswith("results/pmt.json")
    assert "docs/BENCHMARKS.md" in _git(repo, "status", "--porcelain")
