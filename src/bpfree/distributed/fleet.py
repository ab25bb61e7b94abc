"""One fleet run: the demo's drift adaptation, trained by W data-parallel workers.

``method="pmt"``: PMT (layer-wise, synchronized; WP, NP or adaptive) on the demo's INT8
64-64-10 MLP (:func:`bpfree.demo.drifted_digits`). ``method="zo"``: float RGE with
:class:`~bpfree.optim.ZOOptimizer` on the demo's float model. Every worker walks the same
seeded batches (:func:`bpfree.harness.batches`) and takes its contiguous shard of each
(``tensor_split``), so W workers see exactly the samples one process sees.
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
import time
from dataclasses import asdict, dataclass

import torch

from ..demo import accuracy_fraction, drifted_digits
from ..estimators import rge
from ..harness import batches, cosine_lr
from ..objective import Objective
from ..optim import ZOOptimizer
from ..pmt import PMTConfig, PMTTrainer, fit
from .comm import SingleProcess
from .pmt import DataParallelPMT
from .zo import DataParallelZO

METHODS = ("pmt", "zo")
PERTURBATIONS = ("wp", "np", "adaptive")


@dataclass(frozen=True)
class FleetOptions:
    """What every worker must agree on. ``die_at_step`` is a fault-injection hook for tests:
    the last worker exits abruptly before that step."""

    method: str = "pmt"
    perturbation: str = "wp"
    seed: int = 0
    epochs: int = 1
    batch_size: int = 64
    queries: int = 10
    lr: float = 0.3
    zo_lr: float = 0.02
    zo_mu: float = 1e-3
    noise: float = 0.2
    contrast: float = 0.5
    brightness: float = 0.3
    die_at_step: int | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.perturbation not in PERTURBATIONS:
            raise ValueError(f"perturbation must be one of {PERTURBATIONS}, "
                             f"got {self.perturbation!r}")
        for name in ("epochs", "batch_size", "queries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("lr", "zo_lr", "zo_mu"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")

    def as_dict(self) -> dict:
        return asdict(self)


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over every state tensor's dtype, shape and raw bytes, in sorted name order."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().contiguous().cpu()
        h.update(f"{name}{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def build_setup(options: FleetOptions) -> dict:
    """The factory model and drifted digits of the demo (BP pretraining happens here once)."""
    s = drifted_digits(seed=options.seed, noise=options.noise, contrast=options.contrast,
                       brightness=options.brightness)
    model = s["qmodel"] if options.method == "pmt" else s["float_model"]
    return {"model": model, "x": s["xc_tr"], "y": s["y_tr"], "x_test": s["xc_te"],
            "y_test": s["y_te"], "float_model": copy.deepcopy(s["float_model"])}


def trainable_values(setup: dict) -> int:
    """d: the values BP's data-parallel all-reduce sums each step (the float model's)."""
    return sum(p.numel() for p in setup["float_model"].parameters())


def _pmt_method(model, options: FleetOptions, example, comm):
    config = PMTConfig(queries=options.queries, perturbation=options.perturbation,
                       seed=options.seed)
    return DataParallelPMT(model, config, example=example, comm=comm)


def _zo_method(model, options: FleetOptions, comm):
    opt = ZOOptimizer(list(model.named_parameters()), lr=options.zo_lr,
                      estimator=rge(num_queries=options.queries, mu=options.zo_mu),
                      seed=options.seed)
    return DataParallelZO(opt, comm)


def train(setup: dict, options: FleetOptions, comm=None) -> dict:
    """Train ``setup["model"]`` in place as worker ``comm.rank`` of ``comm.world_size``.

    Returns this worker's digest, accuracies, step count, bytes and wall time per step.
    """
    comm = comm or SingleProcess()
    model, x, y = setup["model"], setup["x"], setup["y"]
    acc_before = accuracy_fraction(model, setup["x_test"], setup["y_test"])
    n = x.shape[0]
    total = options.epochs * math.ceil(n / options.batch_size)
    if options.method == "pmt":
        method = _pmt_method(model, options, x[:1], comm)
    else:
        method = _zo_method(model, options, comm)
    start = time.perf_counter()
    steps = 0
    for step, idx in enumerate(batches(n, options.batch_size, options.epochs, options.seed + 3)):
        if options.die_at_step == step and comm.rank == comm.world_size - 1:
            os._exit(3)  # fault injection: vanish without closing the process group
        shards = idx.tensor_split(comm.world_size)
        mine = shards[comm.rank]
        offset = sum(len(s) for s in shards[:comm.rank])
        if options.method == "pmt":
            rate = cosine_lr(options.lr, step, total)
            method.step(x[mine], y[mine], rate, offset=offset, total=len(idx))
        else:
            if len(mine) == 0:
                raise ValueError(f"batch of {len(idx)} samples split over {comm.world_size} "
                                 "workers leaves one empty; use a larger --batch-size")
            method.step(Objective(model, x[mine], y[mine]))
        steps += 1
    seconds = time.perf_counter() - start
    out = {"rank": comm.rank, "weights_sha256": weights_digest(model), "steps": steps,
           "acc_before": acc_before,
           "acc_after": accuracy_fraction(model, setup["x_test"], setup["y_test"]),
           "bytes_per_step": comm.bytes_reduced / max(steps, 1),
           "collectives_per_step": comm.collectives / max(steps, 1),
           "seconds": seconds, "seconds_per_step": seconds / max(steps, 1)}
    if options.method == "pmt":
        out["bytes_by_kind"] = method.bytes_per_step()
        out["measured_bytes_per_step_by_collective"] = {
            what: b / max(steps, 1) for what, b in comm.bytes_by_what.items()}
        out["modes"] = {name: mode.upper() for name, mode in method.trainer.modes.items()}
        out["wp_layers"], out["np_layers"] = len(method.wp), len(method.np)
        out["np_dense_values"] = sum(l.d_w + l.module.bias.numel() for l in method.np)
    return out


def pmt_trainer_digest(setup: dict, options: FleetOptions) -> str:
    """The weights' digest after plain :class:`bpfree.pmt.PMTTrainer` (float mean of the
    loss differences, not the fixed-point sum) on the same batches: a cross-check."""
    model = copy.deepcopy(setup["model"])
    config = PMTConfig(queries=options.queries, perturbation=options.perturbation,
                       seed=options.seed)
    trainer = PMTTrainer(model, config, example=setup["x"][:1])
    fit(trainer, setup["x"], setup["y"], epochs=options.epochs, batch_size=options.batch_size,
        lr=options.lr, seed=options.seed + 3)
    return weights_digest(model)
