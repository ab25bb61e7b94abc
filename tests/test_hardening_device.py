"""Issue 34, the device surface: hostile or careless files and options given to
``bpfree device export|run|report`` and :class:`~bpfree.device.DeviceProgram` are refused with
an error naming the problem; no file is unpickled and nothing reads past a C buffer."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import threading

import numpy as np
import pytest
import torch

from bpfree.cli import main
from bpfree.data import load_digits_split
from bpfree.device import export_c
from bpfree.device.export import DeviceProgram
from bpfree.device.mcu import main_defines
from bpfree.device.model_file import ModelFileError, load_model, save_model
from bpfree.device.run import HOST_CFLAGS, build_host_library, find_compiler, run_c
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


# --------------------------------------------------- the compiled host driver (main.c) itself

def _defines(**sizes):
    """The Makefile's DEFS (main_defines), with ``sizes`` edited as a user might."""
    return [f"-DBPFREE_{k}={v}" for k, v in sizes.items()]


@pytest.fixture(scope="module")
def driver_objects(tmp_path_factory, program_dir):
    """model.o and bpfree_runtime.o of the program, compiled once with the Makefile's flags:
    only main.c takes the -D sizes, so each driver below compiles just main.c and links."""
    prog = tmp_path_factory.mktemp("driver") / "prog"
    shutil.copytree(program_dir, prog, ignore=shutil.ignore_patterns("build"))
    for name in ("model", "bpfree_runtime"):
        subprocess.run([find_compiler(), *HOST_CFLAGS, "-c", "-o", f"{name}.o", f"{name}.c"],
                       cwd=prog, check=True, capture_output=True)
    return prog


def _link_driver(prog, out, defs):
    subprocess.run([find_compiler(), *HOST_CFLAGS, *defs, "-o", str(out), str(prog / "main.c"),
                    str(prog / "model.o"), str(prog / "bpfree_runtime.o"), "-lm"],
                   cwd=prog, check=True, capture_output=True)
    return out


