"""Device defaults that work (issue 35): export refuses a program that cannot fit its MCU, and
`device run` checks or chooses its learning rate on the program itself."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from bpfree.cli import main
from bpfree.data import load_digits_split
from bpfree.device.export import DeviceProgram
from bpfree.device.fit import memory_floor
from bpfree.device.mcu import STACK_HEAP_BYTES, missing_tools
from bpfree.device.rate import LADDER, check_rate, choose_rate, probe_rate

needs_cc = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                              reason="no C compiler")
needs_m7 = pytest.mark.skipif(bool(missing_tools()), reason="cortex-m7 toolchain missing: "
                              "`make device-toolchain`")


@pytest.fixture(scope="module")
def program_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("defaults") / "prog"
    assert main(["device", "export", "--model", "digits-mlp", "--out", str(out), "--seed", "3",
                 "--batch-size", "16"]) == 0
    return out


@pytest.fixture(scope="module")
def digits():
    x, y, _, _ = load_digits_split(0)
    return torch.tensor(x[:64]), torch.tensor(y[:64])


def _nothing_written(folder) -> bool:
    return not any(folder.iterdir())


def test_export_refuses_an_sram_below_the_programs_floor_and_writes_nothing(tmp_path, capsys):
    # host target, no toolchain needed: the bound from the arena plan alone
    out = tmp_path / "out"
    assert main(["device", "export", "--model", "digits-mlp", "--out", str(out / "p"),
                 "--sram-kib", "4"]) == 2
    err = capsys.readouterr().err
    assert "cannot fit the MCU" in err and "--sram-kib 4" in err and "--sparse" in err
    assert not out.exists() or _nothing_written(out)


@needs_m7
def test_cortex_m7_export_links_and_refuses_what_overflows(tmp_path, capsys):
    assert main(["device", "export", "--model", "digits-mlp", "--target", "cortex-m7",
                 "--out", str(tmp_path / "fits")]) == 0
    text = capsys.readouterr().out
    assert "links into SRAM 1024 KiB" in text
    program = DeviceProgram.load(tmp_path / "fits")
    assert (tmp_path / "fits" / "build" / "program.elf").is_file()  # linked once, kept
    # one KiB less than the floor (arena, copies, buffers, stack and heap): the linker, which
    # also places libc, must refuse it (the floor is a lower bound: the next test)
    kib = memory_floor(program.meta, program.model)["sram"] // 1024
    assert main(["device", "export", "--model", "digits-mlp", "--target", "cortex-m7",
                 "--out", str(tmp_path / "small" / "p"), "--sram-kib", str(kib)]) == 2
    err = capsys.readouterr().err
    assert f"does not link into the MCU (SRAM {kib} KiB" in err and "RAM overflowed by" in err
    assert not (tmp_path / "small").exists() or _nothing_written(tmp_path / "small")


@needs_m7
def test_the_memory_floor_is_below_what_the_linker_places(tmp_path):
    from bpfree.device.mcu import build_elf, size_of

    assert main(["device", "export", "--model", "digits-mlp", "--target", "cortex-m7",
                 "--out", str(tmp_path / "p"), "--batch-size", "4", "--max-samples", "8"]) == 0
    program = DeviceProgram.load(tmp_path / "p")
    sizes = size_of(build_elf(program))
    floor = memory_floor(program.meta, program.model)
    assert STACK_HEAP_BYTES < floor["sram"] <= sizes["data"] + sizes["bss"] + STACK_HEAP_BYTES
    assert floor["flash"] <= sizes["text"] + sizes["data"]


@needs_cc
def test_a_rate_that_blows_up_or_does_nothing_is_refused(program_dir, digits):
    x, y = digits
    program = DeviceProgram.load(program_dir)
    # on this untrained model even 1e4 lowers the batch's loss, but it throws weights across
    # most of the int8 range in one step
    with pytest.raises(ValueError, match="--lr 10000 is too large") as info:
        check_rate(program, x, y, 16, 1e4)
    assert "took the first batch's loss from" in str(info.value)
    assert int(str(info.value).split("the farthest by ")[1].split()[0]) > 127
    with pytest.raises(ValueError, match="--lr 1e-09 is too small.*moved 0 int8"):
        check_rate(program, x, y, 16, 1e-9)
    assert check_rate(program, x, y, 16, 0.0).moved == 0  # lr 0: no training, as asked


@needs_cc
def test_run_without_lr_chooses_one_that_passes_and_reports_it(program_dir, digits, tmp_path,
                                                               capsys):
    x, y = digits
    program = DeviceProgram.load(program_dir)
    lr, probes = choose_rate(program, x, y, 16)
    assert lr in LADDER and probes[-1].verdict == "ok" and probes[-1].lr == lr
    assert all(p.verdict != "ok" for p in probes[:-1])
    # the probe is the run's own first two steps on the first batch (deterministic)
    again = probe_rate(program, x, y, 16, lr)
    assert (again.loss_before, again.loss_after, again.moved) == (
        probes[-1].loss_before, probes[-1].loss_after, probes[-1].moved)
    assert main(["device", "run", str(program_dir), "--data", "digits", "--steps", "3",
                 "--batch-size", "16", "--json", str(tmp_path / "run.json")]) == 0
    assert f"lr {lr:g} (chosen" in capsys.readouterr().out
    assert json.loads((tmp_path / "run.json").read_text())["lr"] == lr
    assert main(["device", "run", str(program_dir), "--data", "digits", "--steps", "1",
                 "--batch-size", "16", "--lr", "1e4"]) == 2
    assert "too large" in capsys.readouterr().err
    assert main(["device", "run", str(program_dir), "--data", "digits", "--steps", "1",
                 "--batch-size", "16", "--lr", "1e4", "--no-rate-check"]) == 0
    assert main(["device", "run", str(program_dir), "--data", "digits", "--lr", "nan"]) == 2
    assert "--lr must be a finite number" in capsys.readouterr().err
