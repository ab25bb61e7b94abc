"""The claim ledger (bench.claims), its place in result documents and docs, and the
refusal to record results from a checkout with uncommitted changes."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from bpfree import cli
from bpfree.bench import claims, docs, runner

_GOOD = dict(paper=64.7, ours=60.1, holds=False)


# ----------------------------------------------------------------------------- validation


def test_claim_normalises_numbers_and_numpy_bools():
    entry = claims.claim("t7-mean", "Table 7", "BP-free beats INT8 BP", paper=np.float32(64.5),
                         ours=3, holds=np.bool_(True), note="3 corruptions")
    assert entry == {"id": "t7-mean", "paper_ref": "Table 7", "statement": "BP-free beats INT8 BP",
                     "paper": 64.5, "ours": 3.0, "holds": True, "note": "3 corruptions"}
    assert type(entry["holds"]) is bool and type(entry["ours"]) is float
    assert claims.claim("x", "Fig. 5", "s", paper="layer-wise > model-wise", ours=None,
                        holds=None)["holds"] is None


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"holds": 1}, "'holds' must be True, False, 'not decided'"),
        ({"holds": "yes"}, "'holds' must be True, False, 'not decided'"),
        ({"paper": float("nan")}, "'paper' must be finite"),
        ({"ours": [1, 2]}, "'ours' must be a string, a finite number or None"),
        ({"ours": True}, "'ours' must be a string, a finite number or None"),
        ({"note": 3}, "'note' must be a string"),
    ],
)
def test_claim_refuses_bad_types(changes, fragment):
    with pytest.raises(claims.ClaimError, match=fragment):
        claims.claim("c", "Table 1", "a statement", **{**_GOOD, **changes})


def test_validate_claims_refuses_bad_entries_and_duplicate_ids():
    good = claims.claim("a", "T1", "s", **_GOOD)
    with pytest.raises(claims.ClaimError, match="'id' must be a non-empty string"):
        claims.claim(" ", "T1", "s", **_GOOD)
    with pytest.raises(claims.ClaimError, match="missing keys \\['holds'\\]"):
        claims.validate_claims([{k: v for k, v in good.items() if k != "holds"}])
    with pytest.raises(claims.ClaimError, match="unknown keys \\['verdict'\\]"):
        claims.validate_claims([{**good, "verdict": "ok"}])
    with pytest.raises(claims.ClaimError, match="claim 1: duplicate id 'a'"):
        claims.validate_claims([good, {**good, "holds": True}])
    with pytest.raises(claims.ClaimError, match="list of dicts"):
        claims.validate_claims(good)
    assert claims.validate_claims([]) == []


# ----------------------------------------------------------------------------- runner


_MODULE = textwrap.dedent("""
    from pathlib import Path
    from bpfree.bench.claims import claim
    NAME = "ledger"
    DESCRIPTION = "A benchmark with claims."
    def run(quick):
        Path(__file__).with_name("ran.txt").write_text("ran")
        rows = [{"table": "t", "method": "m", "setting": "", "metric": "acc",
                 "value": 61.0, "paper": 64.7}]
        return rows, {"notes": "n", "claims": CLAIMS}
