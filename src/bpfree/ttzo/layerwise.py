"""ZO-CGE's ``d + 1`` loss evaluations (TT-ZO Eq. 2 with ξ_i = e_i) by the linearity of each layer.

Every layer of an MLP or TT-MLP is affine in each of its scalars taken alone: a linear layer
``z = W a + b`` in ``W_ij`` and ``b_i``, and a :class:`~bpfree.tt.TTLinear` (TT-ZO Eq. 7) in
every entry of every core, since ``W`` is a product of the cores. So moving one coordinate
``c`` of layer ``ℓ`` by ``δ`` moves that layer's output by exactly ``δ·∂z_ℓ/∂θ_c``:

* ``W_ij``: ``δ·a_j`` on output ``i``; ``b_i``: ``δ`` on output ``i``;
* TT core ``k``, entry ``(α, μ, ν, β)``: on the outputs whose ``k``-th output digit is ``μ``,
  ``δ·Σ L[o, i, α] a[i, ν, j] R[β, p, j]``, with ``L`` the merged cores before ``k``
  (``(M_<, N_<, r_{k−1})``), ``R`` those after it (``(r_k, M_>, N_>)``) and ``o, p`` the
  output digits before and after ``k`` (the row-major folding of :mod:`bpfree.tt.decompose`).

:class:`LayerwiseCGE` runs the unperturbed forward once, adds these columns to the cached
``z_ℓ`` for a chunk of coordinates at a time, and runs only the layers after ``ℓ`` on the
chunk. The losses equal those of ``d`` perturbed full forwards up to float rounding (the
perturbed output is formed as ``z + δ·col`` instead of from the perturbed weight), and the
cost per coordinate is the rest of the network after its layer instead of the whole
network.

When the rest is element-wise activations ``σ`` and one last (TT-)linear layer ``W'``
(every coordinate of a two-layer MLP's or TT-MLP's first layer), only the outputs ``S`` that
the column touches change: ``{i}`` for ``W_ij`` and ``b_i``, the ``M / m_k`` outputs whose
``k``-th digit is ``μ`` for a core entry. The network output is then
``y + W'[:, S]·(σ(z_S + δ·col_S) − σ(z_S))``, formed from the cached ``y`` and the dense
``W'`` (the same linearity; again equal up to float rounding), at a cost of ``|S|`` columns
of ``W'`` per sample instead of the whole of ``z`` and ``W'``.

Models it understands: an ``nn.Sequential`` of ``nn.Linear``, :class:`~bpfree.tt.TTLinear`
and element-wise activations, or a :class:`~bpfree.ttzo.MaskedModel` around one (its kept
values are positions in the dense weight). Anything else falls back to
:class:`~bpfree.estimators.CoordinateWise`'s own evaluation, as does ``mode="lean"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..estimators import CoordinateWise
from ..estimators.base import QueryContext
from ..objective import Objective
from ..tt import TTLinear
from ..tt.decompose import merge_cores

__all__ = ["LayerwiseCGE", "layerwise_losses"]

#: Activations applied element-wise (the only non-affine layers allowed between layers).
ELEMENTWISE = (nn.ReLU, nn.Tanh, nn.GELU, nn.Sigmoid, nn.Identity)
#: Elements of the largest perturbed chunk ``(C, B, M)`` (keeps one chunk in cache).
_CHUNK_ELEMS = 1 << 21


@dataclass(frozen=True)
class LayerwiseCGE(CoordinateWise):
    """:class:`~bpfree.estimators.CoordinateWise` whose batched mode uses :func:`layerwise_losses`.

    Same coordinates, same estimate and the same ``d + 1`` (``2d`` central) evaluation count
    as the parent; only how the perturbed losses are computed differs (see the module
    docstring). ``mode="lean"`` and unsupported models use the parent's evaluation.
    """

    def evaluate(self, ctx: QueryContext, points) -> tuple[float, list[float]]:
        if ctx.mode == "batched" and isinstance(ctx.closure, Objective):
            out = layerwise_losses(ctx.closure, ctx.params, points)
            if out is not None:
                base, losses = out
                return (float("nan") if self.central else base), losses
        return super().evaluate(ctx, points)


def _layers(model: nn.Module) -> list[nn.Module] | None:
    # A MaskedModel keeps the network as ``.net``; duck-typed because baselines imports hybrid.
    net = model.net if isinstance(getattr(model, "net", None), nn.Sequential) else model
    if not isinstance(net, nn.Sequential):
        return None
    layers = list(net)
    if not all(isinstance(m, (nn.Linear, TTLinear) + ELEMENTWISE) for m in layers):
        return None
    return layers


def _locate(layers, params):
    """For each trainable tensor: ``(layer index, kind, extra)`` or None if not found.

    kind ``"dense"``: positions index the layer's dense ``(M, N)`` weight (extra: None, or the
    kept positions of a masked weight); ``"bias"`` (extra: None or kept positions); ``"core"``
    (extra: the core index).
    """
    where = {}
    for li, m in enumerate(layers):
        if isinstance(m, TTLinear):
            for k, c in enumerate(m.cores):
                where[id(c)] = (li, "core", k)
        for attr in ("weight", "bias"):
            kind = "dense" if attr == "weight" else "bias"
            p = m._parameters.get(attr)
            if p is not None:
                where[id(p)] = (li, kind, None)
            values = m._parameters.get(f"{attr}_values")
            if values is not None:
                where[id(values)] = (li, kind, getattr(m, f"{attr}_index"))
    out = [where.get(id(p)) for p in params]
    return None if any(o is None for o in out) else out


def _core_columns(layer: TTLinear, a: torch.Tensor, k: int) -> torch.Tensor:
    """``J[b, o, α, ν, β, p]``: output ``(o, μ, p)`` of sample ``b`` per unit of core ``k``'s
    entry ``(α, μ, ν, β)`` (the same for every μ)."""
    cores = list(layer.cores)
    fin, fout = layer.in_factors, layer.out_factors
    n_lt, n_gt = math.prod(fin[:k]), math.prod(fin[k + 1:])
    one = a.new_ones(1, 1, 1, 1)
    left = merge_cores(cores[:k])[0] if k else one[0]                 # (M_<, N_<, r_{k-1})
    right = merge_cores(cores[k + 1:])[..., 0] if k + 1 < len(cores) else one[..., 0]
    x = a.reshape(a.shape[0], n_lt, fin[k], n_gt)
    t = torch.einsum("bivj,cpj->bivcp", x, right)                     # (B, N_<, n_k, r_k, M_>)
    return torch.einsum("oia,bivcp->boavcp", left, t)


@torch.no_grad()
def layerwise_losses(objective: Objective, params, points) -> tuple[float, list[float]] | None:
    """``(L(θ), [L(θ + δ e_j) for (i, j, δ) in points])`` by the layer linearity of the module
    docstring, or None when the objective's model is not a supported layered network (or a
    trainable tensor is not one of its layers' parameters). ``params`` are the tensors the
    points' first entries index; ``j`` is a flat offset into ``params[i]``."""
    layers = _layers(objective.model)
    if layers is None:
        return None
    located = _locate(layers, params)
    if located is None:
        return None
    x, y, loss_fn = objective.inputs, objective.targets, objective.loss_fn
    acts, outs = [], []
    h = x
    for m in layers:
        acts.append(h)
        h = m(h)           # a masked layer's pre-hook rebuilds its dense weight here
        outs.append(h)
    base = float(loss_fn(h, y).mean())
    losses = [float("nan")] * len(points)
    by_tensor: dict[int, list[int]] = {}
    for n, (i, _, _) in enumerate(points):
        by_tensor.setdefault(i, []).append(n)
    B = x.shape[0]
    for i, members in by_tensor.items():
        li, kind, extra = located[i]
        layer, a, z = layers[li], acts[li], outs[li]
        M = z.shape[-1]
        flat = torch.tensor([points[n][1] for n in members], dtype=torch.long, device=z.device)
        if extra is not None and kind != "core":
            flat = extra[flat]             # kept values -> positions in the dense tensor
        deltas = torch.tensor([points[n][2] for n in members], dtype=z.dtype, device=z.device)
        if kind == "core":
            k = extra
            jac = _core_columns(layer, a, k)
            idx = _unravel(flat, layer.cores[k].shape)
            split = (math.prod(layer.out_factors[:k]), layer.out_factors[k], -1)
        tail = _tail(layers, li)
        chunk = max(1, _CHUNK_ELEMS // (B * M))
        for start in range(0, len(members), chunk):
            sel = slice(start, start + chunk)
            j, d = flat[sel], deltas[sel]
            C = j.numel()
            if tail is not None:
                acts_after, last = tail
                if kind == "core":
                    alpha, mu, nu, beta = (t[sel] for t in idx)
                    cols = jac[:, :, alpha, nu, beta, :].permute(2, 0, 1, 3)  # (C, B, M_<, M_>)
                    zs = z.view(B, *split).permute(2, 0, 1, 3)[mu]           # (C, B, M_<, M_>)
                    ws = last.view(last.shape[0], *split).permute(2, 0, 1, 3)[mu]  # (C, M', M_<, M_>)
                    zs_new = zs + d[:, None, None, None] * cols
                    change = "cbij,coij->cbo"
                else:
                    i_out = j if kind == "bias" else j // a.shape[-1]
                    zs = z[:, i_out].T                                       # (C, B)
                    ws = last[:, i_out].T                                    # (C, M')
                    zs_new = zs + (d[:, None] if kind == "bias"
                                   else d[:, None] * a[:, j % a.shape[-1]].T)
                    change = "cb,co->cbo"
                for m in acts_after:
                    zs_new, zs = m(zs_new), m(zs)
                h = (outs[-1] + torch.einsum(change, zs_new - zs, ws)).reshape(C * B, -1)
                per = loss_fn(h, y.repeat(C)).reshape(C, B).mean(1).tolist()
                for n, value in zip(members[sel], per):
                    losses[n] = value
                continue
            rows = torch.arange(C, device=z.device)
            zc = z.unsqueeze(0).repeat(C, 1, 1)
            if kind == "bias":
                zc[rows, :, j] += d[:, None]
            elif kind == "dense":
                n_in = a.shape[-1]
                zc[rows, :, j // n_in] += d[:, None] * a[:, j % n_in].T
            else:
                alpha, mu, nu, beta = (t[sel] for t in idx)
                cols = jac[:, :, alpha, nu, beta, :].permute(2, 0, 1, 3)  # (C, B, M_<, M_>)
                zc.view(C, B, *split)[rows, :, :, mu, :] += d[:, None, None, None] * cols
            h = zc.reshape(C * B, M)
            for m in layers[li + 1:]:
                h = m(h)
            per = loss_fn(h, y.repeat(C)).reshape(C, B).mean(1).tolist()
            for n, value in zip(members[sel], per):
                losses[n] = value
    return base, losses


def _tail(layers, li):
    """``(activations, dense W')`` when the layers after ``li`` are element-wise activations
    and one last (TT-)linear layer (the module docstring's shortcut), else None. Read after
    the base forward, so a masked layer's dense weight is the current one."""
    rest = layers[li + 1:]
    if not rest or not isinstance(rest[-1], (nn.Linear, TTLinear)) \
            or not all(isinstance(m, ELEMENTWISE) for m in rest[:-1]):
        return None
    last = rest[-1]
    w = last.dense_weight() if isinstance(last, TTLinear) else last.weight
    return rest[:-1], w.detach()


def _unravel(flat: torch.Tensor, shape) -> tuple[torch.Tensor, ...]:
    """Row-major multi-indices of flat offsets (``torch.unravel_index`` for a tensor)."""
    out = []
    for size in reversed(tuple(shape)):
        out.append(flat % size)
        flat = flat // size
    return tuple(reversed(out))
