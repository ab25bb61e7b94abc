"""QZO-FF on an int8 model's own codes (bpfree.qzoff.IntegerQZOFF, `bpfree adapt --method
qzo-ff`): one step against Eqs. 6-8 assembled from the fixed-point primitives, the int8 / int32
ranges, the hyper-parameter checks, and adaptation to a shifted task."""

from __future__ import annotations

import copy
from functools import lru_cache

import pytest
import torch
from torch import nn

from bpfree import tflite as bt
from bpfree.harness import accuracy, fit, holdout_split
from bpfree.perturb import derive_seed, quantization_scale, quantized_gaussian_codes
from bpfree.pmt import per_sample_loss
from bpfree.quant import quantize_model
from bpfree.quant.fixed_point import multiply_by_quantized_multiplier, quantize_multiplier
from bpfree.qzoff import IntegerQZOFF


@lru_cache(maxsize=1)
def _shifted_task():
    """A 20-32-5 MLP trained (BP, float) on ``y = argmax(x[:5])``, PTQ'd with LiteRT's rules,
    and 500 samples of a shifted domain: features 1 and 3 read at half gain, so the deployed
    model is wrong on about a third of them (labels still from the true features)."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x = torch.rand(4000, 20, generator=g)
    y = x[:, :5].argmax(-1)
    net = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 5))
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    for _ in range(500):
        idx = torch.randint(0, 4000, (128,), generator=g)
        loss = nn.functional.cross_entropy(net(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    q = quantize_model(net.eval(), x[:500])
    bt.use_litert_kernels(q)
    gain = torch.ones(20)
    gain[[1, 3]] = 0.5
    xs = torch.rand(500, 20, generator=g)
    return bt.to_bytes(q, (20,)), xs * gain, xs[:, :5].argmax(-1)


def shifted_task():
    """``(loaded model, x, y)``: a fresh copy of the model each call."""
    data, x, y = _shifted_task()
    return bt.from_bytes(data), x, y


def _reference_step(model, x, y, lr, *, m, eps_codes, seed, t=0):
    """Eqs. 6-8 on every layer's int8 weights and int32 bias, from the primitives."""
    dz = quantization_scale(8, 3.5)
    pm, ps = quantize_multiplier(dz)
    layers = [mod for mod in model.body if hasattr(mod, "weight_quant")]
    tensors = []
    for mod in layers:
        s_w = torch.tensor(mod.weight_quant.scales, dtype=torch.float64)
        tensors.append((mod, "weight", s_w, torch.full_like(s_w, eps_codes).long(), 127))
        s_b = s_w * mod.input_quant.scale
        tensors.append((mod, "bias", s_b, torch.round(eps_codes * s_w / s_b).long(), 2**31 - 1))
    w0 = [getattr(mod, a).to(torch.int64).clone() for mod, a, *_ in tensors]
    xq = model.quantize_input(x)
    acc = [torch.zeros_like(w) for w in w0]
    signs = []
    for i in range(m):
        zs = [quantized_gaussian_codes(derive_seed(seed, t, i, k), w.shape, 8, 3.5,
                                       dtype=torch.int64) for k, w in enumerate(w0)]
        losses = []
        for sign in (1, -1):
            probe = copy.deepcopy(model)
            probe_tensors = [mod for mod in probe.body if hasattr(mod, "weight_quant")]
            for k, ((_, attr, _, eps_q, top), w, z) in enumerate(zip(tensors, w0, zs)):
                eps = eps_q.reshape(-1, *[1] * (w.dim() - 1))
                moved = (w + multiply_by_quantized_multiplier(sign * eps * z, pm, ps)).clamp(
                    -top, top)
                getattr(probe_tensors[k // 2], attr).copy_(moved)
            losses.append(float(per_sample_loss(probe.forward_int(xq), y,
                                                probe.output_quant).mean()))
        s = (losses[0] > losses[1]) - (losses[0] < losses[1])
        signs.append(s)
        acc = [a + s * z for a, z in zip(acc, zs)]
    new = []
    for (_, _, scale, _, top), w, a in zip(tensors, w0, acc):
        pairs = [quantize_multiplier(lr * dz / (m * float(s))) for s in scale]
        mult = torch.tensor([p[0] for p in pairs])
        shift = torch.tensor([p[1] for p in pairs])
        step = multiply_by_quantized_multiplier(a, mult, shift, axis=0)
        new.append((w - step).clamp(-top, top))
    return signs, new


def test_one_step_is_eqs_6_to_8_on_the_file_codes():
    model, x, y = shifted_task()
    reference = copy.deepcopy(model)
    trainer = IntegerQZOFF(model, example=x[:2], m=3, eps_codes=2, seed=5)
    out = trainer.step(x[:64], y[:64], 0.03)
    signs, expected = _reference_step(reference, x[:64], y[:64], 0.03, m=3, eps_codes=2, seed=5)
    assert out["signs"] == signs and any(signs)
    got = [t.codes for t in trainer.tensors]
    assert [g.dtype for g in got] == [torch.int8, torch.int32] * 2  # stays int8 / int32
    for g, e in zip(got, expected):
        assert torch.equal(g.to(torch.int64), e)
    assert out["moved"] > 0 and out["forwards"] == 2 * 3 * 64 == trainer.forwards
    assert int(got[0].abs().max()) <= 127


def test_zero_rate_leaves_every_code_unchanged_after_the_probes():
    model, x, y = shifted_task()
    before = [t.clone() for t in model.state_dict().values()]
    trainer = IntegerQZOFF(model, example=x[:2])
    out = trainer.step(x[:32], y[:32], 0.0)
    assert out["moved"] == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.state_dict().values()))


