"""SplitMix64 mixing function, the hash behind the counter-based generator and seed derivation.

SplitMix64 (Steele, Lea & Flood, OOPSLA 2014) outputs ``mix64(state + (i + 1) * GOLDEN)`` for
its i-th value. Because output i depends only on (state, i) it is a *counter-based* generator:
any slice can be regenerated without replaying the stream, which is what zeroth-order training
needs to re-create a perturbation from its seed (PMT Appendix F makes the same point for
XORShift, which must replay from the start).

This module is the pure-Python reference; the numba kernels in :mod:`.counter` and the int64
torch path implement the same arithmetic and are tested against it.
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1
#: 2**64 / golden ratio, the SplitMix64 increment ("gamma").
GOLDEN = 0x9E3779B97F4A7C15
MIX_MUL1 = 0xBF58476D1CE4E5B9
MIX_MUL2 = 0x94D049BB133111EB


def mix64(z: int) -> int:
    """The SplitMix64 finaliser (a bijection on 64-bit integers), on Python ints."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * MIX_MUL1) & MASK64
    z = ((z ^ (z >> 27)) * MIX_MUL2) & MASK64
    return z ^ (z >> 31)


def splitmix64(state: int, index: int) -> int:
    """Output ``index`` (0-based) of the SplitMix64 stream started at ``state``."""
    return mix64((state + (index + 1) * GOLDEN) & MASK64)


def to_int64(u: int) -> int:
    """Reinterpret an unsigned 64-bit value as two's-complement int64 (for torch tensors)."""
    u &= MASK64
    return u - (1 << 64) if u >= (1 << 63) else u
