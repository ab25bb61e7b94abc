"""Tensor-train (TT) matrix format: validation, TT-SVD and forming the dense matrix.

Conventions (TT-ZO Eq. 7, Oseledets 2011). A weight ``W`` of shape ``(M, N)`` maps
``x`` in R^N to ``y = W x`` in R^M, so ``M = prod(out_factors) = prod(m_k)`` is the output
size and ``N = prod(in_factors) = prod(n_k)`` the input size. The row index ``i`` of ``W`` is
the row-major multi-index ``(i_1, ..., i_L)`` over ``(m_1, ..., m_L)`` (``i_1`` most
significant), the column index ``j`` likewise over ``(n_1, ..., n_L)``, and

    W[(i_1..i_L), (j_1..j_L)] = G_1[:, i_1, j_1, :] @ ... @ G_L[:, i_L, j_L, :]

with TT-cores ``G_k`` of shape ``(r_{k-1}, m_k, n_k, r_k)`` and ``r_0 = r_L = 1``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch

__all__ = ["check_factors", "check_ranks", "tt_svd", "tt_to_dense", "tt_num_parameters",
           "full_ranks", "merge_cores"]


def _is_int(v) -> bool:
    """A Python or NumPy integer (not a bool)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_factors(in_factors: Sequence[int], out_factors: Sequence[int]) -> tuple[tuple[int, ...],
                                                                                  tuple[int, ...]]:
    """Validated ``(in_factors, out_factors)`` as tuples of positive ints of equal length L."""
    try:
        fin = tuple(in_factors)
        fout = tuple(out_factors)
    except TypeError:
        raise TypeError(f"in_factors and out_factors must be sequences of ints, got "
                        f"{in_factors!r} and {out_factors!r}") from None
    if not fin or not fout:
        raise ValueError(f"factorizations must be non-empty, got in_factors={fin}, "
                         f"out_factors={fout}")
    for name, fs in (("in_factors", fin), ("out_factors", fout)):
        if not all(_is_int(f) and f >= 1 for f in fs):
            raise ValueError(f"{name} must be positive ints, got {fs}")
    fin, fout = tuple(int(f) for f in fin), tuple(int(f) for f in fout)
    if len(fin) != len(fout):
        raise ValueError(f"mismatched factorizations: in_factors {fin} has {len(fin)} factors "
                         f"but out_factors {fout} has {len(fout)}; both need L factors")
    return fin, fout


def check_ranks(ranks, num_cores: int) -> tuple[int, ...]:
    """Validated TT-ranks ``(r_0, ..., r_L)``; an int ``r`` means ``[1, r, ..., r, 1]``."""
    if _is_int(ranks):
        if ranks < 1:
            raise ValueError(f"TT-rank must be >= 1, got {ranks} (an int r >= 1 means ranks "
                             f"[1, r, ..., r, 1]; or pass the L+1 = {num_cores + 1} ranks)")
        return (1,) + (int(ranks),) * (num_cores - 1) + (1,)
    try:
        rs = tuple(ranks)
    except TypeError:
        raise TypeError(f"ranks must be an int or a sequence of L+1 ints, got {ranks!r}") from None
    if len(rs) != num_cores + 1:
        raise ValueError(f"ranks {rs} has {len(rs)} entries; L = {num_cores} cores need "
                         f"L+1 = {num_cores + 1} ranks (r_0, ..., r_L)")
    if not all(_is_int(r) for r in rs):
        raise TypeError(f"ranks must be ints, got {rs}")
    rs = tuple(int(r) for r in rs)
    if any(r < 1 for r in rs):
        raise ValueError(f"TT-ranks must be >= 1, got {rs}")
    if rs[0] != 1 or rs[-1] != 1:
        raise ValueError(f"TT-ranks need r_0 = r_L = 1, got r_0 = {rs[0]}, r_L = {rs[-1]} "
                         f"in {rs}")
    return rs


def full_ranks(in_factors: Sequence[int], out_factors: Sequence[int]) -> tuple[int, ...]:
    """The TT-ranks at which the format is exact for every matrix (TT-SVD without truncation):
    ``r_k = min(prod_{i<=k} m_i n_i, prod_{i>k} m_i n_i)``."""
    fin, fout = check_factors(in_factors, out_factors)
    sizes = [m * n for m, n in zip(fout, fin)]
    return tuple(min(math.prod(sizes[:k]), math.prod(sizes[k:])) for k in range(len(sizes) + 1))


def tt_num_parameters(in_factors: Sequence[int], out_factors: Sequence[int], ranks) -> int:
    """Number of TT-core entries, ``sum_k r_{k-1} m_k n_k r_k`` (TT-ZO §3.1; no bias)."""
    fin, fout = check_factors(in_factors, out_factors)
    rs = check_ranks(ranks, len(fin))
    return sum(rs[k] * fout[k] * fin[k] * rs[k + 1] for k in range(len(fin)))


