"""PMT core: integer ZO estimates against brute force and autograd, the Eq. 8 update, the trainer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bpfree.perturb import derive_seed, rademacher_xorshift
from bpfree.pmt import (
    LayerEstimate,
    PMTConfig,
    PMTTrainer,
    StagedModel,
    apply_update,
    estimate_group,
    find_layers,
    fit,
    gradient_norm_factor,
    node_to_parameter_gradients,
    per_sample_loss,
    requant_scale,
)
from bpfree.quant import QConv2d, QFlatten, QLinear, TensorQuant


class TinyQuantized(nn.Module):
    """Conv (relu) -> [flatten, linear]: two stages, int8 throughout."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.input_quant = TensorQuant(1 / 255, -128)
        mid = TensorQuant(0.02, -128)
        self.output_quant = TensorQuant(0.1, 3)
        w1 = torch.randint(-127, 128, (4, 1, 3, 3), generator=g)
        w2 = torch.randint(-127, 128, (10, 4 * 4 * 4), generator=g)
        self.body = nn.Sequential(
            QConv2d(w1, torch.randint(-500, 500, (4,), generator=g),
                    weight_scale=[0.01, 0.02, 0.015, 0.03], input_quant=self.input_quant,
                    output_quant=mid, stride=2, padding=1, activation="relu"),
            nn.Sequential(QFlatten(), QLinear(w2, torch.randint(-500, 500, (10,), generator=g),
                                              weight_scale=0.004, input_quant=mid,
                                              output_quant=self.output_quant)))

    def forward(self, x):
        xq = x if x.dtype == torch.int8 else self.input_quant.quantize(x)
        return self.output_quant.dequantize(self.body(xq))


