"""Tests for bpfree.quant.ptq (post-training quantization) and bpfree.quant.twin (float twin)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bpfree.models import mnist_cnn, mnist_mobilenet
from bpfree.quant import (
    FloatTwin,
    QConv2d,
    QGlobalAvgPool2d,
    QInvertedResidual,
    QLinear,
    QReLU,
    QuantizedModel,
    TensorQuant,
    TwinConv2d,
    fold_batchnorm,
    float_twin,
    quantize_model,
    quantize_weights,
    stage_output_quant,
    tensor_quant_from_range,
    to_float_units,
    trainable_layers,
    write_back,
)


def images(n: int, seed: int) -> torch.Tensor:
    """Smooth image-like inputs in [0, 1] (upsampled 7x7 noise), 1x28x28."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 7, 7, generator=g)
    return F.interpolate(x, size=28, mode="bilinear").clamp(0, 1)


def randomize_bn(model: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial BN statistics and affine parameters, so folding is actually exercised."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.rand(n, generator=g) * 0.4 - 0.2)
            m.running_var.copy_(torch.rand(n, generator=g) * 1.5 + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
            m.bias.data.copy_(torch.rand(n, generator=g) * 0.4 - 0.2)
    return model.eval()


@pytest.fixture(scope="module")
def float_model() -> nn.Sequential:
    torch.manual_seed(0)
    return randomize_bn(mnist_mobilenet())


@pytest.fixture(scope="module")
def qmodel(float_model) -> QuantizedModel:
    return quantize_model(float_model, [images(64, s) for s in range(3)], input_range=(0, 1))


# ---------------------------------------------------------------------------------------------
# PTQ
# ---------------------------------------------------------------------------------------------


def test_structure_mirrors_float_model(float_model, qmodel):
    assert len(qmodel.body) == len(float_model)
    assert isinstance(qmodel.body[0], QConv2d) and qmodel.body[0].activation == "relu6"
    block = qmodel.body[1]
    assert isinstance(block, QInvertedResidual) and block.add is not None
    assert [c.activation for c in block.body] == ["relu6", "relu6", None]
    assert block.body[1].groups == block.body[1].in_channels  # depthwise
    assert qmodel.body[2].add is None  # stride 2: no residual
    assert isinstance(qmodel.body[6], QGlobalAvgPool2d)
    assert isinstance(qmodel.body[8], QLinear)
    assert qmodel.output_quant == qmodel.stage_quants[-1]
    # Weights symmetric in [-127, 127]; every stage's quant chain is consistent.
    q = qmodel.input_quant
    for stage in qmodel.body:
        q = stage_output_quant(stage, q)
    assert q == qmodel.output_quant
    for _, layer in trainable_layers(qmodel):
        assert layer.weight.dtype == torch.int8 and int(layer.weight.abs().max()) <= 127
        assert layer.bias.dtype == torch.int32
    names = [n for n, _ in trainable_layers(qmodel)]
    assert names[:4] == ["body.0", "body.1.body.0", "body.1.body.1", "body.1.body.2"]
    assert names[-1] == "body.8" and len(names) == 15


def test_fold_batchnorm_matches_conv_bn():
    torch.manual_seed(1)
    for groups, bias in ((1, False), (4, True)):
        conv = nn.Conv2d(4, 8, 3, padding=1, groups=groups, bias=bias)
        bn = randomize_bn(nn.BatchNorm2d(8), seed=groups)
        x = torch.randn(5, 4, 9, 9)
        w, b = fold_batchnorm(conv, bn)
        with torch.no_grad():
            ref = bn(conv(x))
        got = F.conv2d(x, w, b, padding=1, groups=groups)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_int8_logits_close_to_float(float_model, qmodel):
    x = images(300, 99)
    with torch.no_grad():
        ref = float_model(x)
    out = qmodel(x)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    # Observed: full argmax agreement and a max error of ~1.2 output LSBs; the bound leaves
    # room for platform differences while still catching a wrong scale, zero point or fold.
    agree = (out.argmax(1) == ref.argmax(1)).float().mean().item()
    assert agree >= 0.95
    err_lsb = (out - ref).abs().max().item() / qmodel.output_quant.scale
    assert err_lsb <= 6
    assert qmodel.output_quant.dequantize(qmodel.forward_int(qmodel.quantize_input(x))).equal(out)


def test_percentile_and_calibration_forms(float_model, qmodel):
    x = images(64, 0)
    q1 = quantize_model(float_model, x, input_range=(0, 1))  # one tensor
    q2 = quantize_model(float_model, [(x, torch.zeros(64))], input_range=(0, 1))  # (x, y) pairs
    assert q1.output_quant == q2.output_quant
    qp = quantize_model(float_model, [x], input_range=(0, 1), percentile=99.0)
    assert qp.body[0].output_quant.scale < q1.body[0].output_quant.scale  # clipped range
    assert qp(images(8, 5)).shape == (8, 10)
    with pytest.raises(ValueError, match="percentile"):
        quantize_model(float_model, [x], percentile=30)
    with pytest.raises(ValueError, match="calibration is empty"):
        quantize_model(float_model, [])
    assert float_model.training is False  # mode restored, model untouched


def test_tensor_quant_from_range_contains_zero():
    q = tensor_quant_from_range(0.0, 6.0)
    assert q.zero_point == -128 and q.dequantize(q.quantize(torch.tensor(0.0))) == 0
    q = tensor_quant_from_range(0.5, 2.0)  # extended to [0, 2]
    assert q.zero_point == -128
    q = tensor_quant_from_range(-1.0, 1.0)
    assert q.zero_point in (-1, 0)
    assert tensor_quant_from_range(0.0, 0.0).scale > 0  # dead activation guarded


def test_bias_guard_and_exact_large_bias_twin():
    # A channel with tiny weights and a large bias gets a larger weight scale, so that
    # |bias| <= 2**24 (exact in float32) instead of saturating.
    w = torch.tensor([[1e-9, -1e-9], [0.5, 0.25], [0.0, 0.0]])
    b = torch.tensor([3.0, 0.1, -2.0])
    w_int, b_int, wq = quantize_weights(w, b, 0.01, "fc")
    assert int(b_int.abs().max()) <= 2**24 and w_int[1].tolist() == [127, 64]
    real_b = b_int.double() * 0.01 * torch.tensor(wq.scales, dtype=torch.float64)
    torch.testing.assert_close(real_b, b.double(), rtol=1e-6, atol=0)
    # A QLinear with a bias beyond 2**24 (e.g. after integer training) keeps it exact in the
    # twin (float64 bias) and through write_back.
    q_in, q_out = TensorQuant(0.01, 0), TensorQuant(0.05, 3)
    layer = QLinear(torch.ones(3, 2, dtype=torch.int8), torch.tensor([2**30 + 1, -7, 5]),
                    weight_scale=1e-6, input_quant=q_in, output_quant=q_out)
    model = QuantizedModel(nn.Sequential(layer), q_in, [q_out])
    twin = float_twin(model, fake_quant=True)
    assert twin.body[0].bias.dtype == torch.float64
    target = copy.deepcopy(model)
    target.body[0].bias.zero_()
    write_back(twin, target)
    assert torch.equal(target.body[0].bias, layer.bias)


def test_batch_size_independence(qmodel):
    xq = qmodel.quantize_input(images(7, 3))
    full = qmodel.forward_int(xq)
    singles = torch.cat([qmodel.forward_int(xq[i:i + 1]) for i in range(7)])
    assert full.dtype == torch.int8 and torch.equal(full, singles)


def test_top_level_relu_fused_and_maxpool():
    torch.manual_seed(2)
    model = mnist_cnn().eval()  # Conv2d, ReLU, MaxPool2d at top level
    # Calibrated on the inputs it is checked on: values beyond the calibrated range saturate
    # (by design), which with this random CNN costs up to ~35 LSBs on held-out images.
    x = images(100, 7)
    q = quantize_model(model, x, input_range=(0, 1))
    assert isinstance(q.body[1], QReLU) and q.body[0].activation == "relu"
    assert q.body[1].quant == q.body[0].output_quant
    with torch.no_grad():
        ref = model(x)
    out = q(x)
    assert (out.argmax(1) == ref.argmax(1)).float().mean() >= 0.9
    assert (out - ref).abs().max() / q.output_quant.scale <= 6
    twin = float_twin(q, fake_quant=True)
    assert (twin(x) - out).abs().max() / q.output_quant.scale <= 4


def test_avgpool_and_plain_linear_stages():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU6(), nn.AvgPool2d(2),
                          nn.Flatten(), nn.Linear(4 * 14 * 14, 16), nn.ReLU(), nn.Dropout(),
                          nn.Linear(16, 3)).eval()
    x = images(50, 8)
    q = quantize_model(model, [images(32, 2), x])
    with torch.no_grad():
        ref = model(x)
    assert (q(x) - ref).abs().max() / q.output_quant.scale <= 6
    assert q.body[4].activation == "relu"


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


class _NoIteration:
    """Calibration data that fails if PTQ touches it: errors must come before calibration."""

    def __iter__(self):
        raise AssertionError("calibration must not be read")


def test_unsupported_layer_named_before_anything():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Sigmoid())
    with pytest.raises(ValueError, match=r"'1' of type Sigmoid"):
        quantize_model(model, _NoIteration())
    lstm = nn.Sequential(nn.Flatten(), nn.LSTM(4, 4))
    with pytest.raises(ValueError, match=r"'1' of type LSTM"):
        quantize_model(lstm, _NoIteration())
    nested = mnist_mobilenet()
    nested[3].conv[1].append(nn.Tanh())
    with pytest.raises(ValueError, match=r"'3\.conv\.1\.3' of type Tanh"):
        quantize_model(nested, _NoIteration())
    with pytest.raises(ValueError, match="AdaptiveAvgPool2d"):
        quantize_model(nn.Sequential(nn.AdaptiveAvgPool2d(2)), _NoIteration())
    with pytest.raises(ValueError, match="nn.Sequential"):
        quantize_model(nn.Conv2d(1, 1, 1), _NoIteration())


