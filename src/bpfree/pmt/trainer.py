"""Poor Man's Training (PMT): BP-free training of a real-quantized model (§3, Algorithm 1).

One :meth:`PMTTrainer.step` is one iteration of Algorithm 1 on a mini-batch:

1. clean forward (line 4), caching every stage's input — the activation buffer;
2. for each trainable layer in forward order (layer-wise estimation, §3.2.2), Q perturbed
   partial forwards starting at that layer: weight perturbation when ``d_w < d_a``, else node
   perturbation (adaptive WP/NP), with Rademacher ±1 integer directions and ``mu = 1`` (Eq. 6, 9);
3. the integer update of Eq. 8 (GNS, QAS, round and clip). With ``synchronized=True`` every
   layer's estimate uses the step-t activations (line 34, the *global* update). Layer-wise
   without micro-batches, the stages are visited with one activation buffer: a stage's output
   is recomputed with the step-t weights before that stage's updates are applied
   (:meth:`PMTTrainer._estimate_and_update_by_stage`); with micro-batches or model-wise, the
   clean pass caches every stage input and the updates are applied after the last layer. Both
   are the same arithmetic as updating in place and recomputing ``a^(i+1)`` with the old
   weights. ``synchronized=False`` is the *local* (block-coordinate) variant: each layer is
   updated at once and later layers see it.

Every switch can be turned off for the ablations of Fig. 7: ``layerwise`` (False = model-wise,
all trainable layers perturbed together), ``perturbation`` ("adaptive", "wp", "np"), ``gns``,
``qas``, ``synchronized``. ``micro_batch`` accumulates estimates over micro-batches before one
update (gradient accumulation, §4.1). There is no momentum (§4.1: no optimizer state).

Forward passes are counted per sample, as in Table 5: a clean pass on N samples is N, each
layer's Q perturbed partial passes are Q*N.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

from ..perturb import derive_seed
from .estimate import estimate_group
from .exact import LossTables, exact_step
from ..quant.graph import StagedModel, TrainableLayer, find_layers, per_sample_loss, select_layers
from ..updates.integer_layer import LayerEstimate, apply_update

PERTURBATIONS = ("adaptive", "wp", "np")


@dataclass(frozen=True)
class PMTConfig:
    """Hyper-parameters of PMT (defaults: the paper's switches all on).

    Attributes:
        queries: Q, perturbed forward passes per layer per step (the paper uses 100).
        perturbation: "adaptive" (WP if d_w < d_a else NP, §3.2.2), "wp" or "np" everywhere.
        layerwise: estimate one layer at a time (True) or all trainable layers at once.
        gns: gradient-norm scaling NQ/(NQ+d-1) (Eq. 8). qas: quantization-aware 1/s^2 (App. B).
        synchronized: global update (Algorithm 1 line 34) instead of a local one.
        micro_batch: accumulate over micro-batches of this size (None: the whole batch).
        seed: base seed of every perturbation (steps and layers derive theirs from it).
        device_exact: use the integer loss and fixed-order float64 update of :mod:`.exact`,
            which the generated C of :mod:`bpfree.device` reproduces bit for bit (needs
            layer-wise estimation and the synchronized update).
    """

    queries: int = 10
    perturbation: str = "adaptive"
    layerwise: bool = True
    gns: bool = True
    qas: bool = True
    synchronized: bool = True
    micro_batch: int | None = None
    seed: int = 0
    device_exact: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.queries, bool) or not isinstance(self.queries, int) or self.queries < 1:
            raise ValueError(f"queries must be an int >= 1, got {self.queries!r}")
        if self.perturbation not in PERTURBATIONS:
            raise ValueError(f"perturbation must be one of {PERTURBATIONS}, "
                             f"got {self.perturbation!r}")
        if self.micro_batch is not None and (isinstance(self.micro_batch, bool) or not isinstance(
                self.micro_batch, int) or self.micro_batch < 1):
            raise ValueError(f"micro_batch must be None or an int >= 1, got {self.micro_batch!r}")
        if self.micro_batch is not None and not self.synchronized:
            raise ValueError("micro_batch (gradient accumulation) needs synchronized=True: a local "
                             "update changes the weights between micro-batches")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        if not isinstance(self.device_exact, bool):
            raise ValueError(f"device_exact must be a bool, got {self.device_exact!r}")
        if self.device_exact and not (self.layerwise and self.synchronized):
            raise ValueError("device_exact=True supports layer-wise estimation with the "
                             "synchronized update (Algorithm 1); got layerwise="
                             f"{self.layerwise}, synchronized={self.synchronized}")

    def as_dict(self) -> dict:
        return asdict(self)


def _check_lr_scale(lr_scale, trainable: list[TrainableLayer]) -> dict[str, float]:
    if lr_scale is None:
        return {}
    names = {layer.name for layer in trainable}
    unknown = sorted(set(lr_scale) - names)
    if unknown:
        raise ValueError(f"lr_scale names layer(s) {unknown} that are not trainable; trainable "
                         f"layers: {sorted(names)}")
    for name, factor in lr_scale.items():
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (
                math.isfinite(factor) and factor >= 0):
            raise ValueError(f"lr_scale[{name!r}] must be a finite number >= 0, got {factor!r}")
    return {name: float(factor) for name, factor in lr_scale.items()}


class PMTTrainer:
    """Trains the integer weights and biases of a real-quantized model with PMT.

    Args:
        model: a :class:`~bpfree.quant.ptq.QuantizedModel` (int8 ``body`` of stages).
        config: :class:`PMTConfig`.
        example: one input batch (float images or int8), used to read layer shapes.
        trainable: names of the integer layers to train (default: all), e.g. one block for
            sparse training (§3.3; see :mod:`bpfree.pmt.sparse`).
        lr_scale: optional ``{layer name: factor}``; that layer's step uses ``factor * lr``
            (the other layers ``lr``), as parameter groups do in ``torch.optim``. Useful when a
            freshly initialised head and pretrained backbone layers train together: with QAS
            the rate is in float units, but a new head tolerates far larger steps.
        engine: how the integer stages run (:class:`~bpfree.quant.graph.StagedModel`):
            "auto" (the fused channels-last kernels where available), "fast" or "reference"
            (the reference layers). Every engine gives the same bits.
    """

    def __init__(self, model: nn.Module, config: PMTConfig | None = None, *,
                 example: torch.Tensor, trainable=None,
                 lr_scale: dict[str, float] | None = None, engine: str = "auto") -> None:
        self.model = model
        self.config = config or PMTConfig()
        self.staged = StagedModel(model, engine=engine)
        self.layers = find_layers(model, example)
        self.sample_shape = tuple(example.shape[1:])
        self.trainable = select_layers(self.layers, trainable)
        if not self.trainable:
            raise ValueError("no trainable layers selected")
        self.lr_scale = _check_lr_scale(lr_scale, self.trainable)
        self.index = {layer.name: i for i, layer in enumerate(self.layers)}
        self.modes = {layer.name: (layer.preferred_mode if self.config.perturbation == "adaptive"
                                   else self.config.perturbation) for layer in self.trainable}
        self.steps = 0
        self.forwards = 0
        self.loss_tables = (LossTables.for_scale(model.output_quant.scale)
                            if self.config.device_exact else None)

    # -----------------------------------------------------------------------------------------
    def _clean(self, xq: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        # The stage-by-stage schedule keeps one stage input; the others cache them all.
        lean = cfg.layerwise and cfg.synchronized and cfg.micro_batch is None
        logits = self.staged.clean(xq, cache=not lean, keep=self.trainable[0].stage)
        self.forwards += xq.shape[0]
        loss = per_sample_loss(logits, y, self.model.output_quant)
        if not bool(torch.isfinite(loss).all()):
            raise FloatingPointError("non-finite loss in the clean forward; model unchanged")
        return loss

    def _rate(self, layer: TrainableLayer, lr: float) -> float:
        return lr * self.lr_scale.get(layer.name, 1.0)

    def _group(self, layers: list[TrainableLayer]):
        return [(layer, self.modes[layer.name]) for layer in layers]

    def _estimate(self, xq, y, loss, seed, lr) -> tuple[dict[str, LayerEstimate], dict]:
        cfg, n = self.config, xq.shape[0]
        stats: dict = {}
        if not cfg.layerwise:
            group = self._group(self.trainable)
            est = estimate_group(self.staged, group, [self.index[l.name] for l in self.trainable],
                                 y, loss, cfg.queries, seed)
            self.forwards += cfg.queries * n
            total = sum(e.dimension for e in est.values())
            for e in est.values():
                e.dimension = total  # Table 2: the model-wise variance grows with the total d
            return est, stats
        if cfg.synchronized and cfg.micro_batch is None:
            return {}, self._estimate_and_update_by_stage(y, loss, seed, lr)
        estimates = {}
        for layer in self.trainable:
            est = estimate_group(self.staged, self._group([layer]), [self.index[layer.name]], y,
                                 loss, cfg.queries, seed)
            self.forwards += cfg.queries * n
            if cfg.synchronized:
                estimates.update(est)  # gradient accumulation keeps every layer's buffer
            else:
                stats[layer.name] = apply_update(layer.module, est[layer.name],
                                                 self._rate(layer, lr),
                                                 gns=cfg.gns, qas=cfg.qas)
                self.staged.refresh_from(layer.stage)
                loss = per_sample_loss(self.staged.inputs[-1], y, self.model.output_quant)
                self.forwards += n
        return estimates, stats

    def _estimate_and_update_by_stage(self, y, loss, seed, lr) -> dict:
        """Algorithm 1's memory-efficient schedule for the synchronized update.

        Layers are visited in forward order with only the current stage's input held (the
        activation buffer). When a stage is done, its output is recomputed with the step-t
        weights (line 34) before that stage's updates are applied, so later layers still see
        step-t activations while at most one stage's gradient buffers are alive at a time.
        """
        cfg, n = self.config, y.shape[0]
        stats = {}

        def estimate(layer: TrainableLayer) -> LayerEstimate:
            est = estimate_group(self.staged, self._group([layer]), [self.index[layer.name]],
                                 y, loss, cfg.queries, seed)
            self.forwards += cfg.queries * n
            return est[layer.name]

        def finish(layer: TrainableLayer, est: LayerEstimate) -> None:
            stats[layer.name] = apply_update(layer.module, est, self._rate(layer, lr),
                                             gns=cfg.gns, qas=cfg.qas)

        self.staged.by_stage(self.trainable, estimate, finish, start=self.trainable[0].stage)
        return stats

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        """One iteration of Algorithm 1 on the mini-batch ``(x, y)`` with learning rate ``lr``.

        Returns ``{"loss": mean clean loss, "forwards": passes this step, "changed": ...}``.
        """
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
            raise ValueError(f"learning rate must be a finite number >= 0, got {lr!r}")
        if x.shape[0] != y.shape[0] or x.shape[0] == 0:
            raise ValueError(f"x and y must hold the same non-zero number of samples, got "
                             f"{x.shape[0]} and {y.shape[0]}")
        cfg = self.config
        start_forwards = self.forwards
        xq = self.staged.quantize(x)
        if cfg.device_exact:
            out = exact_step(self, xq, y, lr)
            out["forwards"] = self.forwards - start_forwards
            return out
        n = xq.shape[0]
        size = cfg.micro_batch or n
        total: dict[str, LayerEstimate] = {}
        losses = []
        stats: dict = {}
        for j, lo in enumerate(range(0, n, size)):
            xb, yb = xq[lo:lo + size], y[lo:lo + size]
            loss = self._clean(xb, yb)
            losses.append(loss)
            est, stats = self._estimate(xb, yb, loss, derive_seed(cfg.seed, self.steps, j), lr)
            share = xb.shape[0] / n
            for name, e in est.items():
                if name in total:
                    total[name].add_(e, share)
                else:
                    e.weight.mul_(share)
                    if e.bias is not None:
                        e.bias.mul_(share)
                    total[name] = e
        for layer in self.trainable:
            if layer.name in total:
                stats[layer.name] = apply_update(layer.module, total[layer.name],
                                                 self._rate(layer, lr),
                                                 gns=cfg.gns, qas=cfg.qas)
        self.steps += 1
        changed = [s["changed"] for s in stats.values()]
        return {"loss": float(torch.cat(losses).mean()), "forwards": self.forwards - start_forwards,
                "changed": sum(changed) / max(len(changed), 1)}