def _data(n=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


def _clean(model, x, y):
    staged = StagedModel(model)
    loss = per_sample_loss(staged.clean(model.input_quant.quantize(x)), y, model.output_quant)
    return staged, loss


def test_find_layers_dimensions_and_adaptive_choice():
    model = TinyQuantized()
    x, _ = _data()
    layers = find_layers(model, x)
    assert [l.name for l in layers] == ["body.0", "body.1.1"]
    assert (layers[0].d_w, layers[0].d_a) == (36, 64)
    assert (layers[1].d_w, layers[1].d_a) == (640, 10)
    assert [l.preferred_mode for l in layers] == ["wp", "np"]


def test_weight_perturbation_matches_brute_force_full_forwards():
    model = TinyQuantized()
    x, y = _data()
    staged, loss = _clean(model, x, y)
    layers = find_layers(model, x)
    before = model.body[0].weight.clone()
    est = estimate_group(staged, [(layers[0], "wp")], [0], y, loss, queries=3, seed=7)
    assert torch.equal(model.body[0].weight, before)  # restored bit-exactly
    expected = torch.zeros(before.shape, dtype=torch.float64)
    for q in range(3):
        xi = rademacher_xorshift(derive_seed(7, 0, q), before.shape)
        model.body[0].weight.copy_((before.to(torch.int16) + xi).clamp(-128, 127))
        lq = per_sample_loss(model.body(model.input_quant.quantize(x)), y, model.output_quant)
        expected += float((lq - loss).mean()) * xi.double()
    model.body[0].weight.copy_(before)
    assert torch.allclose(est["body.0"].weight, expected / 3, rtol=0, atol=1e-12)
    assert (est["body.0"].directions, est["body.0"].dimension) == (3, 36)


def test_node_perturbation_matches_brute_force_and_batches_queries():
    model = TinyQuantized()
    x, y = _data()
    staged, loss = _clean(model, x, y)
    layers = find_layers(model, x)
    layer = layers[0]
    for chunk in (1, 10**9):  # one query at a time, and all queries in one batch
        est = estimate_group(staged, [(layer, "np")], [0], y, loss, queries=4, seed=3,
                             chunk_elements=chunk)
        gz = torch.zeros((12, *layer.output_shape), dtype=torch.float64)
        for q in range(4):
            xi = rademacher_xorshift(derive_seed(3, 0, q), (12, *layer.output_shape))
            layer.module.node_offset = xi
            lq = per_sample_loss(model.body(model.input_quant.quantize(x)), y, model.output_quant)
            layer.module.node_offset = None
            gz += (lq - loss).view(-1, 1, 1, 1) * xi.double()
        gw, gb = node_to_parameter_gradients(layer.module, model.input_quant.quantize(x), gz / 4)
        assert torch.allclose(est["body.0"].weight, gw, atol=1e-12)
        assert torch.allclose(est["body.0"].bias, gb, atol=1e-12)
    assert est["body.0"].directions == 12 * 4 and est["body.0"].dimension == 64


def test_node_offset_is_added_before_the_relu_clamp():
    model = TinyQuantized()
    x, _ = _data()
    conv = model.body[0]
    xq = model.input_quant.quantize(x)
    clean = conv(xq)
    conv.node_offset = torch.tensor(-1, dtype=torch.int8)
    shifted = conv(xq)
    conv.node_offset = None
    zp = conv.output_quant.zero_point  # ReLU clamps at the zero point
    assert torch.equal(shifted, (clean.to(torch.int16) - 1).clamp(min=zp).to(torch.int8))


@pytest.mark.parametrize("kind", ["conv", "linear"])
def test_eq10_parameter_gradients_match_autograd(kind):
    model = TinyQuantized()
    x, _ = _data()
    xq = model.input_quant.quantize(x)
    layer = model.body[0] if kind == "conv" else model.body[1][1]
    inp = xq if kind == "conv" else model.body[1][0](model.body[0](xq))
    g = torch.Generator().manual_seed(5)
    out_shape = layer(inp).shape
    node_grad = torch.randn(out_shape, generator=g, dtype=torch.float64)
    gw, gb = node_to_parameter_gradients(layer, inp, node_grad)
    # The real-valued pre-activation in output LSBs: z = M (W (x - z_x) + b).
    w = layer.weight.double().requires_grad_()
    b = layer.bias.double().requires_grad_()
    xf = inp.double() - layer.input_quant.zero_point
    m = requant_scale(layer)
    if kind == "conv":
        z = F.conv2d(xf, w, b, layer.stride, layer.padding) * m.view(1, -1, 1, 1)
    else:
        z = (xf @ w.T + b) * m
    ((z * node_grad).sum() / inp.shape[0]).backward()
    assert torch.allclose(gw, w.grad, rtol=1e-10, atol=1e-12)
    assert torch.allclose(gb, b.grad, rtol=1e-10, atol=1e-12)


def test_update_follows_eq8_with_gns_and_qas():
    model = TinyQuantized()
    layer = model.body[0]
    w0, b0 = layer.weight.clone(), layer.bias.clone()
    g = torch.full(w0.shape, 1e-4, dtype=torch.float64)
    gb = torch.full((4,), 1e-9, dtype=torch.float64)
    est = LayerEstimate(g.clone(), gb.clone(), directions=10, dimension=36)
    apply_update(layer, est, lr=0.5, gns=True, qas=True)
    factor = 10 / (10 + 36 - 1)
    s_w = torch.tensor(layer.weight_quant.scales, dtype=torch.float64).view(-1, 1, 1, 1)
    expect = torch.round(w0.double() - 0.5 * factor * g / s_w**2).clamp(-128, 127)
    assert torch.equal(layer.weight, expect.to(torch.int8))
    s_b = s_w.view(-1) * layer.input_quant.scale
    assert torch.equal(layer.bias, torch.round(b0.double() - 0.5 * factor * gb / s_b**2).int())
    assert gradient_norm_factor(10, 36) == pytest.approx(factor)
    # Without QAS the same lr moves nothing: the update is below half an LSB (§3.1.2).
    layer.weight.copy_(w0)
    est = LayerEstimate(g.clone(), gb.clone(), directions=10, dimension=36)  # consumed above
    stats = apply_update(layer, est, lr=0.5, gns=True, qas=False)
    assert stats["changed"] == 0.0 and torch.equal(layer.weight, w0)


def test_update_clips_to_int8_and_rejects_non_finite():
    model = TinyQuantized()
    layer = model.body[0]
    est = LayerEstimate(torch.full(layer.weight.shape, -1e9, dtype=torch.float64), None, 1, 1)
    apply_update(layer, est, lr=1.0, gns=False, qas=False)
    assert int(layer.weight.min()) == 127 and layer.weight.dtype == torch.int8
    before = layer.weight.clone()
    for bad in (float("nan"), float("inf"), float("-inf")):
        est.weight.zero_()
        est.weight[0, 0, 0, 0] = bad
        with pytest.raises(FloatingPointError):
            apply_update(layer, est, lr=1.0)
        assert torch.equal(layer.weight, before)


def test_trainer_is_bit_reproducible_and_counts_forwards():
    x, y = _data(16)
    runs = []
    for _ in range(2):
        model = TinyQuantized()
        trainer = PMTTrainer(model, PMTConfig(queries=3, seed=11), example=x)
        fit(trainer, x, y, epochs=2, batch_size=8, lr=0.05)
        runs.append([t.clone() for t in model.state_dict().values()])
        # per step: N clean + Q*N per trainable layer
        assert trainer.forwards == 4 * (8 + 2 * 3 * 8)
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_synchronized_update_uses_step_t_activations():
    """Global update (Alg. 1 line 34): the estimate of layer 2 must not see layer 1's update."""
    x, y = _data(8)
    a, b = TinyQuantized(), TinyQuantized()
    PMTTrainer(a, PMTConfig(queries=2), example=x).step(x, y, lr=5.0)
    # Same step with only the second layer trainable gives the same second-layer result.
    PMTTrainer(b, PMTConfig(queries=2), example=x, trainable=["body.1.1"]).step(x, y, lr=5.0)
    assert torch.equal(a.body[1][1].weight, b.body[1][1].weight)
    # A local update does see it (the first layer moved at lr=5).
    c = TinyQuantized()
    PMTTrainer(c, PMTConfig(queries=2, synchronized=False), example=x).step(x, y, lr=5.0)
    assert not torch.equal(c.body[0].weight, TinyQuantized().body[0].weight)


def test_pmt_reduces_the_loss_on_a_learnable_task():
    torch.manual_seed(0)
    model = TinyQuantized(seed=3)
    x, _ = _data(64, seed=2)
    with torch.no_grad():
        y = model(x).argmax(-1).roll(1)  # labels the model currently gets wrong
    trainer = PMTTrainer(model, PMTConfig(queries=8, seed=1), example=x)
    hist = fit(trainer, x, y, epochs=15, batch_size=32, lr=0.02, schedule="constant")
    first, last = sum(hist.loss[:4]) / 4, sum(hist.loss[-4:]) / 4
    assert last < 0.8 * first


@pytest.mark.parametrize("kwargs, match", [
    ({"queries": 0}, "queries"),
    ({"perturbation": "node"}, "perturbation"),
    ({"micro_batch": 0}, "micro_batch"),
    ({"micro_batch": 4, "synchronized": False}, "synchronized"),
    ({"seed": -1}, "seed"),
])
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PMTConfig(**kwargs)


def test_trainer_rejects_bad_input():
    x, y = _data(8)
    model = TinyQuantized()
    with pytest.raises(ValueError, match="unknown trainable"):
        PMTTrainer(model, example=x, trainable=["body.7"])
    trainer = PMTTrainer(model, example=x)
    with pytest.raises(ValueError, match="learning rate"):
        trainer.step(x, y, lr=float("nan"))
    with pytest.raises(ValueError, match="same non-zero"):
        trainer.step(x, y[:3], lr=0.1)
    with pytest.raises(ValueError, match="QuantizedModel|body"):
        PMTTrainer(nn.Linear(3, 3), example=torch.zeros(1, 3))


def test_stage_by_stage_schedule_equals_update_at_the_end():
    """Alg. 1's lean schedule (one stage buffer, updates applied stage by stage) must give the
    same bits as holding every estimate and updating after the last layer."""
    x, y = _data(16)
    a, b = TinyQuantized(), TinyQuantized()
    ta = PMTTrainer(a, PMTConfig(queries=3, seed=4), example=x)
    tb = PMTTrainer(b, PMTConfig(queries=3, seed=4, micro_batch=16), example=x)  # held path
    for _ in range(3):
        ta.step(x, y, lr=0.5)
        tb.step(x, y, lr=0.5)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(),
                                                  b.state_dict().values()))
    assert ta.forwards == tb.forwards
    # Only the current stage's input is held after a lean step.
    assert sum(t is not None for t in ta.staged.inputs) <= 2


