"""bpfree.tflite without LiteRT: save / load round trips, errors, atomic writes, PMT training.

The comparison with LiteRT's interpreter itself is tests/test_tflite_litert.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from bpfree import tflite as bt
from bpfree.models import mnist_cnn, mnist_mobilenet
from bpfree.pmt import PMTConfig, PMTTrainer, fit
from bpfree.quant import QuantizedModel, quantize_model, trainable_layers
from bpfree.quant.params import TensorQuant
from bpfree.tflite.schema import tflite
from bpfree.tflite.writer import _Graph, _Op, _serialize


def small_mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 5))


#: (name, float model builder, one sample's shape)
MODELS = [("mlp", small_mlp, (20,)), ("cnn", mnist_cnn, (1, 28, 28)),
          ("mobilenet", mnist_mobilenet, (1, 28, 28))]


def quantized(build, shape, seed: int = 0) -> QuantizedModel:
    """``quantize_model`` of a seeded float model (random BN statistics), LiteRT's MEAN rule."""
    torch.manual_seed(seed)
    model = build().eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 2.0)
    q = quantize_model(model, torch.rand(32, *shape))
    bt.use_litert_kernels(q)
    return q


def int8_inputs(shape, n: int = 8, seed: int = 1) -> torch.Tensor:
    """Random int8 inputs followed by saturating ones (all -128, all 127, alternating)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-128, 128, (n, *shape), dtype=torch.int8, generator=g)
    lo = torch.full((1, *shape), -128, dtype=torch.int8)
    hi = torch.full((1, *shape), 127, dtype=torch.int8)
    alt = torch.where(torch.arange(int(np.prod(shape))).reshape(1, *shape) % 2 == 0, hi, lo)
    return torch.cat([x, lo, hi, alt])


@pytest.mark.parametrize("name, build, shape", MODELS, ids=[m[0] for m in MODELS])
def test_load_of_save_reproduces_the_model(tmp_path, name, build, shape):
    q = quantized(build, shape)
    path = tmp_path / f"{name}.tflite"
    bt.save(q, path, input_shape=shape)
    loaded = bt.load(path)
    assert loaded.input_shape == shape
    assert loaded.input_quant == q.input_quant and loaded.output_quant == q.output_quant
    x = int8_inputs(shape)
    assert torch.equal(loaded.forward_int(x), q.forward_int(x))
    a, b = trainable_layers(q), trainable_layers(loaded)
    assert len(a) == len(b)
    for (_, la), (_, lb) in zip(a, b):
        assert type(la) is type(lb)
        assert torch.equal(la.weight, lb.weight) and torch.equal(la.bias, lb.bias)
        assert (la.input_quant, la.output_quant, la.weight_quant, la.activation) == \
            (lb.input_quant, lb.output_quant, lb.weight_quant, lb.activation)
    # Saving a loaded model and loading it again is a fixed point, byte for byte (the first
    # save may drop stages that write nothing, such as a QReLU after a fused ReLU).
    data = bt.to_bytes(loaded)
    assert bt.to_bytes(bt.from_bytes(data)) == data


def test_float_input_is_quantized_with_the_files_parameters(tmp_path):
    q = quantized(small_mlp, (20,))
    loaded = bt.from_bytes(bt.to_bytes(q, (20,)))
    x = torch.rand(4, 20)
    assert torch.equal(loaded(x), q(x))


def test_a_loaded_model_trains_with_pmt(tmp_path):
    q = quantized(small_mlp, (20,), seed=3)
    path = tmp_path / "mlp.tflite"
    bt.save(q, path, input_shape=(20,))
    model = bt.load(path)
    g = torch.Generator().manual_seed(2)
    x = torch.rand(64, 20, generator=g)
    y = x[:, :5].argmax(-1)  # a task a linear layer can learn
    before = [layer.weight.clone() for _, layer in trainable_layers(model)]
    trainer = PMTTrainer(model, PMTConfig(queries=8, seed=1), example=x)
    hist = fit(trainer, x, y, epochs=30, batch_size=32, lr=0.2, schedule="constant")
    assert sum(hist.loss[-4:]) / 4 < 0.95 * sum(hist.loss[:4]) / 4
    after = [layer.weight for _, layer in trainable_layers(model)]
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    # The trained integers go into the file and come back unchanged.
    bt.save(model, path)
    again = bt.load(path)
    xq = q.quantize_input(x)
    assert torch.equal(again.forward_int(xq), model.forward_int(xq))


def test_save_refuses_the_reference_mean_rule_and_layers_without_an_operator(tmp_path):
    q = quantized(mnist_mobilenet, (1, 28, 28))
    for m in q.modules():
        if hasattr(m, "rule"):
            m.rule = "reference"
    with pytest.raises(ValueError, match="use_litert_kernels"):
        bt.to_bytes(q, (1, 28, 28))
    assert bt.use_litert_kernels(q) == 1
    raw = quantize_model(small_mlp().eval(), torch.rand(8, 20))  # fixed-point QLinear epilogue
    with pytest.raises(ValueError, match="body.0.*FULLY_CONNECTED rescales in double"):
        bt.to_bytes(raw, (20,))
    assert bt.use_litert_kernels(raw) == 2 and bt.use_litert_kernels(raw) == 0
    assert bt.from_bytes(bt.to_bytes(raw, (20,))) is not None
    with pytest.raises(ValueError, match="input_shape"):
        bt.to_bytes(q)
    odd = QuantizedModel(nn.Sequential(nn.Tanh()), q.input_quant, [q.input_quant])
    with pytest.raises(ValueError, match="body.0.*Tanh"):
        bt.to_bytes(odd, (4,))


def test_save_is_atomic(tmp_path):
    path = tmp_path / "model.tflite"
    path.write_bytes(b"old contents")
    q = quantized(small_mlp, (20,))
    odd = QuantizedModel(nn.Sequential(nn.Tanh()), q.input_quant, [q.input_quant])
    with pytest.raises(ValueError):
        bt.save(odd, path, input_shape=(20,))
    assert path.read_bytes() == b"old contents"
    bt.save(q, path, input_shape=(20,))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.tflite"]
    assert bt.load(path) is not None


# ---------------------------------------------------------------------------- bad files


def _file(op_code: int, in_type=tflite.TensorType.INT8, out_type=tflite.TensorType.INT8) -> bytes:
    """A one-operator graph: tensor 0 -> op -> tensor 1."""
    from bpfree.tflite.writer import _Tensor

    g = _Graph()
    q = TensorQuant(0.1, 0)
    for t, name in ((in_type, "x"), (out_type, "y")):
        g.tensor(_Tensor((1, 4), t, name, scales=(q.scale,), zero_points=(0,)))
    options = (tflite.BuiltinOptions.SoftmaxOptions,
               lambda b: (tflite.SoftmaxOptionsStart(b), tflite.SoftmaxOptionsEnd(b))[1])
    g.ops.append(_Op(op_code, [0], [1], *options))
    return _serialize(g, 0, 1)


def test_unsupported_operator_is_named_with_its_index_and_tensor():
    with pytest.raises(bt.TFLiteFormatError,
                       match=r"operator 0 \(TANH\) on tensor 0 'x': unsupported operator"):
        bt.from_bytes(_file(tflite.BuiltinOperator.TANH))
    with pytest.raises(bt.TFLiteFormatError, match=r"operator 0 \(LOGISTIC\)"):
        bt.from_bytes(_file(tflite.BuiltinOperator.LOGISTIC))
    # SOFTMAX is supported, with LiteRT's output quantization only
    with pytest.raises(bt.TFLiteFormatError,
                       match=r"operator 0 \(SOFTMAX\) on tensor 1 'y': SOFTMAX output must"):
        bt.from_bytes(_file(tflite.BuiltinOperator.SOFTMAX))


def with_softmax(q: QuantizedModel, beta: float = 1.0) -> QuantizedModel:
    from bpfree.tflite.softmax import OUTPUT_QUANT

    return QuantizedModel(nn.Sequential(*q.body, bt.QSoftmax(q.output_quant, beta)),
                          q.input_quant, (*q.stage_quants, OUTPUT_QUANT))


def test_softmax_round_trips_and_is_not_trained(tmp_path):
    model = with_softmax(quantized(small_mlp, (20,)), beta=0.5)
    loaded = bt.from_bytes(bt.to_bytes(model, (20,)))
    assert isinstance(loaded.body[-1], bt.QSoftmax) and loaded.body[-1].beta == 0.5
    x = int8_inputs((20,))
    assert torch.equal(loaded.forward_int(x), model.forward_int(x))
    probs = loaded.output_quant.dequantize(loaded.forward_int(x))
    assert torch.allclose(probs.sum(-1), torch.ones(x.shape[0]), atol=0.05)


@pytest.mark.parametrize("ttype, match", [(tflite.TensorType.FLOAT32, "float activations"),
                                          (tflite.TensorType.INT16, "int16 activations")])
def test_float_and_int16_models_are_refused(ttype, match):
    data = _file(tflite.BuiltinOperator.RESHAPE, ttype, ttype)
    with pytest.raises(bt.TFLiteFormatError, match=rf"operator 0 \(RESHAPE\).*{match}"):
        bt.from_bytes(data)


def test_truncated_and_corrupt_files_raise_a_clear_error(tmp_path):
    data = bt.to_bytes(quantized(small_mlp, (20,)), (20,))
    with pytest.raises(bt.TFLiteFormatError, match="not a .tflite file"):
        bt.from_bytes(b"\x00" * 16)
    with pytest.raises(bt.TFLiteFormatError, match="not a .tflite file"):
        bt.from_bytes(data[:6])
    for cut in (len(data) // 2, len(data) - 100, 64):
        with pytest.raises(bt.TFLiteFormatError):
            bt.from_bytes(data[:cut])
    rng = np.random.default_rng(0)
    for _ in range(10):  # random byte flips: an error or a model, never another exception
        bad = bytearray(data)
        for i in rng.integers(8, len(bad), 20):
            bad[i] = int(rng.integers(0, 256))
        try:
            bt.from_bytes(bytes(bad))
        except bt.TFLiteFormatError:
            pass
    with pytest.raises(FileNotFoundError):
        bt.load(tmp_path / "missing.tflite")


# ------------------------------------------------- graphs bpfree's writer does not produce


#: The converter's names for a Keras model's input ``x`` and output under ``serving_default``.
SIGNED_INPUT, SIGNED_OUTPUT = "serving_default_x:0", "StatefulPartitionedCall_1:0"


def converter_style_file(seed: int = 0, *, signed: bool = False) -> bytes:
    """A graph like the TFLite converter's: float QUANTIZE / DEQUANTIZE edges, asymmetric SAME
    padding (stride 2 on an even size), per-tensor weights, a depth multiplier of 2, a residual
    ADD with its inputs in the other order, average and max pooling, a standalone PAD. With
    ``signed``, also the converter's interface: the tensor names :data:`SIGNED_INPUT` /
    :data:`SIGNED_OUTPUT`, a ``serving_default`` signature (``x`` -> ``output_0``) and a
    ``min_runtime_version`` metadata entry."""
    from bpfree.tflite.writer import _options, _Tensor

    rng = np.random.default_rng(seed)
    T, O, B = tflite.TensorType, tflite.BuiltinOperator, tflite.BuiltinOptions
    g = _Graph()
    q = [TensorQuant(0.02, 3), TensorQuant(0.05, -128), TensorQuant(6 / 255, -128),
         TensorQuant(0.04, 5), TensorQuant(0.06, -10), TensorQuant(0.1, 2)]

    def weights(shape, scales, axis, name):
        w = rng.integers(-127, 128, shape).astype(np.int8)
        return g.const(w, T.INT8, name, tuple(scales), (0,) * len(scales), axis)

    def bias(n, s_in, scales, name):
        b = rng.integers(-2000, 2000, n).astype("<i4")
        return g.const(b, T.INT32, name, tuple(s_in * s for s in scales), (0,) * n)

    x = g.tensor(_Tensor((1, 8, 8, 3), T.FLOAT32, SIGNED_INPUT if signed else "image"))
    q0 = g.activation((1, 8, 8, 3), q[0], "q0")
    g.ops.append(_Op(O.QUANTIZE, [x], [q0], B.QuantizeOptions, _options("QuantizeOptions")))
    s1 = [0.01]  # per-tensor
    c1 = g.activation((1, 4, 4, 6), q[1], "c1")
    g.ops.append(_Op(O.CONV_2D, [q0, weights((6, 3, 3, 3), s1, 0, "w1"),
                                 bias(6, q[0].scale, s1 * 6, "b1")], [c1], B.Conv2DOptions,
                     _options("Conv2DOptions", padding=tflite.Padding.SAME, stride_h=2,
                              stride_w=2, fused_activation_function=1)))
    s2 = list(rng.uniform(0.005, 0.02, 12))
    d2 = g.activation((1, 4, 4, 12), q[2], "d2")
    g.ops.append(_Op(O.DEPTHWISE_CONV_2D, [c1, weights((1, 3, 3, 12), s2, 3, "w2"),
                                           bias(12, q[1].scale, s2, "b2")], [d2],
                     B.DepthwiseConv2DOptions,
                     _options("DepthwiseConv2DOptions", padding=tflite.Padding.SAME,
                              stride_h=1, stride_w=1, depth_multiplier=2,
                              fused_activation_function=3)))
    s3 = list(rng.uniform(0.002, 0.01, 12))
    c3 = g.activation((1, 4, 4, 12), q[3], "c3")
    g.ops.append(_Op(O.CONV_2D, [d2, weights((12, 1, 1, 12), s3, 0, "w3"),
                                 bias(12, q[2].scale, s3, "b3")], [c3], B.Conv2DOptions,
                     _options("Conv2DOptions", padding=tflite.Padding.VALID, stride_h=1,
                              stride_w=1)))
    a4 = g.activation((1, 4, 4, 12), q[4], "a4")
    g.ops.append(_Op(O.ADD, [c3, d2], [a4], B.AddOptions, _options("AddOptions")))
    p5 = g.activation((1, 2, 2, 12), q[4], "p5")
    pool = dict(padding=tflite.Padding.VALID, stride_h=2, stride_w=2, filter_height=2,
                filter_width=2)
    g.ops.append(_Op(O.AVERAGE_POOL_2D, [a4], [p5], B.Pool2DOptions,
                     _options("Pool2DOptions", **pool)))
    pads = g.int32(np.array([[0, 0], [1, 1], [1, 1], [0, 0]]), "paddings")
    p6 = g.activation((1, 4, 4, 12), q[4], "p6")
    g.ops.append(_Op(O.PAD, [p5, pads], [p6], B.PadOptions, _options("PadOptions")))
    m7 = g.activation((1, 2, 2, 12), q[4], "m7")
    g.ops.append(_Op(O.MAX_POOL_2D, [p6], [m7], B.Pool2DOptions,
                     _options("Pool2DOptions", **pool)))
    r8 = g.activation((1, 48), q[4], "r8")
    g.ops.append(_Op(O.RESHAPE, [m7, g.int32([-1, 48], "shape")], [r8], B.ReshapeOptions,
                     _options("ReshapeOptions", new_shape=[-1, 48])))
    s9 = [0.004]
    f9 = g.activation((1, 5), q[5], "f9")
    g.ops.append(_Op(O.FULLY_CONNECTED, [r8, weights((5, 48), s9, 0, "w9"),
                                         bias(5, q[4].scale, s9 * 5, "b9")], [f9],
                     B.FullyConnectedOptions, _options("FullyConnectedOptions")))
    y = g.tensor(_Tensor((1, 5), T.FLOAT32, SIGNED_OUTPUT if signed else "logits"))
    g.ops.append(_Op(O.DEQUANTIZE, [f9], [y], B.DequantizeOptions,
                     _options("DequantizeOptions")))
    if not signed:
        return _serialize(g, x, y)
    return _serialize(g, x, y, signature=("serving_default", {"x": x}, {"output_0": y}),
                      metadata={"min_runtime_version": b"1.14.0".ljust(16, b"\0")})


def depthwise_file(padding: str, size: int = 8, channels: int = 4, seed: int = 0) -> bytes:
    """A DEPTHWISE_CONV_2D as the converter writes it for MobileNet's downsampling: depth
    multiplier 1, stride 2, 3x3, per-channel scales on axis 3, fused RELU6, with ``padding``
    "SAME" (asymmetric on an even ``size``: nothing before, one row and column after) or
    "VALID"."""
    from bpfree.tflite.writer import _options

    rng = np.random.default_rng(seed)
    T, O, B = tflite.TensorType, tflite.BuiltinOperator, tflite.BuiltinOptions
    g = _Graph()
    q_in, q_out = TensorQuant(0.03, -7), TensorQuant(6 / 255, -128)
    out = -(-size // 2) if padding == "SAME" else (size - 3) // 2 + 1
    scales = tuple(rng.uniform(0.005, 0.03, channels))
    x = g.activation((1, size, size, channels), q_in, "x")
    w = g.const(rng.integers(-127, 128, (1, 3, 3, channels)).astype(np.int8), T.INT8, "w",
                scales, (0,) * channels, 3)
    b = g.const(rng.integers(-3000, 3000, channels).astype("<i4"), T.INT32, "b",
                tuple(q_in.scale * s for s in scales), (0,) * channels)
    y = g.activation((1, out, out, channels), q_out, "y")
    g.ops.append(_Op(O.DEPTHWISE_CONV_2D, [x, w, b], [y], B.DepthwiseConv2DOptions,
                     _options("DepthwiseConv2DOptions", padding=getattr(tflite.Padding, padding),
                              stride_h=2, stride_w=2, depth_multiplier=1,
                              fused_activation_function=3)))
    return _serialize(g, x, y)


@pytest.mark.parametrize("padding, size, kinds, pads", [
    ("SAME", 8, ["QPad", "QConv2d"], (0, 1, 0, 1)),  # asymmetric: a PAD stage first
    ("SAME", 7, ["QConv2d"], (1, 1)),                 # symmetric: the convolution's padding
    ("VALID", 8, ["QConv2d"], (0, 0)),
])
def test_stride_2_depthwise_loads_with_tflite_padding(padding, size, kinds, pads):
    model = bt.from_bytes(depthwise_file(padding, size))
    assert [type(m).__name__ for m in model.body] == kinds
    conv = model.body[-1]
    assert conv.groups == conv.out_channels == 4 and conv.stride == (2, 2)
    assert conv.activation == "relu6"
    assert (model.body[0].pads if kinds[0] == "QPad" else conv.padding) == pads
    out = -(-size // 2) if padding == "SAME" else (size - 3) // 2 + 1
    assert model.forward_int(int8_inputs((4, size, size))).shape[-2:] == (out, out)


def test_converter_style_graph_loads_into_bpfree_stages():
    model = bt.from_bytes(converter_style_file())
    kinds = [type(m).__name__ for m in model.body]
    assert kinds == ["QPad", "QConv2d", "QConv2d", "QInvertedResidual", "QAvgPool2d", "QPad",
                     "QMaxPool2d", "QFlatten", "FloatRuleLinear"]
    assert model.body[0].pads == (0, 1, 0, 1)  # SAME, stride 2 on 8: nothing before, 1 after
    depthwise, block = model.body[2], model.body[3]
    assert depthwise.groups == 6 and depthwise.out_channels == 12  # depth multiplier 2
    assert len(block.body) == 1 and block.add is not None  # ADD(branch, input) reversed
    assert model.input_shape == (3, 8, 8) and model.input_quant == TensorQuant(0.02, 3)
    out = model(torch.rand(2, 3, 8, 8))
    assert out.dtype == torch.float32 and out.shape == (2, 5)
