"""Marsaglia XORShift32 and the device-parity Rademacher generator of PMT Appendix F.

PMT (Appendix F, "In-Place Random Perturbation Generation") generates perturbations on the
MCU with

.. code-block:: c

    xor_seed ^= xor_seed << 13;
    xor_seed ^= xor_seed >> 17;
    xor_seed ^= xor_seed << 5;
    return xor_seed;                       /* xor_rand()   */
    return (rand_num & 1) ? -1 : 1;        /* rademacher() */

on a 32-bit ``unsigned int``. The functions here reproduce that stream bit for bit so a model
trained in simulation with ``rademacher_xorshift`` sees the same perturbations as the device.
The stream is sequential: element i needs i state updates, so regenerating a slice means
replaying from the seed (use :mod:`.counter` when device parity is not needed).
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from ._validation import check_int, check_seed32_nonzero, check_shape, numel

_MASK32 = np.uint64(0xFFFFFFFF)
_ONE = np.uint64(1)
_S13 = np.uint64(13)
_S17 = np.uint64(17)
_S5 = np.uint64(5)


# The state is carried in uint64 and masked after each left shift: numba promotes uint32
# arithmetic to 64 bits, so the mask is what gives C's 32-bit `unsigned int` wrap-around.
@numba.njit(cache=True, nogil=True)
def _xorshift32_kernel(seed, out):  # pragma: no cover - compiled
    s = np.uint64(seed)
    for i in range(out.shape[0]):
        s ^= (s << _S13) & _MASK32
        s ^= s >> _S17
        s ^= (s << _S5) & _MASK32
        out[i] = np.uint32(s)


@numba.njit(cache=True, nogil=True)
def _rademacher_xorshift_kernel(seed, out):  # pragma: no cover - compiled
    s = np.uint64(seed)
    for i in range(out.shape[0]):
        s ^= (s << _S13) & _MASK32
        s ^= s >> _S17
        s ^= (s << _S5) & _MASK32
        # LSB 1 -> -1, LSB 0 -> +1, as `rademacher()` in PMT Appendix F.
        out[i] = np.int8(1 - 2 * np.int64(s & _ONE))


def xorshift32(seed: int, n: int) -> np.ndarray:
    """The first ``n`` XORShift32 states after ``seed`` (PMT Appendix F, ``xor_rand()``).

    Element 0 is the state after one update of ``seed``, element i the state after i + 1
    updates, i.e. the values successive ``xor_rand()`` calls return after
    ``set_xor_seed(seed)``.

    Args:
        seed: initial state, an int in [1, 2**32 - 1]. 0 is rejected because it is a fixed point
            of the recurrence (every output would be 0).
        n: number of states, an int >= 0.

    Returns:
        ``np.ndarray`` of dtype uint32 and shape ``(n,)``.
    """
    seed = check_seed32_nonzero(seed, "seed")
    n = check_int(n, "n", 0, 2**62)
    out = np.empty(n, dtype=np.uint32)
    _xorshift32_kernel(seed, out)
    return out


def rademacher_xorshift(seed: int, shape, *, device="cpu") -> torch.Tensor:
    """Device-parity Rademacher signs: one ``rademacher()`` call of PMT Appendix F per element.

    Elements are produced in row-major (C) order; value -1 when the LSB of the XORShift32 state
    is 1, else +1. Generation runs on the CPU (the recurrence is sequential) and the result is
    moved to ``device``.

    Args:
        seed: int in [1, 2**32 - 1].
        shape: int or sequence of non-negative ints.
        device: where the returned tensor lives.

    Returns:
        ``torch.int8`` tensor of +-1 with the given shape.
    """
    seed = check_seed32_nonzero(seed, "seed")
    dims = check_shape(shape)
    out = np.empty(numel(dims), dtype=np.int8)
    _rademacher_xorshift_kernel(seed, out)
    t = torch.from_numpy(out).reshape(dims)
    return t if torch.device(device).type == "cpu" else t.to(device)
