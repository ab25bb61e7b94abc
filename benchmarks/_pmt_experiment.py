"""The PMT adaptation experiment (§4.1–4.3 at MNIST scale), as small picklable tasks.

Shared by ``bpfree bench pmt`` (benchmarks/pmt.py) and usable on its own. The protocol is the
paper's (§4.1): batch N = 100 (equivalent to batch 1 with accumulation over 100), vanilla SGD /
ZO-SGD without momentum, cosine decay, ``mu = 1``, Q = 100 queries per layer, 50 epochs — all
fields of :class:`Protocol`, which a run may scale down (the benchmark records what it used).

Every method is tuned the same way (:func:`sweep`): the 1000 training images of a corruption
are split once into a training part and a validation part (``Protocol.validation``, seeded);
each rate of the method's grid trains a fresh copy on the training part, the rate whose run
scores best on the validation part is chosen, and that run's accuracy on the untouched test
split is reported. Every grid has the same number of rates. Nothing is tuned on test data. A
sweep whose choice sits on an edge of its grid is widened one rate at a time past that edge,
up to :data:`MOST_PAST_EDGE` rates (:func:`widening_tasks`), the same rule for every method.

Tasks (:func:`run_task`, one CPU thread each, results as plain dicts):

* ``select``: the §3.3.1 block selection (one BP-free trial epoch per block, gain on the
  validation part);
* ``bp``: FP32 FullTrain, INT8 FullTrain with QAS (MCUTrain's scaling), INT8 FullTrain without
  QAS (PMT Table 7's INT8 FullTrain; its grid is in integer units, see :func:`noqas_rates`),
  or sparse INT8 BP on one block;
* ``pmt``: PMT on one fixed block (Table 4's rows; the selected one is Table 7's BP-free row)
  or dense on every layer;
* ``mezo`` / ``deepzero``: Table 5's baselines at the forward budget of PMT on the chosen block;
* ``same-selection``: Table 6: PMT, MeZO, DeepZero-0 or DeepZero-0.9 at one rate, trained
  on the block PMT's selection chose (:func:`task_same_selection`; ``bench pmt-t6``);
* ``ablation``: Fig. 7 (scaling and estimator ablations on four point-wise layers), one task
  per rate (its ``lr``), a sweep widened like the others (:data:`LR_KINDS`);
* ``cosine``: Fig. 5 (cosine of ZO estimates with BP gradients, one seed).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass

import torch
from torch import nn

from bpfree.bench.parallel import run_named_task
from bpfree.bench.rate_grid import rate_past_edge
from bpfree.harness import accuracy, fit, holdout_split, mean_loss
from bpfree.baselines import DeepZeroCGE, FullTrainFP32, FullTrainINT8, MeZO, SparseBP
from bpfree.pmt.diagnostic import gradient_cosines
from bpfree.pmt.sparse import select_block, split_blocks
from bpfree.pmt.trainer import PMTConfig, PMTTrainer

#: Method keys of Table 7 (``pmt-block-k`` rows are Table 4's fixed selections).
METHODS = ("no-adaptation", "fp32-bp", "int8-bp", "int8-bp-noqas", "int8-sparse-bp", "mezo",
           "deepzero", "pmt-dense", "pmt-sparse")
BP_METHODS = ("fp32-bp", "int8-bp", "int8-bp-noqas", "int8-sparse-bp")


@dataclass(frozen=True)
class Protocol:
    """PMT §4.1's training protocol; defaults are the paper's.

    Attributes:
        queries: Q per layer (paper: 100). zo_epochs / bp_epochs: epochs of the BP-free and
            BP methods (paper: 50 for both). batch_size: N (paper: 100, as accumulation).
        validation: fraction of the training images held out to choose rates and blocks.
        zo_lrs: rate grid of PMT, MeZO and DeepZero (float units: QAS makes one rate serve
            every layer). bp_lrs: rate grid of FP32 BP, INT8 BP with QAS and sparse BP.
        noqas_lsb: INT8 BP without QAS moves weights by ``lr * g`` LSB; its grid is given as
            the RMS step in LSB at the start of training (:func:`noqas_rates`).
        selection_epochs: epochs of each block-selection trial (paper: 1).
    """

    queries: int = 100
    zo_epochs: int = 50
    bp_epochs: int = 50
    batch_size: int = 100
    validation: float = 0.2
    zo_lrs: tuple[float, ...] = (0.01, 0.03)
    bp_lrs: tuple[float, ...] = (3e-3, 1e-2)
    noqas_lsb: tuple[float, ...] = (0.5, 2.0)
    blocks: int = 4
    selection_epochs: int = 1
    seed: int = 0
    curve_points: int = 60

    def __post_init__(self) -> None:
        for name in ("queries", "zo_epochs", "bp_epochs", "batch_size", "blocks",
                     "selection_epochs", "curve_points"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not 0.0 < self.validation < 1.0:
            raise ValueError(f"validation must lie in (0, 1), got {self.validation!r}")
        grids = {"zo_lrs": self.zo_lrs, "bp_lrs": self.bp_lrs, "noqas_lsb": self.noqas_lsb}
        for name, grid in grids.items():
            if not grid or not all(isinstance(r, (int, float)) and not isinstance(r, bool)
                                   and math.isfinite(r) and r > 0 for r in grid):
                raise ValueError(f"{name} must be a non-empty tuple of finite rates > 0, "
                                 f"got {grid!r}")
        if len({len(g) for g in grids.values()}) != 1:
            raise ValueError("every method gets the same search budget: zo_lrs, bp_lrs and "
                             f"noqas_lsb must have equal lengths, got {grids}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")

    def as_dict(self) -> dict:
        return asdict(self)


def split(train: tuple[torch.Tensor, torch.Tensor], protocol: Protocol):
    """(training part, validation part) of the corruption's training images (seeded)."""
    x, y = train
    tr, va = holdout_split(x.shape[0], protocol.validation, protocol.seed)
    return (x[tr], y[tr]), (x[va], y[va])