def _ce(logits_q: torch.Tensor, y: torch.Tensor, out_q: TensorQuant) -> torch.Tensor:
    """Per-sample cross-entropy of dequantized int8 logits, float64, written out."""
    z = (logits_q.double() - out_q.zero_point) * out_q.scale
    return torch.logsumexp(z, 1) - z.gather(1, y[:, None])[:, 0]


def _eq10(module: nn.Module, a: torch.Tensor, gz: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Eq. 10 through the integer graph, as sums over samples and positions: the output LSB
    is z = M (W (a - z_a) + b) with M = s_in s_w / s_out per channel, so dW = M g_z (a - z_a)^T
    and db = M g_z. Convolutions by explicit patches (unfold), not torch's conv2d_weight."""
    m = (torch.tensor(module.weight_quant.scales, dtype=torch.float64)
         * module.input_quant.scale / module.output_quant.scale)
    a = a.double() - module.input_quant.zero_point
    if isinstance(module, QConv2d):
        patches = F.unfold(a, module.weight.shape[2:], padding=module.padding,
                           stride=module.stride)                       # (N, C k k, positions)
        g = gz.flatten(2) * m.view(1, -1, 1)                           # (N, C_out, positions)
        return (torch.einsum("ncp,nkp->ck", g, patches).reshape(module.weight.shape),
                g.sum((0, 2)))
    g = gz * m
    return g.T @ a, g.sum(0)


def _reference_step(model, x, y, *, queries, seed, lr, micro, groups, gns=True, qas=True):
    """One PMT step written from the paper, not from the trainer: full forwards of the int8
    model (no stages, no cached activations), float64 throughout.

    Per micro-batch j of n_j samples (directions from XORShift seeds derive_seed(seed, step 0,
    j), then (layer index, query), Appendix F): WP (Eq. 6, mu = 1, one direction per query
    shared by the micro-batch, the perturbed weight saturated to int8) gives
    g_W = 1/Q sum_q mean_n[l(W + xi_q) - l(W)] xi_q; NP (Eq. 9) perturbs the layer's output
    per sample and query and maps g_z to (g_W, g_b) by Eq. 10. A group's layers are perturbed
    together (model-wise when the group holds every layer). Micro-batch estimates are averaged
    weighted by n_j / N (gradient accumulation). Eq. 8: W <- clip(round(W - lr * NQ/(NQ+d-1)
    / s^2 * g)), NQ the directions averaged, d the perturbed dimension (Table 2: the group's
    total), s = s_w for weights and s_in s_w for biases. All layers are estimated at the
    step-t weights (the synchronized update). Returns {name: (weight, bias)} before rounding.
    """
    layers = {layer.name: layer for layer in find_layers(model, x)}
    index = {name: i for i, name in enumerate(layers)}
    xq = model.input_quant.quantize(x)
    n = xq.shape[0]
    grad, directions = {}, {}
    for j, lo in enumerate(range(0, n, micro)):
        xb, yb = xq[lo:lo + micro], y[lo:lo + micro]
        step_seed = derive_seed(seed, 0, j)
        with torch.no_grad():
            clean = _ce(model.body(xb), yb, model.output_quant)
            inputs = {}  # each layer's clean int8 input, for Eq. 10
            hooks = [layers[name].module.register_forward_pre_hook(
                lambda mod, args, name=name: inputs.setdefault(name, args[0]))
                for name in layers]
            model.body(xb)
            for h in hooks:
                h.remove()
            for group in groups:
                dims = {"wp": lambda l: l.d_w, "np": lambda l: l.d_a}
                d = sum(dims[mode](layers[name]) for name, mode in group)
                acc = {name: 0.0 for name, _ in group}
                for q in range(queries):
                    xis = {}
                    for name, mode in group:
                        layer = layers[name]
                        shape = layer.module.weight.shape if mode == "wp" else (
                            xb.shape[0], *layer.output_shape)
                        xis[name] = rademacher_xorshift(
                            derive_seed(step_seed, index[name], q), shape)
                        if mode == "wp":
                            w = layer.module.weight
                            saved = w.clone()
                            w.copy_((w.to(torch.int16) + xis[name]).clamp(-128, 127))
                            xis[name] = (xis[name], saved)
                        else:
                            layer.module.node_offset = xis[name]
                    diff = _ce(model.body(xb), yb, model.output_quant) - clean
                    for name, mode in group:
                        if mode == "wp":
                            xi, saved = xis[name]
                            layers[name].module.weight.copy_(saved)
                            acc[name] = acc[name] + diff.mean() * xi.double() / queries
                        else:
                            layers[name].module.node_offset = None
                            xi = xis[name].double()
                            acc[name] = acc[name] + diff.view(-1, *[1] * (xi.dim() - 1)) * xi / queries
                for name, mode in group:
                    if mode == "wp":
                        est, ndir = (acc[name], None), queries
                    else:
                        gw, gb = _eq10(layers[name].module, inputs[name], acc[name])
                        est, ndir = (gw / xb.shape[0], gb / xb.shape[0]), xb.shape[0] * queries
                    share = xb.shape[0] / n
                    prev = grad.get(name, (0.0, 0.0 if est[1] is not None else None))
                    grad[name] = tuple(None if e is None else p + share * e
                                       for p, e in zip(prev, est))
                    directions[name] = (directions.get(name, (0, d))[0] + ndir, d)
    out = {}
    for name, (gw, gb) in grad.items():
        module = layers[name].module
        nq, d = directions[name]
        step = lr * (nq / (nq + d - 1) if gns else 1.0)
        s_w = torch.tensor(module.weight_quant.scales, dtype=torch.float64)
        s_b = s_w * module.input_quant.scale
        qw = (1 / s_w**2 if qas else torch.ones_like(s_w)).view(-1, *[1] * (gw.dim() - 1))
        w = module.weight.double() - step * qw * gw
        b = None if gb is None else module.bias.double() - step * (1 / s_b**2 if qas else 1) * gb
        out[name] = (w, b)
    return out


@pytest.mark.parametrize("config, groups", [
    # the default: layer-wise, adaptive (WP conv, NP linear), stage-by-stage schedule
    (dict(), [[("body.0", "wp")], [("body.1.1", "np")]]),
    # gradient accumulation over 3 micro-batches of 6, 6 and 4 samples
    (dict(micro_batch=6), [[("body.0", "wp")], [("body.1.1", "np")]]),
    # model-wise estimation: every layer perturbed together, d = the total dimension
    (dict(layerwise=False), [[("body.0", "wp"), ("body.1.1", "np")]]),
    # one perturbation kind everywhere (NP through a conv), and the scalings switched off
    (dict(perturbation="np", gns=False), [[("body.0", "np")], [("body.1.1", "np")]]),
    (dict(perturbation="wp", qas=False), [[("body.0", "wp")], [("body.1.1", "wp")]]),
])
def test_trainer_step_matches_a_reference_written_from_the_paper(config, groups):
    x, y = _data(16)
    a, b = TinyQuantized(), TinyQuantized()
    cfg = PMTConfig(queries=3, seed=9, **config)
    trainer = PMTTrainer(a, cfg, example=x)
    assert sorted(trainer.modes.items()) == sorted(p for g in groups for p in g)
    lr = 0.5 if cfg.qas else 2e4  # without QAS an int8 LSB needs a huge rate to move
    trainer.step(x, y, lr=lr)
    ref = _reference_step(b, x, y, queries=3, seed=9, lr=lr, micro=cfg.micro_batch or 16,
                          groups=groups, gns=cfg.gns, qas=cfg.qas)
    moved = 0
    for name, (w, bias) in ref.items():
        got, before = a.get_submodule(name), b.get_submodule(name)
        if bias is None:  # WP estimates no bias: it stays
            assert torch.equal(got.bias, before.bias), name
        for tensor, real, lo, hi in ((got.weight, w, -128, 127),
                                     (got.bias, bias, -(2**31), 2**31 - 1)):
            if real is None:
                continue
            # Exact only away from a half: the reference sums in another order.
            assert ((real - real.floor() - 0.5).abs() > 1e-6).all(), name
            assert torch.equal(tensor.double(), real.round().clamp(lo, hi)), name
        moved += int((got.weight != before.weight).sum())
    assert moved > 0  # the step did something for the comparison to check


@pytest.mark.parametrize("config", [PMTConfig(queries=2, seed=5),
                                    PMTConfig(queries=2, seed=5, micro_batch=4),
                                    PMTConfig(queries=2, seed=5, synchronized=False)])
def test_lr_scale_multiplies_one_layers_rate(config):
    """lr_scale={layer: k} steps that layer at k*lr and the others at lr: the scaled layer
    ends where a run at k*lr leaves it, the unscaled one where a run at lr leaves it (both
    synchronized, so neither layer's estimate sees the other's update)."""
    x, y = _data(8)
    first, second = "body.0", "body.1.1"
    scaled = TinyQuantized()
    PMTTrainer(scaled, config, example=x, lr_scale={second: 4.0}).step(x, y, lr=0.5)
    at_lr, at_4lr = TinyQuantized(), TinyQuantized()
    PMTTrainer(at_lr, config, example=x).step(x, y, lr=0.5)
    PMTTrainer(at_4lr, config, example=x, trainable=[second]).step(x, y, lr=2.0)
    assert torch.equal(scaled.body[0].weight, at_lr.body[0].weight)
    if config.synchronized:
        assert torch.equal(scaled.body[1][1].weight, at_4lr.body[1][1].weight)
    assert not torch.equal(scaled.body[1][1].weight, at_lr.body[1][1].weight)
    with pytest.raises(ValueError, match="not trainable"):
        PMTTrainer(TinyQuantized(), config, example=x, trainable=[first],
                   lr_scale={second: 2.0})
    with pytest.raises(ValueError, match="finite number"):
        PMTTrainer(TinyQuantized(), config, example=x, lr_scale={second: float("nan")})
