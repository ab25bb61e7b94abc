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
