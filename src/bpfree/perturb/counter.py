"""Fast counter-based Rademacher generator for simulation (no device parity).

Element ``i`` of the stream for ``seed`` is bit ``i % 64`` of the SplitMix64 output for block
``i // 64``::

    key   = mix64(seed + GOLDEN)                      # decorrelates neighbouring seeds
    h_b   = mix64(key + (b + 1) * GOLDEN)             # SplitMix64 output b of state `key`
    xi_i  = -1 if (h_{i // 64} >> (i % 64)) & 1 else +1

One 64-bit hash yields 64 signs, so the generator is memory-bound (well above 1e9 values/s on
one core), and because ``xi_i`` depends only on ``(seed, i)`` it is stateless: any slice can be
regenerated (``offset=``), which is what the in-place perturb/restore cycle of zeroth-order
training relies on (PMT Appendix F regenerates perturbations from a seed instead of storing
them). The sign convention (bit 1 -> -1) matches the XORShift ``rademacher()`` of PMT Appendix F,
but the stream differs: use :func:`.xorshift.rademacher_xorshift` for device parity.

Two implementations give bit-identical values: a numba kernel for CPU tensors and a pure-torch
int64 path (wrapping multiplies, masked arithmetic shifts to emulate logical shifts) for other
devices such as CUDA.
"""

from __future__ import annotations

import numpy as np
import torch

from ._kernels import fill_kernel
from ._validation import SIGNED_INT_DTYPES, check_int, check_seed64, check_shape
from .splitmix import GOLDEN, MIX_MUL1, MIX_MUL2, mix64, to_int64

_MAX_OFFSET = 2**62

_BACKENDS = ("auto", "numba", "torch")


def counter_key(seed: int) -> int:
    """The 64-bit stream key for ``seed`` (an int in [0, 2**64 - 1])."""
    return mix64(check_seed64(seed) + GOLDEN)


_UINT_VIEW = {1: (torch.int8, np.uint8), 2: (torch.int16, np.uint16),
              4: (torch.int32, np.uint32), 8: (torch.int64, np.uint64)}


def _check_fill_dtype(dtype: torch.dtype) -> None:
    if not (dtype.is_floating_point or dtype in SIGNED_INT_DTYPES):
        raise ValueError(
            "out.dtype must be a floating dtype or one of torch.int8, torch.int16, torch.int32, "
            f"torch.int64 (values are +-1), got {dtype}"
        )


def _sign_patterns(dtype: torch.dtype):
    """(+1, -1) as raw bits of ``dtype``, typed as the matching numpy unsigned scalar."""
    tview, nview = _UINT_VIEW[dtype.itemsize]
    bits = torch.tensor([1, -1], dtype=dtype).view(tview).numpy().view(nview)
    return bits[0], bits[1]


def _fill_numba(flat: torch.Tensor, key: int, offset: int) -> None:
    tview, nview = _UINT_VIEW[flat.dtype.itemsize]
    pos, neg = _sign_patterns(flat.dtype)
    arr = flat.view(tview).numpy().view(nview)
    fill_kernel(arr, np.uint64(key), offset, pos, neg)


# Blocks per torch chunk: bounds the int64 temporaries at 64 * 2**16 * 8 B = 32 MiB.
_TORCH_CHUNK_BLOCKS = 1 << 16
_MASK34 = (1 << 34) - 1
_MASK37 = (1 << 37) - 1
_MASK33 = (1 << 33) - 1


def _torch_block_hash(blocks: torch.Tensor, key: int) -> torch.Tensor:
    """``_kernels.block_hash`` on int64 tensors: multiplies wrap mod 2**64 like uint64, and the arithmetic
    right shifts are masked to act as logical shifts."""
    z = (blocks + 1) * to_int64(GOLDEN) + to_int64(key)
    z = (z ^ ((z >> 30) & _MASK34)) * to_int64(MIX_MUL1)
    z = (z ^ ((z >> 27) & _MASK37)) * to_int64(MIX_MUL2)
    return z ^ ((z >> 31) & _MASK33)


