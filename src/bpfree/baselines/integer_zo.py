"""Zeroth-order baselines on a real-quantized int8 model: MeZO and DeepZero's CGE.

PMT (Zhao et al. 2025, §4.2.2, Tables 5–6) compares against both on the same int8 model, in
integer units (``mu = 1``, saturating perturbations) and with the same integer update
(:func:`~bpfree.updates.integer_layer.apply_update`, Eq. 8):

* :class:`MeZO` — MeZO [58] (Malladi et al. 2023) as PMT's Table 5 applies it: model-wise
  weight perturbation of *all* trainable weights at once, two-point randomized gradient estimate
  ``(l(W + xi) - l(W - xi)) / 2 * xi`` with Rademacher ``xi`` shared across the batch. No GNS
  and no QAS by default ("lack of proper learning-rate scaling"); both can be switched on (the
  paper remarks MeZO still fails with its scaling).
* :class:`DeepZeroCGE` — DeepZero [11] (Chen et al. 2024): coordinate-wise estimate
  ``g_j = l(W + e_j) - l(W)`` on a random subset of coordinates per step (PMT used *random*
  gradient sparsity instead of DeepZero's pruning-based sparsity pattern, §4.2.2), QAS on.

Both implement the :class:`~bpfree.harness.Method` protocol — a ``forwards`` counter of
per-sample forward passes (Table 5's unit: a forward of N samples counts N) and
``step(x, y, lr) -> dict`` whose ``"loss"`` is the mean clean loss of the batch *before* the
update — so :func:`bpfree.harness.fit` runs them on the same batches and schedule as
:class:`~bpfree.pmt.PMTTrainer`. The float versions of these estimators are
:func:`bpfree.estimators.rge` / :func:`~bpfree.estimators.cge`; here the perturbation, the
loss and the update are integer. There is no momentum and no weight decay (§4.1).
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from ..harness import check_batch, check_learning_rate
from ..perturb import derive_seed, rademacher_xorshift
from ..quant.graph import StagedModel, TrainableLayer, find_layers, per_sample_loss, select_layers
from ..updates.integer_layer import LayerEstimate, apply_update
from .bp import model_device

__all__ = ["DeepZeroCGE", "MeZO"]


def _check_positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    return int(seed)


def _finite_loss(loss: torch.Tensor) -> torch.Tensor:
    if not bool(torch.isfinite(loss).all()):
        raise FloatingPointError("non-finite loss in the clean forward; model unchanged")
    return loss


class _IntegerZO:
    """Common state of the ZO baselines: staged int8 model, layers, counters."""

    def __init__(self, qmodel: nn.Module, example: torch.Tensor, trainable, seed) -> None:
        self.model = qmodel
        self.seed = _check_seed(seed)
        self.staged = StagedModel(qmodel)
        self.layers = find_layers(qmodel, example)
        self.trainable: list[TrainableLayer] = select_layers(self.layers, trainable)
        if not self.trainable:
            raise ValueError("no trainable layers selected; choose among "
                             f"{[layer.name for layer in self.layers]}")
        self.index = {layer.name: i for i, layer in enumerate(self.layers)}
        self.start = min(layer.stage for layer in self.trainable)
        self.steps = 0
        self.forwards = 0

    def _prepare(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        check_batch(x, y)
        device = model_device(self.model)
        return self.staged.quantize(x.to(device)), y.to(device)

    def _loss(self, logits_q: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return per_sample_loss(logits_q, y, self.model.output_quant)


class MeZO(_IntegerZO):
    """MeZO [58] on the real-quantized model, as PMT's Table 5 / 6 baseline.

    Per query ``q`` one Rademacher ±1 direction ``xi_q`` over *all* trainable int8 weights (one
    XORShift32 stream per layer, seed ``derive_seed(seed, step, layer index, q)``), shared
    across the mini-batch; two forwards at ``clip(W ± xi_q, -128, 127)`` (a saturating add,
    ``mu = 1``) and the two-point estimate

    ``g = 1/Q sum_q mean_n[(l(W + xi_q; x_n) - l(W - xi_q; x_n)) / 2] xi_q``

    (MeZO's SPSA form, §2 of [58]). Biases are not perturbed (weight perturbation, as PMT's WP).
    The update is :func:`~bpfree.updates.integer_layer.apply_update` per layer with a
    :class:`LayerEstimate` of ``Q`` directions in the *total* perturbed dimension (model-wise:
    the variance grows with the total ``d``, PMT Table 2), so ``gns=True`` scales by
    ``Q / (Q + d_total - 1)``. Both ``gns`` and ``qas`` are off by default: MeZO has no
    learning-rate scaling (§4.2.2); a weight then moves only where ``|lr * g| >= 0.5`` LSB.

    Forward passes: ``2 * N`` per query per step (Table 5: "iter. forwards 2" with Q = 1).
    The clean forward that reports ``"loss"`` is a monitoring pass and is *not* counted (MeZO
    itself needs no clean loss); with ``monitor=False`` it is skipped and ``"loss"`` is the
    mean of ``(l(W + xi) + l(W - xi)) / 2`` over the queries, an O(mu^2)-biased proxy.

    Args:
        qmodel: real-quantized model (``body`` of int8 stages, ``input_quant``, ``output_quant``).
        example: one input batch (float or int8), to read layer shapes.
        queries: Q >= 1. seed: base seed (int >= 0). gns, qas: Eq. 8's scalings.
        trainable: names of the integer layers to train (default: all), as
            :class:`~bpfree.pmt.PMTTrainer` (Table 6 applies PMT's selection to MeZO).
        monitor: run the uncounted clean forward for ``"loss"``.
    """

    def __init__(self, qmodel: nn.Module, example: torch.Tensor, *, queries: int = 1,
                 seed: int = 0, gns: bool = False, qas: bool = False, trainable=None,
                 monitor: bool = True) -> None:
        self.queries = _check_positive_int(queries, "queries")
        super().__init__(qmodel, example, trainable, seed)
        self.gns, self.qas, self.monitor = bool(gns), bool(qas), bool(monitor)
        self.dimension = sum(layer.d_w for layer in self.trainable)

    @torch.no_grad()
    def estimate(self, x: torch.Tensor, y: torch.Tensor) -> tuple[dict[str, LayerEstimate],
                                                                  torch.Tensor]:
        """The step's estimate (name -> :class:`LayerEstimate`) and per-sample loss (clean with
        ``monitor``, else the two-point average). Counts ``2 * N * Q`` forwards."""
        xq, y = self._prepare(x, y)
        n, start = xq.shape[0], self.start
        h = xq
        for stage in self.staged.stages[:start]:  # shared unperturbed prefix
            h = stage(h)
        clean = self._loss(self.staged.from_stage(start, h), y) if self.monitor else None
        modules = [layer.module for layer in self.trainable]
        originals = [m.weight.clone() for m in modules]
        acc = [torch.zeros(w.shape, dtype=torch.float64, device=w.device) for w in originals]
        average = torch.zeros(n, dtype=torch.float64, device=xq.device)
        try:
            for q in range(self.queries):
                xis = [rademacher_xorshift(derive_seed(self.seed, self.steps,
                                                       self.index[layer.name], q),
                                           layer.module.weight.shape, device=w.device)
                       for layer, w in zip(self.trainable, originals)]
                losses = []
                for sign in (1, -1):
                    for m, w, xi in zip(modules, originals, xis):
                        m.weight.copy_(w.to(torch.int16).add_(xi, alpha=sign).clamp_(-128, 127))
                    losses.append(self._loss(self.staged.from_stage(start, h), y))
                diff = float((losses[0] - losses[1]).mean()) / 2
                average.add_((losses[0] + losses[1]) / 2)
                for a, xi in zip(acc, xis):
                    a.add_(xi.to(torch.float64), alpha=diff)
        finally:
            for m, w in zip(modules, originals):
                m.weight.copy_(w)
        self.forwards += 2 * n * self.queries
        est = {layer.name: LayerEstimate(a.div_(self.queries), None, directions=self.queries,
                                         dimension=self.dimension)
               for layer, a in zip(self.trainable, acc)}
        loss = clean if clean is not None else average.div_(self.queries)
        return est, loss

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        lr = check_learning_rate(lr)
        start_forwards = self.forwards
        est, loss = self.estimate(x, y)
        _finite_loss(loss)
        stats = {layer.name: apply_update(layer.module, est[layer.name], lr, gns=self.gns,
                                          qas=self.qas) for layer in self.trainable}
        self.steps += 1
        changed = [s["changed"] for s in stats.values()]
        return {"loss": float(loss.mean()), "forwards": self.forwards - start_forwards,
                "changed": sum(changed) / len(changed)}


class DeepZeroCGE(_IntegerZO):
    """DeepZero's coordinate-wise gradient estimate (CGE) [11] with random gradient sparsity.

    Each step draws ``coordinates`` distinct weight coordinates uniformly from the concatenated
    trainable int8 weights (``torch.randperm`` seeded by ``derive_seed(seed, step)``; PMT
    §4.2.2 replaced DeepZero's pruning-based sparsity pattern by a random one, which needs no
    extra model copies), perturbs each alone by ``+1`` (forward difference, ``mu = 1``; a weight
    at 127 saturates, so its estimate is 0) and estimates

    ``g_j = mean_n[l(W + e_j; x_n) - l(W; x_n)]``, ``g_k = 0`` for unselected ``k``.

    The update is :func:`~bpfree.updates.integer_layer.apply_update` with QAS (default) and without GNS
    (each coordinate's estimate is deterministic, there is no direction averaging), so only the
    selected coordinates can change. Biases are not trained (weight coordinates only).

    Forward passes: ``N * (coordinates + 1)`` per step (Table 5/6: DeepZero-0 is dense,
    ``coordinates = d``; DeepZero-0.9 keeps 10 %). A coordinate's forward starts at its layer's
    stage from the cached clean activation; the perturbed stage runs once per coordinate, and
    the stages after it run on a batch of many coordinates' outputs at once (exact: the integer
    engine is batch-size independent).

    Args:
        qmodel, example, seed, trainable: as :class:`MeZO`.
        coordinates: coordinates per step (None: all, dense CGE). sparsity: alternatively the
            gradient sparsity in [0, 1) (``coordinates = ceil((1 - sparsity) * d)``).
        qas: quantization-aware scaling of the update.
        chunk_elements: bound on the stacked stage outputs batched after the perturbed stage.
    """

    def __init__(self, qmodel: nn.Module, example: torch.Tensor, *, coordinates: int | None = None,
                 sparsity: float | None = None, seed: int = 0, qas: bool = True, trainable=None,
                 chunk_elements: int = 2**24) -> None:
        if coordinates is not None and sparsity is not None:
            raise ValueError("give coordinates or sparsity, not both")
        if coordinates is not None:
            coordinates = _check_positive_int(coordinates, "coordinates")
        if sparsity is not None and (isinstance(sparsity, bool)
                                     or not isinstance(sparsity, numbers.Real)
                                     or not 0 <= sparsity < 1):
            raise ValueError(f"sparsity must be a float in [0, 1), got {sparsity!r}")
        self.chunk_elements = _check_positive_int(chunk_elements, "chunk_elements")
        super().__init__(qmodel, example, trainable, seed)
        self.qas = bool(qas)
        self.sizes = [layer.d_w for layer in self.trainable]
        self.dimension = sum(self.sizes)
        if sparsity is not None:
            coordinates = max(1, math.ceil((1 - float(sparsity)) * self.dimension))
        if coordinates is None:
            coordinates = self.dimension
        if coordinates > self.dimension:
            raise ValueError(f"coordinates must be <= the {self.dimension} trainable weights, "
                             f"got {coordinates}")
        self.coordinates = coordinates
        self.last_coordinates: dict[str, torch.Tensor] = {}

    def draw(self) -> dict[str, torch.Tensor]:
        """This step's coordinates: layer name -> sorted flat indices into its weight."""
        g = torch.Generator().manual_seed(derive_seed(self.seed, self.steps))
        chosen = torch.randperm(self.dimension, generator=g)[:self.coordinates].sort().values
        out, lo = {}, 0
        for layer, size in zip(self.trainable, self.sizes):
            sel = chosen[(chosen >= lo) & (chosen < lo + size)] - lo
            if sel.numel():
                out[layer.name] = sel
            lo += size
        return out

    @torch.no_grad()
    def estimate(self, x: torch.Tensor, y: torch.Tensor) -> tuple[dict[str, LayerEstimate],
                                                                  torch.Tensor]:
        """Coordinate estimates (dense tensors, zero off the drawn coordinates) and the clean
        per-sample loss. Counts ``N * (coordinates + 1)`` forwards."""
        xq, y = self._prepare(x, y)
        n = xq.shape[0]
        staged = self.staged
        clean = _finite_loss(self._loss(staged.clean(xq), y))
        self.forwards += n
        coords = self.draw()
        est = {}
        for layer in self.trainable:
            g = torch.zeros(layer.module.weight.shape, dtype=torch.float64,
                            device=layer.module.weight.device)
            if layer.name in coords:
                flat = g.view(-1)
                idx = coords[layer.name]
                flat[idx.to(g.device)] = self._coordinate_losses(layer, idx, y, clean)
            est[layer.name] = LayerEstimate(g, None, directions=1, dimension=1)
        self.forwards += n * self.coordinates
        self.last_coordinates = coords
        return est, clean

    def _coordinate_losses(self, layer: TrainableLayer, idx: torch.Tensor, y: torch.Tensor,
                           clean: torch.Tensor) -> torch.Tensor:
        """mean_n[l(W + e_j) - l(W)] for each flat index ``j`` of ``idx`` in ``layer``."""
        staged, k = self.staged, layer.stage
        h0 = staged.inputs[k]
        n = h0.shape[0]
        w = layer.module.weight
        flat = w.view(-1)
        out = torch.zeros(idx.numel(), dtype=torch.float64, device=clean.device)
        per_coord = max(1, n * staged.inputs[k + 1][0].numel())
        chunk = max(1, self.chunk_elements // per_coord)
        for lo in range(0, idx.numel(), chunk):
            part = idx[lo:lo + chunk].tolist()
            live, outs = [], []
            for pos, j in enumerate(part):
                old = int(flat[j])
                if old == 127:  # saturating +1 leaves W unchanged: l(W + e_j) = l(W)
                    continue
                flat[j] = old + 1
                try:
                    outs.append(staged.stages[k](h0))
                finally:
                    flat[j] = old
                live.append(lo + pos)
            if not live:
                continue
            logits = staged.from_stage(k + 1, torch.cat(outs))
            loss = self._loss(logits, y.repeat(len(live))).view(len(live), n)
            out[torch.tensor(live, device=out.device)] = (loss - clean.view(1, n)).mean(1)
        return out

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        lr = check_learning_rate(lr)
        start_forwards = self.forwards
        est, loss = self.estimate(x, y)
        stats = {layer.name: apply_update(layer.module, est[layer.name], lr, gns=False,
                                          qas=self.qas)
                 for layer in self.trainable if layer.name in self.last_coordinates}
        self.steps += 1
        changed = [s["changed"] for s in stats.values()]
        return {"loss": float(loss.mean()), "forwards": self.forwards - start_forwards,
                "changed": sum(changed) / max(len(changed), 1)}
