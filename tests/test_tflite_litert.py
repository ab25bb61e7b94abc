"""LiteRT's interpreter as the oracle: files bpfree saves run in LiteRT with identical outputs.

BUILTIN_REF selects LiteRT's reference kernels, the bit-exact target of bpfree.quant (the
optimized kernels and XNNPACK may differ by one unit on ties). Skipped without ai-edge-litert
(a dev dependency: `pip install -c constraints.txt -e ".[dev]"`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bpfree import tflite as bt
from bpfree.tflite.oracle import REASON, litert_available, run_litert
from test_tflite import MODELS, int8_inputs, quantized

pytestmark = pytest.mark.skipif(not litert_available(), reason=REASON)


@pytest.mark.parametrize("name, build, shape", MODELS, ids=[m[0] for m in MODELS])
def test_litert_output_equals_bpfree_forward(name, build, shape):
    for seed in (0, 1):
        q = quantized(build, shape, seed=seed)
        data = bt.to_bytes(q, shape)
        x = int8_inputs(shape, n=32, seed=seed)
        ours = q.forward_int(x).numpy()
        theirs = run_litert(data, x)
        assert theirs.dtype == np.int8
        np.testing.assert_array_equal(theirs.reshape(ours.shape), ours)
        loaded = bt.from_bytes(data)  # and the model loaded back from the file
        np.testing.assert_array_equal(loaded.forward_int(x).numpy(), ours)


def test_litert_runs_the_trained_integers(tmp_path):
    """Train a loaded model with PMT, save it: LiteRT computes the adapted model."""
    from bpfree.pmt import PMTConfig, PMTTrainer, fit

    q = quantized(MODELS[2][1], MODELS[2][2])
    model = bt.from_bytes(bt.to_bytes(q, (1, 28, 28)))
    g = torch.Generator().manual_seed(0)
    x = torch.rand(16, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (16,), generator=g)
    fit(PMTTrainer(model, PMTConfig(queries=2), example=x), x, y, epochs=1, batch_size=16,
        lr=0.5)
    path = tmp_path / "adapted.tflite"
    bt.save(model, path)
    xq = int8_inputs((1, 28, 28), n=8)
    np.testing.assert_array_equal(run_litert(path.read_bytes(), xq).reshape(8 + 3, -1),
                                  model.forward_int(xq).numpy())


def test_litert_runs_the_qzo_ff_adapted_integers(tmp_path):
    """`bpfree adapt --method qzo-ff` writes a file LiteRT computes exactly as bpfree does."""
    from bpfree.cli import main
    from test_qzoff_integer import _shifted_task

    data, xs, ys = _shifted_task()
    (tmp_path / "model.tflite").write_bytes(data)
    np.savez(tmp_path / "shifted.npz", x=xs.numpy(), y=ys.numpy())
    out = tmp_path / "adapted.tflite"
    assert main(["adapt", str(tmp_path / "model.tflite"), "--data", str(tmp_path / "shifted.npz"),
                 "--out", str(out), "--method", "qzo-ff", "--epochs", "2", "--lr", "0.03",
                 "--quiet"]) == 0
    adapted = bt.load(out)
    assert not torch.equal(adapted.body[0].weight, bt.from_bytes(data).body[0].weight)
    xq = torch.cat([adapted.quantize_input(xs[:32]), int8_inputs((20,), n=32)])
    np.testing.assert_array_equal(run_litert(out.read_bytes(), xq), adapted.forward_int(xq).numpy())


def test_mcunet_in1_in_litert_gives_bpfree_classify_logits(tmp_path):
    """MCUNet-in1 saved as .tflite: LiteRT's logits on the sample photos are those of
    ``bpfree classify`` run with LiteRT's kernel rules (the TFLite Micro rules of the default
    model differ in the MEAN and the classifier, on up to 18% of the logits by a few units)."""
    from bpfree.classify import classify, sample_image
    from bpfree.models.mcunet import mcunet_in1, preprocess_image

    pytest.importorskip("skimage.data", reason="scikit-image provides the sample photos")
    model = mcunet_in1()
    assert bt.use_litert_kernels(model) == 2  # the classifier and the global pooling
    path = tmp_path / "mcunet-in1.tflite"
    bt.save(model, path, input_shape=(3, 128, 128))
    data = path.read_bytes()
    for name, top1 in (("chelsea", 285), ("coffee", 967)):
        image = sample_image(name)
        x = preprocess_image(image).reshape(1, 3, 128, 128)
        theirs = run_litert(data, x).reshape(-1)
        result = classify(image, model)
        np.testing.assert_array_equal(theirs, np.array(result["logits"], dtype=np.int8))
        assert result["topk"][0] == top1 and int(theirs.argmax()) == top1


def test_converter_style_graph_matches_litert():
    """Float in, float out, asymmetric SAME padding, per-tensor weights, depth multiplier 2, a
    reversed residual ADD, pooling and PAD (tests/test_tflite.py:converter_style_file)."""
    from test_tflite import converter_style_file

    for seed in (0, 1, 2):
        data = converter_style_file(seed)
        model = bt.from_bytes(data)
        g = torch.Generator().manual_seed(seed)
        x = torch.cat([torch.rand(16, 3, 8, 8, generator=g) * 6 - 3,
                       torch.full((1, 3, 8, 8), 100.0), torch.full((1, 3, 8, 8), -100.0)])
        np.testing.assert_array_equal(run_litert(data, x), model(x).numpy())
        # and the file bpfree writes for the loaded model computes the same
        xq = model.quantize_input(x)
        np.testing.assert_array_equal(run_litert(bt.to_bytes(model), xq),
                                      model.forward_int(xq).numpy())


@pytest.mark.parametrize("padding, size", [("SAME", 8), ("SAME", 7), ("VALID", 8),
                                           ("VALID", 7)])
def test_stride_2_depthwise_matches_litert(padding, size):
    """DEPTHWISE_CONV_2D with depth multiplier 1 and stride 2, SAME (asymmetric on an even
    size, symmetric on an odd one) and VALID, from a file bpfree did not write."""
    from test_tflite import depthwise_file

    for seed in (0, 1):
        data = depthwise_file(padding, size, seed=seed)
        model = bt.from_bytes(data)
        x = int8_inputs((4, size, size), n=32, seed=seed)
        ours = model.forward_int(x).numpy()  # NCHW; LiteRT's output is NHWC
        for file in (data, bt.to_bytes(model)):  # the file, and the one bpfree writes back
            np.testing.assert_array_equal(run_litert(file, x).transpose(0, 3, 1, 2), ours)


@pytest.mark.parametrize("scale", [0.01, 0.1, 0.37, 1.0, 10.0, 40.0])
def test_int8_softmax_matches_litert(scale):
    """gemmlowp's fixed-point exp and reciprocal, across input scales that move diff_min from
    -1984 (nothing cut) to 0 (only the maximum survives)."""
    from bpfree.quant import QuantizedModel, TensorQuant
    from bpfree.tflite.softmax import OUTPUT_QUANT

    g = torch.Generator().manual_seed(0)
    for zero_point, beta in ((0, 1.0), (-128, 0.5), (17, 2.0)):
        q = TensorQuant(scale, zero_point)
        model = QuantizedModel(torch.nn.Sequential(bt.QSoftmax(q, beta)), q, (OUTPUT_QUANT,))
        x = torch.randint(-128, 128, (1000, 10), dtype=torch.int8, generator=g)
        x[0], x[1], x[2] = 127, -128, 5  # equal logits
        x[3, 3] = 6
        np.testing.assert_array_equal(run_litert(bt.to_bytes(model, (10,)), x),
                                      model.forward_int(x).numpy())


def test_softmax_model_matches_litert():
    from test_tflite import with_softmax

    model = with_softmax(quantized(MODELS[0][1], MODELS[0][2]))
    x = int8_inputs(MODELS[0][2], n=64)
    np.testing.assert_array_equal(run_litert(bt.to_bytes(model, MODELS[0][2]), x),
                                  model.forward_int(x).numpy())
