"""Issue 34, the remaining findings: the fleet launcher's SIGKILL escalation, the seed
ledger's checksum and errors, the checkpoint clean-up race, FIFOs and deep nesting, bad labels
and negative schedules."""

from __future__ import annotations

import ast
import json
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from bpfree import io
from bpfree.baselines.bp import BPTrainer
from bpfree.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from bpfree.distributed import LedgerError, SeedLedger
from bpfree.distributed.fleet import FleetOptions, build_setup, weights_digest
from bpfree.distributed.launch import _wait, load_setup
from bpfree.restricted_load import UnsafeFileError
from test_hardening_device import _Payload
from bpfree.harness import fit

# ------------------------------------------------------------------------------- fleet


def test_a_stopped_worker_is_killed_after_the_timeout_not_waited_on():
    """A SIGSTOPped worker ignores SIGTERM until continued; the launcher must SIGKILL it, or
    multiprocessing's exit handler joins it for ever."""
    ctx = mp.get_context("fork")
    failed = ctx.Process(target=sys.exit, args=(1,), daemon=True)
    stopped = ctx.Process(target=time.sleep, args=(600,), daemon=True)
    failed.start()
    stopped.start()
    os.kill(stopped.pid, signal.SIGSTOP)
    start = time.monotonic()
    try:
        _wait([failed, stopped], timeout_s=0.2, margin_s=0.1, grace_s=0.5)
    finally:
        if stopped.is_alive():  # never leave it behind, whatever happened
            os.kill(stopped.pid, signal.SIGKILL)
            stopped.join(5)
    assert not stopped.is_alive()
    assert stopped.exitcode == -signal.SIGKILL
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("method", ["pmt", "zo"])
def test_the_fleet_setup_round_trips_through_the_restricted_loader(tmp_path, method):
    setup = build_setup(FleetOptions(method=method))
    torch.save(setup, tmp_path / "setup.pt")
    back = load_setup(tmp_path / "setup.pt")
    assert set(back) == set(setup)
    for key in ("model", "float_model"):
        assert weights_digest(back[key]) == weights_digest(setup[key])
    assert all(torch.equal(back[k], setup[k]) for k in ("x", "y", "x_test", "y_test"))
    with torch.no_grad():
        assert torch.equal(back["model"](setup["x"][:8]), setup["model"](setup["x"][:8]))


def test_a_crafted_fleet_setup_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"model": _Payload(marker), "x": torch.zeros(1)}, tmp_path / "setup.pt")
    with pytest.raises(UnsafeFileError, match="fleet setup: .*setup.pt is not a safe fleet"):
        load_setup(tmp_path / "setup.pt")
    assert not marker.exists()
    torch.save({"x": torch.zeros(1)}, tmp_path / "partial.pt")
    with pytest.raises(UnsafeFileError, match="must hold a dict with the keys"):
        load_setup(tmp_path / "partial.pt")


def test_no_torch_load_in_src_can_unpickle():
    """Every ``torch.load`` under src/ passes ``weights_only=True`` literally (issue 34: no
    user file is ever unpickled; a private path today is a user's path tomorrow)."""
    src = Path(__file__).resolve().parents[1] / "src"
    calls = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "load" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "torch"):
                safe = any(k.arg == "weights_only" and isinstance(k.value, ast.Constant)
                           and k.value.value is True for k in node.keywords)
                calls.append((f"{path.relative_to(src)}:{node.lineno}", safe))
    assert calls, "found no torch.load at all: the scan is looking in the wrong place"
    assert [c for c, safe in calls if not safe] == []


def test_only_signed_pickles_are_unpickled_in_src():
    """``pickle.load(s)`` and ``pickle.Unpickler`` appear only where the bytes passed
    bpfree.signed_pickle's check first: the module itself and the epoch snapshots (whose
    method blob sits inside a signed payload)."""
    src = Path(__file__).resolve().parents[1] / "src"
    allowed = {"bpfree/signed_pickle.py", "bpfree/checkpoint/resume.py"}
    found = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "pickle"
                    and node.attr in ("load", "loads", "Unpickler")):
                found.append(str(path.relative_to(src)))
    assert "bpfree/signed_pickle.py" in found, "the scan is looking in the wrong place"
    assert sorted(set(found) - allowed) == []


# ------------------------------------------------------------------------------- ledger

HEADER = {"run": "test"}
RECORD = {"round": 0, "seed": 1, "lr": 0.1, "count": 4, "sums": [3, -2]}


def _ledger(tmp_path):
    path = tmp_path / "ledger.json"
    SeedLedger(path, HEADER).append(dict(RECORD))
    return path


def test_one_flipped_sum_is_caught_by_the_checksum(tmp_path):
    path = _ledger(tmp_path)
    doc = json.loads(path.read_text())
    doc["rounds"][0]["sums"][0] = 4  # silently replayed before
    path.write_text(json.dumps(doc))
    with pytest.raises(LedgerError, match=f"{path}: the checksum does not match"):
        SeedLedger(path, HEADER)


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.pop("rounds"), "'rounds' must be a list"),
    (lambda d: d.__setitem__("rounds", {"0": 1}), "'rounds' must be a list"),
    (lambda d: d["rounds"][0].pop("sums"), "checksum does not match|must hold exactly"),
    (lambda d: d.__setitem__("format", 7), "not a seed ledger"),
    (lambda d: d.__setitem__("header", [[[[]]]]), "checksum does not match"),
])
def test_ledger_errors_name_the_file(tmp_path, edit, match):
    path = _ledger(tmp_path)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(LedgerError, match=match) as err:
        SeedLedger(path, HEADER)
    assert str(path) in str(err.value)


