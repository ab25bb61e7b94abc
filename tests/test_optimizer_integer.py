"""ZOOptimizer on integer parameters through the update rules of bpfree.updates.

Each expected value is computed here from the papers' formulas, with the directions regenerated
from the seeds the optimizer documents (direction q of tensor i at step t: derive_seed(seed, t,
q, i)), not by calling the update rules under test.
"""

from __future__ import annotations

import math

import pytest
import torch

from bpfree.estimators import rge, sign_spsa
from bpfree.optim import ZOOptimizer
from bpfree.perturb import QuantizedGaussian, Rademacher, derive_seed
from bpfree.transforms import gradient_norm_scaling, momentum, quantization_aware_scaling

SEED = 11


def _codes(dist, q: int, i: int, shape) -> list:
    """Integer direction codes of query q, tensor i, step 0 (the optimizer's seeds)."""
    return dist.sample_int(derive_seed(SEED, 0, q, i), shape, dtype=torch.int64).tolist()


def _round_half_even(v: float) -> int:
    r = round(v)  # Python's round is half to even, as Eq. 11's torch.round
    assert abs(abs(v - math.floor(v)) - 0.5) > 1e-9, "test values must avoid exact ties"
    return r


@pytest.mark.parametrize("per_channel", [False, True])
def test_round_and_clip_group_is_pmt_eq8_by_hand(per_channel):
    """int8 weights, RGE with mu = 1 (PMT Eq. 6), GNS and QAS, Eq. 8 rounded and clipped."""
    w0 = [[10, -5, 126], [0, 40, -100]]
    c = [[0.5, -1.0, -40.0], [0.25, 3.0, -0.75]]  # loss = sum c * w: dL/dw = c
    w = torch.tensor(w0, dtype=torch.int8)
    cw = torch.tensor(c, dtype=torch.float64)
    scales = [0.5, 0.25]
    scale = torch.tensor(scales, dtype=torch.float64) if per_channel else 0.5
    queries, lr = 3, 0.0173
    opt = ZOOptimizer([{"params": [w], "update": "round_and_clip", "scale": scale}], lr=lr,
                      estimator=rge(queries, mu=1), seed=SEED,
                      transforms=[gradient_norm_scaling(), quantization_aware_scaling()])
    loss = opt.step(lambda: float((cw * w.to(torch.float64)).sum()))
    assert loss == sum(ci * wi for cr, wr in zip(c, w0) for ci, wi in zip(cr, wr))

    flat_c = [v for row in c for v in row]
    d = len(flat_c)
    dirs = [_codes(Rademacher(), q, 0, (2, 3)) for q in range(queries)]
    g = [[0.0] * 3 for _ in range(2)]
    for xi in dirs:
        diff = sum(ci * xq for cr, xr in zip(c, xi) for ci, xq in zip(cr, xr))  # L(W+xi)-L(W)
        for r in range(2):
            for k in range(3):
                g[r][k] += diff * xi[r][k] / queries
    gns = queries / (queries + d - 1)
    expected = []
    for r in range(2):
        s = scales[r] if per_channel else 0.5
        qas = 1 / s ** 2
        expected.append([min(127, max(-128, _round_half_even(w0[r][k] - lr * gns * qas * g[r][k])))
                         for k in range(3)])
    assert w.dtype == torch.int8 and w.tolist() == expected
    assert expected[0][2] == 127  # the pushed-up weight clips (Eq. 8's clip)
    assert sum(a != b for ra, rb in zip(expected, w0) for a, b in zip(ra, rb)) >= 3


def test_fixed_point_group_is_qzoff_appendix_a_by_hand():
    """16-bit codes, sign-m-SPSA with quantized Gaussian codes (QZO-FF Eq. 3), and Eq. 8 /
    Appendix A with the real factor lr*dz/(m*dw) = 1 exactly: multiplier 2**30, shift 1,
    so the multiply-and-shift returns the accumulator unchanged and saturation is the rest."""
    dist = QuantizedGaussian()
    w0 = [1000, -2000, 32700, 5, -32700, -32760]
    c = [1.0, -1.0, -2.0, 0.5, 3.0, 0.0]
    w = torch.tensor(w0, dtype=torch.int32)
    cw = torch.tensor(c, dtype=torch.float64)
    m = 3
    opt = ZOOptimizer([{"params": [w], "update": "fixed_point", "scale": dist.int_scale,
                        "bits": 16}], lr=float(m), estimator=sign_spsa(m, mu=2),
                      distribution=dist, seed=SEED)
    opt.step(lambda: float((cw * w.to(torch.float64)).sum()))

    acc = [0] * len(w0)
    for q in range(m):
        z = _codes(dist, q, 0, (len(w0),))
        diff = 4 * sum(ci * zi for ci, zi in zip(c, z))  # L(w + 2z) - L(w - 2z)
        sign = (diff > 0) - (diff < 0)
        acc = [a + sign * zi for a, zi in zip(acc, z)]
    q16 = 2 ** 15 - 1
    expected = [max(-q16, min(q16, wi - a)) for wi, a in zip(w0, acc)]
    assert w.tolist() == expected
    assert expected[2] == q16 and expected[5] == -q16  # both ends saturate symmetrically
    assert sum(a != 0 for a in acc) >= 3