def test_non_finite_weights_raise():
    model = mnist_mobilenet().eval()
    model[2].conv[0][0].weight.data[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"'2\.conv\.0\.0'.*non-finite"):
        quantize_model(model, _NoIteration())
    model = mnist_mobilenet().eval()
    model[0][1].running_var.fill_(float("inf"))
    with pytest.raises(ValueError, match=r"'0\.1'.*non-finite"):
        quantize_model(model, _NoIteration())


@pytest.mark.parametrize("calibration", [
    torch.zeros(4, 1, 28, 28, dtype=torch.uint8),  # a single integer tensor, not only in a list
    [torch.zeros(4, 1, 28, 28, dtype=torch.uint8)],
    [(torch.zeros(4, 1, 28, 28, dtype=torch.int64), torch.zeros(4))],
    ["images"],
])
def test_non_float_calibration_is_a_clear_error(calibration):
    model = mnist_mobilenet().eval()
    with pytest.raises(ValueError, match="calibration must be a float tensor"):
        quantize_model(model, calibration)


@pytest.mark.parametrize("kwargs, match", [
    ({"accumulate": "int32"}, r"accumulate must be one of \('auto', 'float64'\)"),
    ({"backend": "cuda"}, r"backend must be one of \('auto', 'torch', 'numba'\)"),
])
def test_bad_layer_options_fail_before_calibration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        quantize_model(mnist_mobilenet().eval(), _NoIteration(), **kwargs)


