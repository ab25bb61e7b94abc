"""Update rules (bpfree.updates): float SGD, PMT's round-and-clip, QZO-FF's fixed point."""

from __future__ import annotations

import pytest
import torch

from bpfree.perturb import Rademacher, get_distribution, list_distributions
from bpfree.updates import fixed_point_update, qmax, round_and_clip_, saturate, sgd_


def test_round_and_clip_rounds_half_to_even_and_saturates_in_the_step_buffer():
    w = torch.tensor([0, 0, 0, 120, -120, 5], dtype=torch.int8)
    step = torch.tensor([0.5, 1.5, -2.5, 10.0, -10.0, 0.49], dtype=torch.float64)
    out = round_and_clip_(step, w, -128, 127)
    assert out is step  # the gradient buffer becomes the new weights (PMT §3.2.2)
    assert out.tolist() == [0.0, 2.0, -2.0, 127.0, -128.0, 5.0]
    with pytest.raises(ValueError, match="low <= high"):
        round_and_clip_(step, w, 1, 0)


def test_sgd_matches_the_formula_with_one_rounding_to_the_parameter_dtype():
    p = torch.tensor([1.0, -2.0, 3.0])
    g = torch.tensor([0.1, 0.2, -0.3], dtype=torch.float64)
    expected = p - (g.to(torch.float32) * 0.5)
    sgd_(p, g, 0.5)
    assert torch.equal(p, expected)


def test_fixed_point_update_is_multiply_shift_then_symmetric_saturation():
    # multiplier 2**30 with shift 0 is the real factor 1/2: g = 7 -> round(3.5) = 4.
    w = torch.tensor([100, -32767, 0], dtype=torch.int32)
    g = torch.tensor([7, -2**20, 3], dtype=torch.int32)
    new, step = fixed_point_update(w, g, 2**30, 0, 16)
    assert step.tolist() == [4, -2**19, 2]
    assert new.tolist() == [96, qmax(16), -2]  # -32767 + 2**19 saturates
    assert saturate(torch.tensor([40000, -40000]), 16).tolist() == [qmax(16), -qmax(16)]
    with pytest.raises(ValueError, match="shape"):
        fixed_point_update(w, g[:2], 2**30, 0, 16)


@pytest.mark.parametrize("alias,generator", [("rademacher_xorshift", "xorshift"),
                                             ("rademacher_torch", "torch")])
def test_rademacher_aliases_are_the_one_class_with_a_generator(alias, generator):
    d = get_distribution(alias)
    assert d == Rademacher(generator=generator) and alias in list_distributions()
    assert torch.equal(d.sample(5, (64,)), Rademacher(generator=generator).sample(5, (64,)))
    # Different generators are different streams of the same law.
    assert not torch.equal(d.sample(5, (64,)), Rademacher().sample(5, (64,)))
    with pytest.raises(ValueError, match="unknown argument"):
        get_distribution(alias, generator="counter")


def test_rademacher_refuses_an_unknown_generator_and_xorshift_seed_zero():
    with pytest.raises(ValueError, match="counter.*xorshift.*torch"):
        Rademacher(generator="mt19937")
    with pytest.raises(ValueError):
        Rademacher(generator="xorshift").sample(0, (3,))
    assert Rademacher().sample(0, (3,)).abs().eq(1).all()


def test_map_transforms_update_their_state_in_place_and_return_the_new_gradients():
    """The stated contract of bpfree.transforms.base: state changes in place (no second
    momentum buffer), the returned list is the transformed gradient."""
    from bpfree.transforms import momentum

    m = momentum(0.5)
    params = [torch.zeros(3)]
    state = m.init(params)
    out1 = m.update([torch.tensor([1.0, 2.0, 4.0])], state, None, params)
    buf = state["buffers"][0]
    out2 = m.update([torch.tensor([1.0, 0.0, -4.0])], state, None, params)
    assert state["buffers"][0] is buf  # same buffer, updated in place
    assert out1[0].tolist() == [1.5, 1.0, -2.0]  # b_1 = 0.5 * b_0 + g_1, aliasing the buffer
    assert out2[0].tolist() == [1.5, 1.0, -2.0]


def test_integer_update_is_eq8_with_per_channel_qas_in_the_gradient_buffer():
    from bpfree.updates import integer_update_

    w = torch.tensor([[10, -10], [100, 0]], dtype=torch.int8)
    g = torch.tensor([[1.0, -3.0], [-40.0, 0.2]], dtype=torch.float64)
    qas = torch.tensor([1.0, 4.0], dtype=torch.float64)  # 1/s^2 for s = 1, 0.5
    out = integer_update_(g, w, 0.5, -128, 127, qas)
    assert out is g  # no second buffer (PMT §3.2.2)
    # 10 - 0.5, -10 + 1.5, 100 + 80 (clips), 0 - 0.4
    assert out.tolist() == [[10.0, -8.0], [127.0, 0.0]]
    with pytest.raises(ValueError, match="one value per output channel"):
        integer_update_(torch.zeros(2, 2, dtype=torch.float64), w, 0.5, -128, 127,
                        torch.ones(3, dtype=torch.float64))


def test_adamw_transform_matches_torch_adamw():
    """QZO-FF's AdamW (transforms.AdamW times the rate) against torch.optim.AdamW, whose
    decoupled decay w <- w - lr*wd*w is the same first-order step."""
    from bpfree.qzoff import FloatOptimizer

    torch.manual_seed(0)
    w_ours = torch.randn(5, dtype=torch.float64)
    w_ref = w_ours.clone().requires_grad_(True)
    ref = torch.optim.AdamW([w_ref], lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ours = FloatOptimizer("adamw", betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for _ in range(4):
        g = torch.randn(5, dtype=torch.float64)
        w_ref.grad = g.clone()
        ref.step()
        w_ours = w_ours - ours.steps([g], [w_ours], 0.01)[0]
    assert torch.allclose(w_ours, w_ref.detach(), rtol=0, atol=1e-12)
    assert ours.state["t"] == 4 and ours.t == 4
    with pytest.raises(ValueError, match="beta1"):
        FloatOptimizer("sgd", betas=(1.0, 0.9))


def test_no_map_transform_writes_into_the_gradients_it_is_given():
    """The other half of the contract: a transform's output may alias its state (momentum),
    so a chain is only safe if no transform writes into its input."""
    from bpfree.transforms import (TensorInfo, adamw, clip_by_norm, clip_by_value,
                                   kernelwise_normalization, momentum, sign)

    g = torch.tensor([[0.5, -3.0], [2.0, 0.25]])
    params = [torch.tensor([[1.0, 2.0], [-1.0, 0.5]])]
    infos = [TensorInfo(name="w", num_directions=1, dim=4)]
    for t in (sign(), momentum(0.9), adamw(), kernelwise_normalization(), clip_by_norm(1.0),
              clip_by_value(1.0)):
        grads = [g.clone()]
        state = t.init(params)
        for _ in range(2):
            out = t.update(grads, state, infos, params)
            assert torch.equal(grads[0], g), repr(t)
        assert not torch.equal(out[0], g), repr(t)  # each one does transform (momentum: b_1)
