"""Cached weight perturbation on one flat buffer: the same numbers in a few ops per query.

Cached mode (:class:`~bpfree.optim.ZOOptimizer`) draws a step's ``Q`` directions once and
evaluates ``L(θ + α·ξ_q)``. Per query and per tensor it used to run ``θ_i + (α·ξ_{q,i})``
into the parameter, and per direction and tensor ``g_i += w_q·ξ_{q,i}`` for a dense
estimate: ``2·Q·n`` small ops each, with a fresh temporary for every product. On TT-ZO's
models (10 tensors, N = 10) that Python and allocation work cost as much as the forwards of
the TT-MLP r = 6 (issue 32), and on the dense MLP the temporaries' page faults a fifth of the
step.

Here the ``n`` tensors are laid end to end: the directions are one ``(Q, d)`` tensor, drawn
into their rows by the same seeded generator calls; a query's point is two element-wise ops
on ``d`` values and one ``torch._foreach_copy_`` into the parameters; the dense estimate is
two ops per direction. Each element sees the same two roundings in the same order as before
(``α·ξ`` rounded, then added to ``θ``; ``w·ξ`` rounded, then accumulated over ``q`` in
order), so every perturbed tensor, loss and estimate is bit-identical to the per-tensor path,
which stays in :mod:`bpfree.estimators.weight` as the reference (``reference=True``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..perturb import Distribution
from ..perturb.distributions import Gaussian
from .base import loss_value

__all__ = ["FlatDirections", "draw_flat", "flat_supported", "losses_flat", "materialize_flat"]


@dataclass
class FlatDirections:
    """A step's directions ``ξ_{q,i}`` as rows of one ``(Q, d)`` tensor.

    ``rows[q, offsets[i]:offsets[i] + numel_i]`` is tensor ``i``'s direction of query ``q``,
    flattened; ``shapes[i]`` its shape."""

    rows: Tensor
    offsets: list[int]
    shapes: list[torch.Size]

    def split(self, flat: Tensor) -> list[Tensor]:
        """Views of a length-``d`` vector as the step's tensors (no copy)."""
        return [flat[o:o + s.numel()].view(s) for o, s in zip(self.offsets, self.shapes)]

    def per_tensor(self) -> list[list[Tensor]]:
        """``[[ξ_{q,i} for i] for q]``: views of the rows, the layout of
        :attr:`~bpfree.estimators.Estimate.directions`."""
        return [self.split(row) for row in self.rows]


def flat_supported(params: list[Tensor]) -> bool:
    """Whether ``params`` can share one flat buffer: one or more floating-point tensors of one
    dtype on one device."""
    return bool(params) and all(p.is_floating_point() and p.dtype == params[0].dtype
                                and p.device == params[0].device for p in params)


def draw_flat(params: list[Tensor], distribution: Distribution,
              seeds: list[list[int]]) -> FlatDirections:
    """:func:`~bpfree.estimators.base.draw_directions` into one ``(Q, d)`` tensor: the same
    values, tensor ``i`` of query ``q`` drawn from ``seeds[q][i]``.

    A Gaussian on the CPU is drawn by ``torch.randn(..., out=row_view)`` from one generator
    re-seeded per tensor, the values a fresh generator of that seed gives
    (:func:`~bpfree.perturb.gaussian`; the test suite checks it); any other distribution's
    ``sample`` is copied into its row."""
    p0 = params[0]
    shapes = [p.shape for p in params]
    offsets, d = [], 0
    for s in shapes:
        offsets.append(d)
        d += s.numel()
    rows = torch.empty(len(seeds), d, dtype=p0.dtype, device=p0.device)
    fast = type(distribution) is Gaussian and p0.device.type == "cpu"
    gen = torch.Generator() if fast else None
    for q, row in enumerate(seeds):
        for i, (o, s) in enumerate(zip(offsets, shapes)):
            view = rows[q, o:o + s.numel()].view(s)
            if fast:
                gen.manual_seed(distribution.check_seed(row[i]))
                torch.randn(s, generator=gen, dtype=p0.dtype, out=view)
            else:
                view.copy_(distribution.sample(row[i], s, dtype=p0.dtype, device=p0.device))
    return FlatDirections(rows, offsets, shapes)


def losses_flat(closure, params: list[Tensor], flat: FlatDirections, points) -> list[float]:
    """``[L(θ + α·ξ_q) for (q, α) in points]`` with ``θ`` restored afterwards (bit-exact: it
    is copied back from a flat copy kept for the step)."""
    theta = torch.cat([p.detach().reshape(-1) for p in params])
    point = torch.empty_like(theta)
    datas = [p.data for p in params]
    views = flat.split(point)
    out = []
    try:
        for q, alpha in points:
            torch.mul(flat.rows[q], alpha, out=point)   # α·ξ rounded, as in perturb_
            point.add_(theta)                           # then θ + (α·ξ), rounded
            torch._foreach_copy_(datas, views)
            with torch.no_grad():
                out.append(loss_value(closure()))
    finally:
        torch._foreach_copy_(datas, flat.split(theta))
    return out


def materialize_flat(flat: FlatDirections, weights: Tensor) -> Tensor:
    """``Σ_q w_q ξ_q`` as one length-``d`` vector, accumulated in
    :func:`~bpfree.estimators.base.materialize`'s order (``w_q·ξ_q`` rounded, then added;
    ``w_q = 0`` skipped), so its values are that function's bit for bit."""
    grad = flat.rows.new_zeros(flat.rows.shape[1])
    term = torch.empty_like(grad)
    for q, w in enumerate(weights.tolist()):
        if w == 0.0:
            continue
        torch.mul(flat.rows[q], w, out=term)
        grad.add_(term)
    return grad
