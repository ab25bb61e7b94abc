"""``ZOOptimizer``: zeroth-order training for any ``torch.nn.Module``, torch.optim style.

    model = ...                                   # any nn.Module
    opt = ZOOptimizer(select_parameters(model, "fc2.*"), lr=1e-2,
                      estimator=rge(num_queries=16, mu=1e-3),
                      transforms=[gradient_norm_scaling()])
    for x, y in loader:
        loss = opt.step(Objective(model, x, y))   # forward passes only

One step = estimate (an estimator from :mod:`bpfree.estimators`) → transforms
(:mod:`bpfree.transforms`) → SGD update ``θ ← θ − η_t · Π(scales) · T(ĝ)`` (PMT Eq. 5/8).

Execution modes give the same estimate for the same seeds:

* ``lean``: perturb the parameters in place and restore them bit-exactly by regenerating the
  direction from its seed; extra memory is O(Q) scalars (plus a sparse repair list of the
  few float entries whose round trip is inexact). When no tensor transform is used, the
  update itself is applied from the seeds too, so no gradient buffer ever exists.
* ``batched``: evaluate many perturbed parameter sets in one vectorized forward
  (``vmap`` + ``functional_call``, or stacked perturbed activations for node perturbation).

Directions are never stored: direction ``q`` of step ``t`` for tensor ``i`` is drawn from
seed ``derive_seed(seed, t, q, i)``, so a checkpoint needs only the step counter.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..estimators import QueryContext, get_estimator, materialize
from ..objective import Objective
from ..perturb import add_direction_, derive_seed, get_distribution
from ..updates import sgd_
from ..transforms import TensorInfo, split_transforms
from .params import owners

MODES = ("lean", "batched")


@dataclass
class StepStats:
    """What one step did (``optimizer.last_stats``)."""

    step: int
    loss: float
    forward_passes: int
    queries: int
    dropped: int
    applied: bool
    lr: float


class ZOOptimizer(torch.optim.Optimizer):
    """Zeroth-order optimizer with the ``torch.optim`` interface.

    Args:
        params: tensors, ``(name, tensor)`` pairs (e.g. from :func:`select_parameters`), or
            parameter-group dicts. A group may set ``lr`` and ``scale`` (quantization scale
            ``s_θ`` used by quantization-aware scaling; default 1.0).
        lr: base learning rate ``η``.
        estimator: an estimator object or name (``bpfree.estimators.list_estimators()``).
        distribution: direction distribution object or name (``bpfree.perturb``).
        transforms: scale and tensor transforms applied in order (``bpfree.transforms``).
        schedule: callable ``step -> multiplier`` of ``lr`` (``bpfree.transforms.cosine``...).
        mode: ``"lean"`` or ``"batched"``.
        seed: run seed from which every direction is derived.
        chunk_size: most parameter sets stacked in one batched forward (memory bound).
    """

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
        super().__init__(params, {"lr": float(lr), "scale": 1.0})
        self.state["zo"] = {"step": 0, "seed": seed, "forward_passes": 0, "dropped": 0}
        self.state["transforms"] = [m.init(self._params()) for m in self._maps]
        self.state["config"] = self._config()
        self.last_stats: StepStats | None = None

    def add_param_group(self, param_group: dict) -> None:
        """torch's, plus checks of the group's own ``lr`` and ``scale`` and of its dtypes."""
        index = len(self.param_groups)
        for key, lowest in (("lr", 0.0), ("scale", None)):
            value = param_group.get(key, self.defaults[key])
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value < 0 or (lowest is None and value == 0)):
                bound = ">= 0" if lowest is not None else "> 0"
                raise ValueError(f"param group {index}: {key} must be a finite number {bound}, "
                                 f"got {value!r}")
        super().add_param_group(param_group)
        for p in self.param_groups[-1]["params"]:
            if not p.is_floating_point():
                raise TypeError(
                    f"ZOOptimizer updates floating-point tensors; got dtype {p.dtype}. Integer "
                    "(quantized) parameters need an integer update rule")

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
    def forward_passes(self) -> int:
        return self.state["zo"]["forward_passes"]

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
        zo = self.state["zo"]
        t = zo["step"]
        ctx = self.context(closure)
        params, names = ctx.params, ctx.names
        est = self.estimator.estimate(ctx)
        multiplier = self.schedule(t) if self.schedule is not None else 1.0
        applied = est.dropped < est.queries
        if applied:
            applied = self._apply(est, params, names, t, multiplier)
        zo["step"] = t + 1
        zo["forward_passes"] += int(est.forward_passes)
        zo["dropped"] += int(est.dropped)
        self.last_stats = StepStats(step=t, loss=est.loss, forward_passes=int(est.forward_passes),
                                    queries=est.queries, dropped=est.dropped, applied=applied,
                                    lr=self.param_groups[0]["lr"] * multiplier)
        return est.loss

    def _apply(self, est, params, names, t, multiplier) -> bool:
        lrs, infos = [], []
        i = 0
        for group in self.param_groups:
            for _ in group["params"]:
                info = TensorInfo(name=names[i], num_directions=est.num_directions[i],
                                  dim=est.dims[i], scale=float(group["scale"]), step=t)
                factor = 1.0
                for s in self._scales:
                    factor *= s.factor(info)
                lrs.append(group["lr"] * multiplier * factor)
                infos.append(info)
                i += 1
        if est.is_lazy and not self._maps:
            # Apply Σ_k w_k ξ_k straight from the seeds: no gradient buffer (MeZO / PMT Alg. 1).
            reach = sum(abs(w) for w in est.weights.tolist()) * self._direction_bound()
            self._check_reach(params, names, lrs, [reach] * len(params))
            for k, w in enumerate(est.weights.tolist()):
                if w == 0.0:
                    continue
                for j, p in enumerate(params):
                    add_direction_(p.data, self.distribution, est.seeds[k][j], -lrs[j] * w)
            return True
        grads = est.grads if not est.is_lazy else materialize(params, self.distribution,
                                                              est.weights, est.seeds)
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