def _trained_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of what training changes: the integer tensors of a quantized model (its float
    scales are fixed), else the floating ones."""
    state = model.state_dict()
    integer = {k: v.clone() for k, v in state.items()
               if not v.is_floating_point() and v.dim() > 0}
    return integer or {k: v.clone() for k, v in state.items() if v.is_floating_point()}


def changed_values(before: dict[str, torch.Tensor], model: nn.Module) -> int:
    """How many stored values of ``model`` differ from the snapshot ``before``."""
    after = model.state_dict()
    return sum(int((after[k] != v).sum()) for k, v in before.items())


def _thin(loss: list[float], forwards: list[int], points: int) -> tuple[list[float], list[int]]:
    n = len(loss)
    if n == 0:
        return [], []
    stride = max(1, n // points)
    # Window means: a readable curve from noisy ZO steps.
    means = [sum(loss[i:i + stride]) / len(loss[i:i + stride]) for i in range(0, n, stride)]
    return means, [forwards[min(i + stride, n) - 1] for i in range(0, n, stride)]


def train_and_score(make, train, val, test, *, epochs: int, lr: float,
                    protocol: Protocol) -> dict:
    """Train ``make() -> (method, model)`` on ``train``; score it on ``val`` and ``test``.

    A run whose loss turns non-finite is reported as diverged (validation accuracy -1, so it
    is never chosen) instead of aborting the experiment.
    """
    method, model = make()
    before = _trained_state(model)
    t0 = time.perf_counter()
    diverged = False
    try:
        hist = fit(method, *train, epochs=epochs, batch_size=protocol.batch_size, lr=lr,
                   seed=protocol.seed)
        loss, fw = _thin(hist.loss, hist.forwards, protocol.curve_points)
    except FloatingPointError:
        diverged, loss, fw = True, [], []
    changed = changed_values(before, model)
    return {"lr": lr, "diverged": diverged,
            "validation_accuracy": -1.0 if diverged else accuracy(model, *val),
            "accuracy": accuracy(model, *test), "forwards": method.forwards,
            "seconds": time.perf_counter() - t0, "loss": loss, "curve_forwards": fw,
            "changed_values": changed, "first_loss": loss[0] if loss else None,
            "last_loss": loss[-1] if loss else None}


RUN_SUMMARY = ("lr", "validation_accuracy", "accuracy", "diverged", "changed_values",
               "first_loss", "last_loss", "forwards")


def choose(runs: list[dict]) -> dict:
    """The run with the best validation accuracy (ties to the smaller rate), with every run's
    summary: ``{"chosen": rate, "runs": [...], "grid_edge": bool, **chosen run}``.
    ``grid_edge`` says the choice sits at an end of a grid of three or more rates (then the
    grid should be widened)."""
    runs = sorted(runs, key=lambda r: r["lr"])
    best = max(runs, key=lambda r: (r["validation_accuracy"], -r["lr"]))
    edge = len(runs) >= 3 and best["lr"] in (runs[0]["lr"], runs[-1]["lr"])
    return {**best, "chosen": best["lr"], "grid_edge": edge,
            "runs": [{k: r.get(k) for k in RUN_SUMMARY} for r in runs]}


def sweep(make, train, val, test, *, epochs: int, rates, protocol: Protocol,
          grid_index: int | None = None) -> dict:
    """Every rate of ``rates`` (:func:`train_and_score`), or only ``rates[grid_index]`` (one
    task per rate, so that a resumed full run loses at most one rate's run; :func:`merge`
    joins them), and the chosen one (:func:`choose`). A task past the grid's edge passes its
    one rate as ``rates`` (:func:`widening_tasks`)."""
    if grid_index is not None:
        rates = [rates[grid_index]]
    return choose([train_and_score(make, train, val, test, epochs=epochs, lr=r,
                                   protocol=protocol) for r in rates])


def merge(parts: list[dict]) -> dict:
    """One sweep from its per-rate tasks (each a :func:`sweep` with ``grid_index``): the chosen
    run over all of them, and the task-level extras of the first part that has each."""
    runs = []
    for part in parts:
        chosen = {k: v for k, v in part.items() if k not in ("chosen", "runs", "grid_edge")}
        runs.append(chosen)
    out = choose(runs)
    for part in parts:
        for key, value in part.items():
            out.setdefault(key, value)
    out["task_seconds"] = sum(p.get("task_seconds") or 0.0 for p in parts)
    return out


def merge_grid(results: dict, is_sweep_part, grid_size: int | None = None) -> dict:
    """Join the per-rate tasks of every sweep (keys ``(..., grid index)`` for which
    ``is_sweep_part(key)`` holds) into one result keyed without the index (:func:`merge`);
    every other result is kept as it is. ``grid_size``: a sweep with fewer finished rates is
    left out (a partial report must not choose a rate from part of its grid). The parts are
    merged base grid first (index 0 up), then the rates past its top, then those below."""
    out, sweeps = {}, {}
    for key, value in results.items():
        if is_sweep_part(key):
            sweeps.setdefault(key[:-1], []).append((key[-1], value))
        else:
            out[key] = value
    out.update({key: merge([v for _, v in sorted(parts, key=lambda p: (p[0] < 0, p[0]))])
                for key, parts in sweeps.items()
                if grid_size is None or len(parts) >= grid_size})
    return out


#: Rates a sweep may add past each edge of its grid (:func:`widening_tasks`). The paper
#: gives no grids; two steps of the grid's own ratio (x9 for a half-decade grid) bracket
#: every choice the last runs made, and keep a widened PMT sweep under 1.5x its base cost.
MOST_PAST_EDGE = 2
#: The task kinds that are per-rate parts of a sweep (keys ``(kind, ..., grid index)``).
SWEEP_KINDS = ("bp", "pmt", "pmt-dense", "mezo", "deepzero", "ablation")
#: The sweep kinds whose per-rate task names its rate as ``lr`` (Fig. 7's ablations), not as
#: a ``grid_index`` into its protocol's grid; a rate past an edge is then the same task with
#: another ``lr``, rather than the task with ``rates=(r,)``.
LR_KINDS = ("ablation",)


def grid_of(kind: str, kwargs: dict) -> str:
    """The :class:`Protocol` grid a sweep task draws its rates from."""
    if kind == "bp":
        return "noqas_lsb" if kwargs.get("method") == "int8-bp-noqas" else "bp_lrs"
    return "zo_lrs"


def widening_tasks(results: dict, tasks: dict, most: int = MOST_PAST_EDGE,
                   is_sweep_part=lambda key: key[0] in SWEEP_KINDS) -> dict:
    """The next rate of every finished sweep whose choice sits on an edge of its grid.

    ``tasks``: every task so far; those whose key ``is_sweep_part`` (default: bench pmt's
    keys ``(kind, ..., position)``) are per-rate parts of a sweep, keyed by position last:
    the base grid's positions are ``0 .. n-1`` (of its task's ``protocol``), rates past its
    top ``n, n+1, ...`` and below its bottom ``-1, -2, ...``; ``results``: the finished
    ones. For a sweep whose every task finished and whose chosen rate (:func:`choose`, over
    all its tasks) is its smallest or largest, the task one grid step further
    (:func:`~bpfree.bench.rate_grid.rate_past_edge`, in the grid's own units: LSB per step
    for INT8 BP without QAS) at the next position, unless ``most`` rates were already added
    on that side (a task of :data:`LR_KINDS` names its rate as ``lr``, at every position).
    Returns ``{key: (kind, kwargs)}``.
    """
    sweeps: dict = {}
    for key, task in tasks.items():
        if is_sweep_part(key):
            sweeps.setdefault(key[:-1], {})[key[-1]] = task
    out = {}
    for name, parts in sweeps.items():
        if 0 not in parts or not all((*name, pos) in results for pos in parts):
            continue  # unfinished (or, in a partial report, not reported)
        kind, base = parts[0]
        grid = getattr(base["protocol"], grid_of(kind, base))
        values = {pos: _rate_of(task, pos, grid) for pos, task in parts.items()}
        runs = {pos: results[(*name, pos)] for pos in parts}
        chosen = choose(list(runs.values()))["chosen"]
        pos = next(p for p, r in runs.items() if r["lr"] == chosen)
        rate = rate_past_edge(values.values(), values[pos], digits=3)
        if rate is None:
            continue
        top = values[pos] == max(values.values())
        if sum(p >= len(grid) if top else p < 0 for p in parts) >= most:
            continue
        kwargs = {k: v for k, v in base.items() if k != "grid_index"}
        out[(*name, max(parts) + 1 if top else min(parts) - 1)] = (
            kind, {**kwargs, "lr": rate} if kind in LR_KINDS else {**kwargs, "rates": (rate,)})
    return out


def _rate_of(task: tuple[str, dict], position: int, grid) -> float:
    """The one rate of a sweep's per-rate ``task`` at ``position`` (see :func:`widening_tasks`)."""
    kind, kwargs = task
    if kind in LR_KINDS:
        return kwargs["lr"]
    return grid[position] if 0 <= position < len(grid) else kwargs["rates"][0]


