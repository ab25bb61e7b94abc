"""``ZOOptimizer``: zeroth-order training for any ``torch.nn.Module``, torch.optim style.

    model = ...                                   # any nn.Module
    opt = ZOOptimizer(select_parameters(model, "fc2.*"), lr=1e-2,
                      estimator=rge(num_queries=16, mu=1e-3),
                      transforms=[gradient_norm_scaling()])
    for x, y in loader:
        loss = opt.step(Objective(model, x, y))   # forward passes only

One step = estimate (an estimator from :mod:`bpfree.estimators`) → transforms
(:mod:`bpfree.transforms`) → the update rule of each parameter group (:mod:`bpfree.updates`):

* ``"sgd"`` (default), float tensors: ``θ ← θ − η_t · Π(scales) · T(ĝ)`` (PMT Eq. 5).
* ``"round_and_clip"``, integer tensors: PMT Eq. 8 with Eq. 11's rounding,
  ``W ← clip(round(W − η_t · Π(scales) · ĝ))``; GNS and QAS are the scale transforms, QAS per
  output channel when the group's ``scale`` is a tensor.
* ``"fixed_point"``, integer tensors: QZO-FF Eq. 8 / Appendix A, the real factor
  ``η_t · Π(scales) · Δz / (K · Δw)`` as one TFLite multiply-and-shift of the integer
  accumulator ``Σ_k s_k z_k`` (``s_k`` the sign of each query, ``z_k`` its integer direction
  codes, ``K`` the directions kept), then saturation to ``±(2**(b−1) − 1)``.

Integer tensors are perturbed exactly in their dtype by ``μ`` times the distribution's integer
codes (``sample_int``: ±1 for Rademacher, ``z_q`` for the quantized Gaussian), so ``μ`` must be a
whole number (PMT: ``μ = 1``) and the estimate is taken in code units. A perturbation that
would leave the dtype's range raises ``OverflowError``, weights untouched: keep codes of ``b``
bits in a wider dtype (int8 codes in int16, with ``bits=8``) so the update clips them and the
perturbation still fits. Only a weight-perturbation estimator whose estimate is a seed-weighted
sum (``rge``, ``spsa``, ``sign_spsa``) feeds integer groups, in lean mode, with scale
transforms only: there is no float gradient buffer for a tensor transform to work on.

Execution modes give the same estimate for the same seeds:

* ``lean``: perturb the parameters in place and restore them bit-exactly by regenerating the
  direction from its seed; extra memory is O(Q) scalars (plus a sparse repair list of the
  few float entries whose round trip is inexact). When no tensor transform is used, the
  update itself is applied from the seeds too, so no gradient buffer ever exists.
* ``cached``: lean mode's arithmetic with memory traded for time (weight perturbation; other
  estimators run as in lean mode): the step's ``Q`` directions are drawn once and kept,
  the tensors are perturbed from one copy of θ kept for the step and restored from it, and
  the update reuses the drawn directions. Every perturbed tensor, loss and update is
  bit-identical to lean mode's; extra memory is ``(Q + 1)·d`` values instead of O(Q)
  scalars, and a step draws each direction once instead of three times (perturb, restore,
  update).
* ``batched``: coordinate-wise estimators (CGE; TT-ZO's layer-wise CGE) evaluate many
  perturbed parameter sets in one vectorized forward (``vmap`` + ``functional_call``).
  Weight perturbation runs cached mode's arithmetic with ``chunk_size`` directions drawn at a
  time (memory ``chunk_size·d``), and node perturbation runs as lean: their vectorized forms
  were slower than cached / lean in every ``bench throughput`` row (issue 30) and were
  retired. All three give lean mode's bits.

Directions are never stored: direction ``q`` of step ``t`` for tensor ``i`` is drawn from
seed ``derive_seed(seed, t, q, i)``, so a checkpoint needs only the step counter.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .._deprecation import warn_renamed
from ..estimators import QueryContext, WeightPerturbation, get_estimator, materialize
from ..objective import Objective
from ..perturb import add_direction_, derive_seed, get_distribution
from ..updates import (UPDATE_RULES, fixed_point_update, integer_update_, qmax, sgd_,
                       update_multiplier)
from ..transforms import TensorInfo, split_transforms
from .params import owners

MODES = ("lean", "cached", "batched")
#: Tensor dtypes the integer update rules accept.
INTEGER_DTYPES = (torch.int8, torch.int16, torch.int32)


def _integer_range(group: dict, p: Tensor, where: str) -> tuple[int, int, int]:
    """``(low, high, bits)`` an integer group's rule keeps ``p`` in (the class docstring's
    ``bits``), or ValueError naming the allowed widths."""
    width = 8 * p.element_size()
    bits = group.get("bits")
    fixed = group["update"] == "fixed_point"
    if bits is None:
        if not fixed:
            info = torch.iinfo(p.dtype)
            return info.min, info.max, width
        if width > 16:
            raise ValueError(f"{where}: a fixed-point group of {p.dtype} tensors needs 'bits', "
                             "the weight bit width b of QZO-FF, an int in [2, 31]")
        bits = width
    top = min(width, 31) if fixed else width
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= top:
        raise ValueError(f"{where}: bits must be an int in [2, {top}] for {p.dtype} tensors, "
                         f"got {bits!r}")
    if fixed:
        return -qmax(bits), qmax(bits), bits
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1, bits


@dataclass
class StepStats:
    """What one step did (``optimizer.last_stats``)."""

    step: int
    loss: float
    batch_forwards: int
    queries: int
    dropped: int
    applied: bool
    lr: float

    @property
    def forward_passes(self) -> int:
        """Deprecated name of :attr:`batch_forwards`."""
        warn_renamed("StepStats.forward_passes", "StepStats.batch_forwards")
        return self.batch_forwards


class ZOOptimizer(torch.optim.Optimizer):
    """Zeroth-order optimizer with the ``torch.optim`` interface.

    Args:
        params: tensors, ``(name, tensor)`` pairs (e.g. from :func:`select_parameters`), or
            parameter-group dicts. A group may set ``lr``; ``update``, its rule (one of
            :data:`bpfree.updates.UPDATE_RULES`, default ``"sgd"``); ``scale``, the
            quantization scale ``s_θ`` (``Δw`` of the fixed-point rule, the ``s`` of
            quantization-aware scaling; default 1.0), a number, or for an integer group a 1-D
            tensor with one scale per output channel (dim 0) of each of its tensors; and
            ``bits``, the integer range of an integer group (``round_and_clip``:
            ``[−2**(b−1), 2**(b−1) − 1]``, default the dtype's range; ``fixed_point``:
            ``±(2**(b−1) − 1)``, default the dtype's width for int8/int16, required for int32).
        lr: base learning rate ``η``.
        estimator: an estimator object or name (``bpfree.estimators.list_estimators()``).
        distribution: direction distribution object or name (``bpfree.perturb``).
        transforms: scale and tensor transforms applied in order (``bpfree.transforms``).
        schedule: callable ``step -> multiplier`` of ``lr`` (``bpfree.transforms.cosine``...).
        mode: ``"lean"``, ``"cached"`` or ``"batched"``.
        seed: run seed from which every direction is derived.
        chunk_size: most parameter sets in one batched forward, or directions drawn at once by
            batched weight perturbation (memory bound).
    """

    def __getstate__(self) -> dict:
        # torch.optim.Optimizer pickles only defaults, state and param_groups; this optimizer's
        # own settings (distribution, mode, seeds, counters) must survive a pickle too (an
        # epoch snapshot of a training run pickles its method: checkpoint.resume).
        return self.__dict__.copy()

    def __init__(self, params, lr: float = 1e-3, *, estimator="rge", distribution="rademacher",
                 transforms=(), schedule=None, mode: str = "lean", seed: int = 0,
                 chunk_size: int = 64) -> None:
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr < 0:
            raise ValueError(f"lr must be a finite number >= 0, got {lr!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
        if schedule is not None and not callable(schedule):
            raise TypeError("schedule must be callable: step -> learning-rate multiplier")
        self.estimator = get_estimator(estimator) if isinstance(estimator, str) else estimator
        if not hasattr(self.estimator, "estimate"):
            raise TypeError(f"estimator must be a name or an estimator object, got {type(estimator).__name__}")
        self.distribution = (get_distribution(distribution) if isinstance(distribution, str)
                             else distribution)
        self.transforms = list(transforms)
        self._scales, self._maps = split_transforms(self.transforms)
        self.schedule = schedule
        self.mode = mode
        self.chunk_size = chunk_size
        super().__init__(params, {"lr": float(lr), "scale": 1.0, "update": "sgd", "bits": None})
        self.state["zo"] = {"step": 0, "seed": seed, "forward_passes": 0, "dropped": 0}
        self.state["transforms"] = [m.init(self._params()) for m in self._maps]
        self.state["config"] = self._config()
        self.last_stats: StepStats | None = None

    def add_param_group(self, param_group: dict) -> None:
        """torch's, plus checks of the group's ``lr``, ``update``, ``scale`` and ``bits``
        against its tensors' dtypes and the optimizer's estimator, distribution and mode."""
        index = len(self.param_groups)
        rule = param_group.get("update", self.defaults["update"])
        if rule not in UPDATE_RULES:
            raise ValueError(f"param group {index}: update must be one of {UPDATE_RULES}, "
                             f"got {rule!r}")
        scale = param_group.get("scale", self.defaults["scale"])
        values = [("lr", param_group.get("lr", self.defaults["lr"]), ">= 0")]
        if not (rule != "sgd" and isinstance(scale, Tensor)):
            values.append(("scale", scale, "> 0"))
        for key, value, bound in values:
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value < 0 or (bound == "> 0" and value == 0)):
                raise ValueError(f"param group {index}: {key} must be a finite number {bound}, "
                                 f"got {value!r}")
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            if rule != "sgd":
                self._check_integer_group(group, index)
            for p in group["params"]:
                if p.is_meta:
                    raise ValueError(
                        f"param group {index}: a parameter of shape {list(p.shape)} is on the "
                        "meta device (shapes only, no values): materialize the model "
                        "(model.to_empty(device='cpu'), then load its weights) before training")
                if rule == "sgd" and not p.is_floating_point():
                    raise TypeError(
                        f"param group {index}: the 'sgd' update rule updates floating-point "
                        f"tensors; got dtype {p.dtype}. Integer (quantized) parameters need a "
                        "group with update='round_and_clip' (PMT Eq. 8) or 'fixed_point' "
                        "(QZO-FF Eq. 8)")
        except (TypeError, ValueError):
            self.param_groups.pop()  # a refused group leaves the optimizer as it was
            raise

    def _check_integer_group(self, group: dict, index: int) -> None:
        """Refuse, naming the problem, an integer group the integer rules cannot update."""
        rule, where = group["update"], f"param group {index} ({group['update']!r})"
        for p in group["params"]:
            if p.dtype not in INTEGER_DTYPES:
                raise TypeError(f"{where}: integer update rules update {INTEGER_DTYPES} tensors, "
                                f"got dtype {p.dtype}; float tensors take update='sgd'")
            _integer_range(group, p, where)
            scale = group["scale"]
            if isinstance(scale, Tensor) and not (
                    scale.dim() == 1 and p.dim() >= 1 and scale.numel() == p.shape[0]
                    and scale.is_floating_point() and bool(torch.isfinite(scale).all())
                    and bool((scale > 0).all())):
                raise ValueError(f"{where}: a tensor scale must be 1-D with one finite scale > 0 "
                                 f"per output channel (dim 0) of each tensor; got shape "
                                 f"{tuple(scale.shape)} for a tensor of shape {tuple(p.shape)}")
        if self.mode != "lean":
            raise ValueError(f"{where}: integer tensors are perturbed in place; use "
                             f"mode='lean', got {self.mode!r}")
        if self._maps:
            raise TypeError(f"{where}: integer groups take scale transforms only (e.g. GNS, "
                            f"QAS); {[repr(m) for m in self._maps]} need a float gradient "
                            "buffer")
        if not getattr(self.distribution, "integer_valued", False):
            raise ValueError(f"{where}: integer tensors need an integer-valued distribution "
                             f"('rademacher', 'quantized_gaussian'), got "
                             f"{self.distribution.name!r}")
        est = self.estimator
        if not isinstance(est, WeightPerturbation) or est.sign_estimate:
            raise TypeError(f"{where}: integer groups need a weight-perturbation estimator whose "
                            f"estimate is a seed-weighted sum (rge, spsa, sign_spsa), got {est!r}")
        if float(est.mu) != int(est.mu):
            raise ValueError(f"{where}: integer tensors are perturbed by mu times integer codes, "
                             f"so mu must be a whole number (PMT uses mu = 1), got {est.mu!r}")
        if rule == "fixed_point" and not est.sign_difference:
            raise TypeError(f"{where}: the fixed-point update needs integer direction "
                            "coefficients, the signs of sign_spsa (QZO-FF Eq. 3), got "
                            f"{est!r}")

    # -- helpers -------------------------------------------------------------------------
    def _params(self) -> list[Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def _resolve(self, closure):
        """Names and owning modules of the trainable tensors (needed by batched/NP modes)."""
        params = self._params()
        names = []
        for g in self.param_groups:
            pn = g.get("param_names")
            names.extend(pn if pn else [None] * len(g["params"]))
        modules = {}
        if isinstance(closure, Objective):
            table = owners(closure.model)
            for i, p in enumerate(params):
                if id(p) not in table:
                    raise ValueError(
                        f"trainable tensor {names[i] or i} is not a parameter of the objective's model")
                qual, module, attr = table[id(p)]
                names[i] = qual
                modules[i] = (module, attr)
        names = [n if n is not None else f"param{i}" for i, n in enumerate(names)]
        return params, names, modules

    @property
    def step_count(self) -> int:
        return self.state["zo"]["step"]

    @property
    def batch_forwards(self) -> int:
        """Closure evaluations so far, each one forward pass over the whole batch (TT-ZO's
        ``batch_forwards``); a trainer's ``forwards`` counts per sample, this times N."""
        return self.state["zo"]["forward_passes"]  # the key checkpoints were saved with

    @property
    def forward_passes(self) -> int:
        """Deprecated name of :attr:`batch_forwards`."""
        warn_renamed("ZOOptimizer.forward_passes", "ZOOptimizer.batch_forwards")
        return self.batch_forwards

    # -- the step ------------------------------------------------------------------------
    def context(self, closure) -> QueryContext:
        """What the estimator sees at the current step (its seeds, tensors and closure).

        ``estimator.estimate(opt.context(closure))`` evaluates this step's queries without
        updating anything: data-parallel training (:mod:`bpfree.distributed`) records a
        shard's losses this way before the step itself.
        """
        zo = self.state["zo"]
        t, run_seed = zo["step"], zo["seed"]
        params, names, modules = self._resolve(closure)

        def seed_for(q: int, i: int) -> int:
            return derive_seed(run_seed, t, q, i)

        return QueryContext(params=params, names=names, closure=closure,
                            distribution=self.distribution, seed_for=seed_for, mode=self.mode,
                            chunk_size=self.chunk_size, modules=modules, step=t)

    @torch.no_grad()
    def step(self, closure=None) -> float:
        """One zeroth-order step; returns the loss at the current parameters.

        ``closure`` is an :class:`~bpfree.objective.Objective` (any mode, any estimator) or a
        zero-argument callable returning the scalar loss (lean weight perturbation only).
        A query whose loss is NaN/Inf is dropped and counted; a step with no finite query
        leaves parameters and optimizer state unchanged (the step counter still advances so
        the next step draws fresh directions).
        """
        if closure is None or not callable(closure):
            raise TypeError("ZOOptimizer.step needs a closure: an Objective or a callable returning the loss")
        # A scheduler (or a user) may have changed a group's lr since add_param_group checked
        # it; a negative or non-finite lr would ascend or write inf, so refuse before any query.
        for i, group in enumerate(self.param_groups):
            lr = group["lr"]
            if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) \
                    or lr < 0:
                raise ValueError(f"param group {i}: lr must be a finite number >= 0, got "
                                 f"{lr!r} (changed after construction?); weights left unchanged")
        zo = self.state["zo"]
        t = zo["step"]
        ctx = self.context(closure)
        params, names = ctx.params, ctx.names
        try:
            est = self.estimator.estimate(ctx)
        except OverflowError as exc:
            raise OverflowError(
                f"{exc}. An integer tensor at the edge of its dtype cannot be perturbed: keep "
                "its codes in a wider dtype and give the group 'bits' (e.g. int8 codes in an "
                "int16 tensor with bits=8); weights left unchanged") from exc
        multiplier = self.schedule(t) if self.schedule is not None else 1.0
        applied = est.dropped < est.queries
        if applied:
            applied = self._apply(est, params, names, t, multiplier)
        zo["step"] = t + 1
        zo["forward_passes"] += int(est.forward_passes)
        zo["dropped"] += int(est.dropped)
        self.last_stats = StepStats(step=t, loss=est.loss, batch_forwards=int(est.forward_passes),
                                    queries=est.queries, dropped=est.dropped, applied=applied,
                                    lr=self.param_groups[0]["lr"] * multiplier)
        return est.loss

    def _apply(self, est, params, names, t, multiplier) -> bool:
        lrs, channels, infos, groups = [], [], [], []
        i = 0
        for g_index, group in enumerate(self.param_groups):
            scale = group["scale"]
            scale = scale.to(torch.float64) if isinstance(scale, Tensor) else float(scale)
            for _ in group["params"]:
                info = TensorInfo(name=names[i], num_directions=est.num_directions[i],
                                  dim=est.dims[i], scale=scale, step=t)
                factor, channel = 1.0, None
                for s in self._scales:
                    f = s.factor(info)
                    if isinstance(f, Tensor):  # per-channel (QAS of a per-channel scale)
                        channel = f if channel is None else channel * f
                    else:
                        factor *= f
                lrs.append(group["lr"] * multiplier * factor)
                channels.append(channel)
                infos.append(info)
                groups.append((g_index, group))
                i += 1
        # .get: a state saved before groups named their rule loads groups without the key
        floats = [j for j, (_, g) in enumerate(groups) if g.get("update", "sgd") == "sgd"]
        ints = [j for j, (_, g) in enumerate(groups) if g.get("update", "sgd") != "sgd"]
        if ints and not bool(torch.isfinite(est.weights).all()):
            return False  # never let a non-finite estimate reach the weights
        if floats and not self._apply_float(est, [params[j] for j in floats],
                                            [names[j] for j in floats],
                                            [lrs[j] for j in floats],
                                            [infos[j] for j in floats], floats):
            return False
        for j in ints:
            self._apply_integer(est, params[j], j, *groups[j], lrs[j], channels[j])
        return True

    def _apply_float(self, est, params, names, lrs, infos, index) -> bool:
        """The ``sgd`` rule on the float tensors (``index``: their positions in the step)."""
        seeds = None if est.seeds is None else [[row[j] for j in index] for row in est.seeds]
        if est.is_lazy and not self._maps:
            # Apply Σ_k w_k ξ_k straight from the seeds: no gradient buffer (MeZO / PMT Alg. 1).
            reach = sum(abs(w) for w in est.weights.tolist()) * self._direction_bound()
            self._check_reach(params, names, lrs, [reach] * len(params))
            drawn = est.directions
            for k, w in enumerate(est.weights.tolist()):
                if w == 0.0:
                    continue
                for j, p in enumerate(params):
                    if drawn is None:
                        add_direction_(p.data, self.distribution, seeds[k][j], -lrs[j] * w)
                    else:  # add_direction_'s arithmetic on the direction drawn this step
                        p.data.add_(drawn[k][index[j]] * (-lrs[j] * w))
            return True
        drawn = (None if est.directions is None
                 else [[row[j] for j in index] for row in est.directions])
        grads = ([est.grads[j] for j in index] if not est.is_lazy
                 else materialize(params, self.distribution, est.weights, seeds, drawn))
        if any(g is None for g in grads):
            missing = [names[j] for j, g in enumerate(grads) if g is None]
            raise RuntimeError(f"the estimator produced no gradient for {missing}")
        if not all(bool(torch.isfinite(g).all()) for g in grads):
            return False  # never let a non-finite estimate reach the weights
        state = self.state["transforms"]
        for m, st in zip(self._maps, state):
            grads = m.update(grads, st, infos, params)
        self._check_reach(params, names, lrs, [float(torch.linalg.vector_norm(g, float("inf")))
                                               for g in grads])
        for p, g, lr in zip(params, grads, lrs):
            sgd_(p.data, g, lr)
        return True

    def _code_sum(self, p: Tensor, j: int, seeds, coefs, dtype) -> Tensor:
        """``Σ_k c_k z_k`` for tensor ``j``, ``z_k`` the integer codes its perturbation added."""
        out = torch.zeros(p.shape, dtype=dtype, device=p.device)
        for k, c in enumerate(coefs):
            if c != 0:
                z = self.distribution.sample_int(seeds[k][j], p.shape, dtype=torch.int64,
                                                 device=p.device)
                out.add_(z.to(dtype) * c)
        return out

    def _apply_integer(self, est, p: Tensor, j: int, g_index: int, group: dict, lr: float,
                       channel: Tensor | None) -> None:
        """The group's integer rule on tensor ``j`` (see the module docstring)."""
        where = f"param group {g_index} ({group['update']!r})"
        low, high, bits = _integer_range(group, p, where)
        weights = est.weights.tolist()
        if group["update"] == "round_and_clip":
            g = self._code_sum(p, j, est.seeds, weights, torch.float64)
            new = integer_update_(g, p.data, lr, low, high, channel)
        else:
            kept = est.num_directions[j]
            signs = [round(w * kept) for w in weights]
            if any(abs(w * kept - s) > 1e-6 for w, s in zip(weights, signs)):
                raise ValueError(f"{where}: the fixed-point update needs integer direction "
                                 f"coefficients, got {[w * kept for w in weights]}")
            acc = self._code_sum(p, j, est.seeds, signs, torch.int64)
            w_scale = torch.as_tensor(group["scale"], dtype=torch.float64)
            if channel is not None:  # a per-channel transform factor multiplies the real
                w_scale = w_scale / channel
            mult, shift = update_multiplier(lr, self.distribution.int_scale, w_scale, kept)
            new, _ = fixed_point_update(p.data, acc, mult, shift, bits)
        p.data.copy_(new.to(p.dtype))

    def _direction_bound(self) -> float:
        """Largest |ξ| a direction can hold: 1 for Rademacher, z_max for the quantized
        Gaussian; 8 covers torch's Gaussian (its 24-bit uniforms stay below 6 sigma)."""
        return max(8.0, float(getattr(self.distribution, "z_max", 0.0)))

    def _check_reach(self, params, names, lrs, steps) -> None:
        """Refuse, weights untouched, an update that could leave the dtype's finite range:
        ``max|θ| + lr·max|step|`` must stay finite (an absurd lr such as 1e308)."""
        for j, (p, lr, step) in enumerate(zip(params, lrs, steps)):
            if p.numel() == 0:
                continue
            low, high = torch.aminmax(p.detach())  # no |p| temporary: lean mode stays lean
            reach = max(-float(low), float(high)) + abs(lr) * step
            if not reach < torch.finfo(p.dtype).max:
                raise ValueError(
                    f"the update of {names[j]} with lr {lr:g} would take its weights beyond "
                    f"the largest {p.dtype} (max |step| {step:g}); weights left unchanged, "
                    "lower the group's lr")

    # -- state ---------------------------------------------------------------------------
    def _config(self) -> dict:
        """What a saved state is only valid for: the estimator, distribution, transforms and
        schedule (their reprs), and the trainable tensors' shapes and dtypes, in order."""
        return {
            "estimator": repr(self.estimator),
            "distribution": repr(self.distribution),
            "transforms": [repr(t) for t in self.transforms],
            "schedule": None if self.schedule is None else repr(self.schedule),
            "params": [f"{str(p.dtype).removeprefix('torch.')}{list(p.shape)}"
                       for p in self._params()],
        }

    def check_state_dict(self, state_dict) -> None:
        """Raise ``ValueError`` naming the differences when ``state_dict`` was saved by an
        optimizer set up differently (another estimator or transforms, other tensors):
        loading it would silently drop momentum or fill buffers of the wrong shapes.
        States saved before the configuration was recorded are accepted."""
        saved = state_dict.get("state", {}).get("config") if isinstance(state_dict, dict) else None
        if saved is None:
            return
        mine = self._config()
        differ = [f"{key}: saved {saved.get(key)!r}, this optimizer {mine[key]!r}"
                  for key in mine if saved.get(key) != mine[key]]
        if differ:
            raise ValueError("the optimizer state was saved by a ZOOptimizer set up "
                             "differently; " + "; ".join(differ))

    def load_state_dict(self, state_dict) -> None:
        self.check_state_dict(state_dict)
        # Deep-copy the non-parameter entries so later in-place updates (momentum) never
        # write into the caller's dict (e.g. a checkpoint still held in memory).
        state_dict = dict(state_dict)
        state_dict["state"] = {k: (copy.deepcopy(v) if isinstance(k, str) else v)
                               for k, v in state_dict["state"].items()}
        super().load_state_dict(state_dict)
