"""A throw-away git repository holding one of the queue scripts of ``benchmarks/``
(``full_runs.sh``, ``land_run.sh``, with the ``_runs_common.sh`` they source) and a stand-in
Python, so that their tests check the scripts' contracts without training anything."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
#: A committer identity for the throw-away repository (and the commits a script makes).
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
NEEDS = shutil.which("git") is None or shutil.which("bash") is None


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=dict(os.environ, **GIT_ENV)).stdout.strip()


def make_repo(repo: Path, script: str) -> Path:
    """``repo`` made a git repository with ``benchmarks/SCRIPT`` (and the shared start-up)
    added to what the caller already put there, all in one first commit."""
    (repo / "benchmarks").mkdir(parents=True, exist_ok=True)
    shutil.copy(BENCHMARKS / script, repo / "benchmarks" / script)
    shutil.copy(BENCHMARKS / "_runs_common.sh", repo / "benchmarks")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "init")
    return repo


def run_script(repo: Path, tmp_path: Path, script: str, fake_python: str, *args: str,
               **env: str) -> subprocess.CompletedProcess:
    """``bash benchmarks/SCRIPT ARGS`` in ``repo`` with ``fake_python`` as $PYTHON (it may log
    its calls to $CALLS), the queue's folders under ``tmp_path / "runs"``."""
    fake = tmp_path / "fake-python"
    fake.write_text(fake_python)
    fake.chmod(0o755)
    environ = dict(os.environ, BPFREE_RUNS=str(tmp_path / "runs"), PYTHON=str(fake),
                   CALLS=str(tmp_path / "calls.log"), **GIT_ENV, **env)
    return subprocess.run(["bash", str(repo / "benchmarks" / script), *args],
                          capture_output=True, text=True, env=environ, cwd=repo)
