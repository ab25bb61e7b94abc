"""One training harness for every method: epochs, schedules, validation, budget accounting.

Every method exposes ``step(x, y, lr) -> dict`` (with at least ``"loss"``) and a ``forwards``
counter of per-sample forward passes (Table 5's unit): the :class:`Method` protocol. So
:func:`fit` runs any of them on the same data, the same batches and the same schedule, and
records the same :class:`History`. This is the trainer level; the optimizer level below it is
:class:`bpfree.optim.ZOOptimizer` (``step(closure)``, for your own loop), which
:class:`bpfree.optim.ZOMethod` turns into a Method.
"""

from __future__ import annotations

import copy
import math
import numbers
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from .checkpoint.resume import next_fit_snapshot
from .checkpoint.rng import capture_rng_state, restore_rng_state
from .progress import logger, progress_bar
from .plotting import pyplot, save_figure  # matplotlib itself loads only to draw

log = logger.getChild("harness")


class Method(Protocol):
    """The trainer-level protocol every method follows and :func:`fit` runs.

    ``step(x, y, lr)`` trains on one batch at learning rate ``lr`` and returns a dict with at
    least ``"loss"`` (the batch loss, float); ``forwards`` counts per-sample forward passes
    (PMT Table 5's unit). Optional attributes :func:`fit` reads when present: ``model`` (what
    validation scores; else the method itself is called), ``batch_forwards`` (whole-batch
    passes, TT-ZO's "queries") and ``phase`` / ``name`` (recorded per epoch). A
    :class:`~bpfree.optim.ZOOptimizer` becomes a Method through :class:`bpfree.optim.ZOMethod`.
    """

    forwards: int

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict: ...


@dataclass
class History:
    """What :func:`fit` records: per step, per epoch, and how the run ended.

    Per step (one entry per completed step): ``loss`` (the step's batch loss), ``lr``,
    ``forwards`` (cumulative per-sample forward passes). Per epoch (parallel lists):
    ``epoch_loss`` (mean of the epoch's finite step losses, NaN if none), ``epoch_lr`` (the
    rate of the epoch's first step), ``epoch_forwards`` / ``epoch_batch_forwards``
    (cumulative counts at the epoch's end; the latter None for methods that do not count
    whole-batch passes), ``epoch_phase`` (the method's ``phase``, else its ``name``, during the
    epoch) and ``val_acc`` (%, only with validation data). ``best_epoch``: the epoch whose
    weights ``keep_best`` restored; ``diverged``: why ``on_nonfinite="stop"`` ended the run;
    ``switch_epoch``: the first epoch of a staged method's second phase (TT-ZO's hybrid).
    """

    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    forwards: list[int] = field(default_factory=list)
    epoch_loss: list[float] = field(default_factory=list)
    epoch_lr: list[float] = field(default_factory=list)
    epoch_forwards: list[int] = field(default_factory=list)
    epoch_batch_forwards: list[int | None] = field(default_factory=list)
    epoch_phase: list[str | None] = field(default_factory=list)
    val_acc: list[float] = field(default_factory=list)
    best_epoch: int | None = None
    diverged: str | None = None
    switch_epoch: int | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)

    def plot(self, path: str | Path | None = None):
        """Draw the curves with matplotlib: the step loss (and each epoch's mean) against
        cumulative forward passes, the learning rate per step, and the validation accuracy
        per epoch when there is one. Returns the figure; with ``path`` it is also written
        as PNG (parents created) and closed."""
        plt = pyplot()
        panels = 3 if self.val_acc else 2
        fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.4))
        axes[0].plot(self.forwards, self.loss, lw=0.8, alpha=0.6, label="step")
        if self.epoch_forwards:
            axes[0].plot(self.epoch_forwards, self.epoch_loss, "o-", label="epoch mean")
        axes[0].set(xlabel="forward passes (per sample)", ylabel="loss", title="loss")
        axes[0].legend()
        axes[1].plot(range(len(self.lr)), self.lr)
        axes[1].set(xlabel="step", ylabel="learning rate", title="learning rate")
        if self.val_acc:
            axes[2].plot(range(len(self.val_acc)), self.val_acc, "o-")
            if self.best_epoch is not None:
                axes[2].axvline(self.best_epoch, ls="--", c="gray", label="kept (best)")
                axes[2].legend()
            axes[2].set(xlabel="epoch", ylabel="accuracy (%)", title="validation")
        if path is not None:
            save_figure(fig, path)
        return fig


