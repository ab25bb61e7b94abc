"""The PMT adaptation experiment (§4.1–4.3 at MNIST scale): every method on one corrupted task.

Shared by ``bpfree bench pmt`` (benchmarks/pmt.py) and usable on its own: given a pretrained
float model, its int8 twin from PTQ and a corrupted training / test split, :func:`adapt` runs
each method of Table 7 on a fresh copy with the same batches and cosine schedule, and records
test accuracy, forward passes (per sample, Table 5's unit), wall time and the loss curve.

Budgets: PMT dense trains ``epochs`` epochs with Q queries per layer; MeZO and DeepZero get the
same total number of forward passes (MeZO as more 2-forward steps, DeepZero as ``L*Q``
coordinates per step); PMT sparse spends its block-selection trials plus ``epochs`` epochs on
the chosen block; BP methods train ``epochs`` epochs (their forward count is N per step, plus
a backward pass the forward count does not show).

Learning rates: each BP method picks its rate from ``bp_lrs`` on a held-out fifth of the
training data (:func:`pick_lr`), because un-normalised BP gradients on heavily corrupted
inputs need a task-dependent rate. PMT dense and sparse pick theirs the same way from
``pmt_lrs`` (default: ``lr`` alone; GNS and QAS make one global rate serve every layer,
§3.1.2, but the best rate still moves with the task). MeZO uses ``lr``, DeepZero ``cge_lr``.
The rate searches are not counted in the forward passes, for BP and PMT alike.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from .baselines import DeepZeroCGE, FullTrainFP32, FullTrainINT8, MeZO, SparseBP
from ..harness import accuracy, fit, pick_lr
from .sparse import select_block, split_blocks
from .trainer import PMTConfig, PMTTrainer

#: ``int8-bp`` trains the fake-quant twin with QAS (MCUTrain's fix for real-quantized BP);
#: ``int8-bp-noqas`` without it, the plain INT8 FullTrain whose "remarkable accuracy drop"
#: PMT §4.2 reports.
METHODS = ("no-adaptation", "fp32-bp", "int8-bp", "int8-bp-noqas", "int8-sparse-bp", "mezo",
           "deepzero", "pmt-dense", "pmt-sparse")
BP_METHODS = ("fp32-bp", "int8-bp", "int8-bp-noqas", "int8-sparse-bp")


@dataclass(frozen=True)
class Setup:
    """Hyper-parameters of one adaptation run (the paper's: Q=100, 50 epochs, N=100, lr 0.01)."""

    queries: int = 5
    epochs: int = 2
    batch_size: int = 100
    lr: float = 0.1
    cge_lr: float = 0.05
    bp_lrs: tuple[float, ...] = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2)
    pmt_lrs: tuple[float, ...] | None = None
    seed: int = 0
    methods: tuple[str, ...] = METHODS
    curve_points: int = 60

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown method(s) {unknown}; choose from {METHODS}")
        if self.queries < 1 or self.epochs < 1 or self.batch_size < 1:
            raise ValueError("queries, epochs and batch_size must be >= 1")
        rates = (self.lr, self.cge_lr, *self.bp_lrs, *(self.pmt_lrs or ()))
        if not self.bp_lrs or self.pmt_lrs == () or not all(
                math.isfinite(r) and r > 0 for r in rates):
            raise ValueError(f"learning rates must be finite and > 0 (and bp_lrs, pmt_lrs "
                             f"non-empty), got lr={self.lr}, cge_lr={self.cge_lr}, "
                             f"bp_lrs={self.bp_lrs}, pmt_lrs={self.pmt_lrs}")

    @property
    def pmt_rates(self) -> tuple[float, ...]:
        """The PMT rates to choose from: ``pmt_lrs``, or ``(lr,)``."""
        return tuple(self.pmt_lrs) if self.pmt_lrs else (self.lr,)


