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

Per core, the entries are not taken one chunk at a time (issue 32): the columns of all its
entries form one tensor ``J[b, e, o, p]`` (``e = (ν, β, α)``, the same for every ``μ``), and
:func:`layerwise_losses` evaluates them digit by digit in batched products. When the
activations before the last layer are ReLU (or none), ``σ(z + δJ) − σ(z) = 1[z > 0]·δJ``
except on the few outputs that ``δJ`` moves across the kink, so the change of the network
output is one product ``J @ (1[z > 0]·W')`` for every entry and digit of the core, plus an
exact correction on those outputs (:func:`_piecewise_core_losses`); the perturbed hidden
outputs are never formed. ``layerwise_losses(..., reference=True)`` is the chunked path of
before, kept as the reference the fast one is tested and timed against (`bench
tt-zo-cost`).

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
from ..estimators.coordinate import Points
from ..objective import Objective
from ..tt import TTLinear
from ..tt.decompose import merge_cores

__all__ = ["LayerwiseCGE", "layerwise_losses"]

#: Activations applied element-wise (the only non-affine layers allowed between layers).
ELEMENTWISE = (nn.ReLU, nn.Tanh, nn.GELU, nn.Sigmoid, nn.Identity)
#: The element-wise activations that are linear on each side of zero.
PIECEWISE_LINEAR = (nn.ReLU, nn.Identity)
#: Elements of the largest perturbed chunk ``(C, B, M)`` (keeps one chunk in cache).
_CHUNK_ELEMS = 1 << 21
#: Elements of one digit's perturbed outputs ``(B, c, M_<, M_>)`` (larger chunks measured faster).
_SLICE_ELEMS = 1 << 20
#: Output digits after a core (``M_>``) from which :func:`_core_jacobian` forms ``J`` by one
#: broadcast product instead of the einsum (measured on the §5.1 TT-MLP's cores).
_WIDE_RIGHT = 16


@dataclass(frozen=True)
class _Members:
    """The points of one tensor on the fast path: their positions in ``points``, flat
    offsets into the tensor and steps δ (in the layer's dtype)."""

    index: torch.Tensor
    flat: torch.Tensor
    deltas: torch.Tensor


@dataclass(frozen=True)
class LayerwiseCGE(CoordinateWise):
    """:class:`~bpfree.estimators.CoordinateWise` whose batched mode uses :func:`layerwise_losses`.

    Same coordinates, same estimate and the same ``d + 1`` (``2d`` central) evaluation count
    as the parent; only how the perturbed losses are computed differs (see the module
    docstring). ``mode="lean"`` and unsupported models use the parent's evaluation.
    ``reference=True`` evaluates by the chunked path of before issue 32 (for timing it).
    """

    reference: bool = False

    def evaluate(self, ctx: QueryContext, points) -> tuple[float, list[float]]:
        if ctx.mode == "batched" and isinstance(ctx.closure, Objective):
            out = layerwise_losses(ctx.closure, ctx.params, points, reference=self.reference)
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


def _prepare(objective: Objective, params, points):
    """The unperturbed forward of a supported model: ``(layers, located, acts, outs, base
    loss, points grouped by tensor)``, or None (see :func:`layerwise_losses`)."""
    layers = _layers(objective.model)
    if layers is None:
        return None
    located = _locate(layers, params)
    if located is None:
        return None
    acts, outs = [], []
    h = objective.inputs
    for m in layers:
        acts.append(h)
        h = m(h)           # a masked layer's pre-hook rebuilds its dense weight here
        outs.append(h)
    base = float(objective.loss_fn(h, objective.targets).mean())
    return layers, located, acts, outs, base, _by_tensor(points)


def _by_tensor(points) -> dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Tensor index -> ``(positions in points, flat offsets, steps δ in float64)`` of its
    points, tensors in order of first occurrence and points in their order.

    Unzipped once and grouped by tensor comparisons: the per-point Python loops and lists
    this replaces cost ~5 ms of every CGE step over the 8,314 coordinates of the §5.1
    TT-MLP at r = 10 (issue 32)."""
    if not points:
        return {}
    if isinstance(points, Points):   # the columns CoordinateWise built: no unzip (issue 32)
        which, flat, step = points.tensor, points.offset, points.step
    else:
        tensor, flat, step = zip(*points)
        which = torch.tensor(tensor, dtype=torch.long)
        flat = torch.tensor(flat, dtype=torch.long)
        step = torch.tensor(step, dtype=torch.float64)
    groups = {}
    for i in dict.fromkeys(which.tolist()):
        index = (which == i).nonzero().squeeze(1)
        groups[i] = (index, flat[index], step[index])
    return groups


@torch.no_grad()
def layerwise_losses(objective: Objective, params, points, *,
                     reference: bool = False) -> tuple[float, list[float]] | None:
    """``(L(θ), [L(θ + δ e_j) for (i, j, δ) in points])`` by the layer linearity of the module
    docstring, or None when the objective's model is not a supported layered network (or a
    trainable tensor is not one of its layers' parameters). ``params`` are the tensors the
    points' first entries index; ``j`` is a flat offset into ``params[i]``.

    TT-core coordinates whose layer is the last or is followed by the shortcut's tail take
    :func:`_core_slice_losses` (batched products per core), and so do the biases before a
    ReLU tail; every other coordinate the chunked path (:func:`_chunked_losses`).
    ``reference=True`` takes the chunked path for every coordinate: the path before issue
    32, kept as the reference the fast one is tested and timed against. Both give the
    losses of the perturbed forwards up to float rounding."""
    prepared = _prepare(objective, params, points)
    if prepared is None:
        return None
    layers, located, acts, outs, base, by_tensor = prepared
    losses = [float("nan")] * len(points)
    # per step, not per tensor: a (TT-)last layer's dense W' is formed once (issue 32)
    tails = {li: None if li == len(layers) - 1 else _tail(layers, li)
             for li in {located[i][0] for i in by_tensor}}
    for i, (sel, offsets, steps) in by_tensor.items():
        li, kind, extra = located[i]
        last = li == len(layers) - 1
        tail = tails[li]
        mine = _Members(sel, offsets, steps.to(outs[li].dtype))
        if reference:
            _chunked_losses(objective, layers, located[i], acts, outs, mine, losses)
            continue
        if kind == "core" and (tail is not None or last):
            _core_slice_losses(objective, layers, li, extra, acts, outs, tail, mine, losses)
        elif kind == "bias" and extra is None and _piecewise(tail):
            # a bias entry is a one-entry "core" whose column is 1 on its own output
            z = outs[li]
            ones = z.new_ones(z.shape[0], 1, 1, 1)
            _piecewise_core_losses(objective, ones, z, outs[-1], (1, z.shape[-1], 1, 1), (1, 1),
                                   tail, mine, losses)
        elif tail is not None and kind != "core":
            # the shortcut's per-coordinate tensors are (C, B) and (C, B, M'), not the
            # reference's (C, B, M): chunks that large run the same arithmetic in far fewer
            # passes (each coordinate's loss is computed alone, so its value is unchanged)
            chunk = max(1, _CHUNK_ELEMS // (objective.inputs.shape[0] * (tail[1].shape[0] + 4)))
            _chunked_losses(objective, layers, located[i], acts, outs, mine, losses, chunk=chunk)
        else:
            _chunked_losses(objective, layers, located[i], acts, outs, mine, losses)
    return base, losses


def _core_jacobian(layer: TTLinear, a: torch.Tensor, k: int) -> torch.Tensor:
    """``J[b, e, o, p]``, e = ``(ν, β, α)`` flattened: :func:`_core_columns` laid out so that
    one output digit's columns of every entry are one ``(B·E, M_<·M_>)`` matrix.

    Built as two products in this layout (the contraction of ``a`` with the cores after
    ``k``, then with those before it), not as
    :func:`_core_columns`' einsum and a permuted copy: the first core's ``J`` is then the
    first product itself, and no core copies its ``(B, E, M_<, M_>)`` columns."""
    cores = list(layer.cores)
    fin, fout = layer.in_factors, layer.out_factors
    r0, _, n, r1 = cores[k].shape
    B = a.shape[0]
    n_lt, n_gt = math.prod(fin[:k]), math.prod(fin[k + 1:])
    m_lt, m_gt = math.prod(fout[:k]), math.prod(fout[k + 1:])
    x = a.reshape(B, n_lt, n, n_gt)
    if k + 1 < len(cores):
        right = merge_cores(cores[k + 1:])[..., 0]                        # (r_k, M_>, N_>)
        t = torch.matmul(x, right.reshape(r1 * m_gt, n_gt).T)            # (B, N_<, n_k, r_k·M_>)
    else:
        t = x
    if k == 0:                          # N_< = M_< = r_{k-1} = 1: already (b, (ν, β), o, p)
        return t.reshape(B, n * r1, 1, m_gt)
    t = t.view(B, n_lt, n * r1, m_gt)                                     # (B, N_<, (ν, β), M_>)
    left = merge_cores(cores[:k])[0]                                      # (M_<, N_<, r_{k-1})
    if m_gt == 1 or m_gt >= _WIDE_RIGHT:
        # J[b, v, (α, o), p] = Σ_i left[o, i, α]·t[b, i, v, p] written straight into its
        # layout: one (B·v·p, i) @ (i, (α, o)) when p has one value, else one product per
        # (b, v) with (α, o) rows (2.5x faster than the einsum's permuted copy at p = 32;
        # slower for a narrow p, which keeps the einsum; torch 2.13, CPU)
        lt = left.permute(2, 0, 1).reshape(r0 * m_lt, n_lt)              # ((α, o), i)
        t = t.transpose(1, 2).contiguous()                                # (B, v, i, p)
        out = torch.mm(t.view(-1, n_lt), lt.T) if m_gt == 1 else torch.matmul(lt, t)
        return out.view(B, n * r1 * r0, m_lt, m_gt)
    # einsum, not matmul: torch.matmul broadcasting a plain 2-D left operand over this
    # strided batch took 30x longer on the last core (torch 2.13, CPU)
    return torch.einsum("oia,bivp->bvaop", left, t).reshape(B, n * r1 * r0, m_lt, m_gt)


def _entry(cols: torch.Tensor, shape) -> tuple[torch.Tensor, torch.Tensor]:
    """``(μ, e)`` of flat core offsets ``cols``: the output digit and the index of ``(ν, β, α)``
    in :func:`_core_jacobian`'s layout."""
    alpha, mu, nu, beta = _unravel(cols, shape)
    return mu, (nu * shape[3] + beta) * shape[0] + alpha


def _core_slice_losses(objective, layers, li, k, acts, outs, tail, members: _Members,
                       losses) -> None:
    """Fill ``losses[n]`` for the ``members`` of core ``k`` of layer ``li`` (the last layer, or
    one followed by ``tail``: element-wise activations and one last layer, see :func:`_tail`).

    Entry ``(α, μ, ν, β)`` changes only the outputs ``(o, μ, p)``, by ``δ·J[b, e, o, p]``. For
    one digit ``μ`` the perturbed outputs of every selected entry are one broadcast
    ``z_μ + δ·J`` (no per-coordinate gather); after the activation, the change of the
    network output is one matrix product with the last layer's ``W'[:, (o, μ, p)]``. A ReLU /
    identity tail takes :func:`_piecewise_core_losses`, the last layer
    :func:`_last_core_losses`."""
    x, y, loss_fn = objective.inputs, objective.targets, objective.loss_fn
    layer, a, z = layers[li], acts[li], outs[li]
    B, logits = x.shape[0], outs[-1]
    r0, m, n, r1 = layer.cores[k].shape
    O, P = math.prod(layer.out_factors[:k]), math.prod(layer.out_factors[k + 1:])
    jac = _core_jacobian(layer, a, k)                                  # (B, E, O, P)
    if _piecewise(tail):
        _piecewise_core_losses(objective, jac, z, logits, (r0, m, n, r1), (O, P), tail,
                               members, losses)
        return
    deltas, members_t = members.deltas.to(z.device), members.index
    mu, entry = _entry(members.flat, (r0, m, n, r1))
    zv = z.view(B, O, m, P)
    if tail is None:
        _last_core_losses(objective, jac, logits, (O, m, P), mu, entry, deltas, members_t,
                          losses)
        return
    acts_after, w = tail
    wv = w.view(w.shape[0], O, m, P)
    chunk = max(1, _SLICE_ELEMS // (B * O * P))
    buf = z.new_empty(B * min(chunk, members_t.numel()) * O * P)
    for digit in range(m):
        on = (mu == digit).nonzero().flatten()
        if not on.numel():
            continue
        z_mu = zv[:, :, digit, :].unsqueeze(1)                        # (B, 1, O, P)
        s_mu = _activate(acts_after, z_mu)
        w_mu = wv[:, :, digit, :].reshape(w.shape[0], O * P)          # (C', O·P), contiguous
        for start in range(0, on.numel(), chunk):
            sel = on[start:start + chunk]
            e, d = entry[sel], deltas[sel]
            c = e.numel()
            first = int(e[0])
            if torch.equal(e, torch.arange(first, first + c)):
                cols = jac[:, first:first + c]                         # a view: no gather
            else:
                cols = jac.index_select(1, e.to(jac.device))
            z_new = buf[:B * c * O * P].view(B, c, O, P)
            torch.mul(cols, d.view(1, c, 1, 1), out=z_new).add_(z_mu)  # z_μ + δ·J
            change = _activate(acts_after, z_new, inplace=True).sub_(s_mu)
            # W' as the transposed view of a contiguous (C', O·P): MKL's fast layout
            h = torch.matmul(change.view(B, c, O * P), w_mu.T).add_(logits.unsqueeze(1))
            per = loss_fn(h.reshape(B * c, -1), y.repeat_interleave(c)).view(B, c).mean(0)
            for j, value in zip(members_t[sel].tolist(), per.tolist()):
                losses[j] = value


def _last_core_losses(objective, jac, logits, split, mu, entry, deltas, members,
                      losses) -> None:
    """:func:`_core_slice_losses` for a core of the last layer: every digit at once.

    Entry ``(α, μ, ν, β)`` moves the logits ``(o, μ, p)`` by ``δ·J[b, e, o, p]`` and leaves
    the others; for a chunk of entries the perturbed logits are the cached ones with ``δ·J``
    added at each entry's digit (:func:`_moved_logits`), all digits at once instead of a pass
    per digit."""
    y, loss_fn = objective.targets, objective.loss_fn
    m = split[1]
    B, C = logits.shape
    chunk = max(1, _SLICE_ELEMS // (B * C))
    for start in range(0, members.numel(), chunk):
        sel = slice(start, start + chunk)
        e, d = entry[sel], deltas[sel]
        c = e.numel()
        moved = jac.index_select(1, e.to(jac.device)).mul_(d.view(1, c, 1, 1))  # (B, c, O, P)
        h = _moved_logits(logits, moved, mu[sel], m)
        per = loss_fn(h.view(B * c, C), y.repeat_interleave(c)).view(B, c).mean(0)
        for j, value in zip(members[sel].tolist(), per.tolist()):
            losses[j] = value


def _moved_logits(logits: torch.Tensor, moved: torch.Tensor, mu: torch.Tensor,
                  m: int) -> torch.Tensor:
    """``(B, c, C)``: the logits ``(B, C)``, folded as ``(o, μ, p)``, with ``moved[:, s]``
    (``(B, c, O, P)``) added at column ``s``'s digit ``mu[s]`` of ``m``.

    One addition per moved logit, written by ``scatter_add_`` into a copy of the logits: the
    same bits as adding the logits to ``moved`` spread over the digits by a one-hot (``x·1 =
    x``; ``x·0 + l = l``), which the path of before formed as a ``(B, c, O, m, P)`` broadcast
    product 3-6x slower (its inner dimension is ``P`` ≤ 2 here; torch 2.13, CPU)."""
    B, c, O, P = moved.shape
    if m == 1:
        return moved.view(B, c, O * P).add_(logits.unsqueeze(1))
    h = logits.unsqueeze(1).expand(B, c, O * m * P).contiguous()
    index = mu.to(moved.device).view(1, c, 1, 1, 1).expand(B, c, O, 1, P)
    h.view(B, c, O, m, P).scatter_add_(3, index, moved.unsqueeze(3))
    return h


def _piecewise_core_losses(objective, jac, z, logits, shape, split, tail, members: _Members,
                           losses) -> None:
    """:func:`_core_slice_losses` when the activations after the layer are ReLU / identity:
    every digit's change of the network output in one batched product, without forming the
    perturbed outputs.

    With ``σ`` = ReLU, ``σ(z + δJ) − σ(z) = 1[z > 0]·δJ + κ``, where ``κ`` is non-zero only
    where ``z + δJ`` and ``z`` lie on different sides of the kink, which needs
    ``|z| ≤ |δ|·max_e |J|``. So the output change of entry ``(α, μ, ν, β)`` is
    ``δ·Σ_{o,p} J[b, e, o, p]·1[z > 0]·W'[:, (o, μ, p)]`` -- one ``(B, E, M_<·M_>) @
    (B, M_<·M_>, m·C')`` product for all entries and digits of the core, laid out in the
    core's own (flat) entry order so that a full CGE step reads it without a gather -- plus
    ``κ·W'`` on the few ``(b, o, μ, p, e)`` that cross the kink, computed exactly
    (:func:`_add_kinks`). Equal to ``W'(σ(z + δJ) − σ(z))`` in exact arithmetic; in floats it
    skips the cancellation of ``σ(z + δJ) − σ(z)``, so it differs from the reference by less
    than that rounding (≤ ulp(z) per output)."""
    x, y, loss_fn = objective.inputs, objective.targets, objective.loss_fn
    acts_after, w = tail
    r0, m, n, r1 = shape
    O, P = split
    B, E, C = x.shape[0], r0 * n * r1, w.shape[0]
    kinked = any(isinstance(act, nn.ReLU) for act in acts_after)
    zv = z.view(B, O, m, P)
    wv = w.view(C, O, m, P)
    if E == O * P == 1:
        # one entry and one output per digit (a bias): the product is J·1[z > 0]·W', (B, M, C)
        scale = ((z > 0).to(z.dtype) if kinked else torch.ones_like(z)) * jac.view(B, 1)
        unit = scale.unsqueeze(2) * w.T.contiguous().unsqueeze(0)
    else:
        active = (zv > 0).to(z.dtype) if kinked else torch.ones_like(zv)
        # g[b, (μ, c), (o, p)] = 1[z_(o, μ, p) > 0]·W'[c, (o, μ, p)]; passed to bmm
        # transposed, MKL's fast layout for a narrow right operand. Both factors made
        # contiguous in (μ, o, p) order first and the product written into its own buffer:
        # a broadcast of the strided views ran 3x slower at M_> = 1 (torch 2.13, CPU)
        g = torch.mul(active.permute(0, 2, 1, 3).contiguous().unsqueeze(2),
                      wv.permute(2, 0, 1, 3).contiguous().unsqueeze(0),
                      out=z.new_empty(B, m, C, O, P)).view(B, m * C, O * P)
        unit = torch.bmm(jac.view(B, E, O * P), g.transpose(1, 2))    # (B, (ν, β, α), (μ, c))
        # -> (B, (α, μ, ν, β), C): the core's flat order, as a permuted view; a step over
        # the whole core reads it in the product with δ below, copied only otherwise (the
        # copy was ~10 % of a tt6 CGE step, issue 32)
        unit = unit.view(B, n * r1, r0, m, C).permute(0, 2, 3, 1, 4)
    whole = (r0, m, n * r1)
    flat, deltas, members_t = members.flat, members.deltas.to(z.device), members.index
    for sel in _rounds(flat):
        c = sel.numel()
        cols, d = flat[sel], deltas[sel]
        first = int(cols[0])
        if unit.dim() == 5 and c == math.prod(whole) and torch.equal(cols, torch.arange(c)):
            # every entry in flat order: δ·unit written straight in (B, c, C) order
            h = torch.mul(unit, d.view(1, *whole, 1),
                          out=unit.new_empty(B, *whole, C)).view(B, c, C)
        else:
            if unit.dim() == 5:
                unit = unit.reshape(B, -1, C)
            if torch.equal(cols, torch.arange(first, first + c)):
                h = torch.mul(unit[:, first:first + c], d.view(1, c, 1),  # a view: no gather
                              out=unit.new_empty(B, c, C))
            else:
                h = unit.index_select(1, cols.to(unit.device)).mul_(d.view(1, c, 1))
        if kinked:
            _add_kinks(h, jac, zv, wv, shape, cols, d)
        h.add_(logits.unsqueeze(1))                                   # (B, c, C)
        per = loss_fn(h.view(B * c, C), y.repeat_interleave(c)).view(B, c).mean(0)
        for j, value in zip(members_t[sel].tolist(), per.tolist()):
            losses[j] = value


def _add_kinks(h, jac, zv, wv, shape, cols, deltas) -> None:
    """Add ``κ·W'`` (see :func:`_piecewise_core_losses`) in place to ``h`` ``(B, c, C)``,
    whose column ``s`` is the output change of the core entry at flat offset ``cols[s]``
    moved by ``deltas[s]`` (no offset twice), for the ``(b, o, μ, p, e)`` whose ``δ·J``
    moves the output across ReLU's kink."""
    B, O, m, P = zv.shape
    E, C, c = jac.shape[1], wv.shape[0], cols.numel()
    r0, _, n, r1 = shape
    device = zv.device                          # the tables index the model's tensors there
    if c == m * E and torch.equal(cols, torch.arange(c)):
        # every entry in flat order (a full CGE step): the tables are permuted views
        def by_digit(t):
            return t.view(r0, m, n * r1).permute(1, 2, 0).reshape(m, E)
        table, column = by_digit(deltas), by_digit(torch.arange(c, device=device))
    else:
        mu, entry = (t.to(device) for t in _entry(cols, shape))
        table = zv.new_zeros(m, E)              # δ of each (digit, entry), 0 if not asked
        table[mu, entry] = deltas
        column = torch.full((m, E), -1, dtype=torch.long, device=device)  # its column in h
        column[mu, entry] = torch.arange(c, device=device)
    # amax and amin apart: torch.aminmax over a middle dim is ~5x slower (torch 2.13, CPU)
    reach = torch.maximum(jac.amax(1), jac.amin(1).neg_()).unsqueeze(2)        # (B, O, 1, P)
    reach = reach * table.abs().amax(1).view(1, 1, m, 1)
    b, o, u, p = (zv.abs() <= reach).nonzero(as_tuple=True)
    flat_h = h.view(-1)
    # (M, C): W' row of each output (o, μ, p), contiguous: index_select on the transposed
    # view was 4x slower (torch 2.13, CPU)
    w_rows = wv.reshape(C, -1).T.contiguous()
    jac_rows = jac.permute(0, 2, 3, 1)          # (B, O, P, E): one gather per candidate
    step = max(1, _CHUNK_ELEMS // E)
    for start in range(0, b.numel(), step):
        bs, os_, us, ps = (t[start:start + step] for t in (b, o, u, p))
        moved = table[us] * jac_rows[bs, os_, ps]                       # (k, E): δ·J
        zc = zv[bs, os_, us, ps].unsqueeze(1)
        after = zc + moved
        # only a crossing changes σ's slope; elsewhere κ is 0 exactly. Flat positions and
        # 1-D gathers: the 2-D advanced indexing of (k, e) pairs cost 3x more
        crossed = ((after > 0) != (zc > 0)).view(-1).nonzero().squeeze(1)
        if not crossed.numel():
            continue
        k, e = crossed // E, crossed % E
        us_k = us.index_select(0, k)
        col = column.view(-1).index_select(0, us_k * E + e)
        if bool((col < 0).any()):
            # an entry not asked for (δ = 0) "crosses" only where J is not finite (0·inf is
            # NaN): a diverged model. Its loss is not wanted, and its column is -1.
            keep = (col >= 0).nonzero().squeeze(1)
            crossed, k, e, us_k, col = (t.index_select(0, keep)
                                        for t in (crossed, k, e, us_k, col))
            if not crossed.numel():
                continue
        zk = zc.view(-1).index_select(0, k)
        ak, mk = after.view(-1).index_select(0, crossed), moved.view(-1).index_select(0, crossed)
        kink = ak.relu() - zk.relu() - mk * (zk > 0)
        rows = bs.index_select(0, k) * c + col
        outputs = (os_.index_select(0, k) * m + us_k) * P + ps.index_select(0, k)
        # on the flat view: one scalar add per element in the same order as a row-wise
        # index_add_, which adds (C,) rows one by one (2.5x slower, torch 2.13 CPU)
        flat_h.index_add_(0, (rows.unsqueeze(1) * C + torch.arange(C, device=device)).view(-1),
                          (kink.unsqueeze(1) * w_rows.index_select(0, outputs)).view(-1))


def _rounds(flat: torch.Tensor) -> list[torch.Tensor]:
    """Positions of ``flat`` split so that no offset repeats within one group (central CGE
    evaluates each coordinate at ``+δ`` and ``−δ``), in order of first occurrence."""
    if torch.unique(flat).numel() == flat.numel():
        return [torch.arange(flat.numel())]     # no repeats (forward CGE): one group
    seen: dict[int, int] = {}
    groups: list[list[int]] = []
    for pos, j in enumerate(flat.tolist()):
        r = seen.get(j, 0)
        seen[j] = r + 1
        if r == len(groups):
            groups.append([])
        groups[r].append(pos)
    return [torch.tensor(g, dtype=torch.long) for g in groups]


def _piecewise(tail) -> bool:
    """Whether ``tail`` (from :func:`_tail`) exists and its activations are ReLU / identity."""
    return tail is not None and all(isinstance(act, PIECEWISE_LINEAR) for act in tail[0])


def _activate(acts, t: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """The element-wise activations ``acts`` applied to ``t`` (ReLU in place when allowed:
    ``t`` is then a fresh buffer of the caller's)."""
    for act in acts:
        if inplace and isinstance(act, nn.ReLU):
            t = t.relu_()
        else:
            t = act(t)
    return t


def _chunked_losses(objective, layers, where, acts, outs, mine: _Members, losses, *,
                    chunk: int | None = None) -> None:
    """Fill ``losses[n]`` for the points ``mine`` of one tensor located at ``where``,
    ``chunk`` coordinates at a time (default: the reference path's, sized for the whole
    layer output ``(C, B, M)``)."""
    x, y, loss_fn = objective.inputs, objective.targets, objective.loss_fn
    B = x.shape[0]
    li, kind, extra = where
    layer, a, z = layers[li], acts[li], outs[li]
    M = z.shape[-1]
    members = mine.index.tolist()
    flat = mine.flat.to(z.device)
    if extra is not None and kind != "core":
        flat = extra.to(flat.device)[flat]  # kept values -> positions in the dense tensor
    deltas = mine.deltas.to(z.device)
    if kind == "core":
        k = extra
        jac = _core_columns(layer, a, k)
        idx = _unravel(flat, layer.cores[k].shape)
        split = (math.prod(layer.out_factors[:k]), layer.out_factors[k], -1)
    tail = _tail(layers, li)
    if chunk is None:
        chunk = max(1, _CHUNK_ELEMS // (B * M))
    for start in range(0, len(members), chunk):
        sel = slice(start, start + chunk)
        j, d = flat[sel], deltas[sel]
        C = j.numel()
        if tail is not None and kind != "core" and _piecewise(tail):
            h = _dense_tail_outputs(kind, j, d, a, z, tail, outs[-1])           # (C, B, M')
            per = loss_fn(h.view(C * B, -1), y.repeat(C)).view(C, B).mean(1).tolist()
            for n, value in zip(members[sel], per):
                losses[n] = value
            continue
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


def _dense_tail_outputs(kind, j, d, a, z, tail, logits) -> torch.Tensor:
    """The network outputs ``(C, B, M')`` when the dense weight (``kind="dense"``) or bias
    entries at flat offsets ``j`` move by ``d``, for a layer followed by ``tail``: the
    module docstring's shortcut ``y + W'[:, S]·(σ(z_S + δ·col) − σ(z_S))``.

    For a ReLU / identity ``σ`` (:func:`_piecewise`) only: each value is then the same IEEE
    operation on the same operands as in :func:`_chunked_losses`' einsum form (``z + δ·a``,
    σ, the difference, one product per ``(c, b, o)`` and the sum with ``y``, with commuted
    operands), so the bits are equal. The operands are gathered into contiguous ``(C, ·)``
    rows and the products written in ``(C, B, M')`` order, where the einsum's strided result
    cost a copy of the whole ``(C, B, M')`` (~35 % of the dense MLPs' CGE step, torch 2.13,
    CPU; issue 32). Not for tanh or GELU: ATen evaluates those by a vector kernel and the
    last elements of a buffer by a scalar one whose bits differ, so another memory order
    would change some bits."""
    acts_after, last = tail
    i_out = j if kind == "bias" else j // a.shape[-1]
    zs = z.T.index_select(0, i_out)                                      # (C, B)
    ws = last.T.index_select(0, i_out)                                   # (C, M')
    if kind == "bias":
        zs_new = zs + d[:, None]
    else:
        zs_new = a.T.index_select(0, j % a.shape[-1]).mul_(d[:, None]).add_(zs)
    for m in acts_after:
        zs_new, zs = _activate([m], zs_new, inplace=True), m(zs)
    change = zs_new.sub_(zs)
    return torch.mul(change.unsqueeze(2), ws.unsqueeze(1)).add_(logits)


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
