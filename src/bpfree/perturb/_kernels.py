"""Numba kernels of the counter-based Rademacher generator and the fused perturb/restore.

They live in one file on purpose: numba's on-disk cache (``cache=True``) is invalidated by
changes to the *file that defines* a kernel, not to the njit functions it calls, so a kernel
calling ``block_hash`` from another module could silently keep a stale hash after an edit.

See :mod:`.counter` for the stream definition and :mod:`.inplace` for the perturb/restore
contract; the pure-Python reference is :mod:`.splitmix`.
"""

from __future__ import annotations

import numba
import numpy as np

from .splitmix import GOLDEN, MIX_MUL1, MIX_MUL2

_G = np.uint64(GOLDEN)
_M1 = np.uint64(MIX_MUL1)
_M2 = np.uint64(MIX_MUL2)
_U1 = np.uint64(1)
_U63 = np.uint64(63)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)


@numba.njit(cache=True, nogil=True, inline="always")
def block_hash(key, block):  # pragma: no cover - compiled
    """SplitMix64 output ``block`` of state ``key``: the 64 sign bits of block ``block``."""
    z = key + (np.uint64(block) + _U1) * _G
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@numba.njit(cache=True, nogil=True, inline="always")
def sign_bit(key, index):  # pragma: no cover - compiled
    """Bit for global element ``index`` (1 means -1)."""
    h = block_hash(key, index >> 6)
    return (h >> (np.uint64(index) & _U63)) & _U1


# `out` is the unsigned-integer view of the destination; `pos`/`neg` are the bit patterns of
# +1 and -1 in the destination dtype, so one kernel serves every dtype and the hot loop is a
# branch-free xor that LLVM vectorises.
@numba.njit(cache=True, nogil=True, boundscheck=False)
def fill_kernel(out, key, start, pos, neg):  # pragma: no cover - compiled
    n = out.shape[0]
    flip = pos ^ neg
    i = 0
    while i < n and (start + i) % 64 != 0:
        out[i] = pos ^ (flip * sign_bit(key, start + i))
        i += 1
    while i + 64 <= n:
        h = block_hash(key, (start + i) >> 6)
        for k in range(64):
            out[i + k] = pos ^ (flip * ((h >> np.uint64(k)) & _U1))
        i += 64
    while i < n:
        out[i] = pos ^ (flip * sign_bit(key, start + i))
        i += 1


# Processes elements [start, n) and stops early, returning (count, next element), when the
# repair buffers are full; the caller grows them and resumes. Growing inside the kernel instead
# (reassigning the arrays in the loop) made it ~15x slower.
@numba.njit(cache=True, nogil=True, boundscheck=False)
def perturb_f32_kernel(p, pbits, key, a, idx, vals, start, count):  # pragma: no cover
    n = p.shape[0]
    cap = idx.shape[0]
    na = -a
    base = start - start % 64
    k0 = start - base
    while base < n:
        h = block_hash(key, base >> 6)
        m = min(64, n - base)
        for k in range(k0, m):
            i = base + k
            d = na if (h >> np.uint64(k)) & _U1 else a
            x = p[i]
            ob = pbits[i]
            q = x + d
            p[i] = q
            r = q - d
            # Compared as floats plus the one case float equality misses: -0.0 comes back as
            # +0.0 (x - x = +0 in round-to-nearest). NaN != NaN, so NaNs are always recorded.
            if r != x or (x == 0 and ob != 0):
                idx[count] = i
                vals[count] = ob
                count += 1
                if count == cap:
                    return count, i + 1
        base += 64
        k0 = 0
    return count, n


@numba.njit(cache=True, nogil=True, boundscheck=False)
def restore_f32_kernel(p, pbits, key, a, idx, vals):  # pragma: no cover - compiled
    n = p.shape[0]
    na = -a
    for b in range((n + 63) // 64):
        h = block_hash(key, b)
        base = b * 64
        m = min(64, n - base)
        for k in range(m):
            d = na if (h >> np.uint64(k)) & _U1 else a
            p[base + k] = p[base + k] - d
    for j in range(idx.shape[0]):
        pbits[idx[j]] = vals[j]
