"""Tensor-train layers (bpfree.tt): TT-ZO Eq. 7, TT-SVD, the §5.1 TT-MLP."""

from __future__ import annotations

import math

import pytest
import torch

from bpfree.tt import (
    PAPER_FACTORS,
    TTLinear,
    dense_mlp,
    full_ranks,
    tt_contract,
    tt_mlp,
    tt_mlp_num_parameters,
    tt_num_parameters,
    tt_svd,
    tt_to_dense,
)
from bpfree.tt.layers import _groups

F64 = torch.float64


def _reference_dense(cores):
    """W from Eq. 7 entry by entry (slow, obviously right): W[i, j] = prod_k G_k[:, i_k, j_k, :]."""
    fout = [c.shape[1] for c in cores]
    fin = [c.shape[2] for c in cores]
    M, N = math.prod(fout), math.prod(fin)
    W = torch.empty(M, N, dtype=cores[0].dtype)
    for i in range(M):
        i_idx = []
        rem = i
        for m in reversed(fout):
            i_idx.append(rem % m)
            rem //= m
        i_idx.reverse()
        for j in range(N):
            j_idx, rem = [], j
            for n in reversed(fin):
                j_idx.append(rem % n)
                rem //= n
            j_idx.reverse()
            prod = cores[0][:, i_idx[0], j_idx[0], :]
            for k in range(1, len(cores)):
                prod = prod @ cores[k][:, i_idx[k], j_idx[k], :]
            W[i, j] = prod[0, 0]
    return W


def test_dense_weight_matches_eq7_entrywise():
    torch.manual_seed(0)
    layer = TTLinear((2, 3, 2), (3, 1, 2), (1, 2, 3, 1), dtype=F64)
    cores = [c.detach() for c in layer.cores]
    assert torch.allclose(layer.dense_weight().detach(), _reference_dense(cores), atol=1e-13)


@pytest.mark.parametrize("fin,fout,ranks", [
    ((7, 4, 4, 7), (8, 4, 4, 8), 6),
    ((8, 4, 4, 8), (1, 5, 2, 1), (1, 3, 5, 2, 1)),
    ((5,), (3,), 1),
    ((3, 2, 5), (2, 4, 3), (1, 4, 2, 1)),
    ((2, 3), (5, 1), (1, 7, 1)),
])
def test_forward_matches_dense_weight_for_every_plan(fin, fout, ranks):
    torch.manual_seed(1)
    layer = TTLinear(fin, fout, ranks, dtype=F64)
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(9, layer.in_features, dtype=F64)
    W = layer.dense_weight()
    assert W.shape == (layer.out_features, layer.in_features)
    ref = x @ W.T + layer.bias
    assert torch.allclose(layer(x), ref, atol=1e-12, rtol=1e-10)
    for groups in _groups(len(fin)):
        y = tt_contract(x, list(layer.cores), groups) + layer.bias
        assert torch.allclose(y, ref, atol=1e-12, rtol=1e-10), groups
    # leading batch dims and a single sample
    assert torch.allclose(layer(x.reshape(3, 3, -1)).reshape(9, -1), ref, atol=1e-12)
    assert torch.allclose(layer(x[0]), ref[0], atol=1e-12)


def test_forward_is_differentiable():
    torch.manual_seed(2)
    layer = TTLinear((2, 3), (3, 2), 2, dtype=F64)
    x = torch.randn(4, 6, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, *cs: tt_contract(x, cs, (1, 1)),
                                    (x, *[c.detach().requires_grad_() for c in layer.cores]))


def test_tt_svd_full_rank_round_trip():
    torch.manual_seed(3)
    fin, fout = (3, 4, 2), (2, 5, 3)
    W = torch.randn(30, 24, dtype=F64)
    cores = tt_svd(W, fin, fout)
    ranks = (1,) + tuple(c.shape[-1] for c in cores)
    assert ranks == full_ranks(fin, fout) == (1, 6, 6, 1)
    assert (tt_to_dense(cores) - W).abs().max() < 1e-10
    layer = TTLinear.from_dense(W, fin, fout)
    assert (layer.dense_weight() - W).abs().max() < 1e-10
    x = torch.randn(5, 24, dtype=F64)
    assert torch.allclose(layer(x), x @ W.T, atol=1e-10)


