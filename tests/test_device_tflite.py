"""`bpfree device export --model MODEL.tflite` (issue 33, Build 4): a converter-made int8 .tflite
becomes a C training engine, bit-exact with PMT on the loaded model, and `device run
--out-tflite` writes the trained weights into a copy of the file that LiteRT runs.

The fixtures: ``tests/data/converter_cnn.tflite``, made by TensorFlow's converter (SAME padding
as a PAD stage, a stride-2 convolution, an inverted residual with ADD, MEAN, a dense head),
and ``converter_style_file`` (tests/test_tflite.py): QUANTIZE / DEQUANTIZE edges, a
standalone PAD, a depth multiplier of 2, a residual ADD, average and max pooling, and
LiteRT's float-scale FULLY_CONNECTED.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bpfree import tflite as bt
from bpfree.cli import main
from bpfree.device import cyclic_batches, export_c, infer_c, run_c
from bpfree.device.mcu import missing_tools
from bpfree.device.tflite_model import SOURCE_FILE, training_model, written_back
from bpfree.pmt import PMTConfig, PMTTrainer
from bpfree.tflite.adapt import check_classifier
from bpfree.tflite.oracle import litert_available
from test_tflite import converter_style_file

HAS_CC = any(shutil.which(c) for c in ("cc", "gcc", "clang"))
needs_cc = pytest.mark.skipif(not HAS_CC, reason="no C compiler (cc, gcc or clang) on PATH")
MISSING_M7 = missing_tools()
STEPS, BATCH, QUERIES, SEED, LR = 8, 8, 2, 1, 0.5


CONVERTER_CNN = Path(__file__).parent / "data" / "converter_cnn.tflite"


def _data(n: int = 32, shape=(3, 8, 8), classes: int = 5):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-128, 128, (n, *shape), generator=g, dtype=torch.int8)
    return x, torch.randint(0, classes, (n,), generator=g)


def _simulated(data: bytes, x, y, trainable=None):
    """The simulator's PMT on the loaded file (device-exact arithmetic), with the program's
    defaults: Q = 2, seed 1; the per-step integer loss sums and the trained model."""
    model = training_model(bt.from_bytes(data))
    trainer = PMTTrainer(model, PMTConfig(queries=QUERIES, seed=SEED, device_exact=True),
                         example=x[:2], trainable=trainable)
    sums = [trainer.step(x[i], y[i], LR)["loss_fixed"]
            for i in cyclic_batches(len(x), STEPS, BATCH)]
    return sums, trainer.model


def _fixture(name: str) -> bytes:
    return (CONVERTER_CNN.read_bytes() if name == "converter_cnn"
            else converter_style_file(0, signed=True))


def _export_and_run(tmp_path: Path, data: bytes, target: str):
    """`device export --target TARGET` of the file and 8 `device run` steps with
    --out-tflite, through the CLI; the data, the run's JSON and the written-back file."""
    (tmp_path / "model.tflite").write_bytes(data)
    loaded = bt.from_bytes(data)
    x, y = _data(shape=loaded.input_shape, classes=check_classifier(loaded))
    np.savez(tmp_path / "data.npz", x=x.numpy(), y=y.numpy())
    prog, out = tmp_path / f"prog-{target}", tmp_path / f"trained-{target}.tflite"
    assert main(["device", "export", "--model", str(tmp_path / "model.tflite"), "--target",
                 target, "--out", str(prog), "--batch-size", str(BATCH)]) == 0
    assert (prog / SOURCE_FILE).read_bytes() == data
    assert main(["device", "run", str(prog), "--data", str(tmp_path / "data.npz"), "--steps",
                 str(STEPS), "--batch-size", str(BATCH), "--lr", str(LR), "--samples",
                 str(len(x)), "--json", str(tmp_path / f"run-{target}.json"),
                 "--no-rate-check", "--out-tflite", str(out)]) == 0
    return x, y, json.loads((tmp_path / f"run-{target}.json").read_text()), out