def widen(run, tasks: dict, results: dict, most: int = MOST_PAST_EDGE,
          is_sweep_part=lambda key: key[0] in SWEEP_KINDS) -> None:
    """Widen every finished sweep of ``tasks`` whose choice sits on an edge, one rate per
    round (:func:`widening_tasks`), until none does or ``most`` rates were added past it:
    ``run(new_tasks) -> results`` trains each round; ``tasks`` and ``results`` grow in
    place. A round's task that ``run`` leaves out (a partial report) ends its sweep's
    widening."""
    for _ in range(most):
        wider = {k: t for k, t in widening_tasks(results, tasks, most, is_sweep_part).items()
                 if k not in tasks}
        if not wider:
            return
        tasks.update(wider)
        results.update(run(wider))


def added_rates(tasks: dict) -> dict[tuple, list[float]]:
    """Sweep (its key without the position) -> the rates added past its grid's edges: the
    tasks with ``rates``, and those of :data:`LR_KINDS` at a position outside their grid."""
    added: dict[tuple, list[float]] = {}
    for key, (kind, kwargs) in tasks.items():
        if "rates" in kwargs:
            added.setdefault(key[:-1], []).extend(kwargs["rates"])
        elif kind in LR_KINDS and not 0 <= key[-1] < len(
                getattr(kwargs["protocol"], grid_of(kind, kwargs))):
            added.setdefault(key[:-1], []).append(kwargs["lr"])
    return added


