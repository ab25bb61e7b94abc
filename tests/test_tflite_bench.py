"""The claim ledger of benchmarks/tflite.py (`bpfree bench tflite`): each verdict follows the
rows it is given."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from bpfree.bench.claims import validate_claims

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("_bench_tflite", ROOT / "benchmarks" / "tflite.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _rows(exact=(100.0, 100.0), trip=(1.0, 1.0), adapt=((40.0, 60.0), (20.0, 30.0))):
    rows = []
    for i, (e, t) in enumerate(zip(exact, trip)):
        rows.append({"table": bench.EXACT, "method": f"m{i}", "setting": "s",
                     "metric": "identical output values (%)", "value": e, "paper": None})
        rows.append({"table": bench.EXACT, "method": f"m{i}", "setting": "s",
                     "metric": "load(save(m)) identical (1 = yes)", "value": t, "paper": None})
    for i, (b, a) in enumerate(adapt):
        for metric, v in (("LiteRT accuracy before (%)", b), ("LiteRT accuracy after (%)", a)):
            rows.append({"table": bench.ADAPT, "method": f"bpfree adapt --method x{i}",
                         "setting": f"fog: run {i}", "metric": metric, "value": v,
                         "paper": None})
    return rows


def _verdicts(rows):
    claims = bench.ledger(rows)
    validate_claims(claims)
    return {c["id"]: c["holds"] for c in claims}


def test_every_claim_holds_when_the_rows_meet_it():
    assert _verdicts(_rows()) == {"tflite-litert-exact": True, "tflite-round-trip": True,
                                  "tflite-adapt-raises-accuracy": True}


def test_one_mismatching_value_one_failed_round_trip_or_one_flat_adaptation_fails_its_claim():
    assert _verdicts(_rows(exact=(100.0, 99.9)))["tflite-litert-exact"] is False
    assert _verdicts(_rows(trip=(1.0, 0.0)))["tflite-round-trip"] is False
    flat = _verdicts(_rows(adapt=((40.0, 60.0), (20.0, 20.0))))
    assert flat == {"tflite-litert-exact": True, "tflite-round-trip": True,
                    "tflite-adapt-raises-accuracy": False}


def test_no_rows_measure_nothing_and_hold_nothing():
    claims = bench.ledger([])
    # no adaptation rows (a quick run without MNIST): that claim reads "not measured", which
    # `bpfree bench` also says on the terminal (issue 35), not "fails"
    assert [c["holds"] for c in claims] == [False, False, None]
    assert all(c["ours"] is None or c["ours"] == "0/0 models" for c in claims)
