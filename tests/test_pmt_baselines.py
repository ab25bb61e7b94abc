"""PMT's baselines (§4.2.2, §4.3): MeZO, DeepZero CGE, FP32 / INT8 full training, sparse BP."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bpfree.data import load_digits_split
from bpfree.perturb import derive_seed, rademacher_xorshift
from bpfree.pmt import accuracy, find_layers, fit, per_sample_loss
from bpfree.baselines import DeepZeroCGE, FullTrainFP32, FullTrainINT8, MeZO, SparseBP
from bpfree.quant.ptq import quantize_model
from bpfree.quant.twin import float_twin


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny tensors: thread start-up dominates (and oversubscribes a shared CPU).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


_DIGITS = {}


def _digits(n: int = 256):
    if "x" not in _DIGITS:
        xtr, ytr, _, _ = load_digits_split(0)
        _DIGITS["x"] = torch.from_numpy(xtr).view(-1, 1, 8, 8)
        _DIGITS["y"] = torch.from_numpy(ytr)
    return _DIGITS["x"][:n], _DIGITS["y"][:n]


def _float_model(seed: int = 0, bn: bool = False) -> nn.Sequential:
    torch.manual_seed(seed)
    conv = [nn.Conv2d(1, 8, 3, 2, 1)] + ([nn.BatchNorm2d(8)] if bn else []) + [nn.ReLU()]
    return nn.Sequential(nn.Sequential(*conv), nn.Flatten(), nn.Linear(128, 10))


def _qmodel(seed: int = 0):
    x, _ = _digits()
    return quantize_model(_float_model(seed), x, input_range=(0.0, 1.0))


def _loss(q, x, y):
    return per_sample_loss(q.body(q.input_quant.quantize(x)), y, q.output_quant)


def _weights(q):
    return [q.body[0].weight.clone(), q.body[2].weight.clone()]


# ---------------------------------------------------------------------------------------------
# MeZO
# ---------------------------------------------------------------------------------------------


def test_mezo_estimate_matches_brute_force_two_point_and_counts_forwards():
    q = _qmodel()
    x, y = _digits(32)
    method = MeZO(q, x, queries=1, seed=5)
    before = _weights(q)
    est, loss = method.estimate(x, y)
    assert method.forwards == 2 * 32
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(q)))  # restored
    assert torch.allclose(loss, _loss(q, x, y))  # monitoring pass: the clean loss
    layers = find_layers(q, x)
    xis = [rademacher_xorshift(derive_seed(5, 0, i, 0), l.module.weight.shape)
           for i, l in enumerate(layers)]
    losses = []
    for sign in (1, -1):
        for l, w, xi in zip(layers, before, xis):
            l.module.weight.copy_((w.to(torch.int16) + sign * xi).clamp(-128, 127))
        losses.append(_loss(q, x, y))
    for l, w in zip(layers, before):
        l.module.weight.copy_(w)
    d = float((losses[0] - losses[1]).mean()) / 2
    for l, xi in zip(layers, xis):
        assert torch.allclose(est[l.name].weight, d * xi.double(), rtol=0, atol=1e-12)
        assert est[l.name].bias is None
        assert est[l.name].directions == 1
        assert est[l.name].dimension == 72 + 1280  # model-wise: the total d


def test_mezo_step_counts_queries_and_is_deterministic():
    x, y = _digits(16)
    finals = []
    for _ in range(2):
        q = _qmodel()
        method = MeZO(q, x, queries=3, seed=2, qas=True)
        out = method.step(x, y, lr=0.05)
        assert out["forwards"] == 2 * 16 * 3 and method.forwards == 96
        method.step(x, y, lr=0.05)
        assert method.forwards == 2 * 96
        finals.append(_weights(q))
    assert all(torch.equal(a, b) for a, b in zip(*finals))
    assert any(not torch.equal(a, b) for a, b in zip(finals[0], _weights(_qmodel())))


def test_mezo_trainable_subset_and_unmonitored_loss():
    q = _qmodel()
    x, y = _digits(16)
    w0 = _weights(q)
    method = MeZO(q, x, seed=1, trainable=["body.2"], qas=True, monitor=False)
    out = method.step(x, y, lr=1e-2)
    assert torch.equal(q.body[0].weight, w0[0])
    assert not torch.equal(q.body[2].weight, w0[1])
    assert out["loss"] == pytest.approx(float(_loss(_qmodel(), x, y).mean()), rel=0.05)


# ---------------------------------------------------------------------------------------------
# DeepZero CGE
# ---------------------------------------------------------------------------------------------


def test_cge_estimates_coordinates_by_forward_difference():
    q = _qmodel()
    x, y = _digits(16)
    method = DeepZeroCGE(q, x, coordinates=12, seed=3, chunk_elements=300)  # several chunks
    est, clean = method.estimate(x, y)
    assert method.forwards == 16 * (12 + 1)
    coords = method.last_coordinates
    assert sum(v.numel() for v in coords.values()) == 12
    layers = {l.name: l for l in find_layers(q, x)}
    for name, idx in coords.items():
        flat_est = est[name].weight.view(-1)
        mask = torch.zeros_like(flat_est, dtype=torch.bool)
        mask[idx] = True
        assert bool((flat_est[~mask] == 0).all())
        flat = layers[name].module.weight.view(-1)
        for j in idx.tolist():
            old = int(flat[j])
            flat[j] = min(old + 1, 127)
            expect = float((_loss(q, x, y) - clean).mean())
            flat[j] = old
            assert float(flat_est[j]) == pytest.approx(expect, abs=1e-12)


def test_cge_step_changes_only_selected_coordinates():
    q = _qmodel()
    x, y = _digits(16)
    w0 = _weights(q)
    method = DeepZeroCGE(q, x, coordinates=40, seed=0)
    out = method.step(x, y, lr=0.5)
    assert out["forwards"] == 16 * 41
    changed_any = False
    for name, w_old, w_new in zip(("body.0", "body.2"), w0, _weights(q)):
        diff = (w_old != w_new).view(-1).nonzero().view(-1)
        sel = method.last_coordinates.get(name, torch.empty(0, dtype=torch.long))
        assert set(diff.tolist()) <= set(sel.tolist())
        changed_any |= diff.numel() > 0
    assert changed_any
    dense = DeepZeroCGE(_qmodel(), x, seed=0, trainable="body.0")
    assert dense.coordinates == 72
    assert DeepZeroCGE(_qmodel(), x, sparsity=0.9).coordinates == 136  # ceil(0.1 * 1352)


# ---------------------------------------------------------------------------------------------
# Full training, FP32 and INT8, and sparse BP
# ---------------------------------------------------------------------------------------------


def test_fulltrain_fp32_is_a_plain_sgd_step_with_frozen_bn_statistics():
    x, y = _digits(32)
    model = _float_model(bn=True)
    model[0][1].running_mean.uniform_(-0.1, 0.1)
    ref = copy.deepcopy(model)
    method = FullTrainFP32(model)
    out = method.step(x, y, lr=0.3)
    ref.eval()
    loss = F.cross_entropy(ref(x), y)
    loss.backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.3 * p.grad
    assert out["loss"] == pytest.approx(loss.item())
    for a, b in zip(model.state_dict().values(), ref.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-7)
    assert method.forwards == 32 and method.backwards == 32
    with torch.no_grad():  # the reference model's top-1 hits, counted here
        hits = int((ref(x).argmax(1) == y).sum())
    assert accuracy(method.model, x, y) == 100.0 * hits / 32


def test_fulltrain_fp32_lr_scale_is_a_parameter_group_rate():
    x, y = _digits(16)
    model = _float_model()
    ref = copy.deepcopy(model)
    FullTrainFP32(model, lr_scale={"2": 3.0}).step(x, y, lr=0.1)
    F.cross_entropy(ref.eval()(x), y).backward()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p -= (0.3 if name.startswith("2.") else 0.1) * p.grad
    for a, b in zip(model.state_dict().values(), ref.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-7)
    with pytest.raises(ValueError, match="unknown module"):
        FullTrainFP32(_float_model(), lr_scale={"nope": 2.0})
    with pytest.raises(ValueError, match="finite number"):
        FullTrainFP32(_float_model(), lr_scale={"2": -1.0})


def test_fulltrain_fp32_trainable_subset():
    x, y = _digits(16)
    model = _float_model()
    conv0 = model[0][0].weight.clone()
    FullTrainFP32(model, trainable=["2"]).step(x, y, lr=0.5)
    assert torch.equal(model[0][0].weight, conv0)
    with pytest.raises(ValueError, match="modules with parameters"):
        FullTrainFP32(_float_model(), trainable=["1"])  # Flatten has no parameters


def test_fulltrain_int8_with_qas_learns_and_without_qas_rounds_updates_away():
    x, y = _digits(128)
    q = _qmodel()
    method = FullTrainINT8(q, qas=True)
    hist = fit(method, x, y, epochs=15, batch_size=64, lr=0.3, schedule="constant")
    assert method.forwards == 30 * 64
    first, last = sum(hist.loss[:3]) / 3, sum(hist.loss[-3:]) / 3
    assert last < 0.9 * first
    assert q.body[0].weight.dtype == torch.int8 and q.body[2].bias.dtype == torch.int32
    # The twin stays in sync with the integer model that is evaluated.
    assert torch.equal(method.tlayers["body.2"].weight.detach(), q.body[2].weight.float())

    q2 = _qmodel()
    w0 = _weights(q2)
    fit(FullTrainINT8(q2, qas=False), x, y, epochs=15, batch_size=64, lr=0.3,
        schedule="constant")
    changed = sum(int((a != b).sum()) for a, b in zip(w0, _weights(q2)))
    assert changed / sum(w.numel() for w in w0) < 0.01


def test_fulltrain_int8_update_is_the_qas_scaled_rounded_gradient_step():
    x, y = _digits(32)
    q = _qmodel()
    method = FullTrainINT8(q, qas=True)
    grads, _ = method.gradients(x, y)
    w0 = q.body[2].weight.clone()
    FullTrainINT8(q, qas=True).step(x, y, lr=0.2)
    s_w = torch.tensor(q.body[2].weight_quant.scales, dtype=torch.float64).view(-1, 1)
    expect = torch.round(w0.double() - 0.2 * grads["body.2"].weight / s_w**2).clamp(-128, 127)
    assert torch.equal(q.body[2].weight, expect.to(torch.int8))


def test_sparse_bp_updates_only_the_selected_layers():
    x, y = _digits(32)
    q = _qmodel()
    w0, b0 = _weights(q), q.body[0].bias.clone()
    method = SparseBP(q, trainable=["body.2"])
    for _ in range(3):
        method.step(x, y, lr=0.5)
    assert torch.equal(q.body[0].weight, w0[0]) and torch.equal(q.body[0].bias, b0)
    assert not torch.equal(q.body[2].weight, w0[1])
    assert not method.tlayers["body.0"].weight.requires_grad


def _sub_lsb_rate(q, x, y, name: str = "body.2", fraction: float = 0.2) -> float:
    """A rate at which every QAS step of ``name`` on (x, y) is ``fraction`` of an LSB at most:
    rounded each step, no weight of that layer can move."""
    g = SparseBP(copy.deepcopy(q), trainable=[name]).gradients(x, y)[0][name].weight
    s_w = torch.tensor(dict(q.named_modules())[name].weight_quant.scales,
                       dtype=torch.float64).view(-1, 1)
    return fraction / float((g / s_w**2).abs().max())


def test_sparse_bp_latent_weights_accumulate_updates_that_rounding_swallows():
    # bench mcunet's INT8 sparse BP left test accuracy where it started: at the chosen rate
    # every step of the new head was below half an int8 step, and rounding each step threw
    # it away. MCUTrain keeps an unrounded copy; with it the same rate trains.
    x, y = _digits(64)
    q0 = _qmodel()
    lr = _sub_lsb_rate(q0, x, y, fraction=0.45)
    rounded, latent = copy.deepcopy(q0), copy.deepcopy(q0)
    loss0 = float(_loss(q0, x, y).mean())
    fit(SparseBP(rounded, trainable=["body.2"]), x, y, epochs=5, batch_size=64, lr=lr,
        schedule="constant")
    assert torch.equal(rounded.body[2].weight, q0.body[2].weight)
    hist = fit(SparseBP(latent, trainable=["body.2"], latent_weights=True), x, y, epochs=100,
               batch_size=64, lr=lr, schedule="constant")
    changed = float((latent.body[2].weight != q0.body[2].weight).double().mean())
    assert changed > 0.05
    assert float(_loss(latent, x, y).mean()) < loss0 - 0.02
    assert hist.loss[-1] < hist.loss[0]
    assert latent.body[2].weight.dtype == torch.int8


def test_sparse_bp_latent_weights_follow_the_summed_autograd_steps():
    # Two steps: the int8 weights are round(W0 - lr * (g0 + g1) / s_w^2), g_k the autograd
    # gradient of the fake-quantized twin at the int8 weights of step k (not the sum of two
    # separately rounded steps).
    x, y = _digits(32)
    q = _qmodel()
    w0 = q.body[2].weight.double()
    lr = 3 * _sub_lsb_rate(q, x, y, fraction=0.4)
    method = SparseBP(q, trainable=["body.2"], latent_weights=True)
    s_w = torch.tensor(q.body[2].weight_quant.scales, dtype=torch.float64).view(-1, 1)
    steps = []
    for _ in range(2):
        twin = float_twin(q, fake_quant=True)
        F.cross_entropy(twin(x), y).backward()
        g = dict(twin.named_modules())["body.2"].weight.grad.double()
        steps.append(g / s_w**2)
        method.step(x, y, lr)
    expect = torch.round(w0 - lr * (steps[0] + steps[1])).clamp(-128, 127)
    assert torch.equal(q.body[2].weight, expect.to(torch.int8))
    # Changing the int8 weights from outside restarts the copy from them.
    q.body[2].weight.zero_()
    method.step(x, y, 1e-12)
    assert torch.equal(q.body[2].weight, torch.zeros_like(q.body[2].weight))


# ---------------------------------------------------------------------------------------------
# Bad arguments
# ---------------------------------------------------------------------------------------------


def test_bad_arguments_raise_clear_errors():
    x, y = _digits(8)
    q = _qmodel()
    with pytest.raises(ValueError, match="queries"):
        MeZO(q, x, queries=0)
    with pytest.raises(ValueError, match="seed"):
        MeZO(q, x, seed=-1)
    with pytest.raises(ValueError, match=r"unknown trainable.*body\.0"):
        MeZO(q, x, trainable=["body.5"])
    with pytest.raises(ValueError, match="coordinates"):
        DeepZeroCGE(q, x, coordinates=0)
    with pytest.raises(ValueError, match="coordinates"):
        DeepZeroCGE(q, x, coordinates=10**6)
    with pytest.raises(ValueError, match="sparsity"):
        DeepZeroCGE(q, x, sparsity=1.0)
    with pytest.raises(ValueError, match="not both"):
        DeepZeroCGE(q, x, coordinates=3, sparsity=0.5)
    with pytest.raises(ValueError, match=r"unknown trainable.*body\.2"):
        FullTrainINT8(q, trainable=["body.1"])
    with pytest.raises(ValueError, match="non-empty"):
        SparseBP(q, trainable=[])
    with pytest.raises(ValueError, match="unknown trainable"):
        FullTrainFP32(_float_model(), trainable=["nope"])
    with pytest.raises(ValueError, match="learning rate"):
        MeZO(q, x).step(x, y, lr=-1.0)
    with pytest.raises(ValueError, match="same non-zero"):
        FullTrainINT8(q).step(x, y[:3], lr=0.1)
    with pytest.raises(ValueError, match="body"):
        MeZO(nn.Linear(3, 3), torch.zeros(1, 3))