def _check_written_back(data: bytes, out: Path, trained, x, patched_in_place: bool) -> None:
    """The written-back file holds the simulator's trained weights, and LiteRT computes on it
    what the trained model computes."""
    adapted = bt.load(out)
    ours, theirs = adapted.state_dict(), bt.from_bytes(data).state_dict()
    for key, value in trained.state_dict().items():
        assert torch.equal(ours[key], value), f"{key} differs from the simulator's"
    assert any(not torch.equal(ours[k], theirs[k]) for k in theirs), "training changed nothing"
    if patched_in_place:  # only weight and bias bytes differ
        assert len(out.read_bytes()) == len(data)
    if litert_available():
        from bpfree.tflite.oracle import LiteRT

        litert = LiteRT(out.read_bytes())
        if litert.interpreter.get_input_details()[0]["dtype"] == np.int8:  # a rebuilt graph
            want, got = adapted.forward_int(x[:16]).numpy(), litert(x[:16])
        else:  # the patched file: floats in (QUANTIZE edge) and out
            xf = adapted.input_quant.dequantize(x[:16])
            assert torch.equal(adapted.quantize_input(xf), x[:16])
            with torch.no_grad():
                want = adapted(xf).numpy()
            got = litert(xf)
        np.testing.assert_array_equal(got.reshape(want.shape), want)


@needs_cc
@pytest.mark.parametrize("fixture", ["converter_cnn", "converter_style"])
def test_tflite_export_runs_8_steps_bit_exact_and_writes_back_a_file_litert_runs(tmp_path,
                                                                                  fixture):
    data = _fixture(fixture)
    x, y, run, out = _export_and_run(tmp_path, data, "host")
    sums, trained = _simulated(data, x, y)
    assert run["loss_sums"] == sums
    _check_written_back(data, out, trained, x, fixture == "converter_style")


@needs_cc
def test_tflite_program_inference_and_sparse_block_match_the_loaded_model(tmp_path):
    data = converter_style_file(1, signed=True)
    model = training_model(bt.from_bytes(data))
    x, y = _data(16)
    config = PMTConfig(queries=QUERIES, seed=SEED, device_exact=True)
    names = [layer.name for layer in PMTTrainer(model, config, example=x[:2]).layers]
    trainer = PMTTrainer(model, config, example=x[:2], trainable=names[1:3])
    program = export_c(trainer, tmp_path / "prog", max_batch=BATCH, source_tflite=data)
    assert torch.equal(infer_c(program, x), model.forward_int(x))
    result = run_c(program, x, y, steps=STEPS, batch_size=BATCH, lr=LR)
    sums, trained = _simulated(data, x, y, trainable=names[1:3])
    assert result.loss_sums == sums
    for key, value in trained.state_dict().items():
        assert torch.equal(result.model.state_dict()[key], value), key
    assert bt.from_bytes(written_back(data, result.model)).state_dict().keys() == \
        trained.state_dict().keys()


def test_tflite_export_refuses_what_it_cannot_train(tmp_path, capsys):
    (tmp_path / "bad.tflite").write_bytes(b"TFL3 not a flatbuffer")
    assert main(["device", "export", "--model", str(tmp_path / "bad.tflite"), "--out",
                 str(tmp_path / "p")]) != 0
    assert not (tmp_path / "p").exists()
    (tmp_path / "m.tflite").write_bytes(converter_style_file(0))
    assert main(["device", "export", "--model", str(tmp_path / "m.tflite"), "--out",
                 str(tmp_path / "q"), "--sparse", "--block", "4"]) == 0
    # --out-tflite on a program without the source file names the problem
    from bpfree.device.tflite_model import write_tflite

    (tmp_path / "q" / SOURCE_FILE).unlink()
    with pytest.raises(ValueError, match="not exported from a .tflite"):
        write_tflite(tmp_path / "q", training_model(bt.from_bytes(converter_style_file(0))),
                     tmp_path / "o.tflite")
    capsys.readouterr()


@needs_cc
@pytest.mark.skipif(bool(MISSING_M7), reason=f"cortex-m7 toolchain missing: {MISSING_M7}")
@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["converter_cnn", "converter_style"])
def test_tflite_program_8_steps_bit_exact_on_emulated_cortex_m7(tmp_path, fixture):
    """Issue 33, Done when: the file through `device export --target cortex-m7`, 8 steps on
    the emulated M7 equal to the simulator's and to the host program's (losses and every
    integer weight), and the M7-trained file runs in LiteRT."""
    data = _fixture(fixture)
    x, y, m7, out = _export_and_run(tmp_path, data, "cortex-m7")
    _, _, host, host_out = _export_and_run(tmp_path, data, "host")
    sums, trained = _simulated(data, x, y)
    assert m7["loss_sums"] == sums == host["loss_sums"]
    assert bt.load(out).state_dict().keys() == bt.load(host_out).state_dict().keys()
    for key, value in bt.load(host_out).state_dict().items():
        assert torch.equal(bt.load(out).state_dict()[key], value), f"{key}: M7 != host"
    _check_written_back(data, out, trained, x, fixture == "converter_style")