def test_a_deeply_nested_or_fifo_ledger_names_the_file(tmp_path):
    path = tmp_path / "ledger.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(LedgerError, match=f"{path}: not a readable JSON ledger"):
        SeedLedger(path, HEADER)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(LedgerError, match="not a regular file"):
        SeedLedger(fifo, HEADER)


def test_a_record_with_wrong_types_names_the_file(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = SeedLedger(path, HEADER)
    for bad in ({**RECORD, "sums": 5}, {**RECORD, "lr": "fast"}, {**RECORD, "seed": 1.5}):
        with pytest.raises(LedgerError, match=str(path)):
            ledger.append(bad)


# ------------------------------------------------------------------------------- checkpoints


def test_cleanup_never_removes_a_live_writers_temporary(tmp_path):
    """The race of issue 34: a load deleted the temporary a concurrent save was writing."""
    import fcntl

    path = tmp_path / "ck.safetensors"
    live = tmp_path / f".{path.name}.0123456789ab.tmp"
    fd = os.open(live, os.O_WRONLY | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what atomic_write_bytes holds while it writes
    os.write(fd, b"partial")
    old = time.time() - 3600
    os.utime(live, (old, old))
    dead = tmp_path / f".{path.name}.ba9876543210.tmp"
    dead.write_bytes(b"left by a kill")
    try:
        assert io.remove_stale_temporaries(path) == [dead]
        assert live.exists()
    finally:
        os.close(fd)
    assert io.remove_stale_temporaries(path) == [live]  # its writer is gone now


def test_concurrent_saves_and_loads_never_lose_the_checkpoint(tmp_path):
    path = tmp_path / "ck.safetensors"
    state = {"w": torch.arange(2_000_000, dtype=torch.float32)}  # 8 MB: a save takes a while
    save_checkpoint(path, model_state=state, extra={"step": 0})
    errors, stop = [], threading.Event()

    def saver():
        try:
            for step in range(1, 9):
                save_checkpoint(path, model_state=state, extra={"step": step})
        except Exception as err:  # noqa: BLE001 - collected and asserted below
            errors.append(err)
        finally:
            stop.set()

    def loader():
        try:
            while not stop.is_set():
                load_checkpoint(path)
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=saver), threading.Thread(target=loader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert load_checkpoint(path).extra == {"step": 8}


def test_checkpoint_fifo_and_deep_nesting_are_clear_errors(tmp_path):
    fifo = tmp_path / "ck.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointError, match="not a regular file"):
        load_checkpoint(fifo)
    deep: list = []
    node = deep
    for _ in range(100_000):
        node.append([])
        node = node[0]
    with pytest.raises(ValueError, match="nested too deeply"):
        save_checkpoint(tmp_path / "deep.safetensors", extra={"deep": deep})
    assert not (tmp_path / "deep.safetensors").exists()


def test_a_checkpoint_with_deeply_nested_metadata_is_a_clear_error_on_load(tmp_path):
    """The issue's RecursionError on load: metadata nested 100,000 deep, with a digest that
    matches (an editor's file, not a bit flip), is a CheckpointError naming the file."""
    from bpfree.checkpoint.format import _K_DIGEST, _K_SKELETON, _digest

    path = tmp_path / "ck.safetensors"
    save_checkpoint(path, model_state={"w": torch.zeros(2)}, extra={"step": 1})
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    meta = header["__metadata__"]
    skeleton = json.loads(meta[_K_SKELETON])
    skeleton["extra"] = "@@DEEP@@"
    meta[_K_SKELETON] = json.dumps(skeleton).replace('"@@DEEP@@"', "[" * 100_000 + "]" * 100_000)
    meta[_K_DIGEST] = _digest(meta)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + size:])
    with pytest.raises(CheckpointError, match=f"checkpoint {path} is corrupt: .*nested too deeply"
                                              f"|checkpoint {path} is corrupt: unreadable"):
        load_checkpoint(path)


# ------------------------------------------------------------------------------- labels


def _trainer():
    torch.manual_seed(0)
    return BPTrainer(nn.Linear(4, 3), "sgd")


@pytest.mark.parametrize("labels, match", [
    (torch.tensor([0, 1, 5, 2]), "out of range"),
    (torch.tensor([0, -1, 1, 2]), r"class indices >= 0, got -1 at index \(1,\)"),
    (torch.tensor([0.0, 1.0, 2.0, 1.0]), "integer class indices"),
    (torch.tensor([0.0, float("nan"), 2.0, 1.0]), r"non-finite value nan at index \(1,\)"),
    (torch.tensor([True, False, True, False]), "bool"),
])
def test_bad_labels_are_value_errors_naming_them(labels, match):
    with pytest.raises(ValueError, match=match):
        fit(_trainer(), torch.randn(4, 4), labels, epochs=1, batch_size=4, lr=0.1)


def test_a_negative_schedule_is_refused_not_ascended():
    with pytest.raises(ValueError, match=r"schedule returned -1 at step 0.*ascend"):
        fit(_trainer(), torch.randn(4, 4), torch.tensor([0, 1, 2, 0]), epochs=1, batch_size=4,
            lr=0.1, schedule=lambda t: -1)


@pytest.mark.parametrize("argv", [["fleet"], ["demo"]])
def test_a_huge_seed_is_a_usage_error_for_every_command(argv, capsys):
    from bpfree.cli import main

    assert main([*argv, "--seed", str(2**70)]) == 2
    err = capsys.readouterr().err
    assert "--seed must be an integer in [0, " in err and "Overflow" not in err