# ---------------------------------------------------------------------------------------------
# Float twin
# ---------------------------------------------------------------------------------------------


def test_twin_names_and_integer_units(qmodel):
    twin = float_twin(qmodel, fake_quant=False)
    assert isinstance(twin, FloatTwin)
    q_names = [n for n, _ in trainable_layers(qmodel)]
    t_names = [n for n, _ in trainable_layers(twin)]
    assert q_names == t_names
    t_modules = dict(twin.named_modules())
    for name, q in trainable_layers(qmodel):
        t = t_modules[name]
        assert t.weight.dtype == torch.float32 and torch.equal(t.weight, q.weight.float())
        assert torch.equal(t.bias.double(), q.bias.double())
    assert {n for n, _ in twin.named_parameters()} == {
        f"{n}.{p}" for n in q_names for p in ("weight", "bias")}


def test_twin_fake_quant_reproduces_quantized_model(qmodel):
    """Tolerance: the twin computes each layer's real output and rounds it once (half to
    even); TFLite's integer requantization rounds twice (SaturatingRoundingDoublingHighMul then
    RoundingDivideByPOT, and MBQM before the mean's division), so values within ~0.01 LSB of a
    tie may differ by one LSB per layer (measured ~0.2% per conv, ~3% for the mean). Per stage
    from identical int8 inputs: at most 1 LSB, >= 95% exact. End to end the differences
    propagate: a few LSBs at most, argmax almost always equal."""
    twin = float_twin(qmodel, fake_quant=True)
    x = images(200, 11)
    h, q_in = qmodel.quantize_input(x), qmodel.input_quant
    with torch.no_grad():
        for stage, tstage in zip(qmodel.body, twin.body):
            out = stage(h)
            q_out = stage_output_quant(stage, q_in)
            diff = (tstage(q_in.dequantize(h)) - q_out.dequantize(out)).abs() / q_out.scale
            assert diff.max() <= 1.001 and (diff < 0.5).float().mean() >= 0.95
            h, q_in = out, q_out
        ref = qmodel(x)
        got = twin(x)
    assert (got - ref).abs().max() / qmodel.output_quant.scale <= 4
    assert (got.argmax(1) == ref.argmax(1)).float().mean() >= 0.95


