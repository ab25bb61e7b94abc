"""In-place perturbation with bit-exact restore, for the optimizers' memory-lean mode.

PMT Appendix F adds the perturbation to the weights in place and re-generates it from the seed
instead of buffering it. In floating point that alone does not restore the weights:
``(p + a) - a != p`` whenever the sum rounds (e.g. ``|p| << |a|``). :func:`perturb_` therefore
records a :class:`Repair`, the flat index and original bits of exactly those elements whose
round trip is inexact, and :func:`restore_` subtracts the regenerated perturbation and writes
those bits back, so the tensor is bit-identical to before (``-0.0`` and NaN payloads included).

Arithmetic, for a float tensor ``t`` and direction ``xi = dist.sample(seed, t.shape)``::

    delta = alpha * xi            # rounded to t.dtype
    t    <- t + delta             # one rounding, in t.dtype
    t    <- t - delta, then the Repair entries are written back

Paths:

* CPU, contiguous float32, ``"rademacher"`` (the fast counter generator): one fused numba pass
  generates each sign, adds, checks the round trip and records repairs, with no full-size
  temporary. ``alpha * (+-1)`` is exact, so the result equals ``t + alpha * xi`` computed by torch.
* Everything else: a torch fallback with temporaries the size of the tensor.
* Integer tensors (int8/int16/int32/int64, for quantized models, QZO-FF §3.3): the perturbation is
  ``alpha * sample_int(...)`` with an integer ``alpha`` (e.g. QZO-FF's epsilon_q), applied exactly
  in the tensor's dtype, so the round trip is exact and the Repair is empty. Weights are not
  clipped: for int8/int16/int32 a perturbation that would leave the dtype's range raises
  ``OverflowError`` before anything is modified (choosing alpha/bit widths that fit, or
  saturating, is the caller's job); int64 is not checked (it wraps, which the restore undoes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ._kernels import perturb_f32_kernel, restore_f32_kernel
from ._validation import check_finite_real, check_int
from .counter import counter_key
from .distributions import Distribution, Rademacher, get_distribution

_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CHECKED_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.uint8)
_INT_DTYPES = _CHECKED_INT_DTYPES + (torch.int64,)


@dataclass(frozen=True, eq=False)
class Repair:
    """Elements whose float round trip ``(p + d) - d`` is inexact, recorded by :func:`perturb_`.

    Attributes:
        indices: flat row-major indices (int32 when the tensor has < 2**31 elements, else int64).
        values: original raw bits of those elements (the same-width signed integer dtype).
        numel, dtype: of the perturbed tensor, checked by :func:`restore_`.
        key: ``(distribution, seed, alpha)`` of the perturbation, checked by :func:`restore_`.
    """

    indices: torch.Tensor
    values: torch.Tensor
    numel: int
    dtype: torch.dtype
    key: tuple

    @property
    def nbytes(self) -> int:
        """Bytes held by the record (indices plus original values)."""
        return self.indices.numel() * self.indices.element_size() + \
            self.values.numel() * self.values.element_size()

    def __len__(self) -> int:
        return self.indices.numel()


def _index_dtype(n: int):
    return (np.int32, torch.int32) if n < 2**31 else (np.int64, torch.int64)


def _fused_ok(t: torch.Tensor, dist: Distribution) -> bool:
    return (isinstance(dist, Rademacher) and dist.generator == "counter"
            and t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous())


# --- helpers ----------------------------------------------------------------------------------

def _check_tensor(t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"t must be a torch.Tensor, got {type(t).__name__}")
    if not (t.dtype.is_floating_point or t.dtype in _INT_DTYPES):
        raise ValueError(
            "t.dtype must be floating or one of torch.int8, torch.int16, torch.int32, "
            f"torch.int64, torch.uint8, got {t.dtype}"
        )
    return t


def _check_alpha(alpha: object, t: torch.Tensor):
    if t.dtype.is_floating_point:
        return check_finite_real(alpha, "alpha")
    # Integer weights take integer perturbations (QZO-FF Eq. 6 adds eps_q * z_q).
    return check_int(alpha, "alpha (integer tensors need an integer alpha)", -(2**31), 2**31 - 1)


def _flat_positions(t: torch.Tensor, flat_idx: torch.Tensor):
    """Index usable as ``t[...]`` for flat row-major indices, whatever t's strides."""
    return torch.unravel_index(flat_idx.to(torch.int64), t.shape)


