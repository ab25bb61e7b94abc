"""TinyFoA's training-regime options (the authors' code against the paper's text): Adam on the
active slice, greedy layer-wise training and the diagonal-freeze schedule."""

import pytest
import torch

from bpfree.tinyfoa import SlicedFC, TinyFoA, fit_epochs, evaluate


def test_adam_on_a_slice_equals_torch_adam():
    g = torch.Generator().manual_seed(0)
    layer = SlicedFC(6, 4, m=2, generator=g)
    layer.use_adam()
    layer.set_slice(3)                          # rows 2:4, columns 3:6
    rows, cols = layer.blocks(3)
    w_ref = layer.weight[rows, cols].clone().requires_grad_()
    b_ref = layer.bias[rows].clone().requires_grad_()
    opt = torch.optim.Adam([w_ref, b_ref], lr=0.01)
    for _ in range(3):
        h = torch.randn(5, 6, generator=g)
        dz = torch.randn(5, 2, generator=g)
        layer.local_update(h, dz, 0.01)
        w_ref.grad, b_ref.grad = dz.T @ h[:, cols], dz.sum(0)
        opt.step()
    torch.testing.assert_close(layer.weight[rows, cols], w_ref.detach())
    torch.testing.assert_close(layer.bias[rows], b_ref.detach())


def test_a_data_exchange_drops_the_adam_moments():
    layer = SlicedFC(4, 4, m=2, generator=torch.Generator().manual_seed(1))
    layer.use_adam()
    layer.local_update(torch.ones(2, 4), torch.ones(2, 2), 0.1)
    assert layer.adam_state
    layer.set_slice(1)
    assert layer.adam_state == {}


@pytest.mark.parametrize("variant", ["TinyFoA", "TinyFoA-BW-BA"])
def test_diagonal_freeze_keeps_one_diagonal_block_and_trains_the_rest(variant):
    torch.manual_seed(0)
    net = TinyFoA([8, 8], 3, variant=variant, m=2, seed=0, schedule="diagonal-freeze")
    layer = net.layers[0]
    net.set_progress(1, 2, 2)                   # phase 1: block (rows 4:8, columns 4:8) frozen
    before = layer.latent_weight().clone()
    bias = layer.bias.clone()
    net.step(torch.randn(16, 8), torch.randint(0, 3, (16,)), 0.5)
    after = layer.latent_weight()
    frozen = (slice(4, 8), slice(4, 8))
    assert torch.equal(after[frozen], before[frozen])
    changed = (after != before)
    changed[frozen] = True
    assert changed.float().mean() > 0.9         # everything else moved
    assert not torch.equal(layer.bias, bias)    # biases are not frozen (the authors' code)
    if layer.binary_weights:                    # the running Σ|W| stays the latent's
        assert layer.abs_sum == pytest.approx(float(after.abs().sum()), rel=1e-5)
        assert torch.equal(layer.signs, torch.where(after >= 0, 1.0, -1.0))


def test_greedy_layerwise_trains_one_layer_per_share_of_the_steps():
    net = TinyFoA([6, 8, 8, 8], 3, variant="TinyFoA-V-BA-BW", seed=0, layerwise=True)
    x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    for step, trained in ((0, 0), (4, 1), (8, 2)):  # 9 steps, 3 layers
        net.set_progress(step, 9, 9)
        before = [layer.weight.clone() for layer in net.layers]
        out = net.step(x, y, 0.1)
        moved = [not torch.equal(b, layer.weight) for b, layer in zip(before, net.layers)]
        assert moved == [i == trained for i in range(3)]
        assert len(out["local_losses"]) == 1


def test_the_authors_regime_learns_digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16
    y = torch.tensor(d.target)
    net = TinyFoA([64, 64, 64], 10, variant="TinyFoA", m=2, seed=0, optimizer="adam",
                  layerwise=True, schedule="diagonal-freeze")
    chance = evaluate(net, x[1400:], y[1400:])
    fit_epochs(net, x[:1400], y[:1400], epochs=8, batch_size=32, lr=3e-3, seed=0)
    assert chance > 70 and evaluate(net, x[1400:], y[1400:]) < 25


@pytest.mark.parametrize("kw, match", [
    (dict(optimizer="rmsprop"), r"optimizer must be one of \('sgd', 'adam'\)"),
    (dict(schedule="random"), r"schedule must be one of \('slice', 'diagonal-freeze'\)"),
    (dict(schedule="diagonal-freeze", variant="TinyFoA-V"), "needs an FC network and a "
     "variant with vertical training"),
    (dict(schedule="diagonal-freeze", m=3), "do not divide"),
])
def test_bad_regime_options_are_refused(kw, match):
    kw = dict(dict(variant="TinyFoA", m=2), **kw)
    with pytest.raises(ValueError, match=match):
        TinyFoA([8, 8], 3, **kw)


def test_diagonal_freeze_refuses_lc_layers():
    with pytest.raises(ValueError, match="with LC layers"):
        TinyFoA(None, 10, variant="TinyFoA", lc=[(4, 5, 2)], in_shape=(1, 28),
                schedule="diagonal-freeze")