def _fill_torch(flat: torch.Tensor, key: int, offset: int) -> None:
    n = flat.numel()
    if n == 0:
        return
    device = flat.device
    shifts = torch.arange(64, dtype=torch.int64, device=device)
    first_block = offset // 64
    last_block = (offset + n - 1) // 64
    for c0 in range(first_block, last_block + 1, _TORCH_CHUNK_BLOCKS):
        c1 = min(c0 + _TORCH_CHUNK_BLOCKS, last_block + 1)
        blocks = torch.arange(c0, c1, dtype=torch.int64, device=device)
        # Arithmetic shift then &1 is exact for bit k <= 63: sign extension only fills bits
        # above the one extracted.
        bits = (_torch_block_hash(blocks, key).unsqueeze(1) >> shifts) & 1
        bits = bits.reshape(-1)
        lo = max(offset, c0 * 64)
        hi = min(offset + n, c1 * 64)
        values = 1 - 2 * bits[lo - c0 * 64: hi - c0 * 64]
        flat[lo - offset: hi - offset].copy_(values)


def fill_rademacher_(out: torch.Tensor, seed: int, *, offset: int = 0,
                     backend: str = "auto") -> torch.Tensor:
    """Fill ``out`` in place with fast counter-based Rademacher signs and return it.

    Element j of ``out`` (row-major) receives stream element ``offset + j``, so filling a slice
    with the matching ``offset`` reproduces that part of a larger draw.

    Args:
        out: destination tensor, floating or signed-integer dtype, any device and layout.
        seed: int in [0, 2**64 - 1].
        offset: index of the first stream element, an int in [0, 2**62].
        backend: ``"auto"`` (numba on CPU, torch elsewhere), ``"numba"`` (CPU only) or
            ``"torch"``; all give bit-identical values.
    """
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"out must be a torch.Tensor, got {type(out).__name__}")
    _check_fill_dtype(out.dtype)
    key = counter_key(seed)
    offset = check_int(offset, "offset", 0, _MAX_OFFSET)
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    on_cpu = out.device.type == "cpu"
    if backend == "numba" and not on_cpu:
        raise ValueError(f"backend='numba' needs a CPU tensor, got device {out.device}")
    use_numba = on_cpu and backend != "torch"
    with torch.no_grad():
        target = out.detach()
        flat = target.view(-1) if target.is_contiguous() else torch.empty(
            target.numel(), dtype=target.dtype, device=target.device)
        if use_numba:
            _fill_numba(flat, key, offset)
        else:
            _fill_torch(flat, key, offset)
        if not target.is_contiguous():
            target.copy_(flat.view(target.shape))
    return out


def rademacher_fast(seed: int, shape, *, dtype: torch.dtype = torch.float32, device="cpu",
                    offset: int = 0, backend: str = "auto",
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Fast stateless Rademacher signs (+-1) of the given shape; see the module docstring.

    Args:
        seed: int in [0, 2**64 - 1].
        shape: int or sequence of non-negative ints.
        dtype: floating or signed-integer dtype of the result.
        device: device of the result (numba fills CPU tensors, the torch path the rest).
        offset: stream index of the first element (regenerates a slice of a larger draw).
        backend: ``"auto"``, ``"numba"`` or ``"torch"`` (bit-identical).
        out: optional preallocated tensor of ``shape`` to fill instead of allocating (its own
            dtype and device are used; see :func:`fill_rademacher_`).
    """
    dims = check_shape(shape)
    if out is not None:
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != dims:
            raise ValueError(f"out must be a tensor of shape {dims}, got "
                             f"{tuple(out.shape) if isinstance(out, torch.Tensor) else out!r}")
        return fill_rademacher_(out, seed, offset=offset, backend=backend)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch.dtype, got {dtype!r}")
    _check_fill_dtype(dtype)
    out = torch.empty(dims, dtype=dtype, device=device)
    return fill_rademacher_(out, seed, offset=offset, backend=backend)


def rademacher_fast_reference(seed: int, n: int, *, offset: int = 0) -> list[int]:
    """Slow pure-Python definition of the stream (for tests and documentation)."""
    key = counter_key(seed)
    out = []
    for i in range(offset, offset + n):
        h = mix64(key + (i // 64 + 1) * GOLDEN)
        out.append(-1 if (h >> (i % 64)) & 1 else 1)
    return out


__all__ = ["rademacher_fast", "fill_rademacher_", "counter_key", "rademacher_fast_reference"]