""")


def _bench_folder(folder: Path, claims_code: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    code = " ".join(claims_code.split())
    (folder / "ledger.py").write_text(_MODULE.replace("CLAIMS", code))
    return folder


_THREE_CLAIMS = """[
    claim("beats", "Table 7", "ours beats BP", paper=64.7, ours=rows[0]["value"],
          holds=rows[0]["value"] > 62),
    claim("close", "Table 7", "within 5 points", paper=64.7, ours=61.0, holds=True),
    claim("fig5", "Fig. 5", "layer-wise beats model-wise", paper="yes", ours=None, holds=None),
]"""


def test_claims_are_lifted_into_the_document(tmp_path):
    folder = _bench_folder(tmp_path / "benchmarks", _THREE_CLAIMS)
    out = tmp_path / "out" / "ledger.json"
    document = runner.run_benchmark("ledger", quick=True, json_path=out, directory=folder)
    on_disk = json.loads(out.read_text())
    assert on_disk == document
    assert list(on_disk)[-2:] == ["claims", "rows"]
    assert "claims" not in on_disk["extra"] and on_disk["extra"]["notes"] == "n"
    assert [c["holds"] for c in on_disk["claims"]] == [False, True, None]
    assert on_disk["git_revision"] is None and on_disk["dirty"] is False  # not a git checkout


@pytest.mark.parametrize(("code", "fragment"), [
    ("[claim('a', 'T', 's', paper=1, ours=2, holds=True)] * 2", "duplicate id 'a'"),
    ("[{'id': 'a', 'paper_ref': 'T', 'statement': 's', 'paper': 1, 'ours': 2, 'holds': 1}]",
     "'holds' must be True, False, 'not decided'"),
])
def test_bad_claims_fail_the_run_and_write_nothing(tmp_path, code, fragment):
    folder = _bench_folder(tmp_path / "benchmarks", code)
    out = tmp_path / "ledger.json"
    with pytest.raises(runner.BenchmarkError, match=fragment) as info:
        runner.run_benchmark("ledger", quick=True, json_path=out, directory=folder)
    assert "ledger.py" in str(info.value)
    assert not out.exists()


# ----------------------------------------------------------------------------- docs


def _document(name: str, quick: bool, claim_list: list[dict] | None, **more) -> dict:
    document = {"benchmark": name, "quick": quick, "device": "cpu", "seconds": 1.0,
                "versions": {}, "git_revision": "abc1234", "rows": [], **more}
    if claim_list is not None:
        document["claims"] = claim_list
    return document


def test_docs_open_with_the_claim_status_table(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    full = [claims.claim("a", "T4", "holds here", **{**_GOOD, "holds": True}),
            claims.claim("b", "T7", "fails here", **_GOOD)]
    quick = [claims.claim("a", "T4", "not run quick", paper=1.0, ours=None, holds=None)]
    (results / "pmt.json").write_text(json.dumps(_document("pmt", False, full, dirty=True)))
    (results / "pmt-quick.json").write_text(json.dumps(_document("pmt", True, quick)))
    (results / "plain.json").write_text(json.dumps(_document("plain", False, None)))
    out = tmp_path / "BENCHMARKS.md"
    report = docs.generate_docs(results, out)
    assert not report.skipped
    text = out.read_text()
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Claim status"
    # one verdict per claim: the full run's "a" replaces the quick run's
    assert "**2 claims: 1 hold, 1 fail.**" in text
    status = text[text.index("## Claim status"):text.index("## Overview")]
    assert "| pmt | full (dirty tree) | a | T4 | holds here | 64.7 | 60.1 | holds |" in status
    assert "| pmt | full (dirty tree) | b | T7 | fails here | 64.7 | 60.1 | fails |" in status
    assert "not run quick" not in status
    assert "| plain |" not in status  # no claims: not in the table
    assert "### pmt: claims (1 hold, 1 fail)" in text
    assert "### pmt: claims (0 hold, 0 fail, 1 not measured)" in text
    assert "- **Git revision:** abc1234 (dirty tree)" in text


def test_docs_mark_old_dirty_revisions_and_refuse_bad_claims(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "old.json").write_text(json.dumps(_document("old", False, None,
                                                           git_revision="f00-dirty")))
    bad = [{"id": "x", "paper_ref": "T", "statement": "s", "paper": 1, "ours": 1, "holds": "y"}]
    (results / "bad.json").write_text(json.dumps(_document("bad", False, bad)))
    report = docs.generate_docs(results, tmp_path / "B.md")
    assert "'holds' must be True, False, 'not decided'" in dict(report.skipped)["results/bad.json"]
    assert "- **Git revision:** f00 (dirty tree)" in (tmp_path / "B.md").read_text()


# ----------------------------------------------------------------------------- dirty trees


def _git(folder: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                   cwd=folder, check=True, capture_output=True)


@pytest.fixture
def dirty_checkout(tmp_path, monkeypatch) -> Path:
    """A git checkout whose benchmark file was changed after its commit."""
    repo = tmp_path / "repo"
    folder = _bench_folder(repo / "benchmarks", "[]")
    (repo / ".gitignore").write_text("ran.txt\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    with (folder / "ledger.py").open("a") as fh:
        fh.write("# an uncommitted change\n")
    monkeypatch.setenv(runner.ENV_VAR, str(folder))
    return folder


def test_dirty_tree_is_refused_before_the_run(dirty_checkout, tmp_path, capsys):
    out = tmp_path / "r.json"
    with pytest.raises(runner.DirtyTreeError, match="--allow-dirty"):
        runner.run_benchmark("ledger", quick=True, json_path=out)
    assert cli.main(["bench", "ledger", "--quick", "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--allow-dirty" in err and "uncommitted" in err
    assert not out.exists() and not (dirty_checkout / "ran.txt").exists()


def test_allow_dirty_marks_the_document(dirty_checkout, tmp_path):
    out = tmp_path / "r.json"
    assert cli.main(["bench", "ledger", "--quick", "--json", str(out), "--allow-dirty"]) == 0
    document = json.loads(out.read_text())
    assert document["dirty"] is True and len(document["git_revision"]) >= 4
    _git(dirty_checkout.parent, "commit", "-q", "-am", "second")
    clean = runner.run_benchmark("ledger", quick=True, json_path=tmp_path / "c.json")
    assert clean["dirty"] is False and clean["git_revision"] != document["git_revision"]


def test_benchmark_outputs_do_not_make_the_checkout_dirty(tmp_path):
    """A run writes results/ and docs/BENCHMARKS.md: the next run must still count as clean,
    while a change to code still counts."""
    from bpfree.bench.environment import git_state

    repo = tmp_path / "repo"
    folder = _bench_folder(repo / "benchmarks", "[]")
    (repo / "results").mkdir()
    (repo / "results" / "a.json").write_text("{}\n")
    (repo / "docs").mkdir()
    (repo / "docs" / "BENCHMARKS.md").write_text("# page\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    (repo / "results" / "a.json").write_text('{"new": 1}\n')
    (repo / "docs" / "BENCHMARKS.md").write_text("# regenerated\n")
    assert git_state(folder)[1] is False
    with (folder / "ledger.py").open("a") as fh:
        fh.write("# code\n")
    assert git_state(folder)[1] is True
