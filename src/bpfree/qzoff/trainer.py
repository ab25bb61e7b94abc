"""QZO-FF trainer: quantized sign-m-SPSA forward-gradient learning (Feng et al. 2024).

One step (Algorithm 1, with the §3.4 enhancements as options)::

    [sharpness-aware]  u ~ N(0, I); s_a = sign(L(w + εu) − L(w − εu)); centre c = w + s_a·ρ·u
                       (quantized: c_q = w_q + ⌊s_a·ρ_q·u_q·Δz⌉, not Eq. 6 -- see _perturb)
    for i in 1..m:     z_i (plain seeded Gaussian, or momentum-guided), masked if sparse
                       s_i = sign(L(c + ε z_i) − L(c − ε z_i))          two forwards
                       g^a += s_i z_i                       (integer in quantized mode)
    ĝ = g^a / m        [kernel-wise normalization: ĝ^i ← ĝ^i/‖ĝ^i‖·‖w^i‖, Eq. 9]
    w ← w − update(ĝ)  (Eq. 8 integer update for SGD; float optimizer + re-quantization else)

Modes:

* ``"quantized"``: weights are ``b_w``-bit codes (:class:`~bpfree.qzoff.model.QuantizedParams`),
  directions ``b_z``-bit codes with static ``z_max``, ``w±`` from Eq. 6 through TFLite's
  multiply-and-shift in an int32 accumulator, ``g_q`` integer with scale ``Δz`` (Eq. 7), SGD is
  Eq. 8's integer update, activations fake-quantized to ``b_a`` bits. Momentum/AdamW
  dequantize the gradient (``Δz·g_q/m``), keep float optimizer state, and re-quantize the step
  to the weight scale with round-half-to-even (``w̄_q = ⌊Δ/Δw⌉``).
* ``"fp32"``: the same estimator in float32 (unquantized Gaussian directions, float weights).
* ``"fp16"``: emulated float16: weights, perturbed weights and every hooked activation are
  rounded to float16 while the arithmetic runs in float32 (CPU half matmuls are slow).

The float modes share this loop with the quantized one (rather than reusing
:func:`bpfree.estimators.sign_spsa` through ``ZOOptimizer``) so that a comparison between modes
differs only in arithmetic: same seeds, same directions, same enhancements.

Deviation from Algorithm 1: ``w_q±`` are computed from the stored ``w_q`` for each forward
instead of perturbing in place and resetting (lines 7, 8, 11), because ``Δz·1_q ≠ 1`` makes each
in-place re-quantization shrink the weights (by 0.8% for the defaults) and the chain does not
return to ``w_q``.

Seeds: direction ``i`` of tensor ``k`` at step ``t`` uses ``derive_seed(seed, t, i, k)`` and is
regenerated, never stored; the momentum noise uses ``derive_seed(seed, t, i, k, 1)`` and the
sharpness-aware direction ``derive_seed(seed, t, 2**32, k)``.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

from ..objective import cross_entropy_per_sample
from ..perturb import (
    derive_seed,
    gaussian,
    quantization_scale,
    quantized_gaussian_codes,
    quantized_one,
)
from ..transforms.shaping import KernelwiseNormalization
from ..updates import (fixed_point_update, quantize_multipliers, subtract_and_saturate,
                       update_multiplier)
from . import fixed_point as fxp
from .model import ActivationQuantizer, QuantizedParams, select_parameters
from .optim import OPTIMIZERS, FloatOptimizer
from .sampling import MomentumSampling, quantize_perturbation
from .sparsity import check_mask, make_mask

__all__ = ["QZOFF", "QZOFFConfig", "QZOFFEstimate"]

MODES = ("quantized", "fp32", "fp16")
ASCENT_INDEX = 2**32


def _finite(v, name, low=None, strict=False):
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    if low is not None and (v <= low if strict else v < low):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {low}, got {v!r}")
    return float(v)


@dataclass
class QZOFFConfig:
    """Hyper-parameters of :class:`QZOFF` (defaults: the paper's 16w8a, m = 3, ε = 1e-3).

    Args:
        m: directions per step (``m`` of sign-m-SPSA, Eq. 3); 2·m forward calls per step.
        eps: perturbation scale ε.
        w_bits, z_bits, a_bits: weight, perturbation/gradient and activation bits (16, 8, 8);
            ``a_bits=None`` keeps activations in float.
        z_max: static range of the perturbation (Δz = z_max/(2**(z_bits-1)-1)); must be > 0.
        per_channel: per-output-channel weight scales instead of per tensor.
        mode: ``"quantized"``, ``"fp32"`` or ``"fp16"``.
        params: names / globs of the trained parameters (None: all with requires_grad).
        activation_ranges: ``"static"`` (calibrated on ``calibration_batches`` batches) or
            ``"dynamic"``.
        sampling: ``"gaussian"`` or ``"momentum"`` (momentum-guided, §3.4) with
            ``alpha``, ``beta`` and ``beta_warmup`` draws at β = 1.
        sharpness_rho: radius ρ of the sharpness-aware ascent step (0 disables it).
        sparse: ``None``, ``"topk"``, ``"random"`` or ``"threshold"`` mask from the initial
            weights, keeping ``1 − sparsity`` (or ``|w| > threshold``).
        sparse_scope: which trained tensors get a mask: ``"all"`` (default: every tensor,
            biases included) or ``"weights"`` (only weight matrices / kernels, ``dim >= 2``;
            biases, norm scales and other 1-D tensors stay fully trainable, as weight pruning
            -- GraSP, DeepZero's ZO-GraSP that QZO-FF §4.3 uses -- prunes weights only).
        kernel_norm: kernel-wise normalization (Eq. 9) of each tensor's estimate.
        optimizer: ``"sgd"``, ``"momentum"`` or ``"adamw"`` (+ ``momentum``, ``betas``,
            ``weight_decay``, ``adam_eps``).
        seed: run seed for directions, random masks and nothing else.
        w_max: per-parameter static weight ranges (name -> float or ``[C]``), overriding
            ``max|w|``.
        w_headroom: factor >= 1 on the default ``max|w|`` range. The paper's 1.0 saturates
            weights that outgrow their initial range (measured on digits: at lr 0.03, 16w8a
            with headroom 1 ends above its start, headroom 4 matches fp32).
        unit_exact: re-quantize Eq. 6 with ``m/2**k ≈ 1/1_q`` instead of the paper's ``≈ Δz``.
            Since ``Δz·1_q = 0.99213`` (defaults), the paper's choice evaluates both sides
            around ``0.992·w``; ``1/1_q`` maps ``w_q·1_q`` back to ``w_q`` exactly and scales
            the perturbation by ``1/(1_q·Δz) = 1.0079`` instead.
    """

    m: int = 3
    eps: float = 1e-3
    w_bits: int = 16
    z_bits: int = 8
    a_bits: int | None = 8
    z_max: float = 3.5
    per_channel: bool = False
    mode: str = "quantized"
    params: list[str] | None = None
    activation_ranges: str = "static"
    calibration_batches: int = 1
    sampling: str = "gaussian"
    alpha: float = 1.0
    beta: float = 0.9
    beta_warmup: int = 0
    sharpness_rho: float = 0.0
    sparse: str | None = None
    sparse_scope: str = "all"
    sparsity: float = 0.9
    threshold: float | None = None
    kernel_norm: bool = False
    optimizer: str = "sgd"
    momentum: float = 0.9
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    seed: int = 0
    w_max: dict = field(default_factory=dict)
    w_headroom: float = 1.0
    unit_exact: bool = False

    def __post_init__(self):
        if isinstance(self.m, bool) or not isinstance(self.m, int) or self.m < 1:
            raise ValueError(f"m (directions per step) must be an int >= 1, got {self.m!r}")
        _finite(self.eps, "eps", 0.0, strict=True)
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        quantization_scale(self.z_bits, self.z_max)  # z_max > 0, z_bits in [2, 16]
        if (isinstance(self.w_bits, bool) or not isinstance(self.w_bits, int)
                or not 2 <= self.w_bits <= 24):
            raise ValueError(f"w_bits must be an int in [2, 24], got {self.w_bits!r}")
        if self.sampling not in ("gaussian", "momentum"):
            raise ValueError(f"sampling must be 'gaussian' or 'momentum', got {self.sampling!r}")
        _finite(self.sharpness_rho, "sharpness_rho", 0.0)
        if self.sparse not in (None, "topk", "random", "threshold"):
            raise ValueError(f"unknown sparse mask method {self.sparse!r}; use 'topk', "
                             "'random' or 'threshold'")
        if self.sparse_scope not in ("all", "weights"):
            raise ValueError(f"sparse_scope must be 'all' or 'weights', got "
                             f"{self.sparse_scope!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; use one of {OPTIMIZERS}")
        # checked here, not only when the trainer builds its optimizer: a config is also
        # passed around (pickled to workers, shown in results) before any trainer exists
        _finite(self.adam_eps, "AdamW eps (adam_eps)", 0.0, strict=True)


@dataclass
class QZOFFEstimate:
    """One sign-m-SPSA estimate.

    Attributes:
        grads: float gradient estimate per tensor (``Δz·g_q^a/m`` in quantized mode, after
            kernel-wise normalization when enabled).
        acc: the raw accumulator per tensor (int32 ``g_q^a`` in quantized mode, float else).
        signs: ``sign(l+ − l−)`` per direction.
        losses: the ``2m`` losses ``l+, l−`` per direction in evaluation order, preceded by
            the two losses of the sharpness-aware ascent probe when enabled.
        loss: mean of the finite losses of the m directions.
        forwards: per-sample forward passes spent.
        center: the evaluation centre (codes or floats): ``w``, or the sharpness-aware point.
        ascent_sign: sign of the sharpness-aware ascent (None when disabled).
    """

    grads: list[torch.Tensor]
    acc: list[torch.Tensor]
    signs: list[int]
    losses: list[float]
    loss: float
    forwards: int
    center: list[torch.Tensor]
    ascent_sign: int | None = None


class QZOFF:
    """QZO-FF on a float ``nn.Module``; implements ``bpfree.harness.Method``.

    ``step(x, y, lr) -> {"loss", "forwards", "moved"}`` ("forwards": per-sample forward passes
    of the step, ``2·m·N`` plus ``2·N`` with sharpness-aware perturbation; "moved": how many
    weights changed). ``self.forwards`` is the running total.

    Args:
        model: the network (its selected float parameters are overwritten with the quantized
            weights at construction in quantized/fp16 mode).
        config: :class:`QZOFFConfig` (keyword overrides are accepted too).
        loss_fn: per-sample loss ``(outputs, targets) -> [N]``.
        masks: explicit sparse masks ``{name: bool tensor}`` (overrides ``config.sparse``).
    """

    def __init__(self, model: nn.Module, config: QZOFFConfig | None = None, *,
                 loss_fn=cross_entropy_per_sample, masks: dict | None = None, **overrides):
        if config is None:
            config = QZOFFConfig(**overrides)
        elif overrides:
            config = QZOFFConfig(**{**config.__dict__, **overrides})
        self.config = c = config
        self.model = model
        self.loss_fn = loss_fn
        self.forwards = 0
        self.t = 0
        named = select_parameters(model, c.params)
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.shapes = [p.shape for p in self.params]
        self.quantized = c.mode == "quantized"
        self.z_scale = quantization_scale(c.z_bits, c.z_max)
        self.masks = self._build_masks(masks)
        if self.quantized:
            self.qp = QuantizedParams(named, c.w_bits, c.per_channel, c.w_max, c.w_headroom)
            self.one_q = quantized_one(c.z_bits, c.z_max)
            self.eps_q = [fxp.quantize_epsilon(c.eps, s, warn=False) for s in self.qp.scales]
            self.frozen_tensors = [n for n, e in zip(self.names, self.eps_q)
                                   if bool((e == 0).any())]
            if self.frozen_tensors:
                worst = max(float(s.max()) for s in self.qp.scales)
                warnings.warn(
                    f"eps={c.eps} quantizes to 0 at the {c.w_bits}-bit weight scale of "
                    f"{self.frozen_tensors} (Δw up to {worst:.3g}, ε/Δw < 0.5): those weights "
                    f"are never perturbed, their loss differences are 0 and training cannot "
                    f"move them. This is the paper's reason 8-bit weights (8w8a) fail (§4.2, "
                    f"App. E); use 16-bit weights or a larger eps.",
                    fxp.EpsilonUnderflowWarning, stacklevel=2)
            self.rho_q = [torch.round(c.sharpness_rho / s).to(torch.int64)
                          for s in self.qp.scales]
            for e, r in zip(self.eps_q, self.rho_q):
                fxp.check_accumulator(c.w_bits, c.z_bits, self.one_q, torch.maximum(e, r), c.m)
            self.pmult, self.pshift = fxp.perturbation_multiplier(
                1.0 / self.one_q if c.unit_exact else self.z_scale)
            self.qp.load(self.qp.codes)
            self.acts = ActivationQuantizer(model, c.a_bits, ranges=c.activation_ranges,
                                            calibration_batches=c.calibration_batches)
        else:
            self.weights = [self._round(p.detach().to(torch.float32).clone())
                            for p in self.params]
            self._load_float(self.weights)
            self.acts = ActivationQuantizer(model, None, fp16=c.mode == "fp16")
        self.sampler = (MomentumSampling(c.alpha, c.beta, c.beta_warmup)
                        if c.sampling == "momentum" else None)
        self.optimizer = FloatOptimizer(c.optimizer, momentum=c.momentum, betas=c.betas,
                                        eps=c.adam_eps, weight_decay=c.weight_decay)
        self.kernel_norm = KernelwiseNormalization() if c.kernel_norm else None

    # -- setup helpers --------------------------------------------------------------------
    def _build_masks(self, masks):
        c = self.config
        if masks is not None:
            unknown = set(masks) - set(self.names)
            if unknown:
                raise ValueError(f"masks name unknown parameters {sorted(unknown)}")
            return [check_mask(masks[n], s, n) if n in masks else None
                    for n, s in zip(self.names, self.shapes)]
        if c.sparse is None:
            return [None] * len(self.params)
        return [make_mask(c.sparse, p.detach(), sparsity=c.sparsity, threshold=c.threshold,
                          seed=derive_seed(c.seed, k))
                if c.sparse_scope == "all" or p.dim() >= 2 else None
                for k, p in enumerate(self.params)]

    def _round(self, w: torch.Tensor) -> torch.Tensor:
        return w.to(torch.float16).to(torch.float32) if self.config.mode == "fp16" else w

    @torch.no_grad()
    def _load_float(self, ws) -> None:
        for p, w in zip(self.params, ws, strict=True):
            p.data.copy_(w.to(p.dtype))

    def _load(self, ws) -> None:
        if self.quantized:
            self.qp.load(ws)
        else:
            self._load_float(ws)

    def _loss(self, x, y) -> float:
        with torch.no_grad():
            return float(self.loss_fn(self.model(x), y).mean())

    # -- state ------------------------------------------------------------------------------
    def current(self) -> list[torch.Tensor]:
        """The master weights: int32 codes (quantized) or float tensors."""
        return self.qp.codes if self.quantized else self.weights

    def float_weights(self) -> list[torch.Tensor]:
        """Current weights as float32 tensors."""
        if self.quantized:
            return [self.qp.dequantize(k, c) for k, c in enumerate(self.qp.codes)]
        return [w.clone() for w in self.weights]

    # -- directions and perturbations -----------------------------------------------------------
    def _directions(self, i: int) -> list[torch.Tensor]:
        """Direction ``i`` of this step: int32 codes (quantized) or float32, masked."""
        c = self.config
        seeds = [derive_seed(c.seed, self.t, i, k) for k in range(len(self.shapes))]
        if self.sampler is not None:
            noise = [derive_seed(c.seed, self.t, i, k, 1) for k in range(len(self.shapes))]
            zs = self.sampler.sample(seeds, noise, self.shapes)
            if self.quantized:
                zs = [quantize_perturbation(z, c.z_bits, c.z_max) for z in zs]
        elif self.quantized:
            zs = [quantized_gaussian_codes(s, sh, c.z_bits, c.z_max, dtype=torch.int32)
                  for s, sh in zip(seeds, self.shapes)]
        else:
            zs = [gaussian(s, sh) for s, sh in zip(seeds, self.shapes)]
        return [z if mk is None else z * mk.to(z.dtype) for z, mk in zip(zs, self.masks)]

    def _perturb(self, center, zs, sign: int, radius: str = "eps"):
        """``center ± ε z`` (or ``± ρ z``): Eq. 6 in quantized mode, float add otherwise.

        The sharpness-aware centre (``radius="rho"``) is the displacement only
        (:func:`~bpfree.qzoff.fixed_point.displaced_weights`), not Eq. 6: the ε-probes around
        it go through Eq. 6, so its ``Δz·1_q`` factor is applied once, as for the plain
        probes (an Eq. 6 centre would shrink the weights twice, by 0.992² instead of 0.992)."""
        if self.quantized:
            if radius == "rho":
                return [fxp.displaced_weights(w, z, sign * r, self.pmult, self.pshift,
                                              self.config.w_bits)
                        for w, z, r in zip(center, zs, self.rho_q)]
            return [fxp.perturbed_weights(w, z, sign * r, self.one_q, self.pmult, self.pshift,
                                          self.config.w_bits)
                    for w, z, r in zip(center, zs, self.eps_q)]
        rad = self.config.eps if radius == "eps" else self.config.sharpness_rho
        return [self._round(w + (sign * rad) * z) for w, z in zip(center, zs)]

    def _two_point(self, center, zs, x, y) -> tuple[int, float, float]:
        self._load(self._perturb(center, zs, +1))
        lp = self._loss(x, y)
        self._load(self._perturb(center, zs, -1))
        lm = self._loss(x, y)
        if not (math.isfinite(lp) and math.isfinite(lm)) or lp == lm:
            return 0, lp, lm
        return (1 if lp > lm else -1), lp, lm

    # -- the estimate ------------------------------------------------------------------------
    def estimate(self, x: torch.Tensor, y: torch.Tensor) -> QZOFFEstimate:
        """Sign-m-SPSA estimate at the current weights (no update; advances momentum-sampling
        state). Leaves the model holding the unperturbed weights."""
        c = self.config
        n = int(x.shape[0])
        w = self.current()
        if self.acts.needs_calibration:
            self._load(w)
            self.acts.calibrate(lambda: self.model(x))
        forwards, losses = 0, []
        center, ascent_sign = w, None
        if c.sharpness_rho > 0:
            seeds = [derive_seed(c.seed, self.t, ASCENT_INDEX, k) for k in range(len(w))]
            if self.quantized:
                us = [quantized_gaussian_codes(s, sh, c.z_bits, c.z_max, dtype=torch.int32)
                      for s, sh in zip(seeds, self.shapes)]
            else:
                us = [gaussian(s, sh) for s, sh in zip(seeds, self.shapes)]
            us = [u if mk is None else u * mk.to(u.dtype) for u, mk in zip(us, self.masks)]
            ascent_sign, lp, lm = self._two_point(w, us, x, y)
            losses += [lp, lm]
            forwards += 2 * n
            if ascent_sign:
                center = self._perturb(w, us, ascent_sign, radius="rho")
        acc, signs, dir_losses = None, [], []
        for i in range(c.m):
            zs = self._directions(i)
            s, lp, lm = self._two_point(center, zs, x, y)
            forwards += 2 * n
            signs.append(s)
            losses += [lp, lm]
            dir_losses += [v for v in (lp, lm) if math.isfinite(v)]
            if self.sampler is not None:
                self.sampler.record([z.to(torch.float32) * self.z_scale if self.quantized
                                     else z for z in zs], s)
            if self.quantized:
                part = [z.to(torch.int32) * s for z in zs]
            else:
                part = [z * float(s) for z in zs]
            acc = part if acc is None else [a + p for a, p in zip(acc, part)]
        if self.quantized:
            grads = [a.to(torch.float32) * (self.z_scale / c.m) for a in acc]
        else:
            grads = [a / c.m for a in acc]
        if self.kernel_norm is not None:
            grads = self.kernel_norm.update(grads, {}, None, self.float_weights())
        self._load(w)
        self.forwards += forwards
        loss = sum(dir_losses) / len(dir_losses) if dir_losses else float("nan")
        return QZOFFEstimate(grads=grads, acc=acc, signs=signs, losses=losses, loss=loss,
                             forwards=forwards, center=center, ascent_sign=ascent_sign)

    # -- the update ----------------------------------------------------------------------------
    def apply(self, est: QZOFFEstimate, lr: float) -> int:
        """Update the master weights from ``est``; returns how many weights changed."""
        _finite(lr, "lr", 0.0)
        c = self.config
        old = [t.clone() for t in self.current()]
        if self.quantized:
            if c.optimizer == "sgd":
                for k in range(len(self.qp.codes)):
                    mult, shift = self._sgd_multiplier(k, est, lr)
                    self.qp.codes[k], _ = fixed_point_update(
                        self.qp.codes[k], est.acc[k], mult, shift, c.w_bits, self.masks[k])
            else:
                steps = self.optimizer.steps(est.grads, self.float_weights(), lr)
                for k, st in enumerate(steps):
                    # the float step re-quantized to the weight scale, round half to even
                    wbar = torch.round(st.to(torch.float64) / self.qp.scale_view(k))
                    self.qp.codes[k] = subtract_and_saturate(self.qp.codes[k], wbar, c.w_bits,
                                                             self.masks[k])
        else:
            steps = self.optimizer.steps(est.grads, self.weights, lr)
            for k, st in enumerate(steps):
                if self.masks[k] is not None:
                    st = st * self.masks[k]
                self.weights[k] = self._round(self.weights[k] - st)
        self._load(self.current())
        return int(sum(int((a != b).sum()) for a, b in zip(old, self.current())))

    def _sgd_multiplier(self, k: int, est: QZOFFEstimate, lr: float):
        """Eq. 8's ``(multiplier, shift)`` for tensor ``k``; with kernel-wise normalization the
        real factor becomes ``η·‖w^k‖/(‖g_q^a‖·Δw)`` (the normalization folded into the
        re-quantization, so the update stays one multiply-and-shift)."""
        c = self.config
        scale = self.qp.scales[k]
        if self.kernel_norm is None:
            return update_multiplier(lr, self.z_scale, scale, c.m)
        gnorm = float(torch.linalg.vector_norm(est.acc[k].to(torch.float64)))
        if gnorm == 0.0:
            return torch.zeros_like(scale, dtype=torch.int64), torch.zeros_like(
                scale, dtype=torch.int64)
        wnorm = float(torch.linalg.vector_norm(self.qp.dequantize(k, self.qp.codes[k])
                                               .to(torch.float64)))
        return quantize_multipliers(lr * wnorm / (gnorm * scale))

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        """One QZO-FF step on the batch ``(x, y)`` with learning rate ``lr``."""
        est = self.estimate(x, y)
        moved = self.apply(est, lr)
        self.t += 1
        return {"loss": est.loss, "forwards": est.forwards, "moved": moved,
                "signs": est.signs}
