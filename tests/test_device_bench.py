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
                "fits": fits, "arena": 150 * KB, "arena_fixed": 10 * KB, "weights": 300 * KB,
                "largest": {"name": "body.16", "mode": "np", "d_w": 160000, "cout": 1000},
                "inference": 140 * KB, "analytic": None, "analytic_parts": None,
                "macs": 10**9, "layerwise_macs": 95 * 10**7, "layers": 3}
    return {"full": one(full_kb, full_fits), "sparse": one(sparse_kb, sparse_fits)}


def _measures(**kw):
    per_mac = kw.get("insns_per_mac", 2.5)
    # projected / inference: steps of 50 and 300 inferences, 9.5 s and 57 s at 190 ms each,
    # below Tables 9 and 8's latencies (9.94 s, 72.8 s)
    instructions = {"sparse": {"q1": 2e9, "q2": 3e9, "projected": 50 * per_mac * 1.6e8,
                               "inference": per_mac * 1.6e8, "exact": kw.get("emu_exact", True),
                               "kernels": {"pointwise": 2e8, "depthwise": 1e8},
                               "kernel_macs": {"pointwise": 1.2e8, "depthwise": 0.4e8},
                               "batch": 1},
                    "full": {"q1": 4e9, "q2": 6e9, "projected": 300 * 4e8, "inference": 4e8,
                             "exact": True}}
    host = {"mlp": {"c": 0.01, "sim": kw.get("mlp_sim", 0.02), "exact": True, "steps": 5,
                    "repeats": 3},
            "sparse": {"c": 0.1, "sim": 0.3, "exact": kw.get("host_exact", True), "steps": 1,
                       "repeats": 3}}
    trace = {"counted": 1000, "traced": 1000 - kw.get("trace_gap", 8)}
    return instructions, host, trace


def _accuracy(float64=(90.0, 92.0, 91.0), exact=(91.0, 90.0, 92.0), before=10.0,
              rates=(0.3,), validation=None):
    """A measure_accuracy result: per-seed test accuracies of each path at every rate;
    ``validation`` maps a rate to both paths' validation accuracy (default 50)."""
    runs = [{"path": path, "lr": lr, "seed": seed, "test": test,
             "validation": (validation or {}).get(lr, 50.0), "seconds": 1.0}
            for lr in rates for path, tests in (("float64", float64), ("device-exact", exact))
            for seed, test in enumerate(tests, 1)]
    return {"rates": list(rates), "runs": runs, "before": {"test": before, "validation": 9.0}}


def _ledger(memory=None, accuracy=None, **kw):
    summary = device._accuracy_summary(accuracy or _accuracy())
    claims = device._claims(memory or _memory(), *_measures(**kw), summary)
    validate_claims(claims)
    return {c["id"]: c["holds"] for c in claims}


def test_every_claim_holds_when_the_measures_meet_them():
    assert set(_ledger().values()) == {True}


@pytest.mark.parametrize("memory, kw, failing", [
    (_memory(full_fits=False, full_kb=1100), {}, {"device-full-fits-h7b3", "device-full-668"}),
    (_memory(sparse_fits=False, sparse_kb=400), {},
     {"device-sparse-fits-256", "device-sparse-209"}),
    (None, {"insns_per_mac": 3.2}, {"device-inference-3-insns-per-mac"}),
    (_memory(full_kb=700), {}, {"device-full-668"}),
    (_memory(sparse_kb=210), {}, {"device-sparse-209"}),
    (None, {"host_exact": False}, {"device-host-bit-exact"}),
    (None, {"emu_exact": False}, {"device-emulator-bit-exact"}),
    (None, {"trace_gap": 200}, {"device-counter-trace"}),
    (None, {"macs_over_floor": 1.2}, {"device-sparse-macs-layerwise"}),
    (None, {"mlp_sim": 0.005}, {"device-host-faster"}),
    # means 91 and 93 with std 1 each over 3 seeds: SE = sqrt(2/3) = 0.82, 2 SE = 1.63 < 2
    (None, {"accuracy": _accuracy(exact=(93.0, 92.0, 94.0))}, {"device-exact-accuracy"}),
    (None, {"accuracy": _accuracy(exact=(89.0, 88.0, 90.0))}, {"device-exact-accuracy"}),
    (None, {"accuracy": _accuracy(before=90.5)}, {"device-exact-learns"}),
    (None, {"accuracy": _accuracy(before=90.0)}, {"device-exact-learns"}),
])
def test_a_failed_measure_fails_exactly_its_claims(memory, kw, failing):
    if memory is None and "macs_over_floor" in kw:
        memory = _memory()
        memory["sparse"]["macs"] = int(kw.pop("macs_over_floor") * memory["sparse"]
                                       ["layerwise_macs"])
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
    instructions["sparse"]["step_macs"] = instructions["sparse"]["projected"] / 4
    rows = device._instruction_rows(instructions)
    sparse = next(s for s in device.PROGRAMS if s.key == "sparse").label
    latency = next(r for r in rows if r["metric"].startswith("projected step latency")
                   and r["method"] == sparse)
    projected = instructions["sparse"]["projected"]
    assert latency["value"] == pytest.approx(projected / 4e8 * 0.190)
    at_216 = next(r for r in rows if "216 MHz" in r["metric"] and r["method"] == sparse)
    assert at_216["value"] == pytest.approx(projected / 216e6)
    per_mac = {r["metric"]: r["value"] for r in rows if r["table"].startswith("instructions per")}
    assert per_mac["pointwise: instructions per MAC"] == pytest.approx(2e8 / 1.2e8)
    assert per_mac["whole inference: instructions per MAC"] == pytest.approx(2.5)
    step = next(r for r in rows if r["metric"] == "per step at Q=50: instructions per MAC")
    assert step["value"] == pytest.approx(4.0)
    assert latency["paper"] == pytest.approx(9.939)