def noqas_rates(qmodel: nn.Module, x: torch.Tensor, y: torch.Tensor,
                lsb: tuple[float, ...]) -> tuple[tuple[float, ...], float]:
    """Integer-unit rates for INT8 BP without QAS: ``lsb[i] / rms(g)``.

    Without QAS the step is ``round(lr * dL/dW̄)`` in LSB, and ``dL/dW̄`` of an int8 weight is
    tiny (``s_w`` times the float gradient): float rates round every step to zero. The grid is
    set from the RMS integer-unit gradient of the first training batch, so that the RMS weight
    moves ``lsb`` LSB per step at the start. Returns (rates, rms).
    """
    method = FullTrainINT8(copy.deepcopy(qmodel), qas=False)
    grads, _ = method.gradients(x, y)
    flat = torch.cat([g.weight.reshape(-1) for g in grads.values()])
    rms = float(flat.pow(2).mean().sqrt())
    if not math.isfinite(rms) or rms <= 0:
        raise FloatingPointError(f"INT8 BP gradient RMS is {rms}; cannot set its rate grid")
    return tuple(s / rms for s in lsb), rms


def blocks_of(qmodel: nn.Module, example: torch.Tensor, protocol: Protocol) -> list[list[str]]:
    """Table 4's four blocks: contiguous, cut between stages (:func:`split_blocks`)."""
    return split_blocks(PMTTrainer(qmodel, PMTConfig(), example=example).layers,
                        protocol.blocks)


