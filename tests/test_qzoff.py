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
    displaced_weights,
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
    # E[cos] ≈ sqrt(2/π)·sqrt(m/d) = 0.0514 for m = 10, d = 2410. Measured on seeds 0-29:
    # mean 0.0516 (quantized) / 0.0530 (fp32), sd 0.0135 / 0.0130 per seed, all > 0.028. So
    # every seed is positive (3.8 sd above 0) and the 5-seed mean lies within 4 sd / sqrt(5)
    # = 0.024 of the prediction; an estimate blind to the gradient has mean 0 (sd 1/sqrt(d)).
    predicted = math.sqrt(2 / math.pi) * math.sqrt(10 / g.numel())
    assert all(c > 0 for c in cosines), cosines
    assert abs(sum(cosines) / len(cosines) - predicted) < 4 * 0.0135 / math.sqrt(5), cosines


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
            expected = displaced_weights(w, u, est.ascent_sign * tr.rho_q[k], tr.pmult,
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


# ---------------------------------------------------------------------------------------------
# audit additions: shape checks, 8-bit activations, training modes on the ViT (D-VPT)
# ---------------------------------------------------------------------------------------------

def test_quantized_update_rejects_wrong_shapes():
    w_q = torch.zeros(3, 4, dtype=torch.int32)
    acc = torch.ones(3, 4, dtype=torch.int32)
    mult, shift = update_multiplier(1e-3, quantization_scale(), torch.tensor(1e-4,
                                                                            dtype=torch.float64), 1)
    # a [4] mask would broadcast silently over the rows; it must be refused
    with pytest.raises(ValueError, match="mask has shape"):
        quantized_update(w_q, acc, mult, shift, 16, torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask has shape"):
        quantized_update(w_q, acc, mult, shift, 16, torch.ones(4, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="accumulator has shape"):
        quantized_update(w_q, torch.ones(4, dtype=torch.int32), mult, shift, 16)


def test_adamw_eps_must_be_positive():
    with pytest.raises(ValueError, match="AdamW eps"):
        QZOFF(_mlp(), optimizer="adamw", adam_eps=-1.0)
    with pytest.raises(ValueError, match="AdamW eps"):
        QZOFF(_mlp(), optimizer="adamw", adam_eps=0.0)
    for bad in (1, 25, 16.5, "16", True):
        with pytest.raises(ValueError, match="w_bits must be an int"):
            QZOFFConfig(w_bits=bad)


def _fake_quant_ref(t: torch.Tensor, lo: float, hi: float, bits: int = 8) -> torch.Tensor:
    """TFLite asymmetric quantize-dequantize, written out: scale = (hi−lo)/(2^b−1) with
    lo ≤ 0 ≤ hi, integer zero point, codes clamped to [0, 2^b−1]."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / (2 ** bits - 1)
    zp = round(-lo / scale)
    return (torch.round(t / scale) + zp).clamp(0, 2 ** bits - 1).sub(zp).mul(scale)


def test_activation_quantizer_8bit_static_ranges():
    from bpfree.qzoff import ActivationQuantizer

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    x = torch.randn(32, 5)
    with torch.no_grad():
        h1 = model[0](x)
        h2 = torch.relu(h1)
        h3 = model[2](h2)
    acts = ActivationQuantizer(model, 8)
    assert acts.needs_calibration
    acts.calibrate(lambda: model(x))
    assert not acts.needs_calibration
    # calibration records the float min / max of every hooked output
    for name, h in (("0", h1), ("1", h2), ("2", h3)):
        assert acts.ranges[name] == [float(h.min()), float(h.max())]
    # the 8-bit forward is the chain of fake quantizations with those static ranges
    with torch.no_grad():
        out = model(x)
        r = acts.ranges
        q1 = _fake_quant_ref(h1, *r["0"])
        q2 = _fake_quant_ref(torch.relu(q1), *r["1"])
        q3 = _fake_quant_ref(model[2](q2), *r["2"])
    assert torch.allclose(out, q3, atol=1e-6, rtol=0)
    assert len(torch.unique(out)) <= 256 and not torch.equal(out, h3)
    # static ranges stay frozen: a batch 10x larger saturates at the calibrated range
    with torch.no_grad():
        big = model(10 * x)
    lo, hi = min(r["2"][0], 0.0), max(r["2"][1], 0.0)
    half_step = (hi - lo) / 255 / 2      # the clamp sits on the grid, within half a step
    assert float(big.max()) <= hi + half_step and float(big.min()) >= lo - half_step
    with acts.disabled(), torch.no_grad():
        assert float(model(10 * x).max()) > hi + 1.0  # ... although the float output is far out
    with acts.disabled(), torch.no_grad():
        assert torch.equal(model(x), h3)
    acts.remove()
    with torch.no_grad():
        assert torch.equal(model(x), h3)
    # 4-bit activations: at most 16 levels per output
    acts4 = ActivationQuantizer(model, 4, ranges="dynamic")
    with torch.no_grad():
        assert len(torch.unique(model(x))) <= 16
    acts4.remove()


@pytest.mark.parametrize("mode,k", [("linear-probe", None), ("last-k", 1), ("deep-vpt", None)])
def test_qzoff_trains_exactly_the_mode_parameters_of_a_vit(mode, k):
    """Build item 3: QZO-FF (16w8a) on a small ViT trains exactly the parameters of the
    training mode -- head only, last block + final norm + head, or deep prompts + head."""
    from bpfree.models.vit import TinyViT
    from bpfree.training_modes import trainable_parameters

    torch.manual_seed(0)
    vit = TinyViT(dim=16, depth=2, heads=2, num_classes=3, prompt_tokens=2)
    names = trainable_parameters(vit, mode, k=k)
    x, y = torch.rand(12, 1, 28, 28), torch.arange(12) % 3
    tr = QZOFF(vit, params=names, m=2, seed=1, eps=1e-2)
    assert tr.names == names
    before = {n: p.detach().clone() for n, p in vit.named_parameters()}
    signs = []
    for _ in range(3):
        signs += tr.step(x, y, 1e-2)["signs"]
    assert any(signs), "every loss difference was 0: the test would show nothing"
    after = dict(vit.named_parameters())
    for n, p in before.items():
        if n in names:
            continue
        assert torch.equal(after[n].detach(), p), f"{n} is not in mode {mode!r} but moved"
    moved = [n for n in names if not torch.equal(after[n].detach(), before[n])]
    if mode == "deep-vpt":
        assert "prompts" in moved
    assert any(n.startswith("head") for n in moved)


# ---------------------------------------------------------------------------------------------
# audit: the sharpness-aware centre goes through Eq. 6's Δz·1_q factor once, not twice
# ---------------------------------------------------------------------------------------------

def test_displaced_weights_exact():
    """c_q = sat(w_q + MBQM(ρ_q·z_q)): w_q is kept exactly, only the displacement is scaled
    by m/2**k ≈ Δz (checked against the exact rational multiply-and-shift)."""
    g = torch.Generator().manual_seed(4)
    w = torch.randint(-32767, 32768, (300,), generator=g, dtype=torch.int32)
    z = torch.randint(-127, 128, (300,), generator=g, dtype=torch.int32)
    mult, shift = perturbation_multiplier(quantization_scale())
    for rho_q in (7, -7, 1):
        got = displaced_weights(w, z, rho_q, mult, shift, 16)
        ref = [_sat(int(wi) + _mbqm_ref(rho_q * int(zi), mult, shift), 16)
               for wi, zi in zip(w.tolist(), z.tolist())]
        assert got.tolist() == ref
    assert torch.equal(displaced_weights(w, torch.zeros_like(z), 5, mult, shift, 16), w)
    # per-channel ρ_q
    w2, z2 = w[:12].reshape(3, 4), z[:12].reshape(3, 4)
    rho = torch.tensor([1, 2, 3])
    got = displaced_weights(w2, z2, rho, mult, shift, 16)
    for c in range(3):
        assert torch.equal(got[c], displaced_weights(w2[c], z2[c], int(rho[c]), mult, shift, 16))


def test_sharpness_centre_shrinks_once(digits):
    """The ε-probes around the sharpness-aware centre see Δz·1_q·(w + ρu) -- one factor
    0.992 as the plain probes see Δz·1_q·w -- not 0.992² (an Eq. 6 centre re-quantized by Eq. 6
    again)."""
    x, y = digits[0][:64], digits[1][:64]
    factor = quantization_scale() * quantized_one()            # 0.99213 for the defaults
    tr = QZOFF(_mlp(), m=1, seed=3, sharpness_rho=5e-3)
    w0 = [t.clone() for t in tr.current()]
    est = tr.estimate(x, y)
    assert est.ascent_sign in (-1, 1)
    for k, (w, c) in enumerate(zip(w0, est.center)):
        wf, cf = w.double(), c.double()
        if w.dim() < 2:
            continue    # 10-32 biases: the random ρu dominates the slope estimates below
        # the centre keeps the scale of w: regression of c on w has slope 1, not 0.992
        slope = float((cf * wf).sum() / (wf * wf).sum())
        assert abs(slope - 1.0) < 2e-3, (k, slope)
        # the probe from the centre shrinks once: slope of probe on w ≈ 0.992, not 0.984
        z0 = torch.zeros_like(w)
        probe = perturbed_weights(c, z0, tr.eps_q[k], quantized_one(), tr.pmult, tr.pshift, 16)
        plain = perturbed_weights(w, z0, tr.eps_q[k], quantized_one(), tr.pmult, tr.pshift, 16)
        s_probe = float((probe.double() * wf).sum() / (wf * wf).sum())
        s_plain = float((plain.double() * wf).sum() / (wf * wf).sum())
        assert abs(s_plain - factor) < 1e-4
        assert abs(s_probe - factor) < 2e-3 and abs(s_probe - factor ** 2) > 5e-3
        # the displacement is ρ_q·u·Δz codes (≈ ρ·u, float mode's centre w + ρu), within half
        # a code, except where the centre saturates at the 16-bit range (headroom 1)
        u = quantized_gaussian_codes(derive_seed(3, 0, 2**32, k), w.shape, dtype=torch.int32)
        want = est.ascent_sign * int(tr.rho_q[k]) * u.double() * quantization_scale()
        inside = c.abs() < 32767
        assert bool(inside.float().mean() > 0.95)
        assert float(((cf - wf) - want)[inside].abs().max()) <= 0.51   # m/2**k ≈ Δz, not =
        assert abs(int(tr.rho_q[k]) * float(tr.qp.scales[k]) - 5e-3) < float(tr.qp.scales[k])


def test_config_validates_adam_eps_and_sparse_scope():
    for bad in (0.0, -1e-8, float("nan"), float("inf"), True, "1e-8"):
        with pytest.raises(ValueError, match="adam_eps"):
            QZOFFConfig(optimizer="adamw", adam_eps=bad)
    with pytest.raises(ValueError, match="adam_eps"):
        QZOFFConfig(adam_eps=-1.0)            # refused for any optimizer, as the trainer would
    assert QZOFFConfig(optimizer="adamw", adam_eps=1e-6).adam_eps == 1e-6
    with pytest.raises(ValueError, match="sparse_scope"):
        QZOFFConfig(sparse="topk", sparse_scope="biases")


@pytest.mark.parametrize("method", ["topk", "random"])
def test_sparse_scope_weights_keeps_biases_trainable(digits, method):
    x, y = digits[0][:64], digits[1][:64]
    tr = QZOFF(_mlp(), m=2, sparse=method, sparsity=0.9, sparse_scope="weights")
    assert [mk is None for mk in tr.masks] == [p.dim() < 2 for p in tr.params]
    for mk, p in zip(tr.masks, tr.params):
        if mk is not None:
            assert 0.09 < int(mk.sum()) / mk.numel() < 0.12
    w0 = [t.clone() for t in tr.current()]
    for _ in range(3):
        tr.step(x, y, 1e-2)
    for w, w1, mk, p in zip(w0, tr.current(), tr.masks, tr.params):
        if mk is None:            # every bias entry may move (and some do)
            assert bool((w != w1).any())
        else:
            assert torch.equal(w[~mk], w1[~mk])
    # scope "all" (the default) masks the biases too
    full = QZOFF(_mlp(), m=2, sparse=method, sparsity=0.9)
    assert all(mk is not None for mk in full.masks)