def check_learning_rate(lr) -> float:
    """``lr`` as a float; a clear ValueError unless it is a finite real number >= 0."""
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not math.isfinite(lr) \
            or lr < 0:
        raise ValueError(f"learning rate must be a finite number >= 0, got {lr!r}")
    return float(lr)


def check_batch(x: torch.Tensor, y: torch.Tensor) -> None:
    """A clear ValueError unless inputs and labels hold the same non-zero number of samples,
    integer labels are >= 0 (cross-entropy silently skips -100) and float targets finite."""
    if x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"x and y must hold the same non-zero number of samples, got "
                         f"{x.shape[0]} and {y.shape[0]}")
    if not isinstance(y, torch.Tensor):
        return
    if y.dtype == torch.bool:
        raise ValueError("labels y must be integer class indices, got a bool tensor")
    if y.is_floating_point():
        bad = (~torch.isfinite(y)).nonzero()
        if len(bad):
            raise ValueError(f"y holds a non-finite value {y[tuple(bad[0])].item()} at index "
                             f"{tuple(bad[0].tolist())}")
    elif not y.is_complex():
        bad = (y < 0).nonzero()
        if len(bad):
            raise ValueError(f"labels must be class indices >= 0, got {y[tuple(bad[0])].item()} "
                             f"at index {tuple(bad[0].tolist())}")


def _label_error(err: Exception, y: torch.Tensor) -> ValueError | None:
    """A ValueError naming the labels for torch's own errors about them, else None."""
    text = str(err)
    if isinstance(err, IndexError) and "out of bounds" in text:
        return ValueError(f"a label is out of range for the model's outputs ({text.strip()}); "
                          f"labels here run from {int(y.min())} to {int(y.max())}")
    if isinstance(err, RuntimeError) and ("expected scalar type Long" in text
                                          or "expected target dtype" in text):
        return ValueError(f"labels must be integer class indices (int64), got dtype {y.dtype}")
    return None


def cosine_lr(base: float, step: int, total: int) -> float:
    """Cosine decay from ``base`` to 0 over ``total`` steps (§4.1)."""
    return base * 0.5 * (1.0 + math.cos(math.pi * min(step, total) / max(total, 1)))