def _empty_repair(t: torch.Tensor, key: tuple) -> Repair:
    return Repair(indices=torch.empty(0, dtype=torch.int32, device=t.device),
                  values=torch.empty(0, dtype=_INT_VIEW[t.element_size()], device=t.device),
                  numel=t.numel(), dtype=t.dtype, key=key)


def _float_delta(t: torch.Tensor, dist: Distribution, seed: int, alpha: float) -> torch.Tensor:
    return dist.sample(seed, t.shape, dtype=t.dtype, device=t.device).mul_(alpha)


def _int_delta(t: torch.Tensor, dist: Distribution, seed: int, alpha: int) -> torch.Tensor:
    if not dist.integer_valued:
        raise ValueError(
            f"integer tensors need an integer-valued distribution (e.g. 'rademacher', "
            f"'quantized_gaussian'), got {dist.name!r}"
        )
    return dist.sample_int(seed, t.shape, dtype=torch.int64, device=t.device).mul_(alpha)


# --- public API -------------------------------------------------------------------------------

def perturb_(t: torch.Tensor, dist: Distribution | str, seed: int, alpha: float) -> Repair:
    """Add ``alpha * xi(seed)`` to ``t`` in place and return the :class:`Repair` for
    :func:`restore_` (see the module docstring for the exact arithmetic).

    Args:
        t: tensor to perturb (floating or integer dtype, any device); autograd is bypassed.
        dist: a :class:`Distribution` or a registered name.
        seed: seed valid for ``dist`` (any :func:`derive_seed` output is).
        alpha: step, a finite real; an int in [-2**31, 2**31 - 1] for integer tensors.

    Returns:
        The Repair record; ``repair.nbytes`` is its memory cost (0 for integer tensors).

    Raises:
        OverflowError: an int8/int16/int32/uint8 element would leave its dtype's range
            (``t`` is left unchanged).
    """
    t = _check_tensor(t)
    dist = get_distribution(dist)
    seed = dist.check_seed(seed)
    alpha = _check_alpha(alpha, t)
    key = (dist, seed, alpha)
    with torch.no_grad():
        t = t.detach()
        if t.numel() == 0:
            return _empty_repair(t, key)
        if not t.dtype.is_floating_point:
            delta = _int_delta(t, dist, seed, alpha)
            if t.dtype in _CHECKED_INT_DTYPES:
                wide = t.to(torch.int64) + delta
                info = torch.iinfo(t.dtype)
                lo, hi = int(wide.min()), int(wide.max())
                if lo < info.min or hi > info.max:
                    raise OverflowError(
                        f"perturbation with alpha={alpha} takes {t.dtype} values to [{lo}, {hi}], "
                        f"outside [{info.min}, {info.max}]; t was not modified"
                    )
                t.copy_(wide)
            else:
                t.add_(delta)
            return _empty_repair(t, key)
        if _fused_ok(t, dist):
            flat = t.view(-1)
            n = flat.numel()
            np_idx, torch_idx = _index_dtype(n)
            # ~4% of N(0, 0.05) weights need repair at alpha=1e-3; tiny weights need it all.
            cap = max(1024, n // 16)
            idx, vals = np.empty(cap, np_idx), np.empty(cap, np.int32)
            p, pbits = flat.numpy(), flat.view(torch.int32).numpy()
            ckey, a = np.uint64(counter_key(seed)), np.float32(alpha)
            count, pos = perturb_f32_kernel(p, pbits, ckey, a, idx, vals, 0, 0)
            while pos < n:
                idx = np.concatenate([idx, np.empty_like(idx)])
                vals = np.concatenate([vals, np.empty_like(vals)])
                count, pos = perturb_f32_kernel(p, pbits, ckey, a, idx, vals, pos, count)
            # Copy so the (possibly much larger) growth buffers are freed.
            return Repair(indices=torch.from_numpy(idx[:count].copy()),
                          values=torch.from_numpy(vals[:count].copy()),
                          numel=n, dtype=t.dtype, key=key)
        delta = _float_delta(t, dist, seed, alpha)
        perturbed = t + delta
        back = torch.sub(perturbed, delta, out=delta)  # delta is no longer needed
        iview = _INT_VIEW[t.element_size()]
        bad = (back.view(iview) != t.view(iview)).reshape(-1).nonzero().squeeze(1)
        values = t.view(iview).reshape(-1)[bad]
        t.copy_(perturbed)
        _, torch_idx = _index_dtype(t.numel())
        return Repair(indices=bad.to(torch_idx), values=values, numel=t.numel(), dtype=t.dtype,
                      key=key)


def restore_(t: torch.Tensor, dist: Distribution | str, seed: int, alpha: float,
             repair: Repair) -> torch.Tensor:
    """Undo :func:`perturb_`: subtract the regenerated ``alpha * xi(seed)`` and write back the
    Repair entries, leaving ``t`` bit-identical to its value before ``perturb_``.

    The arguments must be those given to ``perturb_`` (checked against ``repair``) and ``t``
    must not have been modified in between. Returns ``t``.
    """
    t = _check_tensor(t)
    dist = get_distribution(dist)
    seed = dist.check_seed(seed)
    alpha = _check_alpha(alpha, t)
    if not isinstance(repair, Repair):
        raise ValueError(f"repair must be the Repair returned by perturb_, got {type(repair)}")
    if repair.numel != t.numel() or repair.dtype != t.dtype:
        raise ValueError(
            f"repair was recorded for {repair.numel} elements of {repair.dtype}, "
            f"but t has {t.numel()} elements of {t.dtype}"
        )
    if repair.key != (dist, seed, alpha):
        raise ValueError(
            f"restore_ arguments (dist, seed, alpha)={(dist, seed, alpha)} differ from those of "
            f"perturb_ {repair.key}"
        )
    out = t
    with torch.no_grad():
        t = t.detach()
        if t.numel() == 0:
            return out
        if not t.dtype.is_floating_point:
            delta = _int_delta(t, dist, seed, alpha)
            if t.dtype in _CHECKED_INT_DTYPES:
                # Through int64: alpha * xi alone may not fit the dtype even when t - it does.
                t.copy_(t.to(torch.int64) - delta)
            else:
                t.sub_(delta)
            return out
        if _fused_ok(t, dist):
            flat = t.view(-1)
            restore_f32_kernel(flat.numpy(), flat.view(torch.int32).numpy(),
                                np.uint64(counter_key(seed)), np.float32(alpha),
                                repair.indices.numpy(), repair.values.numpy())
            return out
        t.sub_(_float_delta(t, dist, seed, alpha))
        if len(repair):
            iview = _INT_VIEW[t.element_size()]
            idx = repair.indices.to(t.device)
            vals = repair.values.to(t.device)
            if t.is_contiguous():
                t.view(-1).view(iview)[idx.to(torch.int64)] = vals
            else:
                t.view(iview)[_flat_positions(t, idx)] = vals
    return out


def add_direction_(t: torch.Tensor, dist: Distribution | str, seed: int, alpha: float) -> torch.Tensor:
    """``t += alpha * xi(seed)`` in place, with no undo record (for updates, not probes).

    The optimizer's seed-replayed update ``θ ← θ − η Σ_k w_k ξ_k`` never needs restoring, so it
    skips :func:`perturb_`'s round-trip check; the values written are bit-identical to those
    ``perturb_`` would write. Returns ``t``.
    """
    t = _check_tensor(t)
    dist = get_distribution(dist)
    seed = dist.check_seed(seed)
    alpha = _check_alpha(alpha, t)
    if not t.dtype.is_floating_point:
        perturb_(t, dist, seed, alpha)
        return t
    with torch.no_grad():
        target = t.detach()
        if target.numel() == 0:
            return t
        if _fused_ok(target, dist):
            flat = target.view(-1)
            # The restore kernel computes p − a·ξ; with a = −alpha that is p + alpha·ξ.
            restore_f32_kernel(flat.numpy(), flat.view(torch.int32).numpy(),
                               np.uint64(counter_key(seed)), np.float32(-alpha),
                               _NO_INDICES, _NO_VALUES)
        else:
            target.add_(_float_delta(target, dist, seed, alpha))
    return t


_NO_INDICES = np.empty(0, dtype=np.int32)
_NO_VALUES = np.empty(0, dtype=np.int32)