def test_twin_float_mode_matches_float_model(float_model, qmodel):
    twin = float_twin(qmodel, fake_quant=False)
    x = images(100, 12)
    with torch.no_grad():
        ref = float_model(x)
        got = twin(x)
    # Only the int8 weights differ from the float model's: no activation rounding.
    assert (got - ref).abs().max() / qmodel.output_quant.scale <= 3
    twin.set_fake_quant(True)
    assert all(m.fake_quant for m in twin.modules() if hasattr(m, "fake_quant"))
    assert torch.equal(twin(x), float_twin(qmodel, fake_quant=True)(x))


@pytest.mark.parametrize("fake_quant", [False, True])
def test_twin_gradients_in_integer_units(qmodel, fake_quant):
    twin = float_twin(qmodel, fake_quant=fake_quant)
    x, y = images(16, 13), torch.arange(16) % 10
    F.cross_entropy(twin(x), y).backward()
    t_modules = dict(twin.named_modules())
    for name, q in trainable_layers(qmodel):
        t = t_modules[name]
        assert t.weight.grad.shape == q.weight.shape and t.bias.grad.shape == q.bias.shape
        assert bool(torch.isfinite(t.weight.grad).all())
    assert float(t_modules["body.8"].weight.grad.abs().sum()) > 0


def test_twin_gradient_is_per_integer_unit(qmodel):
    """dL/dW (integer units) = s_w[c] * dL/dw (real units): central differences in float64."""
    twin = float_twin(qmodel, fake_quant=False).double()
    x, y = images(8, 14).double(), torch.arange(8) % 10
    F.cross_entropy(twin(x), y).backward()
    layer = dict(twin.named_modules())["body.8"]
    h = 0.5  # half an integer unit
    for idx in ((0, 0), (3, 17), (9, 63)):
        with torch.no_grad():
            layer.weight[idx] += h
            up = F.cross_entropy(twin(x), y).item()
            layer.weight[idx] -= 2 * h
            down = F.cross_entropy(twin(x), y).item()
            layer.weight[idx] += h
        fd = (up - down) / (2 * h)
        assert abs(fd - layer.weight.grad[idx].item()) <= 1e-6 + 1e-4 * abs(fd)


def test_to_float_units_keeps_the_forward_and_steps_float_weights(qmodel):
    """After to_float_units the Parameters are the float weights: the same logits, and one SGD
    step moves each effective weight by lr * dL/dw (on integer units it moved by
    lr * s_w^2 * dL/dw: the FP32 baseline that barely trained)."""
    x, y = images(16, 15), torch.arange(16) % 10
    ref = float_twin(qmodel, fake_quant=False)
    twin = to_float_units(float_twin(qmodel, fake_quant=False))
    with torch.no_grad():
        assert torch.allclose(twin(x), ref(x), rtol=1e-5, atol=1e-6)
    for model in (ref, twin):
        F.cross_entropy(model(x), y).backward()
    r, t = dict(ref.named_modules())["body.8"], dict(twin.named_modules())["body.8"]
    scale = r.weight_scale.view(-1, 1)
    assert torch.equal(t.weight_scale, torch.ones_like(t.weight_scale))
    # dL/dw (float units) = dL/dW / s_w
    assert torch.allclose(t.weight.grad, r.weight.grad / scale, rtol=1e-4, atol=1e-7)
    lr = 1e-2
    before = t.effective_weight().detach().clone()
    with torch.no_grad():
        t.weight -= lr * t.weight.grad
    assert torch.allclose(t.effective_weight() - before, -lr * t.weight.grad, atol=1e-7)
    ref_step = (lr * r.weight.grad * scale).abs().max()  # the integer-unit step, float units
    assert ref_step < 1e-2 * (lr * t.weight.grad).abs().max()


def test_to_float_units_refuses_fake_quant_twins(qmodel):
    with pytest.raises(ValueError, match="plain float twin"):
        to_float_units(float_twin(qmodel, fake_quant=True))
    with pytest.raises(ValueError, match="needs a FloatTwin"):
        to_float_units(nn.Linear(2, 2))


