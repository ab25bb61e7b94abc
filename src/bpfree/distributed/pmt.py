"""Data-parallel PMT: W workers, shards of one mini-batch, one ``all_reduce`` of L·Q scalars.

One step of :class:`DataParallelPMT` is one synchronized, layer-wise step of PMT Algorithm 1
(:class:`bpfree.pmt.PMTTrainer`) split in three phases:

1. **scalars**: every worker runs the clean pass on its shard and, for each weight-perturbed
   (WP) layer and query, the perturbed partial pass, and keeps the shard's *sum* of per-sample
   loss differences ``sum_n [l(W + xi_q; x_n) - l(W; x_n)]`` (Eq. 6). With the synchronized
   update every layer's estimate uses the step-t weights, so all L·Q scalars exist before any
   update (Algorithm 1, line 34).
2. **one all_reduce** of the L·Q sums plus the shard's sample count, in int64 fixed point
   (:mod:`.exact`): the sum is exact in any order, so the mean over the batch is weighted by
   shard size and identical on every worker and in one process over the whole batch.
3. **update**: every worker regenerates the directions from the step seed
   ``derive_seed(seed, step, 0)`` (nothing is broadcast) and applies Eq. 8 (GNS, QAS, round,
   clip) with :func:`bpfree.pmt.apply_update`.

Node perturbation (NP, Eq. 9-10) needs per-sample perturbations of the layer's outputs, so
its estimate is not a function of Q scalars: each worker turns its shard's node gradients
into the layer's ``d_w + d_out`` weight and bias gradient sums (Eq. 10) and those are
all-reduced in float64 (a second collective, present only when a layer uses NP). The
per-sample directions are slices of the whole batch's stream, as in one process. The float
sums make NP layers agree bit for bit across workers (every rank receives the same reduced
bytes) but only to float rounding with one process.
"""

from __future__ import annotations

import math

import torch

from ..perturb import derive_seed, rademacher_xorshift
from ..pmt.estimate import (capture_inputs, node_to_parameter_gradients,
                            perturb_weight_, wp_direction, wp_estimate_from_scalars)
from ..quant.graph import TrainableLayer, per_sample_loss
from ..pmt.trainer import PMTConfig, PMTTrainer
from ..updates.integer_layer import LayerEstimate, apply_update
from .comm import SingleProcess
from .exact import fixed_sum, from_fixed


def check_config(config: PMTConfig) -> None:
    """Data-parallel PMT is the paper's default schedule: layer-wise, synchronized, no
    micro-batches (each worker's shard is its micro-batch)."""
    if not (config.layerwise and config.synchronized and config.micro_batch is None):
        raise ValueError("data-parallel PMT needs layerwise=True, synchronized=True and "
                         "micro_batch=None (the shards are the micro-batches); got "
                         f"layerwise={config.layerwise}, synchronized={config.synchronized}, "
                         f"micro_batch={config.micro_batch}")


@torch.no_grad()
def wp_loss_differences(trainer: PMTTrainer, layer: TrainableLayer, seed: int, y: torch.Tensor,
                        clean: torch.Tensor) -> torch.Tensor:
    """(Q, n) per-sample loss differences of Eq. 6 for ``layer`` on the cached clean pass."""
    staged, index = trainer.staged, trainer.index[layer.name]
    original = layer.module.weight.clone()
    rows = []
    try:
        for q in range(trainer.config.queries):
            perturb_weight_(layer.module, original, wp_direction(layer, index, seed, q))
            logits = staged.from_stage(layer.stage)
            rows.append(per_sample_loss(logits, y, staged.model.output_quant) - clean)
    finally:
        layer.module.weight.copy_(original)
    return torch.stack(rows)


