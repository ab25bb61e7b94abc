"""`bpfree adapt`: adapting a .tflite end to end, its report, its errors and exit codes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bpfree import tflite as bt
from bpfree.cli import main
from test_qzoff_integer import _shifted_task
from test_tflite import _file, quantized, small_mlp


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A quantized MLP saved as .tflite and a learnable 5-class task as .npz."""
    root = tmp_path_factory.mktemp("adapt")
    bt.save(quantized(small_mlp, (20,), seed=3), root / "model.tflite", input_shape=(20,))
    g = torch.Generator().manual_seed(0)
    x = torch.rand(500, 20, generator=g)
    np.savez(root / "data.npz", x=x.numpy(), y=x[:, :5].argmax(-1).numpy())
    (root / "tanh.tflite").write_bytes(_file(tflite_op("TANH")))
    data, xs, ys = _shifted_task()  # a trained model and a shifted domain it must adapt to
    (root / "trained.tflite").write_bytes(data)
    np.savez(root / "shifted.npz", x=xs.numpy(), y=ys.numpy())
    return root


def tflite_op(name: str) -> int:
    from bpfree.tflite.schema import tflite

    return getattr(tflite.BuiltinOperator, name)


def test_adapt_raises_validation_accuracy_and_writes_a_loadable_file(files, tmp_path, capsys):
    out, report = tmp_path / "adapted.tflite", tmp_path / "report.json"
    rc = main(["adapt", str(files / "model.tflite"), "--data", str(files / "data.npz"),
               "--out", str(out), "--epochs", "10", "--lr", "0.2", "--quiet",
               "--json", str(report)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "validation accuracy" in text and "forward passes" in text
    doc = json.loads(report.read_text())
    assert doc["validation"] == 100 and doc["train"] == 400
    assert doc["val_accuracy_after"] > doc["val_accuracy_before"] + 10
    assert doc["forwards"] > 0 and doc["loss_last"] < doc["loss_first"]
    memory = doc["device_memory_bytes"]  # PMT rule: int8 weights, activations, seeds
    assert 0 < memory["batch_1"] < memory["batch_64"]
    assert "analytic device memory" in text
    adapted = bt.load(out)
    x = torch.from_numpy(np.load(files / "data.npz")["x"])
    assert not torch.equal(adapted(x), bt.load(files / "model.tflite")(x))


def test_adapt_pmt_sparse_trains_one_block(files, tmp_path):
    out, report = tmp_path / "adapted.tflite", tmp_path / "report.json"
    rc = main(["adapt", str(files / "model.tflite"), "--data", str(files / "data.npz"),
               "--out", str(out), "--method", "pmt-sparse", "--epochs", "2", "--lr", "0.2",
               "--quiet", "--json", str(report)])
    assert rc == 0
    doc = json.loads(report.read_text())
    chosen = doc["selection"]["blocks"][doc["selection"]["chosen"] - 1]
    assert doc["trained_layers"] == chosen
    assert doc["forwards"] > doc["selection"]["forwards"]


def test_adapt_qzo_ff_raises_validation_accuracy_with_int8_codes(files, tmp_path, capsys):
    out, report = tmp_path / "adapted.tflite", tmp_path / "report.json"
    rc = main(["adapt", str(files / "trained.tflite"), "--data", str(files / "shifted.npz"),
               "--out", str(out), "--method", "qzo-ff", "--epochs", "5", "--batch-size", "32",
               "--lr", "0.03", "--quiet", "--json", str(report)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "qzo-ff, 5 epoch(s), m=3" in text and "(qzo-ff rule" in text
    doc = json.loads(report.read_text())
    assert doc["val_accuracy_after"] >= doc["val_accuracy_before"] + 8
    assert doc["loss_last"] < doc["loss_first"]
    assert doc["queries"] == 3 and doc["eps_codes"] == 1 and 0 < doc["max_step_codes"] <= 254
    assert doc["forwards"] == 2 * 3 * 400 * 5  # 2m passes of every training sample, 5 epochs
    assert doc["trained_layers"] == ["body.0", "body.1"]
    assert doc["frozen_biases"] == []
    memory = doc["device_memory_bytes"]  # QZO-FF's `ff` rule at 1 byte per value
    assert 0 < memory["batch_1"] < memory["batch_32"]
    original, adapted = bt.load(files / "trained.tflite"), bt.load(out)
    for a, b in zip(original.body, adapted.body):  # new int8 codes, the file's own scales
        assert a.weight_quant == b.weight_quant and a.input_quant == b.input_quant
        assert b.weight.dtype == torch.int8 and not torch.equal(a.weight, b.weight)


def test_qzo_ff_hyper_parameters_are_refused_before_training(files, tmp_path, capsys,
                                                            monkeypatch):
    from bpfree.tflite import adapt as adapt_module

    def no_training(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(adapt_module, "fit", no_training)

    def run(*extra):
        return main(["adapt", str(files / "trained.tflite"), "--data",
                     str(files / "shifted.npz"), "--out", str(tmp_path / "o.tflite"),
                     "--quiet", *extra])

    for extra, match in [
        (["--method", "qzo-ff", "--lr", "1e-7"], "learning rate 1e-07 is too small"),
        (["--method", "qzo-ff", "--lr", "10"], "learning rate 10 is too large"),
        (["--method", "qzo-ff", "--eps-codes", "0"], "--eps-codes must be >= 1"),
        (["--method", "qzo-ff", "--eps-codes", "40"], r"must be an int in [1, 36]"),
        (["--method", "pmt", "--eps-codes", "2"], "--eps-codes applies to --method qzo-ff"),
        (["--method", "qzo-ff", "--queries", "0"], "--queries must be >= 1"),
    ]:
        assert run(*extra) == 2, extra
        err = capsys.readouterr().err
        assert match in err, (extra, err)
        assert "validation accuracy" not in err
    assert not (tmp_path / "o.tflite").exists()


def test_a_failure_during_training_leaves_the_output_untouched(files, tmp_path, capsys,
                                                               monkeypatch):
    from bpfree.tflite import adapt as adapt_module

    def failing_fit(*args, **kwargs):
        raise FloatingPointError("non-finite loss in the clean forward; model unchanged")

    monkeypatch.setattr(adapt_module, "fit", failing_fit)
    out = tmp_path / "adapted.tflite"
    out.write_bytes(b"previous")
    for method in ("pmt", "qzo-ff"):
        rc = main(["adapt", str(files / "trained.tflite"), "--data", str(files / "shifted.npz"),
                   "--out", str(out), "--method", method, "--quiet", "--json",
                   str(tmp_path / "r.json")])
        assert rc == 1
        assert f"adaptation failed, {out} not written" in capsys.readouterr().err
        assert out.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapted.tflite"]  # no temp, no json


def test_unsupported_operator_is_refused_before_training(files, tmp_path, capsys):
    out = tmp_path / "adapted.tflite"
    out.write_bytes(b"previous")
    rc = main(["adapt", str(files / "tanh.tflite"), "--data", str(files / "data.npz"),
               "--out", str(out), "--quiet"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "operator 0 (TANH)" in err and "unsupported operator" in err
    assert out.read_bytes() == b"previous"
    corrupt = tmp_path / "corrupt.tflite"
    corrupt.write_bytes((files / "model.tflite").read_bytes()[:200])
    assert main(["adapt", str(corrupt), "--data", str(files / "data.npz"), "--out", str(out),
                 "--quiet"]) == 1
    assert out.read_bytes() == b"previous"


@pytest.mark.parametrize("extra, match", [
    (["--epochs", "0"], "--epochs must be >= 1"),
    (["--queries", "0"], "--queries must be >= 1"),
    (["--validation", "1.5"], "--validation must lie in"),
    (["--lr", "nan"], "--lr must be"),
])
def test_bad_options_are_usage_errors(files, tmp_path, capsys, extra, match):
    rc = main(["adapt", str(files / "model.tflite"), "--data", str(files / "data.npz"),
               "--out", str(tmp_path / "o.tflite"), *extra])
    assert rc == 2 and match in capsys.readouterr().err
    assert not (tmp_path / "o.tflite").exists()


def test_bad_data_and_missing_files_are_usage_errors(files, tmp_path, capsys):
    def run(data, model=files / "model.tflite"):
        return main(["adapt", str(model), "--data", str(data), "--out",
                     str(tmp_path / "o.tflite"), "--quiet"])

    np.savez(tmp_path / "nolabels.npz", x=np.zeros((4, 20), np.float32))
    assert run(tmp_path / "nolabels.npz") == 2
    assert "missing ['y']" in capsys.readouterr().err
    np.savez(tmp_path / "shape.npz", x=np.zeros((4, 21), np.float32), y=np.zeros(4, np.int64))
    assert run(tmp_path / "shape.npz") == 2
    assert "the model takes (20,)" in capsys.readouterr().err
    np.savez(tmp_path / "labels.npz", x=np.zeros((10, 20), np.float32),
             y=np.full(10, 7, np.int64))
    assert run(tmp_path / "labels.npz") == 2
    assert "labels must lie in [0, 5)" in capsys.readouterr().err
    (tmp_path / "junk.npz").write_bytes(b"junk")
    assert run(tmp_path / "junk.npz") == 2
    assert "not a readable .npz" in capsys.readouterr().err
    assert run(tmp_path / "missing.npz") == 2
    assert run(files / "data.npz", model=tmp_path / "missing.tflite") == 2
    assert not (tmp_path / "o.tflite").exists()
    with pytest.raises(SystemExit) as exc:  # argparse: --data and --out are required
        main(["adapt", str(files / "model.tflite")])
    assert exc.value.code == 2


def test_help_explains_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["adapt", "--help"])
    text = capsys.readouterr().out
    for option in ("--data", "--out", "--method", "--epochs", "--queries", "--lr",
                   "--eps-codes", "--batch-size", "--validation", "--seed", "--json",
                   "--quiet", "exit status", "qzo-ff", "pmt-sparse"):
        assert option in text


def test_a_trailing_softmax_is_kept_and_not_trained(files, tmp_path):
    from test_tflite import with_softmax

    model = with_softmax(bt.load(files / "model.tflite"))
    bt.save(model, tmp_path / "softmax-model.tflite", input_shape=(20,))
    out, report = tmp_path / "adapted.tflite", tmp_path / "report.json"
    rc = main(["adapt", str(tmp_path / "softmax-model.tflite"), "--data",
               str(files / "data.npz"), "--out", str(out), "--epochs", "10", "--lr", "0.2",
               "--quiet", "--json", str(report)])
    assert rc == 0
    doc = json.loads(report.read_text())
    assert doc["val_accuracy_after"] > doc["val_accuracy_before"] + 10
    adapted = bt.load(out)
    assert isinstance(adapted.body[-1], bt.QSoftmax)


def test_an_image_folder_is_resized_to_the_model_input(tmp_path, capsys):
    """One sub-folder per class; images of any size and mode become the model's 1x28x28."""
    from PIL import Image

    from bpfree.models import mnist_cnn

    bt.save(quantized(mnist_cnn, (1, 28, 28)), tmp_path / "cnn.tflite", input_shape=(1, 28, 28))
    rng = np.random.default_rng(0)
    for label, name in enumerate(("cats", "dogs")):
        (tmp_path / "images" / name).mkdir(parents=True)
        for i in range(6):
            pixels = rng.integers(0, 256, (40, 30, 3), dtype=np.uint8) // (label + 1)
            Image.fromarray(pixels).save(tmp_path / "images" / name / f"{i}.png")
    (tmp_path / "images" / "dogs" / "notes.txt").write_text("not an image")
    report = tmp_path / "report.json"
    rc = main(["adapt", str(tmp_path / "cnn.tflite"), "--data", str(tmp_path / "images"),
               "--out", str(tmp_path / "out.tflite"), "--epochs", "1", "--queries", "2",
               "--batch-size", "4", "--validation", "0.25", "--quiet", "--json", str(report)])
    assert rc == 0
    assert "0=cats, 1=dogs" in capsys.readouterr().out
    doc = json.loads(report.read_text())
    assert doc["train"] + doc["validation"] == 12
    (tmp_path / "empty" / "a").mkdir(parents=True)
    assert main(["adapt", str(tmp_path / "cnn.tflite"), "--data", str(tmp_path / "empty"),
                 "--out", str(tmp_path / "o.tflite")]) == 2
    assert "no images found" in capsys.readouterr().err


def test_a_directory_as_output_is_refused_before_training(files, tmp_path, capsys):
    out = tmp_path / "a-folder.tflite"
    out.mkdir()  # a folder where the file should go: refused up front (bpfree.io)
    rc = main(["adapt", str(files / "model.tflite"), "--data", str(files / "data.npz"),
               "--out", str(out), "--epochs", "1", "--quiet"])
    assert rc == 2 and "is a directory" in capsys.readouterr().err
    assert out.is_dir() and not any(out.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-folder.tflite"]  # no temp file
