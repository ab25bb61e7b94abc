"""Federated PMT with a seed ledger: late clients replay, a killed server loses nothing."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bpfree.distributed import LedgerError, SeedLedger, late_client, run_federated
from bpfree.distributed.fleet import weights_digest
from bpfree.distributed.federated import KILL_ENV, bytes_per_round
from bpfree.pmt import PMTConfig

CONFIG = PMTConfig(queries=2, perturbation="wp", seed=7)
HEADER = {"test": "federated"}

# The same tiny run in this process and in a subprocess (the server that gets killed).
SETUP = textwrap.dedent("""
    import torch
    from bpfree.models import digits_mlp
    from bpfree.quant.ptq import quantize_model
    g = torch.Generator().manual_seed(0)
    x = torch.rand(80, 64, generator=g)
    y = torch.randint(0, 10, (80,), generator=g)
    torch.manual_seed(0)
    model = quantize_model(digits_mlp().eval(), x[:64], input_range=(0.0, 1.0))
""")


def _setup():
    scope: dict = {}
    exec(SETUP, scope)
    return scope["model"], scope["x"], scope["y"]


def _run(model, x, y, ledger, rounds=4):
    header = {"initial_sha256": weights_digest(model)}  # a ledger belongs to one start
    return run_federated(model, CONFIG, x, y, clients=3, rounds=rounds, batch_size=8, lr=0.5,
                         ledger_path=ledger, header=header)


def test_late_client_replays_to_the_server_digest(tmp_path):
    model, x, y = _setup()
    initial = copy.deepcopy(model)
    out = _run(model, x, y, tmp_path / "ledger.json")
    server = weights_digest(out["replica"].trainer.model)
    assert server != weights_digest(initial)
    for joined in (0, 2, 4):  # never there, missed the last two rounds, fully up to date
        late = late_client(initial, CONFIG, x[:1], out["ledger"], joined_at=joined)
        assert weights_digest(late.trainer.model) == server
    records = json.loads((tmp_path / "ledger.json").read_text())["rounds"]
    assert [r["round"] for r in records] == [0, 1, 2, 3]
    assert all(len(r["sums"]) == 2 * CONFIG.queries and r["count"] == 24 for r in records)


def test_ledger_is_append_only_and_checks_its_run(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = SeedLedger(path, HEADER)
    record = {"round": 0, "seed": 1, "lr": 0.1, "count": 4, "sums": [3, -2]}
    ledger.append(record)
    with pytest.raises(LedgerError, match="round 0 where round 1"):
        ledger.append(record)
    with pytest.raises(LedgerError, match="another run"):
        SeedLedger(path, {"test": "other"})
    assert SeedLedger(path, HEADER).records == [record]
    path.write_text("{not json")
    with pytest.raises(LedgerError, match="not a readable"):
        SeedLedger(path, HEADER)


def test_federated_refuses_node_perturbation(tmp_path):
    model, x, y = _setup()
    with pytest.raises(ValueError, match="perturbation='wp'"):
        run_federated(model, PMTConfig(queries=2, perturbation="np"), x, y, clients=2,
                      rounds=1, batch_size=8, lr=0.5, ledger_path=tmp_path / "l.json",
                      header=HEADER)


def test_bytes_per_round_are_seeds_and_scalars():
    b = bytes_per_round(layers=2, queries=10, trainable_values=4810, clients=4)
    assert b["up_per_client"] == 8 * 21 and b["down_per_client"] == 8 * 23
    assert b["fedavg_up_per_client"] == 4 * 4810


def test_killed_server_restarts_without_losing_a_committed_round(tmp_path):
    model, x, y = _setup()
    reference = weights_digest(_run(copy.deepcopy(model), x, y, tmp_path / "ref.json")
                               ["replica"].trainer.model)
    ledger = tmp_path / "ledger.json"
    script = SETUP + textwrap.dedent(f"""
        from bpfree.distributed import run_federated
        from bpfree.distributed.fleet import weights_digest
        from bpfree.pmt import PMTConfig
        run_federated(model, PMTConfig(queries=2, perturbation="wp", seed=7), x, y, clients=3,
                      rounds=4, batch_size=8, lr=0.5, ledger_path={str(ledger)!r},
                      header={{"initial_sha256": weights_digest(model)}})
    """)
    env = {**os.environ, KILL_ENV: "2", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"),
                                          os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", script], env=env, timeout=600)
    assert proc.returncode == -9  # SIGKILL mid-round 2: clients answered, nothing committed
    committed = ledger.read_bytes()
    assert [r["round"] for r in json.loads(committed)["rounds"]] == [0, 1]
    out = _run(copy.deepcopy(model), x, y, ledger)  # the restarted server
    assert out["replayed"] == 2 and out["rounds_run"] == 2
    assert weights_digest(out["replica"].trainer.model) == reference
    assert ledger.read_bytes() != committed
    assert json.loads(ledger.read_bytes())["rounds"][:2] == json.loads(committed)["rounds"]
