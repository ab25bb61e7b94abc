"""The claim ledger (bpfree.bench.claims) and its place in the result document."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bpfree.bench.claims import claim, validate_claims
from bpfree.bench.runner import BenchmarkError, run_benchmark


def test_claim_accepts_numpy_bools_and_refuses_typed_verdicts():
    c = claim("a", "Table 1", "x beats y", paper=1.0, ours=np.float64(2.0),
              holds=np.bool_(True))
    assert c["holds"] is True and c["ours"] == 2.0 and isinstance(c["ours"], float)
    assert claim("b", "T", "s", paper=None, ours=None, holds=None)["holds"] is None
    with pytest.raises(ValueError, match="holds"):
        claim("c", "T", "s", paper=1, ours=1, holds="yes")
    with pytest.raises(ValueError, match="holds"):
        claim("c", "T", "s", paper=1, ours=1, holds=1)
    with pytest.raises(ValueError, match="id"):
        claim("", "T", "s", paper=1, ours=1, holds=True)
    with pytest.raises(ValueError, match="ours"):
        claim("c", "T", "s", paper=1, ours=[1], holds=True)


def test_validate_claims_refuses_duplicates_and_missing_keys():
    good = claim("a", "T", "s", paper=1, ours=2, holds=False)
    assert validate_claims([good]) == [good]
    with pytest.raises(ValueError, match="duplicate"):
        validate_claims([good, dict(good)])
    with pytest.raises(ValueError, match="keys"):
        validate_claims([{"id": "x"}])
    with pytest.raises(ValueError, match="list"):
        validate_claims({"id": "x"})


def _write_bench(tmp_path, claims_src: str):
    (tmp_path / "ledger.py").write_text(
        "NAME = 'ledger'\nDESCRIPTION = 'ledger test'\n"
        "def run(quick):\n"
        "    rows = [{'table': 't', 'method': 'm', 'setting': 's', 'metric': 'accuracy (%)',"
        " 'value': 3.0, 'paper': 2.0}]\n"
        "    v = rows[0]['value'] > rows[0]['paper']\n"
        f"    return rows, {{'claims': {claims_src}}}\n")


def test_runner_lifts_the_ledger_to_the_document(tmp_path):
    _write_bench(tmp_path, "[{'id': 'c1', 'paper_ref': 'T1', 'statement': 'ours > paper', "
                           "'paper': 2.0, 'ours': 3.0, 'holds': v}]")
    out = tmp_path / "r.json"
    doc = run_benchmark("ledger", quick=True, json_path=out, directory=tmp_path)
    saved = json.loads(out.read_text())
    assert saved["claims"] == doc["claims"] and saved["claims"][0]["holds"] is True
    assert "claims" not in saved.get("extra", {})


def test_runner_refuses_a_bad_ledger_and_writes_nothing(tmp_path):
    _write_bench(tmp_path, "[{'id': 'c1'}]")
    out = tmp_path / "r.json"
    with pytest.raises(BenchmarkError, match="keys"):
        run_benchmark("ledger", quick=True, json_path=out, directory=tmp_path)
    assert not out.exists()


def _doc(benchmark, quick, claims, **extra):
    return {"benchmark": benchmark, "quick": quick, "device": "cpu", "seconds": 1.0,
            "versions": {"torch": "x"}, "rows": [], "claims": claims, **extra}


def test_docs_open_with_the_claim_status_across_benchmarks(tmp_path):
    from bpfree.bench.docs import generate_docs

    results = tmp_path / "results"
    results.mkdir()
    a = [claim("a1", "Table 1", "first", paper=1.0, ours=2.0, holds=True),
         claim("a2", "Table 2", "second", paper="x", ours="y", holds=False, note="why")]
    b = [claim("b1", "Fig. 3", "third", paper=None, ours=None, holds=None)]
    (results / "a.json").write_text(json.dumps(_doc("alpha", False, a, git_revision="abc",
                                                    dirty=True)))
    (results / "b.json").write_text(json.dumps(_doc("beta", True, b)))
    out = tmp_path / "BENCHMARKS.md"
    generate_docs(results, out)
    text = out.read_text()
    status = text.index("## Claim status")
    assert status < text.index("## Overview") < text.index("## alpha")
    assert "**2 hold" not in text and "**1 hold, 1 fail, 1 not measured.**" in text
    table = text[status:text.index("## Overview")]
    assert "`a2`" in table and "**fails**" in table and "_why_" in table
    assert "full (dirty tree)" in table and "| quick |" in table
    assert "abc (dirty tree)" in text  # the revision line of the dirty run
    assert "### alpha: claim ledger" in text


def test_docs_skip_a_result_with_a_bad_ledger_or_nan_seconds(tmp_path):
    from bpfree.bench.docs import generate_docs

    results = tmp_path / "results"
    results.mkdir()
    (results / "bad.json").write_text(json.dumps(_doc("x", True, [{"id": "c"}])))
    nan = _doc("y", True, [])
    nan["seconds"] = float("nan")
    (results / "nan.json").write_text(json.dumps(nan))
    report = generate_docs(results, tmp_path / "B.md")
    skipped = dict(report.skipped)
    assert set(skipped) == {"results/bad.json", "results/nan.json"}
    assert "keys" in skipped["results/bad.json"] and "finite" in skipped["results/nan.json"]


def _git_checkout(tmp_path):
    import subprocess

    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    (repo / "results").mkdir()
    _write_bench(repo / "benchmarks", "[]")
    run = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True,  # noqa: E731
                                    capture_output=True)
    run("init", "-q")
    run("-c", "user.email=t@t", "-c", "user.name=t", "add", "-A")
    run("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")
    return repo


def test_a_dirty_checkout_may_not_write_into_results(tmp_path):
    repo = _git_checkout(tmp_path)
    bench = repo / "benchmarks"
    clean = run_benchmark("ledger", quick=True, json_path=repo / "results" / "a.json",
                          directory=bench)
    assert clean["dirty"] is False and not clean["git_revision"].endswith("-dirty")
    (bench / "ledger.py").write_text((bench / "ledger.py").read_text() + "\n# edited\n")
    target = repo / "results" / "b.json"
    with pytest.raises(BenchmarkError, match="--allow-dirty"):
        run_benchmark("ledger", quick=True, json_path=target, directory=bench)
    assert not target.exists()
    elsewhere = run_benchmark("ledger", quick=True, json_path=tmp_path / "c.json",
                              directory=bench)
    assert elsewhere["dirty"] is True
    forced = run_benchmark("ledger", quick=True, json_path=target, directory=bench,
                           allow_dirty=True)
    assert forced["dirty"] is True and json.loads(target.read_text())["dirty"] is True


def test_cli_refuses_a_dirty_result_with_exit_2(tmp_path, monkeypatch, capsys):
    from bpfree import cli

    repo = _git_checkout(tmp_path)
    bench = repo / "benchmarks"
    (bench / "ledger.py").write_text((bench / "ledger.py").read_text() + "\n# edited\n")
    monkeypatch.setenv("BPFREE_BENCHMARKS", str(bench))
    target = repo / "results" / "x.json"
    assert cli.main(["bench", "ledger", "--quick", "--json", str(target)]) == 2
    assert "--allow-dirty" in capsys.readouterr().err and not target.exists()
    assert cli.main(["bench", "ledger", "--quick", "--json", str(target),
                     "--allow-dirty"]) == 0