def batches(n: int, batch_size: int, epochs: int, seed: int):
    """Shuffled index batches, reproducible from ``seed``; the last partial batch is kept."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g)
        for lo in range(0, n, batch_size):
            yield perm[lo:lo + batch_size]


def _check_fit_options(schedule, schedule_unit, on_nonfinite, x_val, y_val, keep_best,
                       max_steps_per_epoch) -> None:
    if isinstance(schedule, str):
        if schedule not in ("cosine", "constant"):
            raise ValueError(f"schedule must be 'cosine', 'constant' or a callable "
                             f"step -> multiplier, got {schedule!r}")
    elif not callable(schedule):
        raise ValueError(f"schedule must be 'cosine', 'constant' or a callable "
                         f"step -> multiplier, got {schedule!r}")
    if schedule_unit not in ("step", "epoch"):
        raise ValueError(f"schedule_unit must be 'step' or 'epoch', got {schedule_unit!r}")
    if on_nonfinite not in ("raise", "stop"):
        raise ValueError(f"on_nonfinite must be 'raise' or 'stop', got {on_nonfinite!r}")
    if (x_val is None) != (y_val is None):
        raise ValueError("validation needs both x_val and y_val")
    if keep_best and x_val is None:
        raise ValueError("keep_best needs a validation split (x_val, y_val)")
    if max_steps_per_epoch is not None and (isinstance(max_steps_per_epoch, bool) or not
                                            isinstance(max_steps_per_epoch, numbers.Integral)
                                            or max_steps_per_epoch < 1):
        raise ValueError(f"max_steps_per_epoch must be an int >= 1 or None, got "
                         f"{max_steps_per_epoch!r}")


def _tensor_epochs(n: int, batch_size: int, epochs: int, seed: int):
    """Per epoch, a generator of the index batches of :func:`batches` (all drawn, so skipping
    some never changes the order of the next epoch's)."""
    stream = batches(n, batch_size, epochs, seed)
    per_epoch = math.ceil(n / batch_size)
    for _ in range(epochs):
        yield (next(stream) for _ in range(per_epoch))


def _loader_epochs(loader: Iterable, epochs: int):
    """Per epoch, one pass over ``loader`` (any re-iterable of ``(x, y)`` pairs, such as a
    ``torch.utils.data.DataLoader``), each pair checked."""
    for epoch in range(epochs):
        def checked(epoch=epoch):
            count = 0
            for item in loader:
                if not (isinstance(item, (tuple, list)) and len(item) == 2):
                    raise ValueError(f"fit(method, loader): each batch must be an (x, y) pair, "
                                     f"got {type(item).__name__} in epoch {epoch}")
                xb, yb = (torch.as_tensor(v) for v in item)
                check_batch(xb, yb)
                count += 1
                yield xb, yb
            if count == 0:
                raise ValueError(f"fit(method, loader): the loader gave no batch in epoch "
                                 f"{epoch} (a one-shot iterator? pass a DataLoader or a list)")
        yield checked()


def fit(method: Method, x: torch.Tensor | Iterable, y: torch.Tensor | None = None, *,
        epochs: int, batch_size: int | None = None,
        lr: float, schedule: str | Callable[[int], float] = "cosine",
        schedule_unit: str = "step", seed: int = 0, progress: bool | str | None = None,
        quiet: bool = False, before_step: Callable[[int, int], None] | None = None,
        x_val: torch.Tensor | None = None, y_val: torch.Tensor | None = None,
        keep_best: bool = False, max_steps_per_epoch: int | None = None,
        on_nonfinite: str = "raise", nonfinite_ok: Callable[[dict], bool] | None = None,
        on_epoch_end: Callable[[int, History], None] | None = None) -> History:
    """Train ``method`` for ``epochs`` over ``(x, y)``; returns the :class:`History`.

    Data: tensors ``x`` and ``y``, batched by :func:`batches` (``batch_size``, ``seed``), or
    ``fit(method, loader, ...)`` with any re-iterable of ``(x, y)`` batches (a ``DataLoader``:
    it batches and shuffles, so ``batch_size`` and ``seed`` are not used); the cosine
    schedule then needs ``len(loader)``. ``progress``: a bar, by default only on a terminal
    (:func:`bpfree.progress.show_progress`); ``quiet=True`` hides it. The rate of a step is ``lr`` times the
    schedule: ``"cosine"`` (:func:`cosine_lr` over all steps), ``"constant"``, or a callable
    ``t -> multiplier`` (e.g. :func:`bpfree.transforms.exponential`) of the step index, or of
    the epoch index with ``schedule_unit="epoch"`` (TT-ZO §5.1's decay every 10 epochs).

    Hooks: ``before_step(step, total)`` before each step (TinyFoA's slice schedule);
    ``on_epoch_end(epoch, history)`` after an epoch's record is written and before its
    validation (TT-ZO's hybrid decides its phase switch there).

    ``max_steps_per_epoch`` runs only the first batches of every epoch (the rest of the
    epoch's batches are drawn and skipped, so the batch order does not depend on it).
    ``x_val`` / ``y_val``: :func:`accuracy` of ``method.model`` (else of ``method``) after
    every epoch; ``keep_best`` then restores the weights of the best validation epoch (the
    earliest on ties): early stopping decided on validation data only.

    A non-finite step loss raises FloatingPointError (the step did not update), or with
    ``on_nonfinite="stop"`` closes the epoch and returns the history so far with
    ``diverged`` set; a step whose output satisfies ``nonfinite_ok(out)`` (central CGE,
    which never evaluates θ, reports NaN by design) is recorded instead.

    Inside a benchmark task run under a task cache (``BPFREE_TASK_CACHE``), every epoch's end
    saves a snapshot, and a task cut off and run again resumes after its last finished epoch
    with the same bits as an uninterrupted run (:mod:`bpfree.checkpoint.resume`).
    """
    _check_fit_options(schedule, schedule_unit, on_nonfinite, x_val, y_val, keep_best,
                       max_steps_per_epoch)
    lr = check_learning_rate(lr)
    if isinstance(epochs, bool) or not isinstance(epochs, numbers.Integral) or epochs < 1:
        raise ValueError(f"epochs must be an int >= 1, got {epochs!r}")
    if isinstance(x, torch.Tensor):
        if not isinstance(y, torch.Tensor):
            raise ValueError("fit(method, x, y): y must be a tensor of labels beside the tensor "
                             "x (or pass one iterable of (x, y) batches, such as a DataLoader)")
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) \
                or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1 with tensors, got {batch_size!r}")
        check_batch(x, y)
        per_epoch = math.ceil(x.shape[0] / batch_size)
        epoch_batches = _tensor_epochs(x.shape[0], batch_size, epochs, seed)
    else:
        if y is not None:
            raise ValueError(f"fit(method, loader): the loader yields the labels; y must be "
                             f"None with a {type(x).__name__}, got {type(y).__name__}")
        if not isinstance(x, Iterable):
            raise ValueError(f"fit needs tensors x, y or an iterable of (x, y) batches, got "
                             f"{type(x).__name__}")
        try:
            per_epoch = len(x)
        except TypeError:
            per_epoch = None
        if per_epoch is None and schedule == "cosine":
            raise ValueError("the cosine schedule needs the number of batches: give a loader "
                             "with len() or schedule='constant' / a callable")
        epoch_batches = _loader_epochs(x, epochs)
    if per_epoch is None:
        steps = max_steps_per_epoch
    else:
        steps = per_epoch if max_steps_per_epoch is None else min(per_epoch, max_steps_per_epoch)
    total = None if steps is None else epochs * steps
    model = getattr(method, "model", method)
    history = History()
    best_state = None
    t0 = time.perf_counter()
    kind = schedule if isinstance(schedule, str) else "callable"
    log.debug("fit: %s epochs of %s steps, lr %g, schedule %s", epochs, steps or "?", lr, kind)
    step = 0
    # Inside a cached benchmark task, resume from the last epoch snapshot (checkpoint.resume).
    snapshot = next_fit_snapshot()
    signature = (epochs, batch_size, float(lr), kind, schedule_unit, seed, steps,
                 None if not isinstance(x, torch.Tensor) else tuple(x.shape), keep_best)
    done_epochs = 0
    if snapshot is not None:
        saved = snapshot.load(method, model) if isinstance(model, torch.nn.Module) else None
        if saved is not None and saved["signature"] == signature:
            history, best_state, step = saved["history"], saved["best_state"], saved["step"]
            done_epochs = saved["epoch"] + 1
            restore_rng_state(saved["rng"])
            t0 -= saved["seconds"]
            log.info("fit: resumed after epoch %d of %d from %s", done_epochs, epochs,
                     snapshot.path)
        elif saved is not None:
            raise RuntimeError(f"the epoch snapshot {snapshot.path} belongs to another fit "
                               f"call ({saved['signature']} != {signature}); delete it")
    bar = progress_bar(total, "train", progress, quiet)
    bar.update(step)
    for epoch, stream in enumerate(epoch_batches):
        if epoch < done_epochs or history.diverged is not None:
            if isinstance(x, torch.Tensor):
                for _ in stream:  # replay the batch order's draws (a loader's are global RNG)
                    pass
            continue
        losses, first_rate = [], None
        for k, item in enumerate(stream):
            if steps is not None and k >= steps:
                continue
            xb, yb = (x[item], y[item]) if isinstance(x, torch.Tensor) else item
            if before_step is not None:
                before_step(step, total)
            if kind == "cosine":
                rate = cosine_lr(lr, step, total)
            elif kind == "constant":
                rate = lr
            else:
                unit = epoch if schedule_unit == "epoch" else step
                factor = schedule(unit)
                rate = lr * factor
                try:
                    ok = math.isfinite(float(rate)) and float(rate) >= 0
                except (TypeError, ValueError):
                    ok = False
                if not ok:
                    bar.close()
                    raise ValueError(f"the schedule returned {factor!r} at "
                                     f"{schedule_unit} {unit}: the rate must be a finite number "
                                     ">= 0 (a negative one would ascend the loss)")
            first_rate = rate if first_rate is None else first_rate
            try:
                out = method.step(xb, yb, rate)
            except (IndexError, RuntimeError) as err:
                better = _label_error(err, yb)
                if better is None:
                    raise
                bar.close()
                raise better from None
            loss = float(out["loss"])
            if not math.isfinite(loss) and not (nonfinite_ok is not None and nonfinite_ok(out)):
                message = f"non-finite loss at epoch {epoch}, step {k}"
                if on_nonfinite == "raise":
                    bar.close()
                    raise FloatingPointError(message)
                history.diverged = message
                log.warning("fit stopped: %s", message)
                break
            history.loss.append(loss)
            history.lr.append(rate)
            history.forwards.append(method.forwards)
            if math.isfinite(loss):
                losses.append(loss)
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")
        history.epoch_loss.append(sum(losses) / len(losses) if losses else float("nan"))
        history.epoch_lr.append(first_rate)
        history.epoch_forwards.append(int(method.forwards))
        history.epoch_batch_forwards.append(getattr(method, "batch_forwards", None))
        history.epoch_phase.append(getattr(method, "phase", getattr(method, "name", None)))
        if on_epoch_end is not None:
            on_epoch_end(epoch, history)
        if x_val is not None:
            history.val_acc.append(accuracy(model, x_val, y_val))
            if keep_best and history.val_acc[-1] > max(history.val_acc[:-1], default=-math.inf):
                best_state = copy.deepcopy(model.state_dict())
                history.best_epoch = len(history.val_acc) - 1
        if snapshot is not None and isinstance(model, torch.nn.Module):
            snapshot.save({"signature": signature, "epoch": epoch, "step": step,
                           "history": history, "best_state": best_state,
                           "rng": capture_rng_state(), "seconds": time.perf_counter() - t0},
                          method, model)
        if history.diverged is not None:
            break
    bar.close()
    if keep_best and history.best_epoch is not None:
        model.load_state_dict(best_state)
    history.seconds = time.perf_counter() - t0
    return history