def test_tt_svd_rank_cap_and_error_bound():
    torch.manual_seed(4)
    fin, fout = (7, 4, 4, 7), (8, 4, 4, 8)
    W = torch.randn(1024, 784, dtype=F64)
    cores = tt_svd(W, fin, fout, max_rank=6)
    ranks = [c.shape[-1] for c in cores]
    assert all(r <= 6 for r in ranks) and ranks[-1] == 1
    assert tuple(ranks) == (6, 6, 6, 1)
    # an exactly low-rank TT matrix is recovered at its ranks
    src = TTLinear(fin, fout, (1, 3, 4, 2, 1), bias=False, dtype=F64)
    Wl = src.dense_weight().detach()
    layer = TTLinear.from_dense(Wl, fin, fout, max_rank=8)
    assert layer.ranks == (1, 3, 4, 2, 1)
    rel = (layer.dense_weight() - Wl).norm() / Wl.norm()
    assert rel < 1e-10
    # eps bound: ||W - W_tt|| <= eps ||W||
    V = torch.randn(24, 30, dtype=F64)
    for eps in (0.1, 0.5):
        approx = tt_to_dense(tt_svd(V, (2, 3, 5), (3, 2, 4), eps=eps))
        assert (approx - V).norm() <= eps * V.norm() * (1 + 1e-12)
    # an nn.Linear carries its bias over
    lin = torch.nn.Linear(6, 6).double()
    tl = TTLinear.from_dense(lin, (2, 3), (3, 2))
    x = torch.randn(3, 6, dtype=F64)
    assert torch.allclose(tl(x), lin(x), atol=1e-12)


@pytest.mark.parametrize("rank,expected", [(6, 3962), (10, 8314)])
def test_paper_parameter_counts(rank, expected):
    model = tt_mlp(rank)
    # TT-ZO Tables 1-2: core entries of both layers + the 1024 + 10 dense biases
    assert tt_mlp_num_parameters(model) == expected
    assert sum(p.numel() for p in model.parameters()) == expected
    cores = (tt_num_parameters(PAPER_FACTORS[0], PAPER_FACTORS[1], rank)
             + tt_num_parameters(PAPER_FACTORS[1], PAPER_FACTORS[2], rank))
    assert cores == 60 * rank ** 2 + 128 * rank == expected - 1034
    assert model[0].num_parameters + model[2].num_parameters == expected
    assert sum(p.numel() for p in dense_mlp().parameters()) == 814090
    x = torch.randn(3, 784)
    assert model(x).shape == dense_mlp()(x).shape == (3, 10)


def test_core_names_and_shapes():
    layer = TTLinear((7, 4, 4, 7), (8, 4, 4, 8), 6)
    names = dict(layer.named_parameters())
    assert [tuple(names[f"cores.{k}"].shape) for k in range(4)] == [
        (1, 8, 7, 6), (6, 4, 4, 6), (6, 4, 4, 6), (6, 8, 7, 1)]
    assert layer.num_core_parameters == sum(r0 * m * n * r1 for r0, m, n, r1 in
                                            (c.shape for c in layer.cores))


@pytest.mark.parametrize("shared_x", [True, False])
def test_forward_batched_equals_loop(shared_x):
    torch.manual_seed(5)
    layer = TTLinear((7, 4, 4, 7), (8, 4, 4, 8), 3, dtype=F64)
    with torch.no_grad():
        layer.bias.normal_()
    Q, B = 5, 4
    cores_q = [c.detach() + 0.1 * torch.randn(Q, *c.shape, dtype=F64) for c in layer.cores]
    x = torch.randn(B, 784, dtype=F64) if shared_x else torch.randn(Q, B, 784, dtype=F64)
    y = layer.forward_batched(x, cores_q)
    assert y.shape == (Q, B, 1024)
    for q in range(Q):
        W = tt_to_dense([c[q] for c in cores_q])
        xq = x if shared_x else x[q]
        assert torch.allclose(y[q], xq @ W.T + layer.bias, atol=1e-11)
    bias_q = torch.randn(Q, 1024, dtype=F64)
    yb = layer.forward_batched(x, cores_q, bias_q)
    assert torch.allclose(yb - bias_q[:, None], y - layer.bias, atol=1e-11)
    # large batches go through the cache-blocked (chunked) path: same result
    xl = torch.randn(300, 784, dtype=F64)
    yl = layer.forward_batched(xl, cores_q)
    for q in (0, Q - 1):
        W = tt_to_dense([c[q] for c in cores_q])
        assert torch.allclose(yl[q], xl @ W.T + layer.bias, atol=1e-10)