def _pmt_maker(qmodel, example, protocol, trainable=None, config: PMTConfig | None = None):
    config = config or PMTConfig(queries=protocol.queries, seed=protocol.seed)

    def make():
        m = copy.deepcopy(qmodel)
        return PMTTrainer(m, config, example=example, trainable=trainable), m
    return make


def task_select(qmodel, train, protocol: Protocol) -> dict:
    """§3.3.1: one BP-free trial per block, the largest validation gain wins."""
    x, y = train
    blocks = blocks_of(qmodel, x[:2], protocol)
    t0 = time.perf_counter()

    def make_method(model, names):
        return PMTTrainer(model, PMTConfig(queries=protocol.queries, seed=protocol.seed),
                          example=x[:2], trainable=names)

    sel = select_block(qmodel, x, y, blocks=blocks, make_method=make_method,
                       lr=max(protocol.zo_lrs), batch_size=protocol.batch_size,
                       holdout=protocol.validation, epochs=protocol.selection_epochs,
                       seed=protocol.seed)
    return {**sel.as_dict(), "seconds": time.perf_counter() - t0}


def task_bp(method: str, float_model, qmodel, train, test, protocol: Protocol,
            block: list[str] | None = None, grid_index: int | None = None,
            rates: tuple[float, ...] | None = None) -> dict:
    """One BP baseline, its rate chosen on the validation part. ``rates``: train these
    instead of the protocol's grid (in its units: LSB per step without QAS; a sweep widened
    past its edge, :func:`widening_tasks`)."""
    tr, va = split(train, protocol)
    extra: dict = {}
    if method == "fp32-bp":
        def make():
            f = copy.deepcopy(float_model)
            return FullTrainFP32(f), f
        grid = protocol.bp_lrs
    elif method in ("int8-bp", "int8-bp-noqas"):
        qas = method == "int8-bp"

        def make():
            q = copy.deepcopy(qmodel)
            return FullTrainINT8(q, qas=qas), q
        grid = protocol.bp_lrs if qas else protocol.noqas_lsb
    elif method == "int8-sparse-bp":
        if not block:
            raise ValueError("int8-sparse-bp needs the block to train")

        def make():
            q = copy.deepcopy(qmodel)
            # MCUTrain's own update (tiny-training's SGDScale): an unrounded copy of the
            # trained weights, rounded only into the int8 model, as bench mcunet's row does.
            return SparseBP(q, trainable=block, qas=True, latent_weights=True), q
        grid = protocol.bp_lrs
        extra = {"block_layers": list(block), "latent_weights": True}
    else:
        raise ValueError(f"unknown BP method {method!r}; choose from {BP_METHODS}")
    grid = grid if rates is None else rates
    if method == "int8-bp-noqas":
        lsb = grid
        grid, rms = noqas_rates(qmodel, tr[0][:protocol.batch_size],
                                tr[1][:protocol.batch_size], tuple(lsb))
        extra = {"gradient_rms_integer_units": rms,
                 ("lsb_grid" if rates is None else "lsb_past_edge"): list(lsb)}
    out = sweep(make, tr, va, test, epochs=protocol.bp_epochs, rates=grid, protocol=protocol,
                grid_index=grid_index)
    out.update(extra)
    return out