@torch.no_grad()
def np_gradient_sums(trainer: PMTTrainer, layer: TrainableLayer, seed: int, y: torch.Tensor,
                     clean: torch.Tensor, offset: int, total: int) -> torch.Tensor:
    """The shard's sums of Eq. 10's weight and bias gradients, flattened, float64.

    Rows ``offset:offset+n`` of the whole batch's per-sample directions are this shard's, so
    the directions are those one process over the ``total`` samples draws.
    """
    staged, index, queries = trainer.staged, trainer.index[layer.name], trainer.config.queries
    n = y.shape[0]
    inputs = capture_inputs(staged, [layer], layer.stage)[layer.name]
    acc = torch.zeros((n, *layer.output_shape), dtype=torch.float64)
    try:
        for q in range(queries):
            xi = rademacher_xorshift(derive_seed(seed, index, q),
                                     (total, *layer.output_shape))[offset:offset + n]
            layer.module.node_offset = xi
            loss = per_sample_loss(staged.from_stage(layer.stage), y, staged.model.output_quant)
            diff = (loss - clean).view(n, *[1] * len(layer.output_shape))
            acc.add_(diff * xi.to(torch.float64))
    finally:
        layer.module.node_offset = None
    gw, gb = node_to_parameter_gradients(layer.module, inputs, acc.div_(queries))
    return torch.cat([gw.flatten(), gb.flatten()]).mul_(n)