def test_within_seed_noise_is_welchs_two_standard_errors():
    # variances 1 (3 seeds) and 2 (2 seeds): SE = sqrt(1/3 + 2/2); means 2 and 2 + shift
    se = (1 / 3 + 2 / 2) ** 0.5
    for shift, holds in ((2 * se - 0.01, True), (2 * se + 0.01, False), (-2 * se - 0.01, False)):
        out = device.within_seed_noise([1.0, 2.0, 3.0], [1.0 + shift, 3.0 + shift])
        assert out["diff"] == pytest.approx(shift)
        assert out["se"] == pytest.approx(se)
        assert out["holds"] is holds
    assert device.within_seed_noise([5.0, 5.0], [5.0, 5.0])["holds"]  # 0 <= 0
    assert not device.within_seed_noise([5.0, 5.0], [5.5, 5.5])["holds"]
    with pytest.raises(ValueError, match=">= 2 seeds"):
        device.within_seed_noise([1.0], [1.0, 2.0])


def test_the_rate_is_chosen_on_validation_over_both_paths_then_tested():
    acc = _accuracy(rates=(0.1, 0.3, 1.0), validation={0.1: 60.0, 0.3: 70.0, 1.0: 70.0})
    for r in acc["runs"]:  # 0.3 and 1.0 tie on the pooled mean: the smaller wins
        if r["lr"] != 0.3:
            r["test"] += 5.0  # test accuracy plays no part in the choice
    s = device._accuracy_summary(acc)
    assert s["lr"] == 0.3
    assert s["paths"]["float64"]["mean"] == pytest.approx(91.0)
    assert s["paths"]["float64"]["std"] == pytest.approx(1.0)
    assert s["paths"]["device-exact"]["worst"] == 90.0
    assert s["diff"] == pytest.approx(0.0) and s["holds"]
    rows = device._accuracy_rows({**acc, "model": "digits-mlp", "queries": 10, "batch": 64,
                                  "schedule": "cosine", "epochs": 20, "seeds": [1, 2, 3]}, s)
    chosen = {r["setting"] for r in rows if r["metric"] == "chosen (1 = yes)" and r["value"]}
    assert chosen == {"lr=0.3"}
    before = next(r for r in rows if r["method"].startswith("before"))
    assert before["value"] == 10.0


def test_rule_terms_pair_every_part_and_sum_to_both_totals():
    m = _memory()["full"]
    parts = {"parameters": 400 * KB, "trainable_copy": 0, "activations": 140 * KB,
             "gradient_buffers": 600 * KB, "optimizer_state": 0, "seeds_losses": 200,
             "saved_activations": 60 * KB}
    m.update(analytic_parts=parts, analytic=sum(parts.values()))
    terms = device.rule_terms(m)
    *body, (_, rule_total, linked_total) = terms
    assert rule_total == m["analytic"] == sum(rule for _, rule, _ in body)
    assert linked_total == m["data"] + m["bss"] == sum(linked for _, _, linked in body)
    estimate = next(t for t in terms if t[0].startswith("estimate"))
    assert estimate[1:] == (600 * KB + 200, m["arena_fixed"])
    assert device._term_note(m).count("KB") >= 6
    m["analytic_parts"] = {**parts, "optimizer_state": 8}
    m["analytic"] += 8
    other = next(t for t in device.rule_terms(m) if t[0].startswith("other"))
    assert other[1:] == (8, 0) and "optimizer_state" in other[0]


def test_tables_8_9_macs_and_latency_are_judged_on_the_linked_program():
    """PMT Tables 8-9's MACs and latency: the program's counted MACs and its latency projected
    at 190 ms per inference, each at most 10 % above the paper's; no program, not measured."""
    full = _memory()["full"]
    step = {"projected": 300 * 4e8, "inference": 4e8}
    ok = {c["id"]: c["holds"] for c in device._table_claims("full", "Table 8", full, step)}
    assert ok == {"device-full-macs-table8": True, "device-full-latency-table8": True}
    heavy = dict(full, macs=int(1.11 * 7857.5e6))
    slow = dict(step, projected=step["inference"] * 1.11 * 72.839 / 0.19)
    bad = {c["id"]: c["holds"] for c in device._table_claims("full", "Table 8", heavy, slow)}
    assert bad == {"device-full-macs-table8": False, "device-full-latency-table8": False}
    missing = device._table_claims("sparse", "Table 9", None, None)
    assert [c["holds"] for c in missing] == [None, None]