def task_pmt(qmodel, train, test, protocol: Protocol, block: list[str] | None = None,
             grid_index: int | None = None, rates: tuple[float, ...] | None = None) -> dict:
    """PMT on one block (sparse, Table 4 / 7) or on every layer (``block=None``, dense).
    ``rates``: instead of ``protocol.zo_lrs`` (:func:`widening_tasks`)."""
    tr, va = split(train, protocol)
    make = _pmt_maker(qmodel, tr[0][:2], protocol, trainable=block)
    out = sweep(make, tr, va, test, epochs=protocol.zo_epochs,
                rates=protocol.zo_lrs if rates is None else rates,
                protocol=protocol, grid_index=grid_index)
    out["layers"] = len(block) if block else len(
        PMTTrainer(qmodel, PMTConfig(), example=tr[0][:2]).layers)
    return out


def pmt_forwards(num_layers: int, protocol: Protocol, n_train: int) -> int:
    """Per-sample forward passes of PMT on ``num_layers`` layers: N * (1 + L * Q) per step."""
    return protocol.zo_epochs * n_train * (1 + num_layers * protocol.queries)


def task_mezo(qmodel, train, test, protocol: Protocol, budget_layers: int,
              grid_index: int | None = None, rates: tuple[float, ...] | None = None) -> dict:
    """MeZO (model-wise WP on every layer, GNS + QAS) at PMT's forward budget on a block of
    ``budget_layers`` layers (Table 5): the same per-sample forwards, N (1 + L Q) per step.
    ``rates``: instead of ``protocol.zo_lrs`` (:func:`widening_tasks`)."""
    tr, va = split(train, protocol)
    budget = pmt_forwards(budget_layers, protocol, tr[0].shape[0])
    epochs = max(1, round(budget / (2 * tr[0].shape[0])))

    def make():
        q = copy.deepcopy(qmodel)
        return MeZO(q, tr[0][:2], queries=1, seed=protocol.seed, gns=True, qas=True,
                    monitor=False), q
    out = sweep(make, tr, va, test, epochs=epochs,
                rates=protocol.zo_lrs if rates is None else rates, protocol=protocol,
                grid_index=grid_index)
    out.update(epochs=epochs, budget=budget)
    return out


def task_deepzero(qmodel, train, test, protocol: Protocol, budget_layers: int,
                  grid_index: int | None = None,
                  rates: tuple[float, ...] | None = None) -> dict:
    """DeepZero CGE with random sparsity on every layer: ``L * Q`` coordinates per step, i.e.
    PMT's forwards per step on a block of ``budget_layers`` layers. The paper's DeepZero row
    ran coordinate-wise estimation at 49,457 forwards per iteration (Table 5: 2.47e9 in all,
    100x PMT's); at PMT's budget each step estimates ``L * Q`` random coordinates instead.
    ``rates``: instead of ``protocol.zo_lrs`` (:func:`widening_tasks`)."""
    tr, va = split(train, protocol)
    k = budget_layers * protocol.queries

    def make():
        q = copy.deepcopy(qmodel)
        return DeepZeroCGE(q, tr[0][:2], coordinates=k, seed=protocol.seed, qas=True), q
    out = sweep(make, tr, va, test, epochs=protocol.zo_epochs,
                rates=protocol.zo_lrs if rates is None else rates,
                protocol=protocol, grid_index=grid_index)
    out["coordinates_per_step"] = k
    return out


#: Table 6's methods, all trained on PMT's selected block (:func:`task_same_selection`):
#: method -> DeepZero's gradient sparsity (None: not a CGE method).
SAME_SELECTION = {"mezo": None, "deepzero-0": 0.0, "deepzero-0.9": 0.9, "pmt": None}


