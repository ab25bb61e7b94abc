"""The claim ledger of benchmarks/device.py (`bpfree bench device`): each verdict follows the
measurements it is given, and its rows carry the paper's figures where it has them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from bpfree.bench.claims import validate_claims

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("_bench_device", ROOT / "benchmarks" / "device.py")
device = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = device  # its dataclasses resolve annotations through it
_spec.loader.exec_module(device)
KB = 1024


def _memory(full_kb=600.0, sparse_kb=200.0, full_fits=True, sparse_fits=True):
    def one(kb, fits):
        return {"text": 800 * KB, "data": 100 * KB, "bss": int(kb * KB) - 100 * KB,
                "fits": fits, "arena": 150 * KB, "weights": 300 * KB,
                "inference": 140 * KB, "analytic": None, "macs": 10**9, "layers": 3}
    return {"full": one(full_kb, full_fits), "sparse": one(sparse_kb, sparse_fits)}


def _measures(**kw):
    instructions = {"sparse": {"q1": 2e9, "q2": 3e9, "projected": 51e9, "inference": 4e8,
                               "exact": kw.get("emu_exact", True)}}
    host = {"mlp": {"c": 0.01, "sim": kw.get("mlp_sim", 0.02), "exact": True, "steps": 5,
                    "repeats": 3},
            "sparse": {"c": 0.1, "sim": 0.3, "exact": kw.get("host_exact", True), "steps": 1,
                       "repeats": 3}}
    trace = {"counted": 1000, "traced": 1000 - kw.get("trace_gap", 8)}
    return instructions, host, trace


def _ledger(memory=None, **kw):
    claims = device._claims(memory or _memory(), *_measures(**kw))
    validate_claims(claims)
    return {c["id"]: c["holds"] for c in claims}


def test_every_claim_holds_when_the_measures_meet_them():
    assert set(_ledger().values()) == {True}


@pytest.mark.parametrize("memory, kw, failing", [
    (_memory(full_fits=False, full_kb=1100), {}, {"device-full-fits-h7b3", "device-full-668"}),
    (_memory(sparse_fits=False, sparse_kb=400), {},
     {"device-sparse-fits-320", "device-sparse-209"}),
    (_memory(full_kb=700), {}, {"device-full-668"}),
    (_memory(sparse_kb=210), {}, {"device-sparse-209"}),
    (None, {"host_exact": False}, {"device-host-bit-exact"}),
    (None, {"emu_exact": False}, {"device-emulator-bit-exact"}),
    (None, {"trace_gap": 200}, {"device-counter-trace"}),
    (None, {"mlp_sim": 0.005}, {"device-host-faster"}),
])
def test_a_failed_measure_fails_exactly_its_claims(memory, kw, failing):
    verdicts = _ledger(memory, **kw)
    assert {k for k, v in verdicts.items() if not v} == failing


def test_rows_carry_the_papers_figures_for_mcunet():
    memory = _memory()
    rows = device._memory_rows(memory)
    paper = {(r["method"], r["metric"]): r["paper"] for r in rows}
    full = next(s for s in device.PROGRAMS if s.key == "full").label
    assert paper[(full, "data + bss = SRAM used (KB)")] == 668.0
    assert paper[(full, "trainable weights in SRAM (KB)")] == 478.0
    assert paper[(full, "inference-only activations (KB)")] == 190.0
    instructions, _, _ = _measures()
    rows = device._instruction_rows(instructions)
    latency = next(r for r in rows if r["metric"].startswith("projected step latency"))
    assert latency["value"] == pytest.approx(51e9 / 4e8 * 0.190)
    assert latency["paper"] == pytest.approx(9.939)