def test_a_float_group_beside_an_integer_group_moves_as_it_would_alone():
    """The float path is untouched by an integer group: same seeds (the float tensor is
    tensor 0), same losses (the integer weights do not enter the loss), same bits."""
    def run(with_int: bool) -> torch.Tensor:
        p = torch.tensor([0.3, -1.2, 2.5], dtype=torch.float32)
        q = torch.tensor([3, -4], dtype=torch.int16)
        groups = [{"params": [p]}]
        if with_int:
            groups.append({"params": [q], "update": "round_and_clip", "bits": 8})
        opt = ZOOptimizer(groups, lr=0.05, estimator=rge(4, mu=1), seed=SEED)
        for _ in range(3):
            opt.step(lambda: float((p.double() ** 2).sum()))
        return p

    assert torch.equal(run(True), run(False))
    # an explicit 'sgd' group is the default rule
    a = torch.tensor([0.3, -1.2]); b = a.clone()
    for t, group in ((a, {"params": [a]}), (b, {"params": [b], "update": "sgd"})):
        opt = ZOOptimizer([group], lr=0.1, estimator=rge(2, mu=1e-2), seed=SEED)
        opt.step(lambda: float((t.double() ** 2).sum()))
    assert torch.equal(a, b) and not torch.equal(a, torch.tensor([0.3, -1.2]))


def test_integer_groups_refuse_what_the_rules_cannot_do():
    w = torch.zeros(4, dtype=torch.int8)
    rc = {"params": [w], "update": "round_and_clip"}
    with pytest.raises(ValueError, match=r"update must be one of \('sgd', 'round_and_clip', "
                                         r"'fixed_point'\)"):
        ZOOptimizer([{"params": [w], "update": "adam"}])
    with pytest.raises(TypeError, match="update='round_and_clip'"):
        ZOOptimizer([w], estimator=rge(2, mu=1))
    with pytest.raises(TypeError, match="float tensors take update='sgd'"):
        ZOOptimizer([{"params": [torch.zeros(3)], "update": "round_and_clip"}],
                    estimator=rge(2, mu=1))
    with pytest.raises(ValueError, match="whole number"):
        ZOOptimizer([rc], estimator=rge(2, mu=1e-3))
    with pytest.raises(ValueError, match="mode='lean'"):
        ZOOptimizer([rc], estimator=rge(2, mu=1), mode="batched")
    with pytest.raises(TypeError, match="scale transforms only"):
        ZOOptimizer([rc], estimator=rge(2, mu=1), transforms=[momentum()])
    with pytest.raises(ValueError, match="integer-valued distribution"):
        ZOOptimizer([rc], estimator=rge(2, mu=1), distribution="gaussian")
    with pytest.raises(TypeError, match="sign_spsa"):
        ZOOptimizer([{"params": [w], "update": "fixed_point"}], estimator=rge(2, mu=1))
    with pytest.raises(ValueError, match="needs 'bits'"):
        ZOOptimizer([{"params": [torch.zeros(3, dtype=torch.int32)], "update": "fixed_point"}],
                    estimator=sign_spsa(2, mu=1))
    with pytest.raises(ValueError, match=r"bits must be an int in \[2, 8\]"):
        ZOOptimizer([{**rc, "bits": 9}], estimator=rge(2, mu=1))
    with pytest.raises(ValueError, match="one finite scale > 0 per output channel"):
        ZOOptimizer([{**rc, "scale": torch.ones(3, dtype=torch.float64)}],
                    estimator=rge(2, mu=1))
    opt = ZOOptimizer([torch.zeros(2)], estimator=rge(2, mu=1))
    with pytest.raises(ValueError, match="bits must be"):
        opt.add_param_group({**rc, "params": [torch.zeros(2, dtype=torch.int8)], "bits": 1})
    assert len(opt.param_groups) == 1  # the refused group is not kept


def test_a_perturbation_past_the_dtype_edge_raises_and_leaves_the_weights():
    w = torch.tensor([127, 0, -128, 5], dtype=torch.int8)
    before = w.clone()
    opt = ZOOptimizer([{"params": [w], "update": "round_and_clip"}], estimator=rge(2, mu=1))
    with pytest.raises(OverflowError, match="wider dtype"):
        opt.step(lambda: float(w.double().sum()))
    assert torch.equal(w, before)
    # int8 codes kept in int16 with bits=8: the probe reaches 128, the update clips to 127
    w16 = torch.tensor([127, 0, -128, 5], dtype=torch.int16)
    opt = ZOOptimizer([{"params": [w16], "update": "round_and_clip", "bits": 8}], lr=100.0,
                      estimator=rge(2, mu=1))
    opt.step(lambda: float(-(w16.double() ** 2).sum()))
    assert int(w16.max()) <= 127 and int(w16.min()) >= -128
    assert not torch.equal(w16, before.to(torch.int16))
