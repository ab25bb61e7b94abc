"""``TTLinear``: a linear layer whose weight is a tensor train (TT-ZO §3.1, Eq. 7).

``y = W x + b`` with ``W`` of shape ``(M, N)``, ``M = prod(out_factors)``,
``N = prod(in_factors)``; the cores ``cores.k`` have shape ``(r_{k-1}, m_k, n_k, r_k)`` with
``m_k = out_factors[k]`` (output) and ``n_k = in_factors[k]`` (input), ``r_0 = r_L = 1``.
Index folding is row-major: see :mod:`bpfree.tt.decompose`.

The forward pass never forms ``W``. Consecutive cores are grouped into blocks (a block of
several cores is merged into one larger core first, which costs no batch work); the input
is then contracted with the blocks from the last to the first, each step one GEMM (or a
batched GEMM) over ``(n_k, r_k)``. Which grouping is used is chosen per batch size by a cost
model (:meth:`TTLinear.plan`, approximate): multiply-adds, plus a penalty for GEMMs with a
small inner dimension, per-step overheads and memory traffic. For the paper's 784->1024 layer the model
picks the four single cores at batch 1 and two merged halves (7*4 x 8*4 each) from batch ~16 on.
A single block is the dense product itself.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import nn

from .decompose import (
    check_factors,
    check_ranks,
    merge_cores,
    tt_num_parameters,
    tt_svd,
    tt_to_dense,
)

__all__ = ["TTLinear", "tt_contract", "plan_cost", "best_plan", "INITS"]

INITS = {"kaiming": 2.0, "he": 2.0, "lecun": 1.0, "xavier": None}

# cost-model constants, in multiply-add equivalents (calibrated on one CPU thread, float32)
_SMALL_K = 16.0        # GEMM efficiency ~ K / (K + _SMALL_K) for inner dimension K
_STEP_OVERHEAD = 2.5e5  # fixed cost of one step or merge (~10 us of dispatch, reshapes)
_BATCH_OVERHEAD = 60.0  # per small matrix of a batched GEMM
_MEM = 2.0             # per element written (outputs, permuted copies)
_CHUNK_ELEMS = 1 << 17  # query-batched contractions run in chunks of queries whose largest
                        # intermediate holds about this many elements (stays in cache)


def _groups(num_cores: int):
    """All compositions of ``num_cores`` into consecutive group sizes."""
    for cuts in itertools.product((False, True), repeat=num_cores - 1):
        sizes, run = [], 1
        for cut in cuts:
            if cut:
                sizes.append(run)
                run = 1
            else:
                run += 1
        sizes.append(run)
        yield tuple(sizes)


def plan_cost(in_factors, out_factors, ranks, groups: Sequence[int], batch: int,
              queries: int = 1) -> float:
    """Modelled cost (multiply-add equivalents) of a forward with cores grouped by ``groups``."""
    fin, fout = check_factors(in_factors, out_factors)
    rs = check_ranks(ranks, len(fin))
    if sum(groups) != len(fin) or any(g < 1 for g in groups):
        raise ValueError(f"groups {tuple(groups)} must be positive sizes summing to L = {len(fin)}")
    cost = 0.0
    blocks = []
    start = 0
    for g in groups:
        ks = range(start, start + g)
        # merging the group's cores (batch independent, once per query)
        ra, mm, nn_ = rs[start], fout[start], fin[start]
        for k in list(ks)[1:]:
            out = ra * mm * nn_ * fout[k] * fin[k] * rs[k + 1]
            cost += queries * (out * rs[k] * (1 + _SMALL_K / rs[k]) + _MEM * 2 * out
                               + _STEP_OVERHEAD)
            mm *= fout[k]
            nn_ *= fin[k]
        blocks.append((ra, mm, nn_, rs[start + g]))
        start += g
    bq = batch * queries
    for i in range(len(blocks) - 1, -1, -1):
        rp, m, n, r = blocks[i]
        n_lt = math.prod(b[2] for b in blocks[:i])
        m_gt = math.prod(b[1] for b in blocks[i + 1:])
        k_inner = n * r
        flops = bq * n_lt * m_gt * k_inner * rp * m
        cost += flops * (1 + _SMALL_K / k_inner) + _MEM * bq * n_lt * m_gt * rp * m
        cost += _STEP_OVERHEAD
        if m_gt > 1:
            cost += _BATCH_OVERHEAD * bq * n_lt + _MEM * bq * n_lt * rp * m * k_inner
    return cost


def best_plan(in_factors, out_factors, ranks, batch: int, queries: int = 1) -> tuple[int, ...]:
    """The grouping of consecutive cores with the smallest :func:`plan_cost`."""
    L = len(tuple(in_factors))
    return min(_groups(L), key=lambda g: (plan_cost(in_factors, out_factors, ranks, g, batch,
                                                    queries), len(g)))


def _grouped(cores: Sequence[torch.Tensor], groups: Sequence[int]) -> list[torch.Tensor]:
    out, i = [], 0
    for g in groups:
        out.append(merge_cores(cores[i:i + g]) if g > 1 else cores[i])
        i += g
    return out


def tt_contract(x: torch.Tensor, cores: Sequence[torch.Tensor],
                groups: Sequence[int] | None = None) -> torch.Tensor:
    """``x @ W.T`` for the TT matrix ``W`` of ``cores`` without forming ``W``.

    ``x`` has shape ``(..., B, N)``; cores have shape ``(*Q, r_{k-1}, m_k, n_k, r_k)`` with the
    same (possibly empty) leading query dims ``Q``; ``x``'s leading dims broadcast against
    ``Q``. Returns ``(*broadcast, B, M)``. ``groups`` gives the grouping of consecutive cores
    (``None``: one core per step).
    """
    cores = list(cores)
    if groups is not None:
        cores = _grouped(cores, groups)
    q = tuple(cores[0].shape[:-4])
    if q:
        # cache blocking over queries: chunks whose largest intermediate fits in cache
        lead = torch.broadcast_shapes(tuple(x.shape[:-2]), q)
        nq = math.prod(lead)
        per_query = _largest_intermediate(cores, x.shape[-2])
        chunk = max(1, _CHUNK_ELEMS // max(1, per_query))
        if nq > chunk:
            shared = x.dim() == 2
            xs = x if shared else x.expand(*lead, *x.shape[-2:]).reshape(nq, *x.shape[-2:])
            cs = [c.expand(*lead, *c.shape[-4:]).reshape(nq, *c.shape[-4:]) for c in cores]
            if chunk == 1:  # plain per-query contractions (no broadcasting)
                outs = [_contract(xs if shared else xs[i], [c[i] for c in cs]) for i in range(nq)]
                return torch.stack(outs).reshape(*lead, *outs[0].shape[-2:])
            outs = [_contract(xs if shared else xs[i:i + chunk], [c[i:i + chunk] for c in cs])
                    for i in range(0, nq, chunk)]
            return torch.cat(outs).reshape(*lead, *outs[0].shape[-2:])
    return _contract(x, cores)


def _largest_intermediate(cores: Sequence[torch.Tensor], batch: int) -> int:
    ns = [c.shape[-2] for c in cores]
    ms = [c.shape[-3] for c in cores]
    return max(batch * math.prod(ns[:k]) * math.prod(ms[k + 1:]) * max(
        c.shape[-4] * c.shape[-3], c.shape[-2] * c.shape[-1]) for k, c in enumerate(cores))


def _contract(x: torch.Tensor, cores: list[torch.Tensor]) -> torch.Tensor:
    q = tuple(cores[0].shape[:-4])
    ns = [c.shape[-2] for c in cores]
    ms = [c.shape[-3] for c in cores]
    B = x.shape[-2]
    xlead = tuple(x.shape[:-2])
    # torch.broadcast_shapes is a Python reference implementation (~20 us a call, issue 32's
    # RGE steps run 22 of these per step); the common cases need none
    lead = q if not xlead or xlead == q else xlead if not q else torch.broadcast_shapes(xlead, q)
    state = x
    for k in range(len(cores) - 1, -1, -1):
        core = cores[k]
        rp, m, n, r = core.shape[-4:]
        n_lt = math.prod(ns[:k])
        m_gt = math.prod(ms[k + 1:])
        if m_gt == 1:
            # state (*, B*n_lt, n*r) @ (*, n*r, rp*m) -> (*, B, n_lt, rp, m): one GEMM
            mat = core.reshape(*q, rp * m, n * r).mT  # a transposed view: no copy
            state = torch.matmul(state.reshape(*state.shape[:-2], B * n_lt, n * r), mat)
        else:
            # (*, 1, rp*m, n*r) @ (*, B*n_lt, n*r, m_gt) -> (*, B*n_lt, rp*m, m_gt)
            mat = core.reshape(*q, 1, rp * m, n * r)
            state = torch.matmul(mat, state.reshape(*state.shape[:-2], B * n_lt, n * r, m_gt))
        # now laid out as (*, B, n_lt / n_{k-1} ... , r_{k-1}, m_k * m_gt)
        state = state.reshape(*lead, B, -1)
    return state.reshape(*lead, B, math.prod(ms))


class TTLinear(nn.Module):
    """Linear layer ``y = W x + b`` with ``W`` in tensor-train format (TT-ZO Eq. 7).

    Args:
        in_factors: ``(n_1, ..., n_L)``, ``prod = in_features = N``.
        out_factors: ``(m_1, ..., m_L)``, ``prod = out_features = M``.
        ranks: an int ``r`` (ranks ``[1, r, ..., r, 1]``) or the L+1 ranks ``(1, r_1, ..., 1)``.
        bias: add a learned bias of size ``M`` (initialised to zero).
        init: ``"kaiming"``/``"he"`` (``Var W = 2 / N``, for ReLU), ``"lecun"``
            (``Var W = 1 / N``), ``"xavier"`` (``2 / (N + M)``), or a float target variance.
            Core ``k`` is drawn from ``N(0, s_k^2)`` with ``s_k^2 = v^(1/L) / sqrt(r_{k-1} r_k)``,
            so that ``Var W_ij = prod_k s_k^2 * prod_{k<L} r_k = v`` exactly (the entries of
            ``W`` are uncorrelated and zero-mean, so ``E y_i^2 = v N E x^2``).
        plan: ``"auto"`` (cost model per batch size), or fixed group sizes, e.g. ``(2, 2)``.

    Parameters are ``cores.0 .. cores.{L-1}`` (an ``nn.ParameterList``) and ``bias``.
    """

    def __init__(self, in_factors: Sequence[int], out_factors: Sequence[int], ranks,
                 bias: bool = True, init="kaiming", plan="auto", device=None, dtype=None):
        super().__init__()
        fin, fout = check_factors(in_factors, out_factors)
        rs = check_ranks(ranks, len(fin))
        self.in_factors, self.out_factors, self.ranks = fin, fout, rs
        self.in_features, self.out_features = math.prod(fin), math.prod(fout)
        self._plan = self._check_plan(plan)
        self._plan_cache: dict[tuple[int, int], tuple[int, ...]] = {}
        kw = {"device": device, "dtype": dtype}
        self.cores = nn.ParameterList(
            nn.Parameter(torch.empty(rs[k], fout[k], fin[k], rs[k + 1], **kw))
            for k in range(len(fin)))
        self.bias = nn.Parameter(torch.empty(self.out_features, **kw)) if bias else None
        self.init = init
        self.reset_parameters()

    # -- construction -------------------------------------------------------------------------
    def _check_plan(self, plan):
        if plan == "auto":
            return plan
        try:
            groups = tuple(int(g) for g in plan)
        except TypeError:
            raise ValueError(f"plan must be 'auto' or group sizes, got {plan!r}") from None
        if sum(groups) != len(self.in_factors) or any(g < 1 for g in groups):
            raise ValueError(f"plan {groups} must be positive group sizes summing to "
                             f"L = {len(self.in_factors)}")
        return groups

    def target_variance(self) -> float:
        init = self.init
        if isinstance(init, (int, float)) and not isinstance(init, bool):
            if init <= 0:
                raise ValueError(f"init variance must be > 0, got {init}")
            return float(init)
        if init not in INITS:
            raise ValueError(f"unknown init {init!r}; choose one of {', '.join(INITS)} or a "
                             f"float variance")
        if init == "xavier":
            return 2.0 / (self.in_features + self.out_features)
        return INITS[init] / self.in_features

    def core_std(self) -> list[float]:
        """Per-core standard deviations giving ``Var W_ij = target_variance()``."""
        v, L, rs = self.target_variance(), len(self.in_factors), self.ranks
        return [math.sqrt(v ** (1.0 / L) / math.sqrt(rs[k] * rs[k + 1])) for k in range(L)]

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        for core, std in zip(self.cores, self.core_std()):
            core.normal_(0.0, std, generator=generator)
        if self.bias is not None:
            self.bias.zero_()

    @classmethod
    def from_dense(cls, weight, in_factors: Sequence[int], out_factors: Sequence[int],
                   max_rank=None, eps: float | None = None, bias=None, **kwargs) -> "TTLinear":
        """A ``TTLinear`` approximating ``weight`` (``(M, N)`` tensor or an ``nn.Linear``) by
        TT-SVD with ranks capped by ``max_rank`` and optional relative error ``eps``
        (see :func:`~bpfree.tt.decompose.tt_svd`). The bias is copied from ``bias`` or the
        ``nn.Linear``."""
        if isinstance(weight, nn.Linear):
            if bias is None and weight.bias is not None:
                bias = weight.bias
            weight = weight.weight
        weight = weight.detach()
        cores = tt_svd(weight, in_factors, out_factors, max_rank=max_rank, eps=eps)
        ranks = (1,) + tuple(c.shape[-1] for c in cores)
        kwargs.setdefault("dtype", weight.dtype)
        kwargs.setdefault("device", weight.device)
        layer = cls(in_factors, out_factors, ranks, bias=bias is not None, **kwargs)
        with torch.no_grad():
            for p, c in zip(layer.cores, cores):
                p.copy_(c)
            if bias is not None:
                layer.bias.copy_(torch.as_tensor(bias).detach())
        return layer

    # -- introspection ------------------------------------------------------------------------
    @property
    def num_parameters(self) -> int:
        """Core entries ``sum_k r_{k-1} m_k n_k r_k`` plus the bias (``M``) if any."""
        return self.num_core_parameters + (self.out_features if self.bias is not None else 0)

    @property
    def num_core_parameters(self) -> int:
        return tt_num_parameters(self.in_factors, self.out_factors, self.ranks)

    def extra_repr(self) -> str:
        return (f"in_factors={self.in_factors}, out_factors={self.out_factors}, "
                f"ranks={self.ranks}, bias={self.bias is not None}")

    def plan(self, batch: int, queries: int = 1) -> tuple[int, ...]:
        """Group sizes of consecutive cores the forward uses for this batch (and query count)."""
        if self._plan != "auto":
            return self._plan
        key = (int(batch), int(queries))
        if key not in self._plan_cache:
            self._plan_cache[key] = best_plan(self.in_factors, self.out_factors, self.ranks,
                                              max(1, key[0]), max(1, key[1]))
        return self._plan_cache[key]

    def dense_weight(self) -> torch.Tensor:
        """The matrix ``W`` (``(M, N)``) of the cores (for checks; the forward never forms it)."""
        return tt_to_dense(list(self.cores))

    # -- forward ------------------------------------------------------------------------------
    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"input of shape {tuple(x.shape)} does not match TTLinear with "
                             f"in_features = {self.in_features} = prod{self.in_factors}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        y = tt_contract(x2, list(self.cores), self.plan(x2.shape[0]))
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def forward_batched(self, x: torch.Tensor, cores_q: Sequence[torch.Tensor],
                        bias_q: torch.Tensor | None = None) -> torch.Tensor:
        """Forward for ``Q`` copies of the cores at once (e.g. ``Q`` zeroth-order perturbations).

        Args:
            x: ``(B, N)`` shared by all queries, or ``(Q, B, N)`` one batch per query.
            cores_q: L tensors of shape ``(Q, r_{k-1}, m_k, n_k, r_k)``.
            bias_q: ``(Q, M)`` per-query biases, or ``None`` to use the layer's own bias.

        Returns ``(Q, B, M)``; equal to ``[self(x[q]) with cores cores_q[..][q]]`` stacked.
        """
        cores_q = list(cores_q)
        if len(cores_q) != len(self.cores):
            raise ValueError(f"expected {len(self.cores)} query-batched cores, got {len(cores_q)}")
        Q = None
        for k, (c, p) in enumerate(zip(cores_q, self.cores)):
            if c.dim() != 5 or tuple(c.shape[1:]) != tuple(p.shape):
                raise ValueError(f"cores_q[{k}] has shape {tuple(c.shape)}; expected "
                                 f"(Q, {', '.join(map(str, p.shape))})")
            if Q is None:
                Q = c.shape[0]
            elif c.shape[0] != Q:
                raise ValueError(f"cores_q disagree on Q: {[tuple(c.shape) for c in cores_q]}")
        self._check_input(x)
        if x.dim() == 3 and x.shape[0] != Q:
            raise ValueError(f"x of shape {tuple(x.shape)} needs leading dim Q = {Q}")
        if x.dim() not in (2, 3):
            raise ValueError(f"x must be (B, N) or (Q, B, N), got {tuple(x.shape)}")
        B = x.shape[-2]
        y = tt_contract(x, cores_q, self.plan(B, Q))
        if bias_q is not None:
            if tuple(bias_q.shape) != (Q, self.out_features):
                raise ValueError(f"bias_q has shape {tuple(bias_q.shape)}; expected "
                                 f"({Q}, {self.out_features})")
            y = y + bias_q[:, None, :]
        elif self.bias is not None:
            y = y + self.bias
        return y