def _drive(driver, cwd, *args):
    proc = subprocess.run([str(driver), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    return proc.returncode, proc.stderr


def _write_train(path, xs, ys, *, steps=1, batch=8, lr=0.1, n=None, numel=None):
    head = np.array([len(xs) if n is None else n, xs.shape[1] if numel is None else numel,
                     steps, batch], dtype=np.int32)
    path.write_bytes(head.tobytes() + np.float64(lr).tobytes() + xs.tobytes()
                     + np.asarray(ys, dtype=np.int32).tobytes())


@pytest.fixture(scope="module")
def driver(driver_objects):
    """The host driver as the program's Makefile builds it (its DEFS: main_defines)."""
    meta = json.loads((driver_objects / "program.json").read_text())
    assert f"DEFS = {' '.join(main_defines(meta, mcu=False))}" in \
        (driver_objects / "Makefile").read_text()
    return _link_driver(driver_objects, driver_objects / "train",
                        main_defines(meta, mcu=False))


@pytest.fixture(scope="module")
def int8_digits(digits, program_dir):
    x, y = digits
    program = DeviceProgram.load(program_dir)
    xs = program.model.input_quant.quantize(x).numpy().reshape(len(x), -1)
    return np.ascontiguousarray(xs), y.numpy().astype(np.int32)


@needs_cc
def test_the_host_driver_trains_bit_exactly_like_the_library(tmp_path, driver, program_dir,
                                                             digits, int8_digits):
    # the checks refuse nothing valid: the driver's integer loss sums and weights are run_c's
    xs, ys = int8_digits
    _write_train(tmp_path / "train.bin", xs, ys, steps=3, batch=8, lr=0.1)
    rc, err = _drive(driver, tmp_path, "train", "train.bin", "losses.bin", "weights.bin")
    assert (rc, err) == (0, "")
    sums = np.frombuffer((tmp_path / "losses.bin").read_bytes(), dtype=np.int64).tolist()
    x, y = digits
    result = run_c(program_dir, x, y, steps=3, batch_size=8, lr=0.1)
    assert sums == result.loss_sums
    want = b"".join(m.weight.numpy().astype(np.int8).tobytes()
                    + m.bias.numpy().astype(np.int32).tobytes()
                    for m in (dict(result.model.named_modules())[r["name"]]
                              for r in DeviceProgram.load(program_dir).meta["trainable"]))
    assert (tmp_path / "weights.bin").read_bytes() == want


@needs_cc
@pytest.mark.parametrize("edit, match", [
    (dict(ys_at=(3, 10)), "label 10 of sample 3 lies outside [0, 9]"),
    (dict(ys_at=(0, -1)), "label -1 of sample 0 lies outside [0, 9]"),
    (dict(ys_at=(63, 2**31 - 1)), "label 2147483647 of sample 63 lies outside [0, 9]"),
    (dict(numel=16), "samples hold 16 values; the model takes 64"),
    (dict(n=257), "holds 257 samples; this program reads 1 to 256"),
    (dict(n=-5), "holds -5 samples; this program reads 1 to 256"),
    (dict(batch=9), "batch must lie in [1, 8], got 9"),
    (dict(batch=0), "batch must lie in [1, 8], got 0"),
    (dict(steps=-1), "steps must be >= 0, got -1"),
    (dict(lr=float("nan")), "learning rate must be finite and >= 0, got nan"),
    (dict(lr=-0.5), "learning rate must be finite and >= 0, got -0.5"),
    (dict(n=200), "the training file is truncated"),
    (dict(cut=10), "shorter than its 24-byte header"),
])
def test_the_host_driver_refuses_an_edited_training_file(tmp_path, driver, int8_digits, edit,
                                                         match):
    xs, ys = int8_digits
    ys = ys.copy()
    if "ys_at" in edit:
        i, label = edit.pop("ys_at")
        ys[i] = label
    cut = edit.pop("cut", None)
    _write_train(tmp_path / "train.bin", xs, ys, **edit)
    if cut is not None:
        (tmp_path / "train.bin").write_bytes((tmp_path / "train.bin").read_bytes()[:cut])
    rc, err = _drive(driver, tmp_path, "train", "train.bin", "losses.bin", "weights.bin")
    assert rc == 1, f"exit {rc} (negative: killed by a signal): {err}"
    assert match in err and err.startswith("bpfree device program: ")
    assert not (tmp_path / "weights.bin").exists()


@needs_cc
def test_the_host_driver_refuses_an_edited_inference_file_and_mode(tmp_path, driver,
                                                                   int8_digits):
    xs, _ = int8_digits
    for head, match in (([8, 65], "samples hold 65 values; the model takes 64"),
                        ([0, 64], "must hold >= 1 sample, got 0"),
                        ([100, 64], "truncated: it declares 100 samples")):
        (tmp_path / "infer.bin").write_bytes(np.array(head, dtype=np.int32).tobytes()
                                             + xs[:8].tobytes())
        rc, err = _drive(driver, tmp_path, "infer", "infer.bin", "logits.bin")
        assert rc == 1 and match in err, (rc, err)
    rc, err = _drive(driver, tmp_path, "fit", "train.bin")
    assert rc == 2 and "unknown mode 'fit': the first argument must be train or infer" in err


@needs_cc
@pytest.mark.parametrize("sizes, match", [
    (dict(CLASSES=1000), "built with BPFREE_CLASSES=1000 but the model has 10 outputs"),
    (dict(CLASSES=2), "built with BPFREE_CLASSES=2 but the model has 10 outputs"),
    (dict(SAMPLE_BYTES=16), "built with BPFREE_SAMPLE_BYTES=16 but the model takes 64"),
    (dict(SAMPLE_BYTES=4096), "built with BPFREE_SAMPLE_BYTES=4096 but the model takes 64"),
    (dict(MAX_BATCH=4096), "built with BPFREE_MAX_BATCH=4096 but the arena holds 1 to 8"),
    (dict(MICRO_BATCH=4), "built with BPFREE_MICRO_BATCH=4 but the model's micro-batch is 0"),
])
def test_a_driver_built_with_edited_sizes_refuses_to_run(tmp_path, driver_objects, int8_digits,
                                                         sizes, match):
    # an edited Makefile, or -D sizes taken from an edited program.json, would size main.c's
    # buffers wrongly: the driver compares them with the model's own before reading anything
    meta = json.loads((driver_objects / "program.json").read_text())
    good = dict(SAMPLE_BYTES=64, CLASSES=10, MAX_SAMPLES=meta["max_samples"],
                MAX_BATCH=meta["max_batch"], MICRO_BATCH=0)
    assert _defines(**good) == main_defines(meta, mcu=False)
    driver = _link_driver(driver_objects, tmp_path / "train", _defines(**{**good, **sizes}))
    xs, ys = int8_digits
    _write_train(tmp_path / "train.bin", xs, ys)
    for args in (["train", "train.bin", "losses.bin", "weights.bin"],
                 ["infer", "train.bin", "logits.bin"]):
        rc, err = _drive(driver, tmp_path, *args)
        assert rc == 1, f"exit {rc} (negative: killed by a signal): {err}"
        assert match in err
    assert not (tmp_path / "losses.bin").exists() and not (tmp_path / "logits.bin").exists()
