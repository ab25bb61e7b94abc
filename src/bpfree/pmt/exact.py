"""Device-exact PMT arithmetic: the loss and the update a C program reproduces bit for bit.

The float64 path (:func:`~bpfree.quant.graph.per_sample_loss`, :mod:`.estimate`, :mod:`bpfree.updates.integer_layer`)
uses torch's ``exp`` / ``log`` and reductions whose summation order is torch's; libm cannot match
those to the last ulp, and one ulp can flip a rounding of Eq. 11. ``PMTConfig(device_exact=True)``
switches :class:`~bpfree.pmt.PMTTrainer` to this module, whose arithmetic has one meaning on any
machine:

* **loss** (§3.1, cross-entropy of the int8 logits) in fixed point with :data:`LOSS_BITS`
  fractional bits. With ``s`` the logits' scale, ``m`` the largest logit and ``y`` the label,
  ``CE = s (m - q_y) + ln sum_j exp(-s (m - q_j))``. Both terms come from 256-entry tables built
  once from ``s`` (:class:`LossTables`, exported to C as integer constants), and the logarithm
  of the integer sum is computed by the bit-by-bit squaring algorithm (:func:`log2_fixed`),
  integer only.
* **estimates** (Eq. 6 for WP, Eq. 9-10 for NP) are integer sums of ``(l_q - l) * xi`` (and of
  ``g_z (x - z_x)`` through the layer's integer graph); wrap-around int64 on both sides.
* **update** (Eq. 8 and 11) in float64 with only correctly rounded IEEE operations (``*``,
  ``/``, ``-``) in one fixed order, then round half to even and clip:
  ``W <- clip(rint(W - G * c))`` with ``c = lr * GNS * QAS[ch] (* M[ch] for NP) / (N Q) * 2**-F``.

Supported: layer-wise estimation with the synchronized update (Algorithm 1 as written), the
adaptive / WP / NP modes, GNS and QAS on or off, micro-batch accumulation and any trainable
subset (sparse training). The mean over the mini-batch and over micro-batches is taken once,
on the integer sums, so accumulation is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..perturb import derive_seed, rademacher_xorshift
from ..quant.layers import QConv2d
from ..transforms.scaling import gradient_norm_factor
from ..updates import round_and_clip_
from .estimate import requant_scale
from ..quant.graph import StagedModel, TrainableLayer
from ..updates.integer_layer import INT32_MAX, INT32_MIN, quantization_aware_scales

#: Fractional bits of the fixed-point loss (2**-24 nats resolves a one-LSB perturbation).
LOSS_BITS = 24
#: Fractional bits of the exp table and of the mantissa in :func:`log2_fixed`.
EXP_BITS = 30
#: ln 2 with EXP_BITS fractional bits.
LN2_Q = round(math.log(2.0) * 2**EXP_BITS)


@dataclass(frozen=True)
class LossTables:
    """``exp_table[k] = round(2**30 exp(-s k))`` and ``logit_table[k] = round(2**24 s k)``,
    k = 0..255: the only numbers derived from the float scale ``s``; C gets them as integers."""

    exp_table: np.ndarray
    logit_table: np.ndarray

    @classmethod
    def for_scale(cls, scale: float) -> LossTables:
        k = np.arange(256, dtype=np.float64)
        exp_table = np.array([round(math.exp(-scale * i) * 2**EXP_BITS) for i in k],
                             dtype=np.int64)
        logit_table = np.array([round(scale * i * 2**LOSS_BITS) for i in k], dtype=np.int64)
        return cls(exp_table, logit_table)


def log2_fixed(s: np.ndarray) -> np.ndarray:
    """``floor``-style ``log2(s)`` of positive int64 ``s`` with LOSS_BITS fractional bits.

    The integer part is the bit length; the mantissa (Q30 in [1, 2)) is squared LOSS_BITS times,
    each overflow past 2 giving the next fractional bit (truncating shifts, as the C does).
    """
    s = np.asarray(s, dtype=np.int64)
    e = np.floor(np.log2(s.astype(np.float64))).astype(np.int64)
    # log2 in float may be off by one near powers of two; fix it exactly.
    e = np.where((np.int64(1) << e) > s, e - 1, e)
    e = np.where((np.int64(1) << (e + 1)) <= s, e + 1, e)
    x = np.where(e <= EXP_BITS, s << np.maximum(EXP_BITS - e, 0), s >> np.maximum(e - EXP_BITS, 0))
    r = e << LOSS_BITS
    top = np.int64(1) << (EXP_BITS + 1)
    for i in range(LOSS_BITS):
        x = (x * x) >> EXP_BITS
        over = x >= top
        x = np.where(over, x >> 1, x)
        r = r + np.where(over, np.int64(1) << (LOSS_BITS - 1 - i), 0)
    return r


def fixed_loss(logits_q: torch.Tensor, target: torch.Tensor, tables: LossTables) -> np.ndarray:
    """Per-sample cross-entropy of int8 logits (N, C) in units of 2**-LOSS_BITS nats (int64)."""
    q = logits_q.to(torch.int64).numpy()
    y = target.to(torch.int64).numpy()
    m = q.max(axis=1)
    total = tables.exp_table[m[:, None] - q].sum(axis=1)
    log2 = log2_fixed(total) - (np.int64(EXP_BITS) << LOSS_BITS)
    lse = (log2 * np.int64(LN2_Q)) >> EXP_BITS
    return tables.logit_table[m - q[np.arange(len(y)), y]] + lse


@dataclass
class ExactEstimate:
    """Integer sums of one layer over a step: ``weight`` (int64, weight shape) and ``bias``
    (int64 per channel, NP only), ``directions`` / ``dimension`` for GNS (Eq. 8)."""

    weight: np.ndarray
    bias: np.ndarray | None
    directions: int
    dimension: int
    mode: str


def _layer_input(staged: StagedModel, layer: TrainableLayer) -> torch.Tensor:
    captured = {}
    handle = layer.module.register_forward_pre_hook(
        lambda mod, args: captured.setdefault("x", args[0]))
    try:
        h = staged.inputs[layer.stage]
        staged.stages[layer.stage](h)
    finally:
        handle.remove()
    return captured["x"]


def _node_to_parameter_sums(module, x: torch.Tensor, z: np.ndarray) -> tuple[np.ndarray,
                                                                            np.ndarray]:
    """Eq. 10 on integer sums: ``sum_n g_z (x - z_x)`` per weight and ``sum g_z`` per channel."""
    xs = x.to(torch.int64) - module.input_quant.zero_point
    zt = torch.from_numpy(z)
    if isinstance(module, QConv2d):
        # conv2d_weight in int64 is not available; unfold gives the same exact integer sums.
        n, cin = xs.shape[:2]
        kh, kw = module.kernel_size
        cols = torch.nn.functional.unfold(xs.to(torch.float64), (kh, kw), module.dilation,
                                          module.padding, module.stride)
        cols = cols.round().to(torch.int64)  # exact: int8-range values
        g, cout = module.groups, module.out_channels
        cols = cols.view(n, g, cin // g * kh * kw, -1)
        zg = zt.reshape(n, g, cout // g, -1)
        w = torch.einsum("ngkl,ngol->gok", cols, zg).reshape(module.weight.shape)
        b = zt.sum(dim=(0, 2, 3))
    else:
        x2, z2 = xs.reshape(-1, xs.shape[-1]), zt.reshape(-1, zt.shape[-1])
        w = z2.T @ x2
        b = z2.sum(0)
    return w.numpy(), b.numpy()


@torch.no_grad()
def estimate_layer(staged: StagedModel, layer: TrainableLayer, mode: str, index: int,
                   target: torch.Tensor, clean: np.ndarray, queries: int, seed: int,
                   tables: LossTables) -> ExactEstimate:
    """Q perturbed partial forwards from ``layer``'s stage; integer sums of Eq. 6 / 9 / 10."""
    module, n = layer.module, target.shape[0]
    x0 = staged.inputs[layer.stage]
    if mode == "wp":
        original = module.weight.clone()
        acc = np.zeros(tuple(module.weight.shape), dtype=np.int64)
        try:
            for q in range(queries):
                xi = rademacher_xorshift(derive_seed(seed, index, q), module.weight.shape)
                module.weight.copy_((original.to(torch.int16) + xi).clamp_(-128, 127))
                diff = fixed_loss(staged.from_stage(layer.stage, x0), target, tables) - clean
                acc += np.int64(diff.sum()) * xi.numpy().astype(np.int64)
        finally:
            module.weight.copy_(original)
        return ExactEstimate(acc, None, queries, layer.d_w, "wp")
    layer_in = _layer_input(staged, layer)
    z = np.zeros((n, *layer.output_shape), dtype=np.int64)
    try:
        for q in range(queries):
            xi = rademacher_xorshift(derive_seed(seed, index, q), (n, *layer.output_shape))
            module.node_offset = xi
            diff = fixed_loss(staged.from_stage(layer.stage, x0), target, tables) - clean
            z += diff.reshape(n, *[1] * len(layer.output_shape)) * xi.numpy().astype(np.int64)
    finally:
        module.node_offset = None
    w, b = _node_to_parameter_sums(module, layer_in, z)
    return ExactEstimate(w, b, n * queries, layer.d_a, "np")


