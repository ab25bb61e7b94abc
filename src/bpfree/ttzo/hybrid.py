"""TT-ZO's zeroth-order optimizers (Zhao et al., §2.1 Eq. 2 and §3.2) as Method-protocol trainers.

* :class:`ZOTrainer` -- one estimator for the whole run: ZO-RGE (Eq. 2 with Gaussian ξ),
  ZO-signRGE (the sign of Eq. 2, §3.2), ZO-CGE (Eq. 2 with ξ_i = e_i, optional heavy-ball
  momentum ``b_t = m·b_{t−1} + g_t``) or the forward gradient (FG-W, see
  :class:`~bpfree.baselines.ForwardGradientW`). It is a thin shell around
  :class:`~bpfree.optim.ZOOptimizer` with an estimator from :mod:`bpfree.estimators` and the
  :func:`~bpfree.transforms.momentum` transform; nothing is re-implemented here.
* :class:`StallDetector` -- decides when the per-epoch training loss has stalled.
* :class:`HybridZO` -- §3.2's hybrid: ZO-signRGE coarse training (N = 10, μ = 0.1) until the
  training loss stalls, then ZO-CGE fine-tuning (μ = 0.01, momentum 0.9).

Forward accounting. Every trainer keeps two counters:

* ``batch_forwards`` -- loss evaluations on a mini-batch (one forward of the whole batch at
  one parameter setting counts 1). These are the paper's "queries" / "# of loss eval." /
  "forward evaluations": ZO-signRGE costs ``N + 1`` per step and ZO-CGE ``d + 1`` per step
  (§3.2), which is the unit in which the paper states "to reach 85% accuracy ZO-CGE needs 11
  million forward evaluations while ZO-signRGE only needs 340K" (with d = 3,962 and 938
  steps/epoch, 340K ≈ 31 signRGE epochs and 11M ≈ 3 CGE epochs; per-sample counts would be
  64× larger). Use this counter for that comparison.
* ``forwards`` -- per-sample forward passes (a forward of B samples counts B), the unit of
  :mod:`bpfree.harness` (PMT Table 5), so these trainers can share ``bpfree.harness.fit``.

Per step (one-sided estimators, as in Eq. 2 and the foundation's ``sign_rge``/``rge``/``cge``):

=============  ===================  ======================
estimator      batch_forwards       forwards (per sample)
=============  ===================  ======================
rge/sign_rge   N + 1                B·(N + 1)
cge            d + 1 (2d central)   B·(d + 1) (B·2d)
=============  ===================  ======================
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..estimators import forward_gradient, rge, sign_rge
from ..objective import cross_entropy_per_sample
from ..optim import ZOMethod, ZOOptimizer
from ..optim.params import named_trainable
from ..transforms import momentum as momentum_transform
from .layerwise import LayerwiseCGE

__all__ = ["ESTIMATORS", "StallDetector", "ZOTrainer", "HybridZO"]

ESTIMATORS = ("rge", "sign_rge", "cge", "forward_gradient")

#: TT-ZO §5.1 / Fig. 1 defaults.
PAPER_N = 10
PAPER_RGE_MU = 0.1
PAPER_CGE_MU = 0.01
PAPER_MOMENTUM = 0.9


# ---------------------------------------------------------------------------------------------
# Single-estimator trainer
# ---------------------------------------------------------------------------------------------


class ZOTrainer(ZOMethod):
    """Zeroth-order SGD on any ``nn.Module`` with one estimator (the single-method rows).

    A :class:`~bpfree.optim.ZOMethod` whose optimizer it builds from the estimator's name:
    ``step(x, y, lr)`` forms an :class:`~bpfree.objective.Objective` on the batch and runs one
    :class:`~bpfree.optim.ZOOptimizer` step at learning rate ``lr``; the returned ``"loss"``
    is the batch loss at the parameters *before* the update (NaN for central CGE, which never
    evaluates θ itself).

    Args:
        model: any ``nn.Module`` (a TT-MLP from :func:`bpfree.tt.tt_mlp`, a dense or masked
            MLP, ...). ``method.model`` is what :func:`bpfree.pmt.accuracy` evaluates.
        estimator: ``"rge"``, ``"sign_rge"``, ``"cge"`` or ``"forward_gradient"``.
        num_queries: ``N`` directions per step (RGE, signRGE, forward gradient).
        mu: perturbation radius; default 0.1 for RGE/signRGE and 0.01 for CGE (§5.1).
        momentum: heavy-ball coefficient ``m`` (0 = none); §3.2 uses 0.9 with CGE.
        central: central differences for CGE (``2d`` forwards instead of ``d + 1``).
        num_coordinates: CGE on a random subset of this many coordinates per step.
        distribution: direction distribution (``bpfree.perturb``); Gaussian as in RGE.
        params: names (or ``(name, tensor)`` pairs) to train; default every parameter with
            ``requires_grad``.
        mode: ``"lean"`` (perturb in place), ``"cached"`` (RGE/signRGE: lean's weights bit
            for bit, each direction drawn once per step) or ``"batched"`` (``vmap`` many
            parameter sets; CGE on a layered (TT-)MLP: :class:`~bpfree.ttzo.LayerwiseCGE`).
        loss_fn: per-sample loss ``(outputs, targets) -> [B]``; default cross-entropy.
    """

    def __init__(self, model: nn.Module, estimator: str = "sign_rge", *,
                 num_queries: int = PAPER_N, mu: float | None = None, momentum: float = 0.0,
                 central: bool = False, num_coordinates: int | None = None,
                 distribution="gaussian", params=None, mode: str = "lean", seed: int = 0,
                 chunk_size: int = 64, loss_fn: Callable = cross_entropy_per_sample) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
        if mu is None:
            mu = PAPER_CGE_MU if estimator == "cge" else PAPER_RGE_MU
        if estimator == "rge":
            est = rge(num_queries, mu)
        elif estimator == "sign_rge":
            est = sign_rge(num_queries, mu)
        elif estimator == "cge":
            # batched mode evaluates the d + 1 points by layer linearity (ttzo.layerwise)
            est = LayerwiseCGE(mu, num_coordinates, central)
        else:
            est = forward_gradient(num_queries)
        transforms = [momentum_transform(momentum)] if momentum else []
        self.name = estimator
        self.estimator = est
        self.named_params = named_trainable(model, params)
        super().__init__(model, ZOOptimizer(self.named_params, lr=1.0, estimator=est,
                                            distribution=distribution, transforms=transforms,
                                            mode=mode, seed=seed, chunk_size=chunk_size),
                         loss_fn)

    @property
    def num_parameters(self) -> int:
        """``d``: the number of trainable scalars the estimator sees."""
        return sum(p.numel() for _, p in self.named_params)

    def batch_forwards_per_step(self) -> int:
        """Analytic loss evaluations per step (the table in the module docstring)."""
        est = self.estimator
        if self.name == "cge":
            n = self.num_parameters if est.num_coordinates is None else min(est.num_coordinates,
                                                                            self.num_parameters)
            return 2 * n if est.central else n + 1
        if self.name == "forward_gradient":
            return est.num_queries
        return est.num_queries + 1

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        return {**super().step(x, y, lr), "estimator": self.name}


# ---------------------------------------------------------------------------------------------
# Stall detection and the hybrid optimizer
# ---------------------------------------------------------------------------------------------


@dataclass
class StallDetector:
    """Declares the training loss stalled after ``patience`` epochs without a real improvement.

    Epoch ``e`` (0-based, in the order of :meth:`end_epoch` calls) *improves* when its loss is
    strictly below ``best − δ``, where ``best`` is the lowest loss of the epochs before it and
    ``δ = threshold·|best|`` (``mode="relative"``) or ``δ = threshold`` (``"absolute"``). The
    first finite loss always improves (it only sets ``best``); a non-finite loss never does,
    so a NaN/Inf epoch counts towards the patience. The detector reports a
    stall at the first epoch that makes ``patience`` consecutive non-improving epochs, and
    stays stalled afterwards (``stalled_at`` keeps that epoch).

    Example (relative, threshold 0.01, patience 2): losses 1.0, 0.9, 0.895, 0.894 → epoch 2
    (0.895 ≥ 0.9·0.99 = 0.891) and epoch 3 (0.894 ≥ 0.891) do not improve → stall at epoch 3.
    """

    patience: int = 3
    threshold: float = 1e-2
    mode: str = "relative"
    best: float = field(default=math.inf, init=False)
    bad_epochs: int = field(default=0, init=False)
    epoch: int = field(default=0, init=False)
    stalled_at: int | None = field(default=None, init=False)

    def __post_init__(self):
        if isinstance(self.patience, bool) or not isinstance(self.patience, numbers.Integral) \
                or self.patience < 1:
            raise ValueError(f"patience must be an int >= 1, got {self.patience!r}")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, numbers.Real) \
                or not math.isfinite(self.threshold) or self.threshold < 0:
            raise ValueError(f"threshold must be a finite number >= 0, got {self.threshold!r}")
        if self.mode not in ("relative", "absolute"):
            raise ValueError(f"mode must be 'relative' or 'absolute', got {self.mode!r}")

    @property
    def stalled(self) -> bool:
        return self.stalled_at is not None

    def improves(self, loss: float) -> bool:
        """Whether ``loss`` would count as an improvement over the best loss so far."""
        if not math.isfinite(loss):
            return False
        if not math.isfinite(self.best):
            return True
        delta = self.threshold * abs(self.best) if self.mode == "relative" else self.threshold
        return loss < self.best - delta

    def end_epoch(self, loss: float) -> bool:
        """Record one epoch's training loss; True exactly at the epoch the stall is declared."""
        loss = float(loss)
        epoch = self.epoch
        self.epoch += 1
        if self.improves(loss):
            self.best = loss
            self.bad_epochs = 0
        else:
            self.bad_epochs += 1
            if math.isfinite(loss):
                self.best = min(self.best, loss)
        if self.stalled_at is None and self.bad_epochs >= self.patience:
            self.stalled_at = epoch
            return True
        return False

    def reset(self) -> None:
        self.best, self.bad_epochs, self.epoch, self.stalled_at = math.inf, 0, 0, None