@pytest.mark.parametrize("init,gain", [("kaiming", 2.0), ("lecun", 1.0)])
def test_init_keeps_activations_scaled(init, gain):
    ratios, wvars = [], []
    for seed in range(8):
        torch.manual_seed(seed)
        layer = TTLinear((7, 4, 4, 7), (8, 4, 4, 8), 6, bias=False, init=init)
        x = torch.randn(256, 784)
        with torch.no_grad():
            ratios.append((layer(x).pow(2).mean() / x.pow(2).mean()).item())
            wvars.append(layer.dense_weight().pow(2).mean().item() * 784)
    assert abs(sum(ratios) / 8 / gain - 1) < 0.15
    assert abs(sum(wvars) / 8 / gain - 1) < 0.15
    # per-core stds multiply to the target: Var W = prod s_k^2 * prod_{k<L} r_k
    stds = layer.core_std()
    assert math.isclose(math.prod(s * s for s in stds) * 6 ** 3, gain / 784, rel_tol=1e-12)


def test_bad_inputs_name_the_shapes():
    with pytest.raises(ValueError, match=r"mismatched factorizations.*\(7, 4, 4, 7\).*\(8, 4, 8\)"):
        TTLinear((7, 4, 4, 7), (8, 4, 8), 6)
    with pytest.raises(ValueError, match=r">= 1"):
        TTLinear((2, 3), (3, 2), 0)
    with pytest.raises(ValueError, match=r">= 1.*\(1, 0, 1\)"):
        TTLinear((2, 3), (3, 2), (1, 0, 1))
    with pytest.raises(ValueError, match=r"r_0 = 2"):
        TTLinear((2, 3), (3, 2), (2, 3, 1))
    with pytest.raises(ValueError, match=r"r_L = 3"):
        TTLinear((2, 3), (3, 2), (1, 3, 3))
    with pytest.raises(ValueError, match=r"L\+1 = 3 ranks"):
        TTLinear((2, 3), (3, 2), (1, 3, 3, 1))
    with pytest.raises(ValueError, match=r"positive"):
        TTLinear((2, 0), (3, 2), 2)
    with pytest.raises(ValueError, match=r"\(6, 7\).*M = 6.*N = 6"):
        tt_svd(torch.randn(6, 7), (2, 3), (3, 2))
    with pytest.raises(ValueError, match=r"\(4, 5\).*in_features = 6"):
        TTLinear((2, 3), (3, 2), 2)(torch.randn(4, 5))
    with pytest.raises(ValueError, match=r"\(784, 1000, 10\).*\(784, 1024, 10\)"):
        tt_mlp(6, sizes=(784, 1000, 10))
    with pytest.raises(TypeError, match=r"ranks must be ints"):
        TTLinear((2, 3), (3, 2), (1, 2.5, 1))
    with pytest.raises(ValueError, match=r"out_factors must be positive ints"):
        TTLinear((2, 3), (3.0, 2), 2)
    # NumPy integers are integers
    import numpy as np

    layer = TTLinear(np.array([2, 3]), np.array([3, 2]), np.int64(2))
    assert layer.ranks == (1, 2, 1) and layer.in_factors == (2, 3)
    assert all(type(v) is int for v in layer.ranks + layer.in_factors + layer.out_factors)
    layer = TTLinear((2, 3), (3, 2), 2)
    with pytest.raises(ValueError, match=r"cores_q\[0\].*expected \(Q, 1, 3, 2, 2\)"):
        layer.forward_batched(torch.randn(4, 6), [torch.randn(3, 1, 3, 2, 3),
                                                  torch.randn(3, 2, 2, 3, 1)])


def test_models_registry():
    from bpfree.models import MODELS

    for name, expected in (("tt-mlp-r6", 3962), ("tt-mlp-r10", 8314)):
        spec = MODELS[name]
        assert spec.input_shape == (784,)
        model = spec.build()
        assert sum(p.numel() for p in model.parameters()) == expected
        assert model(torch.randn(2, 784)).shape == (2, 10)