@torch.no_grad()
def correct(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
            batch_size: int = 1000) -> torch.Tensor:
    """Whether ``model(x)``'s top-1 prediction equals ``y``, per sample (a bool tensor in
    ``x``'s order): what a paired comparison of two models on one test set needs
    (:func:`bpfree.bench.claims.paired_se`). An empty or mismatched set is an error."""
    check_batch(x, y)
    return torch.cat([model(x[lo:lo + batch_size]).argmax(-1) == y[lo:lo + batch_size]
                      for lo in range(0, x.shape[0], batch_size)])


def percent_correct(hits: torch.Tensor) -> float:
    """The accuracy (%) of per-sample outcomes ``hits`` (:func:`correct`)."""
    return 100.0 * int(hits.sum()) / hits.numel()


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
             batch_size: int = 1000) -> float:
    """Top-1 accuracy (%) of ``model(x)`` logits (:func:`correct`); an empty or mismatched
    set is an error (an accuracy of 0 % on no samples would read as a result)."""
    return percent_correct(correct(model, x, y, batch_size))


@torch.no_grad()
def mean_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
              batch_size: int = 250) -> float:
    """Mean cross-entropy of ``model(x)`` logits over the whole set: a deterministic "did it
    train" check (a training curve's window means are noisy and, for some estimators, a
    proxy). An empty or mismatched set is an error."""
    check_batch(x, y)
    total = sum(float(torch.nn.functional.cross_entropy(model(x[lo:lo + batch_size]),
                                                        y[lo:lo + batch_size], reduction="sum"))
                for lo in range(0, x.shape[0], batch_size))
    return total / x.shape[0]


