"""Per-sample test outcomes (right / wrong) stored in a result file, for paired comparisons.

Two methods scored on the same test images share most of their sampling noise: an image both
get right or both get wrong says nothing about which is better. A run with one seed that
keeps only the accuracies must treat them as independent (:func:`~bpfree.bench.claims.binomial_se`
on each), which overstates the noise of their difference (about twice, when a few in
ten images change). Keeping which
images each method got right lets the ledger use the paired standard error
(:func:`~bpfree.bench.claims.paired_se`) instead.

The outcomes travel in the JSON as text: the booleans packed eight to a byte (numpy's
``packbits``, first sample in the high bit) and base64-encoded, about 1.4 characters per 8
images. :func:`unpack_outcomes` reads them back and refuses anything that is not such a
string for the stated number of samples.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["pack_outcomes", "unpack_outcomes"]


def pack_outcomes(correct: torch.Tensor | np.ndarray | Sequence[bool]) -> str:
    """``correct`` (one boolean per test sample, in test-set order) as base64 text."""
    if isinstance(correct, torch.Tensor):
        correct = correct.detach().cpu().numpy()
    flags = np.asarray(correct)
    if flags.ndim != 1 or flags.dtype != np.bool_:
        raise ValueError(f"outcomes must be a 1-D boolean array, got dtype {flags.dtype} and "
                         f"shape {flags.shape}")
    return base64.b64encode(np.packbits(flags).tobytes()).decode("ascii")


def unpack_outcomes(text: str, n: int) -> np.ndarray:
    """The ``n`` booleans :func:`pack_outcomes` wrote as ``text``; a ValueError names what is
    wrong with anything else (not text, not base64, the wrong length, set padding bits)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive number of samples, got {n!r}")
    if not isinstance(text, str):
        raise ValueError(f"outcomes must be base64 text, got {type(text).__name__}")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error) as err:
        raise ValueError(f"outcomes are not base64 text: {err}") from None
    if len(raw) != -(-n // 8):
        raise ValueError(f"outcomes hold {len(raw)} bytes; {n} samples need {-(-n // 8)}")
    bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8))
    if bits[n:].any():
        raise ValueError("outcomes have bits set past the last sample (not written for "
                         f"{n} samples)")
    return bits[:n].astype(bool)