def merge_cores(cores: Sequence[torch.Tensor]) -> torch.Tensor:
    """Contract consecutive cores ``(..., r_a, m, n, r)`` into ``(..., r_a, prod m, prod n, r_b)``.

    Leading dims (e.g. a query dim) are batch dims shared by all cores. The chain is split in
    halves recursively; each join is one GEMM over the shared rank and one permute whose inner
    run stays contiguous (``(M1, N1, M2, N2 r) -> (M1, M2, N1, N2 r)``).
    """
    cores = list(cores)
    if len(cores) == 1:
        return cores[0]
    h = len(cores) // 2
    a, c = merge_cores(cores[:h]), merge_cores(cores[h:])
    lead = tuple(a.shape[:-4])
    ra, m1, n1, r = a.shape[-4:]
    _, m2, n2, rb = c.shape[-4:]
    t = torch.matmul(a.reshape(*lead, ra * m1 * n1, r), c.reshape(*lead, r, m2 * n2 * rb))
    t = t.reshape(*lead, ra, m1, n1, m2, n2 * rb).transpose(-3, -2)
    return t.reshape(*lead, ra, m1 * m2, n1 * n2, rb)


def tt_to_dense(cores: Sequence[torch.Tensor]) -> torch.Tensor:
    """The matrix ``W`` (``(M, N)``, or ``(..., M, N)`` with leading batch dims) of TT-cores."""
    full = merge_cores(list(cores))
    if full.shape[-4] != 1 or full.shape[-1] != 1:
        raise ValueError(f"boundary ranks must be 1, got r_0 = {full.shape[-4]}, "
                         f"r_L = {full.shape[-1]}")
    return full[..., 0, :, :, 0]


def tt_svd(weight: torch.Tensor, in_factors: Sequence[int], out_factors: Sequence[int],
           max_rank=None, eps: float | None = None) -> list[torch.Tensor]:
    """TT-cores of ``weight`` (shape ``(M, N)``, ``y = W x``) by TT-SVD (Oseledets 2011, Alg. 1).

    The matrix is folded into a 2L-way tensor with index pairs ``(i_k, j_k)`` interleaved and
    split by L-1 sequential truncated SVDs. ``max_rank`` caps the TT-ranks: an int caps every
    interior rank, a sequence gives the L+1 caps ``(1, c_1, ..., c_{L-1}, 1)``; ``None`` keeps
    the full ranks. Singular values below ``s_max * max(shape) * machine eps`` are always
    dropped, so a matrix of lower TT-rank gets its exact ranks. ``eps`` (optional) is a
    relative error bound: each SVD drops the smallest singular values whose tail norm is at
    most ``eps / sqrt(L-1) * ||W||_F``, so that without a rank cap
    ``||W - W_tt||_F <= eps ||W||_F``. Returns the cores
    ``G_k`` of shape ``(r_{k-1}, m_k, n_k, r_k)``, in ``weight``'s dtype and device.
    """
    fin, fout = check_factors(in_factors, out_factors)
    L = len(fin)
    M, N = math.prod(fout), math.prod(fin)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"weight must be a 2-D tensor, got "
                         f"{getattr(weight, 'shape', type(weight).__name__)}")
    if tuple(weight.shape) != (M, N):
        raise ValueError(f"weight of shape {tuple(weight.shape)} does not match the "
                         f"factorizations: out_factors {fout} give M = {M}, in_factors {fin} "
                         f"give N = {N}, so W must be ({M}, {N})")
    caps = full_ranks(fin, fout)
    if max_rank is not None:
        user = check_ranks(max_rank, L)
        caps = tuple(min(a, b) for a, b in zip(caps, user))
    if eps is not None and eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    w = weight.detach()
    compute = w if w.dtype in (torch.float32, torch.float64) else w.float()
    # (m_1..m_L, n_1..n_L) -> (m_1, n_1, m_2, n_2, ..., m_L, n_L)
    t = compute.reshape(*fout, *fin)
    perm = [p for k in range(L) for p in (k, L + k)]
    t = t.permute(perm).contiguous()
    delta = None
    if eps is not None and L > 1:
        delta = eps / math.sqrt(L - 1) * torch.linalg.vector_norm(compute).item()
    cores = []
    r_prev = 1
    rest = t.reshape(-1)
    for k in range(L - 1):
        mat = rest.reshape(r_prev * fout[k] * fin[k], -1)
        u, s, vh = torch.linalg.svd(mat, full_matrices=False)
        # numerically zero singular values are always dropped (exact TT-ranks are recovered)
        tol = s[0] * max(mat.shape) * torch.finfo(s.dtype).eps if s.numel() else 0.0
        r = max(1, min(caps[k + 1], int((s > tol).sum())))
        if delta is not None:
            # smallest r whose discarded tail has norm <= delta
            tail = torch.flip(torch.cumsum(torch.flip(s * s, [0]), 0), [0])  # tail[i] = sum_{j>=i}
            ok = torch.nonzero(tail <= delta * delta).flatten()
            r_eps = int(ok[0].item()) if ok.numel() else s.numel()
            r = max(1, min(r, r_eps))
        cores.append(u[:, :r].reshape(r_prev, fout[k], fin[k], r))
        rest = s[:r, None] * vh[:r]
        r_prev = r
    cores.append(rest.reshape(r_prev, fout[-1], fin[-1], 1))
    return [c.to(weight.dtype).contiguous() for c in cores]