@dataclass
class MethodResult:
    accuracy: float
    forwards: int
    seconds: float
    loss: list[float] = field(default_factory=list)
    curve_forwards: list[int] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def _thin(history, points: int) -> tuple[list[float], list[int]]:
    n = len(history.loss)
    if n == 0:
        return [], []
    stride = max(1, n // points)
    # Mean over each window: a readable curve from noisy ZO steps.
    loss = [sum(history.loss[i:i + stride]) / len(history.loss[i:i + stride])
            for i in range(0, n, stride)]
    fw = [history.forwards[min(i + stride, n) - 1] for i in range(0, n, stride)]
    return loss, fw


def _train(method, x, y, setup: Setup, epochs: int, lr: float, model, test) -> MethodResult:
    t0 = time.perf_counter()
    hist = fit(method, x, y, epochs=epochs, batch_size=setup.batch_size, lr=lr, seed=setup.seed)
    loss, fw = _thin(hist, setup.curve_points)
    return MethodResult(accuracy(model, *test), method.forwards, time.perf_counter() - t0,
                        loss, fw)


def _search_lr(make, x, y, setup: Setup, rates) -> tuple[float, dict]:
    """:func:`bpfree.harness.pick_lr` over ``rates``, timed: (rate, the result's ``extra``)."""
    t0 = time.perf_counter()
    lr, scores = pick_lr(make, x, y, rates, epochs=setup.epochs, batch_size=setup.batch_size,
                         seed=setup.seed)
    return lr, {"lr": lr, "lr_holdout_accuracy": scores,
                "lr_search_seconds": time.perf_counter() - t0}


def pmt_dense_forwards(num_layers: int, setup: Setup, n_train: int) -> int:
    """Forward passes of PMT dense: per step N (clean) + L*Q*N, over all steps."""
    return setup.epochs * n_train * (1 + num_layers * setup.queries)


def _bp_maker(name: str, float_model: nn.Module, qmodel: nn.Module, selection):
    def make():
        if name == "fp32-bp":
            f = copy.deepcopy(float_model)
            return FullTrainFP32(f), f
        q = copy.deepcopy(qmodel)
        if name in ("int8-bp", "int8-bp-noqas"):
            return FullTrainINT8(q, qas=name == "int8-bp"), q
        return SparseBP(q, trainable=selection.blocks[selection.chosen - 1], qas=True), q
    return make


def adapt(float_model: nn.Module, qmodel: nn.Module, train: tuple[torch.Tensor, torch.Tensor],
          test: tuple[torch.Tensor, torch.Tensor], setup: Setup = Setup()) -> dict:
    """Run ``setup.methods`` on copies of the models; returns ``{method: MethodResult}`` plus
    ``"selection"`` (the §3.3 block choice) when a sparse method ran."""
    x, y = train
    out: dict = {}
    example = x[:2]
    layers = PMTTrainer(qmodel, PMTConfig(), example=example).layers
    budget = pmt_dense_forwards(len(layers), setup, x.shape[0])
    selection = None

    def pmt(model, trainable=None):
        return PMTTrainer(model, PMTConfig(queries=setup.queries, seed=setup.seed),
                          example=example, trainable=trainable)

    if any(m in setup.methods for m in ("pmt-sparse", "int8-sparse-bp")):
        t0 = time.perf_counter()
        blocks = split_blocks(layers, 4)
        selection = select_block(qmodel, x, y, blocks=blocks, make_method=pmt, lr=setup.lr,
                                 batch_size=setup.batch_size, seed=setup.seed)
        out["selection"] = {**selection.as_dict(), "seconds": time.perf_counter() - t0}
    for name in setup.methods:
        q = copy.deepcopy(qmodel)
        if name == "no-adaptation":
            out[name] = MethodResult(accuracy(q, *test), 0, 0.0)
        elif name in BP_METHODS:
            make = _bp_maker(name, float_model, qmodel, selection)
            lr, search = _search_lr(make, x, y, setup, setup.bp_lrs)
            method, model = make()
            out[name] = _train(method, x, y, setup, setup.epochs, lr, model, test)
            out[name].extra = search
            if name == "int8-sparse-bp":
                out[name].extra["block"] = selection.chosen
        elif name == "mezo":
            steps_per_epoch = math.ceil(x.shape[0] / setup.batch_size)
            epochs = max(1, round(budget / (2 * x.shape[0])))
            method = MeZO(q, example, queries=1, seed=setup.seed, gns=True, qas=True,
                          monitor=False)
            out[name] = _train(method, x, y, setup, epochs, setup.lr, q, test)
            out[name].extra = {"epochs": epochs, "steps": epochs * steps_per_epoch}
        elif name == "deepzero":
            k = len(layers) * setup.queries
            method = DeepZeroCGE(q, example, coordinates=k, seed=setup.seed, qas=True)
            out[name] = _train(method, x, y, setup, setup.epochs, setup.cge_lr, q, test)
            out[name].extra = {"coordinates_per_step": k}
        elif name in ("pmt-dense", "pmt-sparse"):
            chosen = selection.blocks[selection.chosen - 1] if name == "pmt-sparse" else None

            def make(chosen=chosen):
                m = copy.deepcopy(qmodel)
                return pmt(m, chosen), m

            lr, search = _search_lr(make, x, y, setup, setup.pmt_rates)
            res = _train(pmt(q, chosen), x, y, setup, setup.epochs, lr, q, test)
            res.extra = search
            if name == "pmt-sparse":
                res.forwards += selection.forwards  # the trials are part of the cost (§3.3.1)
                res.extra.update(block=selection.chosen, selection_forwards=selection.forwards)
            out[name] = res
    return out


def ablation(qmodel: nn.Module, train, test, config: PMTConfig, *, epochs: int, lr: float,
             batch_size: int, seed: int = 0, curve_points: int = 60) -> MethodResult:
    """Train a copy of ``qmodel`` with one PMT configuration (Fig. 7 ablations)."""
    q = copy.deepcopy(qmodel)
    trainer = PMTTrainer(q, config, example=train[0][:2])
    setup = Setup(queries=config.queries, epochs=epochs, batch_size=batch_size, lr=lr,
                  seed=seed, curve_points=curve_points)
    res = _train(trainer, *train, setup, epochs, lr, q, test)
    res.extra = {"modes": dict(trainer.modes)}
    return res


def run_task(task: tuple[str, dict]) -> dict:
    """Process-pool entry point: ``("adapt" | "ablation" | "cosine", kwargs)``, one CPU thread.

    Results come back as plain dicts so that they pickle cheaply.
    """
    torch.set_num_threads(1)
    kind, kwargs = task
    if kind == "adapt":
        out = adapt(**kwargs)
        return {k: (v.as_dict() if isinstance(v, MethodResult) else v) for k, v in out.items()}
    if kind == "ablation":
        return ablation(**kwargs).as_dict()
    if kind == "cosine":
        from .diagnostic import gradient_cosines

        return gradient_cosines(**kwargs)
    raise ValueError(f"unknown task kind {kind!r}; expected 'adapt', 'ablation' or 'cosine'")