def update_coefficients(module, est: ExactEstimate, lr: float, samples: int, queries: int, *,
                        gns: bool, qas: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel float64 multipliers (weights, bias) of the integer sums, in the C's order."""
    step = lr * (gradient_norm_factor(est.directions, est.dimension) if gns else 1.0)
    channels = module.weight.shape[0]
    if qas:
        qw, qb = (t.numpy() for t in quantization_aware_scales(module))
    else:
        qw = qb = np.ones(channels)
    cw = step * qw
    cb = step * qb
    if est.mode == "np":
        m = requant_scale(module).numpy()
        cw = cw * m
        cb = cb * m
    denom = float(samples * queries)
    scale = 2.0 ** -LOSS_BITS
    return cw / denom * scale, cb / denom * scale


def apply_exact_update(module, est: ExactEstimate, lr: float, samples: int, queries: int, *,
                       gns: bool, qas: bool) -> dict:
    """Eq. 8 / 11 on the integer sums: ``clip(rint(W - G c))`` per output channel."""
    cw, cb = update_coefficients(module, est, lr, samples, queries, gns=gns, qas=qas)
    shape = (-1, *[1] * (est.weight.ndim - 1))
    # W + (-(G c)) is W - G c to the bit (negation is exact), so the shared rule rounds the
    # same double the C computes.
    step = torch.from_numpy(-(est.weight.astype(np.float64) * cw.reshape(shape)))
    w_new = round_and_clip_(step, module.weight, -128, 127)
    changed = float((w_new != module.weight).to(torch.float64).mean())
    module.weight.copy_(w_new.to(torch.int8))
    if est.bias is not None:
        step = torch.from_numpy(-(est.bias.astype(np.float64) * cb))
        module.bias.copy_(round_and_clip_(step, module.bias, INT32_MIN, INT32_MAX)
                          .to(torch.int32))
    return {"gns": gradient_norm_factor(est.directions, est.dimension) if gns else 1.0,
            "changed": changed}


def _accumulate(sums: dict[str, ExactEstimate], name: str, est: ExactEstimate) -> None:
    if name not in sums:
        sums[name] = est
        return
    acc = sums[name]
    acc.weight += est.weight
    if acc.bias is not None:
        acc.bias += est.bias
    acc.directions += est.directions


def exact_step(trainer, xq: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
    """One device-exact iteration of Algorithm 1 (layer-wise, synchronized) on int8 ``xq``.

    The stages are visited as the generated C visits them (:meth:`StagedModel.by_stage`, the
    schedule of :mod:`bpfree.device.plan`): each stage's layers are estimated from the held
    stage input, the stage output is recomputed with the step-t weights, then the stage's
    layers are updated (without micro-batches) or their integer sums accumulated (with them;
    the update follows the last micro-batch).
    """
    cfg, staged = trainer.config, trainer.staged
    tables = trainer.loss_tables
    n = xq.shape[0]
    size = cfg.micro_batch or n
    first = trainer.trainable[0].stage
    sums: dict[str, ExactEstimate] = {}
    stats: dict[str, dict] = {}
    total_loss = 0
    for j, lo in enumerate(range(0, n, size)):
        xb, yb = xq[lo:lo + size], y[lo:lo + size]
        clean = fixed_loss(staged.clean(xb, cache=False, keep=first), yb, tables)
        trainer.forwards += xb.shape[0]
        total_loss += int(clean.sum())
        seed = derive_seed(cfg.seed, trainer.steps, j)

        def estimate(layer: TrainableLayer, yb=yb, clean=clean, seed=seed) -> ExactEstimate:
            trainer.forwards += cfg.queries * yb.shape[0]
            return estimate_layer(staged, layer, trainer.modes[layer.name],
                                  trainer.index[layer.name], yb, clean, cfg.queries, seed,
                                  tables)

        def finish(layer: TrainableLayer, est: ExactEstimate) -> None:
            if cfg.micro_batch is None:
                stats[layer.name] = apply_exact_update(layer.module, est,
                                                       trainer._rate(layer, lr), n,
                                                       cfg.queries, gns=cfg.gns, qas=cfg.qas)
            else:
                _accumulate(sums, layer.name, est)

        staged.by_stage(trainer.trainable, estimate, finish, start=first)
    for layer in trainer.trainable:
        if layer.name in sums:
            stats[layer.name] = apply_exact_update(layer.module, sums[layer.name],
                                                   trainer._rate(layer, lr), n, cfg.queries,
                                                   gns=cfg.gns, qas=cfg.qas)
    trainer.steps += 1
    changed = [s["changed"] for s in stats.values()]
    return {"loss": total_loss / n / 2**LOSS_BITS, "loss_fixed": total_loss,
            "changed": sum(changed) / max(len(changed), 1)}