def holdout_split(n: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train indices, held-out indices) of ``n`` samples, a seeded shuffle."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"holdout fraction must lie in (0, 1), got {fraction}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    k = max(1, int(round(n * fraction)))
    return perm[k:], perm[:k]


def pick_lr(make: Callable[[], tuple[Method, torch.nn.Module]], x: torch.Tensor,
            y: torch.Tensor, rates, *, epochs: int, batch_size: int, seed: int = 0,
            holdout: float = 0.2) -> tuple[float, dict[float, float]]:
    """The rate of ``rates`` whose run scores best on a held-out part of the training data.

    Each candidate trains a fresh ``make() -> (method, model)`` for ``epochs`` on the other
    part and is scored by its :func:`accuracy` on the held-out part, never on test data; a
    run whose loss turns non-finite scores -1. Ties go to the smaller rate. A single rate is
    returned without training (empty scores).
    """
    rates = tuple(rates)
    if not rates:
        raise ValueError("rates must hold at least one learning rate")
    if len(rates) == 1:
        return rates[0], {}
    train_idx, held_idx = holdout_split(x.shape[0], holdout, seed)
    scores: dict[float, float] = {}
    for lr in rates:
        method, model = make()
        try:
            fit(method, x[train_idx], y[train_idx], epochs=epochs, batch_size=batch_size,
                lr=lr, seed=seed)
            scores[lr] = accuracy(model, x[held_idx], y[held_idx])
        except FloatingPointError:
            scores[lr] = -1.0
    best = max(rates, key=lambda r: (scores[r], -r))
    return best, scores