def test_write_back_roundtrip_exact(qmodel):
    target = copy.deepcopy(qmodel)
    for _, layer in trainable_layers(target):  # make sure the copy really gets overwritten
        layer.weight.zero_()
        layer.bias.zero_()
    twin = float_twin(qmodel, fake_quant=True)
    write_back(twin, target)
    for (name, a), (_, b) in zip(trainable_layers(qmodel), trainable_layers(target)):
        assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias), name
    x = images(5, 15)
    assert torch.equal(target(x), qmodel(x))


def test_write_back_rounds_clamps_and_validates(qmodel):
    target = copy.deepcopy(qmodel)
    twin = float_twin(qmodel, fake_quant=False)
    first = dict(twin.named_modules())["body.0"]
    with torch.no_grad():
        first.weight.fill_(0.6)
        first.weight[0, 0, 0, 0] = 1000.0
        first.weight[0, 0, 0, 1] = -1000.0
        first.bias.fill_(3e9)
    write_back(twin, target)
    w, b = target.body[0].weight, target.body[0].bias
    assert w[0, 0, 0, 0] == 127 and w[0, 0, 0, 1] == -128 and w[0, 0, 1, 1] == 1
    assert bool((b == 2**31 - 1).all()) and w.dtype == torch.int8 and b.dtype == torch.int32

    # A bad twin (nan in the last layer) must leave the target untouched, first layer included.
    target = copy.deepcopy(qmodel)
    with torch.no_grad():
        dict(twin.named_modules())["body.8"].bias[0] = float("nan")
    with pytest.raises(ValueError, match="'body.8'.*non-finite"):
        write_back(twin, target)
    assert torch.equal(target.body[0].weight, qmodel.body[0].weight)

    other = float_twin(quantize_model(randomize_bn(mnist_mobilenet(), 5), images(16, 0)),
                       fake_quant=False)
    with pytest.raises(ValueError, match="weight scales differ"):
        write_back(other, copy.deepcopy(qmodel))


def test_twin_rejects_unknown_stage(qmodel):
    bad = copy.deepcopy(qmodel)
    bad.body[7] = nn.Tanh()
    with pytest.raises(ValueError, match=r"'body.7' of type Tanh"):
        float_twin(bad, fake_quant=True)
    assert isinstance(float_twin(qmodel, fake_quant=True).body[0], TwinConv2d)


# --- non-finite and empty inputs -------------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_inputs_are_refused_not_clamped(qmodel, bad):
    x = images(4, 5)
    x[1, 0, 3, 3] = bad
    with pytest.raises(ValueError, match="1 non-finite value"):
        qmodel(x)
    with pytest.raises(ValueError, match="non-finite"):
        qmodel.quantize_input(x)
    with pytest.raises(ValueError, match="non-finite values .* in the calibration inputs"):
        quantize_model(mnist_cnn(), x)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_pmt_step_refuses_non_finite_inputs_and_keeps_the_weights(bad):
    from bpfree.models import digits_mlp
    from bpfree.pmt import PMTConfig, PMTTrainer

    torch.manual_seed(0)
    x, y = torch.rand(32, 64), torch.randint(0, 10, (32,))
    model = quantize_model(digits_mlp(), x, input_range=(0.0, 1.0))
    trainer = PMTTrainer(model, PMTConfig(queries=2), example=x[:8])
    before = copy.deepcopy(model.state_dict())
    x[3, 7] = bad
    with pytest.raises(ValueError, match="non-finite"):
        trainer.step(x, y, lr=1.0)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    x[3, 7] = 0.5
    trainer.step(x, y, lr=1.0)  # the same batch, cleaned, trains


def test_empty_calibration_and_empty_input_range_are_refused():
    with pytest.raises(ValueError, match="calibration batch of shape \\[0, 1, 28, 28\\] is empty"):
        quantize_model(mnist_cnn(), torch.rand(0, 1, 28, 28))
    for bad in [(0.0, 0.0), (1.0, 0.0), (0.0, float("inf"))]:
        with pytest.raises(ValueError, match="input_range must be finite with lo < hi"):
            quantize_model(mnist_cnn(), images(2, 0), input_range=bad)


def test_meta_device_model_is_refused_with_a_hint():
    """Issue 20 probe 14: a model built under torch.device('meta') failed deep inside torch."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))
    with pytest.raises(ValueError, match=r"meta device .*'0.weight'.*to_empty"):
        quantize_model(model, torch.rand(4, 16))
