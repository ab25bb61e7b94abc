"""Deterministic per-(step, query, tensor) seeds for regenerable perturbations.

Zeroth-order training stores only seeds and re-creates every perturbation from them (PMT
Appendix F: "The same random perturbation can be re-generated using the same initial seed").
``derive_seed(run_seed, step, query, tensor_index)`` gives each perturbation its own seed with a
SplitMix64 hash chain, so it is identical on every machine and Python version (no ``hash()``,
no global RNG state), and the result is a valid XORShift32 seed.
"""

from __future__ import annotations

from ._validation import UINT32_MAX, UINT64_MAX, check_int
from .splitmix import GOLDEN, MASK64, mix64


def derive_seed(base: int, *indices: int) -> int:
    """Hash ``base`` and ``indices`` into a seed in [1, 2**32 - 1].

    ``h = mix64(base + (len(indices) + 1) * GOLDEN)``, then for each index
    ``h = mix64((h ^ index) + GOLDEN)``; the result is ``h % (2**32 - 1) + 1``, which is never 0
    (XORShift32's fixed point, PMT Appendix F) and has negligible bias (2**64 = 1 mod 2**32 - 1).
    Folding the number of indices into the start separates ``derive_seed(b, 0)`` from
    ``derive_seed(b, 0, 0)``.

    Args:
        base: run seed, an int in [0, 2**64 - 1].
        *indices: e.g. step, query, tensor index; each an int in [0, 2**64 - 1].

    Returns:
        int in [1, 2**32 - 1], usable by every generator in :mod:`bpfree.perturb`.
    """
    h = check_int(base, "base", 0, UINT64_MAX)
    h = mix64((h + (len(indices) + 1) * GOLDEN) & MASK64)
    for pos, index in enumerate(indices):
        index = check_int(index, f"indices[{pos}]", 0, UINT64_MAX)
        h = mix64(((h ^ index) + GOLDEN) & MASK64)
    return h % UINT32_MAX + 1
