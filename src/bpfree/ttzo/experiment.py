"""The TT-ZO MNIST experiment (§5.1, Tables 1-3, Fig. 1) as picklable process-pool tasks.

Shared by ``bpfree bench tt-zo`` (benchmarks/tt_zo.py) and usable on its own. One *task* is a
plain dict naming a model, a training method, the data subset and the epoch loop's settings;
:func:`run_task` builds everything inside the worker (MNIST is loaded once per process), runs
:func:`bpfree.ttzo.train` and returns a plain dict (the :class:`~bpfree.ttzo.TrainLog` plus the
parameter count, phase forward counts and wall time), so tasks pickle cheaply and can run in a
``spawn`` pool with one CPU thread per worker.

Models (``model``): ``"mlp"`` (784-1024-10, 814,090 parameters), ``"small-mlp"`` (784-10-10,
7,960), ``"tt"`` (TT-MLP with ranks ``[1, r, r, r, 1]``, ``rank``), ``"sp"`` (the dense MLP
pruned at initialization with GraSP to ``sp_params`` trainable parameters, biases included).

Methods (``method``): ``"fo"`` (SGD with BP), ``"rge"``, ``"sign_rge"``, ``"cge"`` (ZO,
§5.1's N = 10, μ = 0.1; CGE μ = 0.01, momentum 0.9), ``"hybrid"`` (:class:`HybridZO`),
``"fg-w"``, ``"fg-a"``, ``"fa"``, ``"dfa"`` (the Table 3 baselines). ``method_kwargs`` are
passed to the trainer (e.g. ``cge_coordinates``, ``patience``, ``max_coarse_epochs``).
"""

from __future__ import annotations

import copy
import time

import torch

__all__ = ["MODELS", "METHODS", "make_model", "make_method", "load_data", "run_task",
           "compression_ratio", "DENSE_PARAMS"]

MODELS = ("mlp", "small-mlp", "tt", "sp")
METHODS = ("fo", "rge", "sign_rge", "cge", "hybrid", "fg-w", "fg-a", "fa", "dfa")
DENSE_PARAMS = 814_090

_DATA: dict = {}


def compression_ratio(params: int) -> float:
    """Parameters relative to the dense 784-1024-10 MLP (the paper's "Ratio" column)."""
    return params / DENSE_PARAMS


def load_data(n_train: int | None, n_val: int | None, root=None, n_test: int | None = None):
    """``(x_train, y_train, x_val, y_val, x_test, y_test)``: flattened images in [0, 1].

    The validation images are the *last* ``n_val`` images of MNIST's training split, held out
    from training (hyper-parameters and the hybrid's stall test see only them); the training
    images are the first ``n_train`` of the rest; the test images the first ``n_test`` of
    MNIST's test split, touched only for the reported accuracy. ``None`` for ``n_train`` or
    ``n_test`` takes all that is left; ``n_val`` must be given (a positive count). Cached per
    process.
    """
    if n_val is None or int(n_val) < 1:
        raise ValueError(f"n_val must be a positive number of held-out training images, "
                         f"got {n_val!r}")
    key = (n_train, n_val, n_test, None if root is None else str(root))
    if key not in _DATA:
        from ..data import load_mnist

        xtr, ytr = load_mnist(root, split="train")
        xte, yte = load_mnist(root, split="test")
        if int(n_val) >= len(xtr):
            raise ValueError(f"n_val={n_val} leaves no training images (MNIST train has "
                             f"{len(xtr)})")
        xva, yva = xtr[len(xtr) - int(n_val):], ytr[len(ytr) - int(n_val):]
        xtr, ytr = xtr[:len(xtr) - int(n_val)][:n_train], ytr[:len(ytr) - int(n_val)][:n_train]
        xte, yte = xte[:n_test], yte[:n_test]

        def flat(a):
            return torch.from_numpy(a).float().div_(255.0).reshape(a.shape[0], -1)

        _DATA.clear()
        _DATA[key] = (flat(xtr), torch.from_numpy(ytr).long(), flat(xva),
                      torch.from_numpy(yva).long(), flat(xte), torch.from_numpy(yte).long())
    return _DATA[key]


def make_model(kind: str, *, rank: int = 6, seed: int = 0, sp_params: int | None = None,
               prune_data=None) -> torch.nn.Module:
    """One of :data:`MODELS`, initialised from ``seed``."""
    from ..tt import dense_mlp, tt_mlp

    torch.manual_seed(seed)
    if kind == "mlp":
        return dense_mlp((784, 1024, 10))
    if kind == "small-mlp":
        return dense_mlp((784, 10, 10))
    if kind == "tt":
        return tt_mlp(rank)
    if kind == "sp":
        from .baselines import grasp_prune

        if sp_params is None or prune_data is None:
            raise ValueError("model 'sp' needs sp_params and prune_data (an (x, y) batch)")
        dense = dense_mlp((784, 1024, 10))
        _, masked = grasp_prune(dense, prune_data, sp_params, count_unprunable=True)
        return masked
    raise ValueError(f"unknown model {kind!r}; choose one of {MODELS}")


def make_method(name: str, model: torch.nn.Module, *, seed: int = 0, **kwargs):
    """A Method-protocol trainer for ``model`` (see the module docstring)."""
    from .baselines import (BPTrainer, DirectFeedbackAlignment, FeedbackAlignment,
                            ForwardGradientA, ForwardGradientW)
    from .hybrid import HybridZO, ZOTrainer

    if name == "fo":
        return BPTrainer(model, "sgd", **kwargs)
    if name in ("rge", "sign_rge"):
        return ZOTrainer(model, name, seed=seed, **kwargs)
    if name == "cge":
        kwargs.setdefault("momentum", 0.9)
        return ZOTrainer(model, "cge", seed=seed, **kwargs)
    if name == "hybrid":
        return HybridZO(model, seed=seed, **kwargs)
    if name == "fg-w":
        return ForwardGradientW(model, seed=seed, **kwargs)
    if name == "fg-a":
        return ForwardGradientA(model, seed=seed, **kwargs)
    if name == "fa":
        return FeedbackAlignment(model, seed=seed, **kwargs)
    if name == "dfa":
        return DirectFeedbackAlignment(model, seed=seed, **kwargs)
    raise ValueError(f"unknown method {name!r}; choose one of {METHODS}")


def run_task(task: dict) -> dict:
    """Process-pool entry point: train one (model, method) pair; returns a plain dict.

    Keys of ``task``: ``model``, ``method`` (required); ``rank``, ``sp_params``, ``seed``,
    ``method_kwargs``, ``n_train``, ``n_val`` (required), ``n_test``, ``data_root``, ``epochs``, ``batch_size``,
    ``lr``, ``gamma``, ``decay_every``, ``max_steps_per_epoch``, ``threads`` (default 1),
    ``device`` (default ``"cpu"``).
    """
    from .train import train
    from ..harness import accuracy
    from ..tt import tt_mlp_num_parameters

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
    out = {"log": log.as_dict(), "params": int(params), "seconds": seconds,
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
