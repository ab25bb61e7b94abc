"""Issue 34, the device surface: hostile or careless files and options given to
``bpfree device export|run|report`` and :class:`~bpfree.device.DeviceProgram` are refused with
an error naming the problem; no file is unpickled and nothing reads past a C buffer."""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading

import pytest
import torch

from bpfree.cli import main
from bpfree.data import load_digits_split
from bpfree.device import export_c
from bpfree.device.export import DeviceProgram
from bpfree.device.model_file import ModelFileError, load_model, save_model
from bpfree.device.run import build_host_library, run_c
from bpfree.device.validate import ProgramError
from bpfree.models import digits_mlp
from bpfree.pmt import PMTConfig, PMTTrainer
from bpfree.quant import quantize_model

needs_cc = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                              reason="no C compiler")


class _Payload:
    """Unpickling this runs a shell command (the attack of issue 34, finding 2)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def digits():
    x, y, _, _ = load_digits_split(0)
    return torch.tensor(x[:64]), torch.tensor(y[:64])


@pytest.fixture(scope="module")
def program_dir(tmp_path_factory, digits):
    x, _ = digits
    torch.manual_seed(0)
    model = quantize_model(digits_mlp().eval(), x, input_range=(0.0, 1.0))
    trainer = PMTTrainer(model, PMTConfig(queries=2, seed=3, device_exact=True), example=x[:2])
    out = tmp_path_factory.mktemp("device") / "prog"
    export_c(trainer, out, max_batch=8)
    return out


def _copy(program_dir, tmp_path):
    dst = tmp_path / "prog"
    shutil.copytree(program_dir, dst, ignore=shutil.ignore_patterns("build"))
    return dst


def test_a_pickled_payload_is_refused_and_never_run(tmp_path, capsys, program_dir):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save(_Payload(marker), evil)
    assert main(["device", "export", "--model", str(evil), "--out", str(tmp_path / "o")]) == 2
    assert "not a safe bpfree integer model" in capsys.readouterr().err
    # the same payload as a program's own model.pt: run and report refuse it too
    prog = _copy(program_dir, tmp_path)
    shutil.copy(evil, prog / "model.pt")
    for argv in (["device", "run", str(prog), "--data", "digits", "--steps", "1"],
                 ["device", "report", str(prog)]):
        assert main(argv) == 2
        assert "not a safe bpfree integer model" in capsys.readouterr().err
    assert not marker.exists()
    assert not (tmp_path / "o").exists()


def test_a_saved_model_round_trips_through_the_restricted_loader(tmp_path, digits):
    x, _ = digits
    torch.manual_seed(0)
    model = quantize_model(digits_mlp().eval(), x, input_range=(0.0, 1.0))
    save_model(model, tmp_path / "m.pt")
    back = load_model(tmp_path / "m.pt")
    with torch.no_grad():
        assert torch.equal(back(x), model(x))
    torch.save({"not": "a model"}, tmp_path / "d.pt")
    with pytest.raises(ModelFileError, match="not a bpfree QuantizedModel"):
        load_model(tmp_path / "d.pt")
    (tmp_path / "junk.pt").write_bytes(b"\x00" * 100)
    with pytest.raises(ModelFileError, match="not a safe bpfree integer model"):
        load_model(tmp_path / "junk.pt")


@pytest.mark.parametrize("key, value, match", [
    ("classes", 1000, "'classes' is 1000 but the program's model has 10 outputs"),
    ("classes", 2, "'classes' is 2 but"),
    ("classes", -1, "'classes' must be an int"),
    ("sample_shape", [16], "'sample_shape' .* does not fit|disagrees"),
    ("sample_shape", [1, 8, 8], "'sample_shape' .* does not fit|disagrees"),
    ("sample_shape", "64", "'sample_shape' must be a list"),
    ("max_batch", 0, "'max_batch' must be an int"),
    ("max_samples", 2**40, "'max_samples' must be an int"),
    ("target", "gpu", "'target' must be one of"),
])
def test_an_edited_program_json_is_refused_before_any_c_runs(tmp_path, program_dir, key, value,
                                                             match):
    prog = _copy(program_dir, tmp_path)
    meta = json.loads((prog / "program.json").read_text())
    meta[key] = value
    (prog / "program.json").write_text(json.dumps(meta))
    with pytest.raises(ProgramError, match=match):
        DeviceProgram.load(prog)


def test_a_broken_program_json_names_the_file(tmp_path, program_dir):
    prog = _copy(program_dir, tmp_path)
    (prog / "program.json").write_text("[" * 100_000)
    with pytest.raises(ProgramError, match="program.json"):
        DeviceProgram.load(prog)


@needs_cc
def test_concurrent_builds_of_one_program_do_not_share_a_temporary(tmp_path, program_dir):
    prog = DeviceProgram.load(_copy(program_dir, tmp_path))
    errors = []

    def build():
        try:
            build_host_library(prog)
        except Exception as err:  # noqa: BLE001 - collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [p.name for p in (prog.path / "build").iterdir()] == ["libbpfree.so"]


@needs_cc
def test_float_and_out_of_range_labels_are_refused_at_the_ctypes_boundary(program_dir, digits):
    x, y = digits
    with pytest.raises(ValueError, match="labels must lie in"):
        run_c(program_dir, x[:8], torch.full((8,), 10), steps=1, batch_size=8, lr=0.1)
    with pytest.raises(ValueError, match="integer class labels"):
        run_c(program_dir, x[:8], y[:8].float() + 0.5, steps=1, batch_size=8, lr=0.1)


@pytest.mark.parametrize("extra, match", [
    (["--max-samples", "0"], "--max-samples must lie in"),
    (["--max-samples", "-3"], "--max-samples must lie in"),
    (["--queries", "100000000"], "--queries must lie in"),
    (["--batch-size", "1000000000"], "--batch-size must lie in"),
    (["--seed", str(2**70)], "--seed must be an integer in [0, 9223372036854775807]"),
])
def test_export_options_are_bounded_before_any_work(tmp_path, capsys, extra, match):
    assert main(["device", "export", "--model", "digits-mlp", "--out", str(tmp_path / "p"),
                 *extra]) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("extra, match", [
    (["--samples", "-5"], "--samples must lie in"),
    (["--samples", "0"], "--samples must lie in"),
    (["--steps", "-1"], "--steps must lie in"),
    (["--batch-size", "0"], "--batch-size must lie in"),
])
def test_run_options_are_bounded(program_dir, capsys, extra, match):
    assert main(["device", "run", str(program_dir), "--data", "digits", *extra]) == 2
    assert match in capsys.readouterr().err


def test_export_onto_an_existing_directory_says_so(tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    assert main(["device", "export", "--model", "digits-mlp", "--out",
                 str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "file name inside it" not in err


def test_the_project_directory_gets_the_umask_mode(program_dir):
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE(program_dir.stat().st_mode) == 0o777 & ~mask


def test_a_fifo_as_data_or_model_is_refused_not_waited_on(tmp_path, capsys, program_dir):
    fifo = tmp_path / "fifo.npz"
    os.mkfifo(fifo)
    assert main(["device", "run", str(program_dir), "--data", str(fifo)]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert main(["device", "export", "--model", str(fifo), "--out", str(tmp_path / "p")]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_run_json_never_overwrites_the_data_or_the_program(tmp_path, capsys, program_dir, digits):
    import numpy as np

    x, y = digits
    data = tmp_path / "d.npz"
    np.savez(data, x=x.numpy(), y=y.numpy())
    before = data.read_bytes()
    assert main(["device", "run", str(program_dir), "--data", str(data), "--json",
                 str(data)]) == 2
    assert "would overwrite the input --data" in capsys.readouterr().err
    assert data.read_bytes() == before
    meta = (program_dir / "program.json").read_bytes()
    assert main(["device", "report", str(program_dir), "--json",
                 str(program_dir / "program.json")]) == 2
    assert "would overwrite the input DIR" in capsys.readouterr().err
    assert (program_dir / "program.json").read_bytes() == meta
