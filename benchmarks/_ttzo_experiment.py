"""The TT-ZO MNIST experiment (§5.1, Tables 1-3, Fig. 1) as picklable process-pool tasks.

The driver of ``bpfree bench tt-zo`` (benchmarks/tt_zo.py); the models and trainers it names
are the library's (:func:`bpfree.ttzo.make_model`, :func:`bpfree.ttzo.make_method`). One *task*
is a plain dict naming a model, a training method, the data subset and the epoch loop's
settings; :func:`run_task` builds everything inside the worker (MNIST is loaded once per
process), runs :func:`bpfree.ttzo.train` and returns a plain dict (the per-epoch record of
its :class:`~bpfree.harness.History`, :func:`log_record`, plus the parameter count, phase
forward counts and wall time),
so tasks pickle cheaply and can run in a ``spawn`` pool with one CPU thread per worker.

Models (``model``): :data:`bpfree.ttzo.MODELS`. Methods (``method``): :data:`bpfree.ttzo.METHODS`
(§5.1's N = 10, μ = 0.1; CGE μ = 0.01, momentum 0.9). ``method_kwargs`` are passed to the
trainer (e.g. ``cge_coordinates``, ``patience``, ``max_coarse_epochs``).
"""

from __future__ import annotations

import copy
import time

import torch

from bpfree.data import flat_image_splits
from bpfree.harness import accuracy
from bpfree.tt import tt_mlp_num_parameters
from bpfree.ttzo import make_method, make_model, train

__all__ = ["load_data", "log_record", "run_task"]

_DATA: dict = {}


def load_data(n_train: int | None, n_val: int | None, root=None, n_test: int | None = None):
    """``(x_train, y_train, x_val, y_val, x_test, y_test)``: flattened images in [0, 1]
    (:func:`bpfree.data.flat_image_splits`), cached per process (one pool worker runs many
    tasks on the same data).

    The validation images are the *last* ``n_val`` images of MNIST's training split, held out
    from training (hyper-parameters and the hybrid's stall test see only them); the training
    images are the first ``n_train`` of the rest; the test images the first ``n_test`` of
    MNIST's test split, touched only for the reported accuracy. ``None`` for ``n_train`` or
    ``n_test`` takes all that is left; ``n_val`` must be given (a positive count).
    """
    if n_val is None or int(n_val) < 1:
        raise ValueError(f"n_val must be a positive number of held-out training images, "
                         f"got {n_val!r}")
    key = (n_train, n_val, n_test, None if root is None else str(root))
    if key not in _DATA:
        _DATA.clear()
        _DATA[key] = flat_image_splits("mnist", n_train=n_train, n_val=int(n_val),
                                       n_test=n_test, root=root)
    return _DATA[key]


def log_record(history) -> dict:
    """The ``"log"`` of a result: ``history``'s per-epoch record under the keys the tt-zo
    results JSON has always had (``lr``, ``forwards``, ``batch_forwards``, ``phase`` are per
    epoch; ``step_loss`` is the per-step loss)."""
    h = history
    return {"epoch_loss": h.epoch_loss, "val_acc": h.val_acc, "lr": h.epoch_lr,
            "forwards": h.epoch_forwards, "batch_forwards": h.epoch_batch_forwards,
            "phase": h.epoch_phase, "step_loss": h.loss, "switch_epoch": h.switch_epoch,
            "diverged": h.diverged, "best_epoch": h.best_epoch, "seconds": h.seconds}


def run_task(task: dict) -> dict:
    """Process-pool entry point: train one (model, method) pair; returns a plain dict.

    Keys of ``task``: ``model``, ``method`` (required); ``rank``, ``sp_params``, ``seed``,
    ``method_kwargs``, ``n_train``, ``n_val`` (required), ``n_test``, ``data_root``,
    ``epochs``, ``batch_size``, ``lr``, ``gamma``, ``decay_every``, ``max_steps_per_epoch``,
    ``threads`` (default 1), ``device`` (default ``"cpu"``).
    """
    torch.set_num_threads(int(task.get("threads", 1)))
    seed = int(task.get("seed", 0))
    device = torch.device(task.get("device", "cpu"))
    x, y, xv, yv, xt, yt = load_data(task.get("n_train"), task.get("n_val"),
                                     task.get("data_root"), task.get("n_test"))
    prune = None
    if task["model"] == "sp":
        g = torch.Generator().manual_seed(seed)
        idx = torch.randperm(x.shape[0], generator=g)[:int(task.get("prune_samples", 640))]
        prune = [(x[idx[i:i + 64]], y[idx[i:i + 64]]) for i in range(0, len(idx), 64)]
    model = make_model(task["model"], rank=int(task.get("rank", 6)), seed=seed,
                       sp_params=task.get("sp_params"), prune_data=prune).to(device)
    params = tt_mlp_num_parameters(model)
    method = make_method(task["method"], model, seed=seed, **dict(task.get("method_kwargs", {})))
    t0 = time.perf_counter()
    log = train(method, x.to(device), y.to(device), epochs=int(task["epochs"]),
                batch_size=int(task.get("batch_size", 64)), lr=float(task.get("lr", 1e-3)),
                gamma=float(task.get("gamma", 0.9)), decay_every=int(task.get("decay_every", 10)),
                x_val=xv.to(device), y_val=yv.to(device), seed=seed,
                max_steps_per_epoch=task.get("max_steps_per_epoch"), on_nonfinite="stop",
                keep_best=True)
    seconds = time.perf_counter() - t0
    # The untouched test split, once, on the model of the best validation epoch (early
    # stopping on validation: the hybrid's CGE stage can collapse a model late in a run).
    test_acc = accuracy(method.model, xt.to(device), yt.to(device))
    out = {"log": log_record(log), "params": int(params), "seconds": seconds,
           "test_acc": float(test_acc),
           "steps": int(getattr(method, "steps", 0)),
           "forwards": int(method.forwards),
           "batch_forwards": getattr(method, "batch_forwards", None),
           "task": {k: v for k, v in task.items() if k != "data_root"}}
    history = getattr(method, "history", None)
    if isinstance(history, dict):
        out["history"] = copy.deepcopy({k: v for k, v in history.items()
                                        if k in ("switch_epoch", "stall_epoch", "switch_step",
                                                 "batch_forwards", "steps", "epoch_phase")})
    if hasattr(method, "batch_forwards_per_step"):
        out["batch_forwards_per_step"] = int(method.batch_forwards_per_step())
    return out