def same_selection_epochs(method: str, protocol: Protocol, block_layers: int) -> int:
    """Epochs of a Table 6 method on a block of ``block_layers`` layers.

    PMT, DeepZero-0 and DeepZero-0.9 train ``protocol.zo_epochs`` (Table 6: 50 for all three;
    DeepZero's forwards per step follow from the block's weight count). MeZO gets PMT's total
    forwards, as in Table 6 (2.0E+07 both): PMT spends ``1 + L Q`` forwards per sample per
    step, MeZO 2, so MeZO trains ``zo_epochs (1 + L Q) / 2`` epochs (Table 6: 10,000 = 50 x
    400 / 2)."""
    if method not in SAME_SELECTION:
        raise ValueError(f"unknown Table 6 method {method!r}; choose from {list(SAME_SELECTION)}")
    if method == "mezo":
        return max(1, round(protocol.zo_epochs * (1 + block_layers * protocol.queries) / 2))
    return protocol.zo_epochs


def _same_selection_maker(method: str, qmodel, example, protocol: Protocol, block: list[str]):
    if method == "pmt":
        return _pmt_maker(qmodel, example, protocol, trainable=block)
    sparsity = SAME_SELECTION[method]

    def make():
        q = copy.deepcopy(qmodel)
        if method == "mezo":  # as bench pmt's MeZO (GNS + QAS), on the block only
            return MeZO(q, example, queries=1, seed=protocol.seed, gns=True, qas=True,
                        trainable=block, monitor=False), q
        return DeepZeroCGE(q, example, sparsity=sparsity or None, seed=protocol.seed, qas=True,
                           trainable=block), q
    return make


def task_same_selection(method: str, qmodel, train, test, protocol: Protocol,
                        block: list[str], lr: float) -> dict:
    """Table 6: one method at rate ``lr`` on PMT's selected ``block`` (its epochs:
    :func:`same_selection_epochs`), scored on the validation part and the test split.

    Besides :func:`train_and_score`'s fields it keeps the mean training loss (the clean loss
    over the whole training part, the same for every method: MeZO's curve is a two-point
    proxy) before and after training, the epochs and the forwards per sample per step."""
    if not block:
        raise ValueError("Table 6 trains PMT's selected block: give its layer names")
    tr, va = split(train, protocol)
    epochs = same_selection_epochs(method, protocol, len(block))
    make = _same_selection_maker(method, qmodel, tr[0][:2], protocol, list(block))
    trained = {}

    def make_and_keep():
        method_, model = make()
        trained["model"] = model
        return method_, model
    out = train_and_score(make_and_keep, tr, va, test, epochs=epochs, lr=lr, protocol=protocol)
    n = tr[0].shape[0]
    out.update(method=method, epochs=epochs, block_layers=list(block),
               train_loss_before=mean_loss(qmodel, *tr),
               train_loss_after=mean_loss(trained["model"], *tr),
               forwards_per_step=out["forwards"] / (epochs * n))
    return out


def task_ablation(qmodel, train, test, protocol: Protocol, config: PMTConfig,
                  trainable: list[str], epochs: int, lr: float) -> dict:
    """One Fig. 7 configuration at one rate on ``trainable`` (scored on the validation part)."""
    tr, va = split(train, protocol)
    make = _pmt_maker(qmodel, tr[0][:2], protocol, trainable=trainable, config=config)
    out = train_and_score(make, tr, va, test, epochs=epochs, lr=lr, protocol=protocol)
    out["modes"] = PMTTrainer(qmodel, config, example=tr[0][:2], trainable=trainable).modes
    return out


def task_no_adaptation(qmodel, test) -> dict:
    """Table 7's No Adaptation row: the deployed model on the corrupted test split."""
    return {"accuracy": accuracy(qmodel, *test), "forwards": 0}


#: Task kinds of :func:`run_task`.
TASKS = {"select": task_select, "bp": task_bp, "pmt": task_pmt, "mezo": task_mezo,
         "deepzero": task_deepzero, "same-selection": task_same_selection,
         "ablation": task_ablation, "cosine": gradient_cosines,
         "no-adaptation": task_no_adaptation}


def run_task(task: tuple[str, dict]) -> dict:
    """Process-pool entry point: ``(kind, kwargs)`` on one CPU thread; returns a plain dict."""
    return run_named_task(TASKS, task, seconds_key="task_seconds")
