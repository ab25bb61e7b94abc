"""QZO-FF (Feng et al. 2024): fixed-point arithmetic against exact rationals, estimator
alignment with autograd, every §3.4 enhancement, bad input, and a digits run (16w8a vs 8w8a)."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bpfree.data import load_digits_split
from bpfree.perturb import derive_seed, quantization_scale, quantized_gaussian_codes, quantized_one
from bpfree.harness import fit
from bpfree.qzoff import (
    QZOFF,
    EpsilonUnderflowWarning,
    MomentumSampling,
    QZOFFConfig,
    accumulate_gradient,
    perturbation_multiplier,
    perturbed_weights,
    quantize_epsilon,
    quantize_weights,
    quantized_update,
    random_mask,
    threshold_mask,
    topk_magnitude_mask,
    update_multiplier,
)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


# ---------------------------------------------------------------------------------------------
# exact rational reference of TFLite's multiply-and-shift (written from the gemmlowp spec)
# ---------------------------------------------------------------------------------------------

def _round_half_away(q: Fraction) -> int:
    f = math.floor(abs(q) + Fraction(1, 2))
    return f if q >= 0 else -f


def _mbqm_ref(acc: int, mult: int, shift: int) -> int:
    """SaturatingRoundingDoublingHighMul = floor(x·M/2**31 + 1/2) (gemmlowp's nudge), then
    RoundingDivideByPOT = round half away from zero of /2**right."""
    left, right = max(shift, 0), max(-shift, 0)
    x = min(max(acc * 2**left, INT32_MIN), INT32_MAX)
    high = min(math.floor(Fraction(x * mult, 2**31) + Fraction(1, 2)), INT32_MAX)
    return _round_half_away(Fraction(high, 2**right))


def _sat(v: int, bits: int) -> int:
    q = 2 ** (bits - 1) - 1
    return max(-q, min(q, v))


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


@pytest.fixture(scope="module")
def digits():
    xtr, ytr, _, _ = load_digits_split(0)
    return torch.tensor(xtr), torch.tensor(ytr)


def _pretrained(digits, steps):
    """A briefly backprop-trained MLP: the paper adapts pre-trained models."""
    x, y = digits
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def _full_loss(model, digits):
    x, y = digits
    with torch.no_grad():
        return float(F.cross_entropy(model(x), y))


# ---------------------------------------------------------------------------------------------
# §3.3 constants and fixed-point arithmetic
# ---------------------------------------------------------------------------------------------

def test_paper_constants():
    dz = quantization_scale(8, 3.5)
    assert abs(dz - 0.0276) < 1e-4 and quantized_one(8, 3.5) == 36
    mult, shift = perturbation_multiplier(dz)  # Appendix A: m / 2**k ≈ Δz
    assert abs(Fraction(mult, 2 ** (31 - shift)) - Fraction(dz)) <= Fraction(1, 2 ** (32 - shift))


def test_quantize_weights_eq5():
    w = torch.tensor([[0.5, -1.0, 0.25], [0.1, 0.0, -0.2]])
    codes, scale = quantize_weights(w, 16)
    assert float(scale) == 1.0 / 32767 and codes.dtype == torch.int32
    assert codes.tolist() == [[round(0.5 * 32767), -32767, round(0.25 * 32767)],
                              [round(0.1 * 32767), 0, round(-0.2 * 32767)]]
    codes_c, scale_c = quantize_weights(w, 8, per_channel=True)
    assert scale_c.shape == (2,) and codes_c[1].abs().max() == 127 and codes_c[0].abs().max() == 127
    _, zero_scale = quantize_weights(torch.zeros(3), 16)  # all-zero tensor: trainable fallback
    assert float(zero_scale) == 1.0 / 32767


def test_perturbation_matches_exact_rational():
    g = torch.Generator().manual_seed(1)
    bits, one_q = 16, quantized_one(8, 3.5)
    w_q = torch.randint(-32767, 32768, (400,), generator=g, dtype=torch.int32)
    w_q[:4] = torch.tensor([32767, -32767, 0, 1], dtype=torch.int32)
    z_q = quantized_gaussian_codes(7, (400,), 8, 3.5, dtype=torch.int32)
    z_q[:4] = torch.tensor([127, -127, 5, -3], dtype=torch.int32)
    mult, shift = perturbation_multiplier(quantization_scale(8, 3.5))
    dz = Fraction(quantization_scale(8, 3.5))
    for eps_q in (33, -33, 5000, -5000):  # ±5000·127 drives the extremes into saturation
        out = perturbed_weights(w_q, z_q, eps_q, one_q, mult, shift, bits)
        saturated = 0
        for a, b, got in zip(w_q.tolist(), z_q.tolist(), out.tolist()):
            acc = a * one_q + eps_q * b                      # the int32 accumulator of Eq. 6
            exact = _sat(_mbqm_ref(acc, mult, shift), bits)
            assert got == exact
            saturated += abs(_mbqm_ref(acc, mult, shift)) > 32767
            # and the fixed-point result is Δz·acc up to rounding (Eq. 6 / Eq. 10)
            if abs(exact) < 32767:
                assert abs(exact - dz * acc) <= 1
        assert (saturated > 0) == (abs(eps_q) == 5000)


def test_perturbation_per_channel():
    w = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    w_q, scale = quantize_weights(w, 16, per_channel=True)
    eps_q = quantize_epsilon(1e-3, scale)
    assert eps_q.shape == (4,)
    z_q = quantized_gaussian_codes(3, (4, 6), dtype=torch.int32)
    mult, shift = perturbation_multiplier(quantization_scale())
    out = perturbed_weights(w_q, z_q, eps_q, 36, mult, shift, 16)
    for c in range(4):
        for j in range(6):
            acc = int(w_q[c, j]) * 36 + int(eps_q[c]) * int(z_q[c, j])
            assert int(out[c, j]) == _sat(_mbqm_ref(acc, mult, shift), 16)
    # the dequantized perturbation is ≈ ε·z (rounding of ε_q and of the shrink Δz·1_q)
    diff = (out.double() - 0.99212598 * w_q.double()) * scale[:, None]
    zf = z_q.double() * quantization_scale()
    assert torch.allclose(diff, 1e-3 * zf, atol=2 * float(scale.max()))


def test_unit_exact_requantization():
    w_q = torch.tensor([32767, -32767, 12345, -1, 0], dtype=torch.int32)
    zero = torch.zeros(5, dtype=torch.int32)
    paper = perturbation_multiplier(quantization_scale())
    unit = perturbation_multiplier(1 / 36)
    shrunk = perturbed_weights(w_q, zero, 33, 36, *paper, 16)
    assert shrunk.tolist() == [round(v * 36 * 3.5 / 127) for v in w_q.tolist()]  # Δz·1_q ≠ 1
    assert torch.equal(perturbed_weights(w_q, zero, 33, 36, *unit, 16), w_q)
    tr = QZOFF(_mlp(), unit_exact=True)
    assert (tr.pmult, tr.pshift) == unit


def test_gradient_accumulation_and_update_exact():
    m, bits = 5, 16
    codes = [quantized_gaussian_codes(derive_seed(3, 0, i), (300,), dtype=torch.int32)
             for i in range(m)]
    signs = [1, -1, 0, 1, 1]
    acc = accumulate_gradient(signs, codes)
    for j in range(300):
        assert int(acc[j]) == sum(s * int(z[j]) for s, z in zip(signs, codes))
    w_q = torch.randint(-32767, 32768, (300,), generator=torch.Generator().manual_seed(4),
                        dtype=torch.int32)
    w_q[0], acc[0] = -32767, 600  # forces saturation of w_q − w̄_q
    dz, lr = quantization_scale(), 3e-3
    scale = torch.tensor(1.0 / 32767, dtype=torch.float64)
    mult, shift = update_multiplier(lr, dz, scale, m)
    real = Fraction(lr) * Fraction(dz) / (m * Fraction(float(scale)))   # Eq. 8's factor
    assert abs(Fraction(int(mult), 2 ** (31 - int(shift))) - real) <= real / 2**30
    new, step = quantized_update(w_q, acc, mult, shift, bits)
    for j in range(300):
        a = int(acc[j])
        wbar = _mbqm_ref(a, int(mult), int(shift))
        assert int(step[j]) == wbar
        assert abs(wbar - real * a) <= 1                                  # ⌊Δη Δz g/Δw⌉
        assert int(new[j]) == _sat(int(w_q[j]) - wbar, bits)
    assert int(new[0]) == -32767


def test_update_mask_and_per_channel():
    w_q = torch.zeros(3, 4, dtype=torch.int32)
    acc = torch.full((3, 4), 100, dtype=torch.int32)
    scale = torch.tensor([1e-4, 2e-4, 4e-4], dtype=torch.float64)
    mult, shift = update_multiplier(1e-3, quantization_scale(), scale, 1)
    mask = torch.zeros(3, 4, dtype=torch.bool)
    mask[:, 0] = True
    new, _ = quantized_update(w_q, acc, mult, shift, 16, mask)
    assert (new[:, 1:] == 0).all()
    expected = [-round(1e-3 * quantization_scale() * 100 / float(s)) for s in scale]
    assert new[:, 0].tolist() == expected


# ---------------------------------------------------------------------------------------------
# ε underflow (the paper's reason 8-bit weights fail) and bad input
# ---------------------------------------------------------------------------------------------

def test_epsilon_underflow_warns():
    with pytest.warns(EpsilonUnderflowWarning, match="8-bit weights"):
        assert int(quantize_epsilon(1e-3, torch.tensor(0.5 / 127))) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert int(quantize_epsilon(1e-3, torch.tensor(0.5 / 32767))) == 66


def test_bad_input():
    model = _mlp()
    with pytest.raises(ValueError, match="z_max"):
        QZOFF(model, z_max=0.0)
    with pytest.raises(ValueError, match="z_max"):
        QZOFFConfig(z_max=-1.0)
    with pytest.raises(ValueError, match="m"):
        QZOFFConfig(m=0)
    with pytest.raises(ValueError, match="unknown optimizer"):
        QZOFFConfig(optimizer="lion")
    with pytest.raises(ValueError, match="eps"):
        QZOFFConfig(eps=0.0)
    with pytest.raises(ValueError, match="shape"):
        QZOFF(model, masks={"0.weight": torch.ones(3, 3, dtype=torch.bool)})
    with pytest.raises(ValueError, match="unknown parameters"):
        QZOFF(model, masks={"nope": torch.ones(1)})
    with pytest.raises(ValueError, match="matches none"):
        QZOFF(model, params=["head.*"])
    with pytest.raises(ValueError, match="unknown sparse"):
        QZOFFConfig(sparse="magnitude")
    with pytest.raises(ValueError, match="mode"):
        QZOFFConfig(mode="int4")
    with pytest.raises(ValueError, match="lr"):
        QZOFF(model).apply(None, float("nan"))


# ---------------------------------------------------------------------------------------------
# the estimator
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["quantized", "fp32"])
def test_sign_m_spsa_aligns_with_autograd(digits, mode):
    x, y = digits[0][:128], digits[1][:128]
    cosines = []
    for seed in range(5):
        model = _mlp()
        tr = QZOFF(model, m=10, mode=mode, seed=seed)
        est = tr.estimate(x, y)
        model.zero_grad()
        with tr.acts.disabled():   # autograd reference at the same (quantized) weights
            F.cross_entropy(model(x), y).backward()
        g = torch.cat([p.grad.reshape(-1) for p in tr.params])
        e = torch.cat([t.reshape(-1) for t in est.grads])
        cosines.append(float(F.cosine_similarity(g, e, dim=0)))
    # E[cos] ≈ sqrt(2/π)·sqrt(m/d) = 0.051 for m = 10, d = 2410; measured ≈ 0.04-0.05
    assert sum(cosines) / len(cosines) > 0.02, cosines


def test_estimate_regenerates_from_seeds(digits):
    x, y = digits[0][:64], digits[1][:64]
    tr = QZOFF(_mlp(), m=4, seed=11)
    est = tr.estimate(x, y)
    assert est.forwards == 2 * 4 * 64 and len(est.losses) == 8
    for k, shape in enumerate(tr.shapes):
        codes = [quantized_gaussian_codes(derive_seed(11, 0, i, k), shape, dtype=torch.int32)
                 for i in range(4)]
        assert torch.equal(est.acc[k], accumulate_gradient(est.signs, codes))
        assert torch.allclose(est.grads[k], est.acc[k].float() * quantization_scale() / 4)
    # the model holds the unperturbed quantized weights afterwards
    for k, p in enumerate(tr.params):
        assert torch.equal(p.data, tr.qp.dequantize(k, tr.qp.codes[k]))


def test_fit_harness_drives_it(digits):
    x, y = digits[0][:256], digits[1][:256]
    tr = QZOFF(_mlp(), m=2)
    h = fit(tr, x, y, epochs=1, batch_size=64, lr=1e-3)
    assert len(h.loss) == 4 and h.forwards[-1] == 2 * 2 * 256


# ---------------------------------------------------------------------------------------------
# §3.4 enhancements
# ---------------------------------------------------------------------------------------------

def test_momentum_sampling_beta_one_is_plain(digits):
    x, y = digits[0][:64], digits[1][:64]
    plain = QZOFF(_mlp(), m=3, seed=5)
    guided = QZOFF(_mlp(), m=3, seed=5, sampling="momentum", beta=0.5, beta_warmup=10)
    for _ in range(2):
        a, b = plain.step(x, y, 1e-3), guided.step(x, y, 1e-3)
        assert a["signs"] == b["signs"]
    for c1, c2 in zip(plain.qp.codes, guided.qp.codes):
        assert torch.equal(c1, c2)


def test_momentum_sampling_correlates_with_previous():
    shapes = [(2000,)]
    s = MomentumSampling(alpha=0.5, beta=0.5)
    z0 = s.sample([1], [2], shapes)
    s.record(z0, sign=-1)
    z1 = s.sample([3], [4], shapes)
    cos = float(F.cosine_similarity(z1[0], -z0[0], dim=0))
    assert cos > 0.4   # (1−β)·z_t dominates the mean: ≈ 0.5/sqrt(0.5² + 0.25·0.5 + 0.25·0.5)
    plain = MomentumSampling(alpha=0.5, beta=1.0)
    plain.record(z0, 1)
    assert abs(float(F.cosine_similarity(plain.sample([3], [4], shapes)[0], z0[0], dim=0))) < 0.1
    with pytest.raises(ValueError):
        MomentumSampling(beta=1.5)


def test_momentum_sampling_changes_directions(digits):
    x, y = digits[0][:64], digits[1][:64]
    plain = QZOFF(_mlp(), m=3, seed=5)
    guided = QZOFF(_mlp(), m=3, seed=5, sampling="momentum", beta=0.5)
    ea, eb = plain.estimate(x, y), guided.estimate(x, y)
    assert not torch.equal(ea.acc[0], eb.acc[0])


@pytest.mark.parametrize("mode", ["quantized", "fp32"])
def test_sharpness_aware_moves_evaluation_point(digits, mode):
    x, y = digits[0][:64], digits[1][:64]
    rho = 5e-3   # a few ε: larger steps leave the region where the ε-probe's sign holds
    tr = QZOFF(_mlp(), m=2, seed=3, mode=mode, sharpness_rho=rho)
    w0 = [t.clone() for t in tr.current()]
    est = tr.estimate(x, y)
    assert est.ascent_sign in (-1, 1) and est.forwards == 2 * 64 * 3
    seeds = [derive_seed(3, 0, 2**32, k) for k in range(len(w0))]
    for k, (w, c) in enumerate(zip(w0, est.center)):
        if mode == "quantized":
            u = quantized_gaussian_codes(seeds[k], w.shape, dtype=torch.int32)
            expected = perturbed_weights(w, u, est.ascent_sign * tr.rho_q[k], 36, tr.pmult,
                                         tr.pshift, 16)
            assert torch.equal(c, expected) and not torch.equal(c, w)
        else:
            from bpfree.perturb import gaussian
            assert torch.allclose(c, w + est.ascent_sign * rho * gaussian(seeds[k], w.shape))
    # the ascent raised the loss (measured at the centre), and the update lands on w, not c
    assert len(est.losses) == 2 + 2 * 2
    tr._load(est.center)
    at_center = tr._loss(x, y)
    tr._load(w0)
    assert at_center > tr._loss(x, y)
    tr.apply(est, 1e-3)
    if mode == "quantized":
        for k, w in enumerate(w0):
            mult, shift = update_multiplier(1e-3, quantization_scale(), tr.qp.scales[k], 2)
            assert torch.equal(tr.qp.codes[k], quantized_update(w, est.acc[k], mult, shift, 16)[0])


@pytest.mark.parametrize("method", ["topk", "random", "threshold"])
def test_sparse_update_freezes_masked_weights(digits, method):
    x, y = digits[0][:64], digits[1][:64]
    tr = QZOFF(_mlp(), m=2, sparse=method, sparsity=0.9, threshold=0.1)
    w0 = [t.clone() for t in tr.current()]
    for _ in range(3):
        tr.step(x, y, 1e-2)
    moved_inside = 0
    for w, w1, mk in zip(w0, tr.current(), tr.masks):
        assert torch.equal(w[~mk], w1[~mk])
        moved_inside += int((w[mk] != w1[mk]).sum())
    assert moved_inside > 0
    if method != "threshold":
        kept = sum(int(mk.sum()) for mk in tr.masks) / sum(mk.numel() for mk in tr.masks)
        assert 0.09 < kept < 0.12


def test_mask_builders():
    w = torch.arange(-10.0, 10.0).reshape(4, 5)
    mk = topk_magnitude_mask(w, 0.9)
    assert int(mk.sum()) == 2 and bool(mk[0, 0])
    assert torch.equal(threshold_mask(w, 8.5), w.abs() > 8.5)
    r = random_mask((10, 10), 0.9, seed=1)
    assert int(r.sum()) == 10 and torch.equal(r, random_mask((10, 10), 0.9, seed=1))
    with pytest.raises(ValueError):
        topk_magnitude_mask(w, 1.0)


@pytest.mark.parametrize("mode", ["quantized", "fp32"])
def test_kernelwise_normalization(digits, mode):
    x, y = digits[0][:64], digits[1][:64]
    tr = QZOFF(_mlp(), m=1, mode=mode, kernel_norm=True)
    est = tr.estimate(x, y)
    for g, w in zip(est.grads, tr.float_weights()):
        assert math.isclose(float(g.norm()), float(w.norm()), rel_tol=1e-5)   # Eq. 9
    plain = QZOFF(_mlp(), m=1, mode=mode).estimate(x, y)
    assert not math.isclose(float(plain.grads[0].norm()), float(est.grads[0].norm()), rel_tol=0.1)
    if mode == "quantized":   # the integer update moves each layer by ≈ η·‖w‖
        lr = 1e-3
        w0 = tr.float_weights()
        tr.apply(est, lr)
        for a, b in zip(w0, tr.float_weights()):
            assert math.isclose(float((a - b).norm()), lr * float(a.norm()), rel_tol=0.05)


@pytest.mark.parametrize("mode", ["quantized", "fp32"])
def test_optimizer_states_evolve(digits, mode):
    x, y = digits[0][:64], digits[1][:64]
    mom = QZOFF(_mlp(), m=2, mode=mode, optimizer="momentum")
    mom.step(x, y, 1e-2)
    b1 = mom.optimizer.state["buffers"][0].clone()
    mom.step(x, y, 1e-2)
    assert b1.abs().sum() > 0 and not torch.equal(b1, mom.optimizer.state["buffers"][0])
    adam = QZOFF(_mlp(), m=2, mode=mode, optimizer="adamw", weight_decay=0.01)
    w0 = [t.clone() for t in adam.current()]
    adam.step(x, y, 1e-3)
    m1, v1 = adam.optimizer.state["m"][0].clone(), adam.optimizer.state["v"][0].clone()
    adam.step(x, y, 1e-3)
    assert adam.optimizer.t == 2 and (v1 > 0).any()
    assert not torch.equal(m1, adam.optimizer.state["m"][0])
    assert any(not torch.equal(a, b) for a, b in zip(w0, adam.current()))


def test_float_modes(digits):
    x, y = digits[0][:64], digits[1][:64]
    tr = QZOFF(_mlp(), m=2, mode="fp16")
    out = tr.step(x, y, 1e-2)
    assert out["moved"] > 0
    for w in tr.current():
        assert torch.equal(w, w.half().float())      # weights stay fp16-representable
    assert math.isfinite(out["loss"])


def test_per_channel_and_8w8a_runnable(digits):
    x, y = digits[0][:64], digits[1][:64]
    tr = QZOFF(_mlp(), m=2, per_channel=True)
    assert tr.qp.scales[0].shape == (32,)
    assert tr.step(x, y, 1e-2)["moved"] > 0
    tr8 = QZOFF(_mlp(), m=2, w_bits=8, a_bits=8)   # fresh init: max|w| ≈ 0.125, so ε_q = 1
    assert tr8.step(x, y, 1e-2)["moved"] > 0


# ---------------------------------------------------------------------------------------------
# digits: 16w8a trains, 8w8a (ε = 1e-3) warns and cannot move
# ---------------------------------------------------------------------------------------------

def test_digits_16w8a_trains_8w8a_frozen(digits):
    x, y = digits
    model = _pretrained(digits, 10)
    tr = QZOFF(model, m=3)                                # 16w8a, the paper's setting
    before = _full_loss(model, digits)
    fit(tr, x, y, epochs=3, batch_size=64, lr=1e-2, schedule="constant")
    after = _full_loss(model, digits)
    assert after < before - 0.02, (before, after)         # measured 1.5635 -> 1.5093

    model8 = _pretrained(digits, 30)                      # max|w| ≥ 0.288: Δw > 2ε at 8 bits
    with pytest.warns(EpsilonUnderflowWarning, match="8-bit weights"):
        tr8 = QZOFF(model8, m=3, w_bits=8, a_bits=8, eps=1e-3)
    assert tr8.frozen_tensors == tr8.names
    codes0 = [c.clone() for c in tr8.qp.codes]
    out = [tr8.step(x[i:i + 64], y[i:i + 64], 1e-2) for i in range(0, 320, 64)]
    assert all(o["moved"] == 0 and o["signs"] == [0, 0, 0] for o in out)
    assert all(torch.equal(a, b) for a, b in zip(codes0, tr8.qp.codes))