def test_only_the_named_layers_train_and_frozen_stages_run_once():
    model, x, y = shifted_task()
    first = model.body[0].weight.clone()
    trainer = IntegerQZOFF(model, example=x[:2], trainable="body.1")
    out = trainer.step(x[:32], y[:32], 0.03)
    assert torch.equal(model.body[0].weight, first)
    assert out["moved"] > 0
    assert out["forwards"] == 32 + 2 * 3 * 32  # the stage before body.1 once, then 2m passes


def test_a_bias_whose_epsilon_rounds_to_zero_stays_frozen():
    """Input scale > 2·eps_codes: the bias ε_q = ⌊ε_q·Δw/(s_in·Δw)⌉ is 0, so that bias is
    neither perturbed nor updated (its update would be noise)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3))
    q = quantize_model(net.eval(), 1000 * torch.rand(32, 4))
    assert q.body[0].input_quant.scale > 2
    x = 1000 * torch.rand(64, 4)
    y = torch.randint(0, 3, (64,))
    bias = q.body[0].bias.clone()
    trainer = IntegerQZOFF(q, example=x[:2])
    assert trainer.frozen_biases == ["body.0"]
    trainer.step(x, y, float(torch.tensor(q.body[0].weight_quant.scales).max()))
    assert torch.equal(q.body[0].bias, bias)


@pytest.mark.parametrize("kwargs, match", [
    ({"m": 0}, r"m \(directions per step\) must be an int >= 1"),
    ({"eps_codes": 0}, r"eps_codes \(ε in weight codes\) must be an int in \[1, 36\]"),
    ({"eps_codes": 37}, r"must be an int in \[1, 36\]"),
    ({"eps_codes": 1.5}, "must be an int"),
    ({"z_bits": 1}, "bits"),
    ({"z_max": 0.0}, "z_max"),
    ({"seed": -1}, "seed must be an int >= 0"),
    ({"trainable": ["body.9"]}, r"unknown trainable layer\(s\) \['body.9'\]"),
])
def test_bad_settings_are_refused(kwargs, match):
    model, x, _ = shifted_task()
    with pytest.raises(ValueError, match=match):
        IntegerQZOFF(model, example=x[:2], **kwargs)


def test_check_lr_refuses_rates_that_cannot_move_or_overshoot_int8():
    model, x, _ = shifted_task()
    trainer = IntegerQZOFF(model, example=x[:2])
    scales = torch.cat([t.scale for t in trainer.tensors if t.attr == "weight"])
    # the largest step is η·z_max/Δw codes (|ĝ| <= z_max): below 1/2 for every channel
    with pytest.raises(ValueError, match="too small .* no weight can move"):
        trainer.check_lr(0.4 * float(scales.min()) / 3.5)
    with pytest.raises(ValueError, match="too large .* more than the whole int8 range"):
        trainer.check_lr(300 * float(scales.min()) / 3.5)
    assert trainer.check_lr(0.03)["max_step_codes"] == int(trainer.largest_steps(0.03).max())
    with pytest.raises(ValueError, match="learning rate must be a finite number"):
        trainer.check_lr(float("nan"))


def test_adaptation_to_the_shifted_task_raises_validation_accuracy():
    model, x, y = shifted_task()
    train, val = holdout_split(x.shape[0], 0.2, 0)
    before = accuracy(model, x[val], y[val])
    trainer = IntegerQZOFF(model, example=x[:2], m=3)
    history = fit(trainer, x[train], y[train], epochs=5, batch_size=32, lr=0.03, seed=0)
    after = accuracy(model, x[val], y[val])
    assert before < 75 and after >= before + 8
    first, last = history.loss[:5], history.loss[-5:]
    assert sum(last) < 0.8 * sum(first)