class DataParallelPMT:
    """PMT on W workers that each hold the whole INT8 model and one shard of every batch.

    Args:
        model, config, example, trainable, lr_scale: as for :class:`bpfree.pmt.PMTTrainer`.
        comm: a :class:`~.comm.Communicator` (``torch.distributed``) or
            :class:`~.comm.SingleProcess` (default): the single-process reference.
    """

    def __init__(self, model, config: PMTConfig | None = None, *, example: torch.Tensor,
                 comm=None, trainable=None, lr_scale=None) -> None:
        self.trainer = PMTTrainer(model, config, example=example, trainable=trainable,
                                  lr_scale=lr_scale)
        check_config(self.trainer.config)
        self.comm = comm or SingleProcess()
        self.wp = [l for l in self.trainer.trainable if self.trainer.modes[l.name] == "wp"]
        self.np = [l for l in self.trainer.trainable if self.trainer.modes[l.name] == "np"]

    @property
    def steps(self) -> int:
        return self.trainer.steps

    @property
    def forwards(self) -> int:
        return self.trainer.forwards

    def bytes_per_step(self) -> dict[str, int]:
        """Payload each worker hands to the collectives per step, by kind."""
        q = self.trainer.config.queries
        wp = 8 * (len(self.wp) * q + 1)  # int64 sums and the sample count
        np_ = 8 * sum(l.d_w + l.module.bias.numel() for l in self.np)
        return {"wp": wp, "np": np_, "total": wp + np_}

    def shard_scalars(self, x: torch.Tensor, y: torch.Tensor, *, offset: int = 0,
                      total: int | None = None) -> tuple[torch.Tensor, list[torch.Tensor], float]:
        """Phase 1 on this worker's shard = rows ``offset:offset+n`` of a batch of ``total``.

        Returns ``(fixed, dense, loss_sum)``: the int64 fixed-point sums of the WP layers'
        per-sample loss differences (L·Q of them, layer-major) followed by the shard size;
        each NP layer's float64 gradient sums; the shard's summed clean loss. An empty shard
        contributes zeros. Weights are left as they were.
        """
        t, cfg = self.trainer, self.trainer.config
        n = int(x.shape[0])
        total = n if total is None else int(total)
        if y.shape[0] != n or not 0 <= offset <= total - n or total < 1:
            raise ValueError(f"the shard (n={n}, offset={offset}) must lie inside the batch of "
                             f"{total} samples, with as many labels as inputs ({y.shape[0]})")
        seed = derive_seed(cfg.seed, t.steps, 0)
        fixed = torch.zeros(len(self.wp) * cfg.queries + 1, dtype=torch.int64)
        dense = [torch.zeros(l.d_w + l.module.bias.numel(), dtype=torch.float64)
                 for l in self.np]
        if not n:
            return fixed, dense, 0.0
        xq = t.staged.quantize(x)
        clean = per_sample_loss(t.staged.clean(xq, cache=True), y, t.model.output_quant)
        if not bool(torch.isfinite(clean).all()):
            raise FloatingPointError("non-finite loss in the clean forward; model unchanged")
        for i, layer in enumerate(self.wp):
            diffs = wp_loss_differences(t, layer, seed, y, clean)
            fixed[i * cfg.queries:(i + 1) * cfg.queries] = fixed_sum(diffs, dim=1)
        dense = [np_gradient_sums(t, layer, seed, y, clean, offset, total) for layer in self.np]
        fixed[-1] = n
        t.forwards += n * (1 + cfg.queries * len(t.trainable))
        return fixed, dense, float(clean.sum())

    def apply_reduced(self, fixed: torch.Tensor, dense: list[torch.Tensor], lr: float) -> dict:
        """Phase 3: Eq. 8 on every layer from the batch's summed scalars (and NP sums);
        the directions regenerated from the step seed. Advances the step counter."""
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
            raise ValueError(f"learning rate must be a finite number >= 0, got {lr!r}")
        t, cfg = self.trainer, self.trainer.config
        count = int(fixed[-1])
        if count < 1 or fixed.numel() != len(self.wp) * cfg.queries + 1:
            raise ValueError(f"expected {len(self.wp) * cfg.queries} WP sums and a sample "
                             f"count >= 1, got {fixed.numel() - 1} sums and count {count}")
        seed = derive_seed(cfg.seed, t.steps, 0)
        stats = {}
        means = from_fixed(fixed[:-1], count).view(len(self.wp), cfg.queries)
        for layer, scalars in zip(self.wp, means):
            est = wp_estimate_from_scalars(layer, t.index[layer.name], seed, scalars.tolist())
            stats[layer.name] = apply_update(layer.module, est, t._rate(layer, lr),
                                             gns=cfg.gns, qas=cfg.qas)
        for layer, g in zip(self.np, dense):
            g = g.div(count)
            dw = layer.d_w
            est = LayerEstimate(g[:dw].view(layer.module.weight.shape), g[dw:],
                                directions=count * cfg.queries, dimension=layer.d_a)
            stats[layer.name] = apply_update(layer.module, est, t._rate(layer, lr),
                                             gns=cfg.gns, qas=cfg.qas)
        t.steps += 1
        return stats

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float, *, offset: int = 0,
             total: int | None = None) -> dict:
        """One step on this worker's shard ``(x, y)`` = rows ``offset:offset+n`` of a batch of
        ``total`` samples (default: the shard is the whole batch). Every worker must call it.

        Returns ``{"loss": the batch's mean clean loss, "forwards": this worker's passes,
        "changed": mean fraction of weights changed}``.
        """
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
            raise ValueError(f"learning rate must be a finite number >= 0, got {lr!r}")
        start = self.trainer.forwards
        fixed, dense, loss_sum = self.shard_scalars(x, y, offset=offset, total=total)
        self.comm.all_reduce(fixed, "WP loss-difference sums")
        expected = x.shape[0] if total is None else total
        if int(fixed[-1]) != expected:
            raise RuntimeError(f"the shards hold {int(fixed[-1])} samples, the batch "
                               f"{expected}: workers disagree on the batch")
        if self.np:
            flat = self.comm.all_reduce(torch.cat(dense), "NP gradient sums")
            dense = list(flat.split([d.numel() for d in dense]))
        stats = self.apply_reduced(fixed, dense, lr)
        changed = [s["changed"] for s in stats.values()]
        return {"loss": loss_sum / max(int(x.shape[0]), 1),
                "forwards": self.trainer.forwards - start,
                "changed": sum(changed) / max(len(changed), 1)}