class HybridZO:
    """TT-ZO §3.2 hybrid ZO training: ZO-signRGE coarse training, then ZO-CGE with momentum.

    Phase ``"sign_rge"``: ``θ ← θ − α·sign(ĝ_RGE)`` with ``N`` Gaussian directions and radius
    ``mu`` (``N + 1`` loss evaluations per step). After every epoch call :meth:`end_epoch`
    with the epoch's training loss (or nothing: the mean of the step losses since the last
    call is used); when the :class:`StallDetector` reports a stall, every later step is
    phase ``"cge"``: coordinate-wise estimate with radius ``cge_mu`` and heavy-ball momentum
    ``b_t = m·b_{t−1} + g_t``, ``θ ← θ − α·b_t`` (``d + 1`` evaluations per step).

    Both phases use the step size ``α`` passed to :meth:`step` (§5.1: one α = 1e-3), times
    ``cge_lr_scale`` in the CGE phase. The default 1.0 is the paper's single α; a larger scale
    compensates that a sign step moves every coordinate by α while a CGE step moves it by
    α·|ĝ_i| (|ĝ_i| ~ 1e-2 on the TT-MLP at initialisation), which matters in short runs and
    with a random coordinate subset (``cge_coordinates``), where each coordinate is updated
    only in a fraction of the steps.

    With ``steps_per_epoch`` set, :meth:`end_epoch` is called automatically after that many
    steps, so the hybrid also runs under :func:`bpfree.harness.fit` (which has no epoch hook).

    ``history`` holds ``epoch_loss`` (one entry per epoch), ``epoch_phase``, ``switch_epoch``
    (the 0-based index of the first epoch trained with CGE, i.e. the stall epoch + 1; None
    while still coarse), ``switch_step``, and per-phase ``batch_forwards`` / ``forwards``.

    Args:
        model: any ``nn.Module``.
        num_queries, mu: ZO-signRGE's ``N`` and ``μ`` (10, 0.1).
        cge_mu, momentum: ZO-CGE's ``μ`` and ``m`` (0.01, 0.9).
        patience, threshold, stall_mode: the :class:`StallDetector` (or pass ``detector``).
        min_coarse_epochs: never switch before this many coarse epochs.
        max_coarse_epochs: switch after this many coarse epochs even without a stall.
        cge_central, cge_coordinates: CGE variant (central differences / random subset).
        cge_lr_scale: multiplier of the step size in the CGE phase (default 1.0, §5.1).
        mode, cge_mode: execution mode of the signRGE phase, and of the CGE phase (default:
            ``mode``; cached CGE runs as lean); ``"batched"`` CGE evaluates a layered
            (TT-)MLP's ``d + 1`` points by layer linearity
            (:class:`~bpfree.ttzo.LayerwiseCGE`), the same losses up to float rounding.
        Others as in :class:`ZOTrainer`.
    """

    def __init__(self, model: nn.Module, *, num_queries: int = PAPER_N, mu: float = PAPER_RGE_MU,
                 cge_mu: float = PAPER_CGE_MU, momentum: float = PAPER_MOMENTUM,
                 patience: int = 3, threshold: float = 1e-2, stall_mode: str = "relative",
                 detector: StallDetector | None = None, min_coarse_epochs: int = 0,
                 max_coarse_epochs: int | None = None, cge_central: bool = False,
                 cge_coordinates: int | None = None, cge_lr_scale: float = 1.0,
                 steps_per_epoch: int | None = None,
                 distribution="gaussian", params=None, mode: str = "lean",
                 cge_mode: str | None = None, seed: int = 0,
                 chunk_size: int = 64, loss_fn: Callable = cross_entropy_per_sample) -> None:
        self.model = model
        common = dict(params=params, chunk_size=chunk_size, loss_fn=loss_fn,
                      distribution=distribution)
        self.coarse = ZOTrainer(model, "sign_rge", num_queries=num_queries, mu=mu, seed=seed,
                                mode=mode, **common)
        self.fine = ZOTrainer(model, "cge", mu=cge_mu, momentum=momentum, central=cge_central,
                              num_coordinates=cge_coordinates, seed=seed + 1,
                              mode=mode if cge_mode is None else cge_mode, **common)
        self.detector = detector if detector is not None else StallDetector(patience, threshold,
                                                                            stall_mode)
        for name, value, lowest in (("min_coarse_epochs", min_coarse_epochs, 0),
                                    ("max_coarse_epochs", max_coarse_epochs, 1),
                                    ("steps_per_epoch", steps_per_epoch, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < lowest):
                raise ValueError(f"{name} must be an int >= {lowest}, got {value!r}")
        if isinstance(cge_lr_scale, bool) or not isinstance(cge_lr_scale, numbers.Real) \
                or not math.isfinite(cge_lr_scale) or cge_lr_scale <= 0:
            raise ValueError(f"cge_lr_scale must be a finite number > 0, got {cge_lr_scale!r}")
        self.cge_lr_scale = float(cge_lr_scale)
        self.min_coarse_epochs = min_coarse_epochs
        self.max_coarse_epochs = max_coarse_epochs
        self.steps_per_epoch = steps_per_epoch
        self.phase = "sign_rge"
        self.epoch = 0
        self._epoch_losses: list[float] = []
        self._steps_in_epoch = 0
        self.history = {
            "epoch_loss": [], "epoch_phase": [], "switch_epoch": None, "switch_step": None,
            "stall_epoch": None,
            "batch_forwards": {"sign_rge": 0, "cge": 0}, "forwards": {"sign_rge": 0, "cge": 0},
            "steps": {"sign_rge": 0, "cge": 0},
        }

    @property
    def active(self) -> ZOTrainer:
        return self.coarse if self.phase == "sign_rge" else self.fine

    @property
    def forwards(self) -> int:
        return self.coarse.forwards + self.fine.forwards

    @property
    def batch_forwards(self) -> int:
        return self.coarse.batch_forwards + self.fine.batch_forwards

    @property
    def steps(self) -> int:
        return self.coarse.steps + self.fine.steps

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        trainer = self.active
        phase = self.phase
        out = trainer.step(x, y, lr * self.cge_lr_scale if phase == "cge" else lr)
        h = self.history
        h["batch_forwards"][phase] += out["batch_forwards"]
        h["forwards"][phase] += out["batch_forwards"] * int(x.shape[0])
        h["steps"][phase] += 1
        out["phase"] = phase
        if math.isfinite(out["loss"]):
            self._epoch_losses.append(out["loss"])
        self._steps_in_epoch += 1
        if self.steps_per_epoch is not None and self._steps_in_epoch >= self.steps_per_epoch:
            out["switched"] = self.end_epoch()
        return out

    def end_epoch(self, loss: float | None = None) -> bool:
        """Close the current epoch with its training loss; True when the optimizer switched."""
        if loss is None:
            loss = (sum(self._epoch_losses) / len(self._epoch_losses)) if self._epoch_losses \
                else float("nan")
        loss = float(loss)
        self._epoch_losses = []
        self._steps_in_epoch = 0
        epoch = self.epoch
        self.epoch += 1
        h = self.history
        h["epoch_loss"].append(loss)
        h["epoch_phase"].append(self.phase)
        if self.phase != "sign_rge":
            return False
        stalled = self.detector.end_epoch(loss)
        coarse_epochs = epoch + 1
        switch = (stalled or self.detector.stalled) and coarse_epochs >= self.min_coarse_epochs
        if self.max_coarse_epochs is not None and coarse_epochs >= self.max_coarse_epochs:
            switch = True
        if switch:
            self.phase = "cge"
            h["stall_epoch"] = self.detector.stalled_at
            h["switch_epoch"] = epoch + 1
            h["switch_step"] = self.steps
        return switch
