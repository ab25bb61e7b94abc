"""QZO-FF experiments at MNIST scale: few-shot episodes, OOD adaptation, ablations, landscape.

The driver of ``bpfree bench qzo-ff`` (benchmarks/qzo_ff.py). Every public
task function takes and returns plain picklable values (state dicts, lists, floats) so that
the benchmark can run it in a spawn-context process pool with one torch thread per worker;
:func:`run_task` is the pool's entry point.

The backbone is ``mnist-cnn`` (:func:`bpfree.models.mnist_cnn`: two conv layers, a 1568-d
feature and a linear head), pretrained with BP by :func:`pretrain`. (TinyViT was the first
choice, as the paper's ablations use ViT tiny, but it needs several epochs of MNIST to pass 90 %,
too slow for a 10-minute benchmark on 2 CPU cores.)

* :func:`fewshot_chunk` -- QZO-FF §4.1 / Table 2: 5-way 5-shot episodes from held-out classes;
  per episode zero-shot ProtoNet, BP FT / BP LP (:class:`BPAdamW`), FF FT, FF LP and FF LP
  16w8a (:class:`~bpfree.qzoff.QZOFF` with AdamW), all from the prototype-initialised episode
  head with its logit scale chosen by leave-one-out support loss
  (:func:`bpfree.fewshot.prototype_temperature`); :func:`fewshot_validate` chooses each
  method's learning rate on validation episodes (training images of the held-out classes).
* :func:`ood_task` -- QZO-FF §4.3 / Table 5: linear probing (one linear decoder, "LP 1 LN") of
  a pretrained backbone on corrupted digits: zero-shot, BP, FF, FF + 90 % sparse (any
  :class:`~bpfree.qzoff.QZOFFConfig` mask; the benchmark uses a random mask on the weight
  matrix, biases trainable), FF 16w8a, and optional extra FF variants (bit widths, m).
* :func:`landscape_task` -- App. E / Fig. 6: BP and FF trajectories of the linear decoder and
  the 2-D loss contours around the final weights (:func:`bpfree.landscape.landscape_figure`).

Linear probing trains only the decoder on the frozen backbone's features, computed once per
data set (:func:`bpfree.qzoff.frozen_features`, static activation ranges calibrated on the
training / support images); the few-shot LP head starts as ProtoNet's
(:func:`bpfree.fewshot.prototype_head`).
"""

from __future__ import annotations

import copy
import functools
import math
import time
import warnings

import numpy as np
import torch
from torch import nn

from bpfree.baselines import BPTrainer
from bpfree.bench.parallel import run_named_task
from bpfree.data import corrupt, load_mnist
from bpfree.fewshot import (feature_function, protonet_predict, prototype_head,
                            sample_episodes, with_episode_head)
from bpfree.harness import accuracy, fit
from bpfree.landscape import TrajectoryRecorder, flatten_params, landscape_figure
from bpfree.models import mnist_cnn
from bpfree.qzoff import (PRECISIONS, QZOFF, QZOFFConfig, estimate_alignment, expected_alignment,
                          frozen_features, precision_bits)

__all__ = [
    "BPAdamW",
    "alignment_task",
    "fewshot_diagnostic",
    "build_backbone",
    "ff_config",
    "fewshot_chunk",
    "fewshot_validate",
    "landscape_task",
    "load_images",
    "ood_data",
    "ood_task",
    "pretrain",
    "run_task",
    "train_head",
]

# --------------------------------------------------------------------------- data and models

def _to_tensor(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(images)).float().div_(255.0).unsqueeze(1)


@functools.lru_cache(maxsize=4)
def _load(kind: str, split: str):
    return load_mnist(split=split, kind=kind)


def load_images(kind: str = "mnist", split: str = "train", classes=None, limit: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x [N,1,28,28] in 0..1, y int64)`` of MNIST / Fashion-MNIST, restricted to ``classes``
    (labels kept as they are) and to the first ``limit`` of those samples."""
    images, labels = _load(kind, split)
    idx = np.arange(len(labels))
    if classes is not None:
        idx = idx[np.isin(labels, list(classes))]
    if limit is not None:
        idx = idx[:limit]
    return _to_tensor(images[idx]), torch.from_numpy(labels[idx].astype(np.int64))


def build_backbone(num_classes: int = 10, state: dict | None = None) -> nn.Sequential:
    """The benchmark backbone (``mnist-cnn`` with a ``num_classes`` head), optionally loaded;
    ``model[:-1]`` is the feature extractor, ``model[-1]`` the linear head."""
    model = mnist_cnn()
    if num_classes != 10:
        model[-1] = nn.Linear(model[-1].in_features, num_classes)
    if state is not None:
        model.load_state_dict(state)
    return model.eval()


def bp_pretrain_loop(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int,
                     lr: float, batch_size: int, seed: int) -> nn.Module:
    """The factory's BP training of ``model`` in place (every parameter with
    ``requires_grad``): AdamW (0.9, 0.95, weight decay 0.01), 20 warm-up steps, then cosine
    decay, shuffled batches from ``seed``; returns the model in eval mode."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    total = epochs * math.ceil(len(y) / batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / total)))
    g = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(y), generator=g)
        for lo in range(0, len(y), batch_size):
            idx = perm[lo:lo + batch_size]
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    return model.eval()


def pretrain(kind: str = "mnist", classes=None, images: int = 10000, epochs: int = 2,
             lr: float = 2e-3, batch_size: int = 128, seed: int = 0, threads: int = 1) -> dict:
    """BP pretraining of the backbone ("in the factory") on the first ``images`` training
    images of ``classes`` (default all ten), AdamW with a cosine schedule. Returns
    ``{"state", "num_classes", "train_accuracy", "test_accuracy", "seconds", ...}``; the head
    has ``len(classes)`` outputs and the labels are re-indexed 0..len(classes)-1."""
    torch.set_num_threads(threads)
    classes = list(range(10)) if classes is None else sorted(int(c) for c in classes)
    remap = torch.full((10,), -1, dtype=torch.long)
    remap[classes] = torch.arange(len(classes))
    x, y = load_images(kind, "train", classes, images)
    y = remap[y]
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    model = build_backbone(len(classes))
    bp_pretrain_loop(model, x, y, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed)
    xt, yt = load_images(kind, "test", classes, 2000)
    test_acc = accuracy(model, xt, remap[yt], batch_size=len(yt))
    return {"state": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "num_classes": len(classes), "classes": classes, "images": int(len(y)),
            "epochs": epochs, "test_accuracy": test_acc, "seed": seed,
            "seconds": time.perf_counter() - t0}


# --------------------------------------------------------------------------- precisions

def ff_config(precision: str = "fp32", **overrides) -> QZOFFConfig:
    """:class:`QZOFFConfig` for a precision of :data:`PRECISIONS` (AdamW with betas
    0.9/0.95 as the paper's App. C/D, ``m = 3``; quantized runs use ``w_headroom = 4`` unless
    overridden, since a decoder that outgrows its initial ``max|w|`` saturates at 1)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    base = dict(optimizer="adamw", betas=(0.9, 0.95), m=3)
    if precision in ("fp32", "fp16"):
        base["mode"] = precision
    else:
        w, a = precision_bits(precision)
        base.update(mode="quantized", w_bits=w, a_bits=a, w_headroom=4.0)
    base.update(overrides)
    return QZOFFConfig(**base)


def BPAdamW(model: nn.Module, betas=(0.9, 0.95), weight_decay: float = 0.0) -> BPTrainer:
    """Back-propagation with AdamW (betas 0.9/0.95) on the mean cross-entropy: the shared
    :class:`bpfree.baselines.BPTrainer` with QZO-FF's settings (a
    :class:`bpfree.harness.Method`; ``forwards`` counts one per sample and step, each step
    also runs a backward pass)."""
    return BPTrainer(model, "adamw", betas=betas, weight_decay=weight_decay,
                     loss_fn=nn.functional.cross_entropy)


def train_head(head: nn.Module, method: str, x: torch.Tensor, y: torch.Tensor, *,
               epochs: int, batch_size: int, lr: float, seed: int = 0,
               config: QZOFFConfig | None = None, recorder=None,
               trainable: list[str] | None = None) -> dict:
    """Train a (copy of a) decoder on features: ``method`` ``"bp"`` (:class:`BPAdamW`) or
    ``"ff"`` (:class:`QZOFF` with ``config``). Cosine schedule, shuffled batches from
    ``seed`` (:func:`bpfree.harness.fit`). Returns ``{"model", "loss", "epoch_loss",
    "forwards", "seconds", "recorder"}`` (+ ``"eps_underflow"`` warnings for FF).
    ``recorder``: a callable ``recorder(trained_copy) -> TrajectoryRecorder`` (the copy does
    not exist before the call); the recorder stores the start and every step. ``trainable``:
    the parameter names that train (default all; D-VPT passes the prompts and the head of a
    whole model, :func:`bpfree.training_modes.trainable_parameters`)."""
    model = copy.deepcopy(head)
    keep = None if trainable is None else set(trainable)
    for n, p in model.named_parameters():
        p.requires_grad_(keep is None or n in keep)
    if method == "bp":
        runner = BPAdamW(model)
    elif method == "ff":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            runner = QZOFF(model, config or ff_config("fp32", seed=seed))
        underflow = [str(w.message) for w in caught]
    else:
        raise ValueError(f"method must be 'bp' or 'ff', got {method!r}")
    rec = recorder(model) if recorder is not None else None
    if rec is not None:
        rec.record()
        step = runner.step

        def recorded(xb, yb, rate):
            out = step(xb, yb, rate)
            rec.record()
            return out

        runner.step = recorded
    hist = fit(runner, x, y, epochs=epochs, batch_size=batch_size, lr=lr, schedule="cosine",
               seed=seed)
    for p in model.parameters():
        p.requires_grad_(False)
    out = {"model": model, "loss": hist.loss, "epoch_loss": hist.epoch_loss,
           "forwards": hist.forwards[-1], "seconds": hist.seconds, "recorder": rec}
    if method == "ff":
        out["eps_underflow"] = underflow
    return out


# --------------------------------------------------------------------------- few-shot (§4.1)

#: Rows of the few-shot table, in the paper's order.
FEWSHOT_METHODS = ("zero-shot", "BP FT", "BP LP", "FF FT", "FF LP", "FF LP 16w8a")
#: How the FT rows classify the queries. "head": the fine-tuned model itself (the
#: prototype-initialised episode head, trained with the backbone: ProtoNet's classifier with
#: learned prototypes), as LP classifies with its trained head. "protonet": ProtoNet on the
#: adapted features, discarding the trained head (the rows before 2026-11-28: on validation
#: episodes its accuracy fell as the rate grew while the trained head's rose).
FT_CLASSIFIERS = ("head", "protonet")
#: Learning-rate grid of :func:`fewshot_validate` (AdamW; the paper's Table 6 values are not in
#: the text, which says "different learning rate grids are explored").
FEWSHOT_LRS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)


def _fewshot_method(mth: str, backbone: nn.Module, ep, *, lr: float, steps: int, m: int,
                    seed: int, temperature, feats: dict, ff_overrides: dict | None = None,
                    ft_classifier: str = "head"
                    ) -> tuple[float, int, tuple[float, float] | None]:
    """Query accuracy (%) of one method on one episode, its per-sample forwards, and its
    support-set loss at the first and the last step (``None`` for zero-shot): the evidence
    that a baseline trained (the last step's loss below the first's).

    Every trained method starts from the prototype-initialised episode head with logit scale
    ``temperature`` and takes ``steps`` full-batch steps on the support set with AdamW
    (betas 0.9 / 0.95, cosine decay to 0, :func:`train_head`): BP FT / FF FT train the whole
    backbone + head and classify the queries with the fine-tuned model (``ft_classifier``
    ``"head"``) or with ProtoNet on the adapted features (``"protonet"``,
    :data:`FT_CLASSIFIERS`); BP LP / FF LP train the head on the frozen features and classify
    with it. ``feats``: a cache of
    the frozen support / query features per precision, filled on demand; ``ff_overrides``:
    extra :class:`QZOFFConfig` fields of the FF rows (e.g. ``{"eps": 1e-2}``)."""
    if ft_classifier not in FT_CLASSIFIERS:
        raise ValueError(f"ft_classifier must be one of {FT_CLASSIFIERS}, got "
                         f"{ft_classifier!r}")
    ffo = ff_overrides or {}
    n_way = ep.n_way
    n_s = len(ep.support_y)
    qy = ep.query_y

    def frozen(prec):
        if prec not in feats:
            feats[prec] = (frozen_features(backbone, ep.support_x, prec),
                           frozen_features(backbone, ep.query_x, prec,
                                           calibration=ep.support_x))
        return feats[prec]

    def score(pred):
        return 100.0 * float((pred == qy).float().mean())

    if mth == "zero-shot":
        fs, fq = frozen("fp32")
        return score(protonet_predict(fs, ep.support_y, fq)), 0, None
    if mth in ("BP FT", "FF FT"):
        model = with_episode_head(backbone, ep, temperature=temperature)
        method = "bp" if mth == "BP FT" else "ff"
        cfg = None if method == "bp" else ff_config("fp32", m=m, seed=seed, **ffo)
        out = train_head(model, method, ep.support_x, ep.support_y, epochs=steps,
                         batch_size=n_s, lr=lr, seed=seed, config=cfg)
        if ft_classifier == "head":
            with torch.no_grad():
                pred = out["model"](ep.query_x).argmax(1)
        else:
            fn = feature_function(out["model"])
            pred = protonet_predict(fn(ep.support_x), ep.support_y, fn(ep.query_x))
        return score(pred), out["forwards"], _first_last(out["loss"])
    if mth in ("BP LP", "FF LP", "FF LP 16w8a"):
        prec = "16w8a" if mth == "FF LP 16w8a" else "fp32"
        fs, fq = frozen(prec)
        head = prototype_head(fs, ep.support_y, n_way, temperature)
        method = "bp" if mth == "BP LP" else "ff"
        cfg = None if method == "bp" else ff_config(prec, m=m, seed=seed, **ffo)
        out = train_head(head, method, fs, ep.support_y, epochs=steps, batch_size=n_s, lr=lr,
                         seed=seed, config=cfg)
        return score(out["model"](fq).argmax(1)), out["forwards"], _first_last(out["loss"])
    raise ValueError(f"unknown few-shot method {mth!r}; expected one of {FEWSHOT_METHODS}")


def _first_last(losses: list[float]) -> tuple[float, float]:
    """The first and the last step's support-set loss of one run."""
    return float(losses[0]), float(losses[-1])


def _steps_of(mth: str, steps: int, lp_steps: int | None) -> int:
    return lp_steps if (lp_steps is not None and "LP" in mth) else steps


def _fewshot_episodes(kind, classes, split, episodes, n_way, k_shot, n_query, seed):
    x, y = load_images(kind, split, classes)
    return sample_episodes(x, y, classes, n_way=n_way, k_shot=k_shot, n_query=n_query,
                           episodes=episodes, seed=seed)


def fewshot_chunk(state: dict, num_classes: int, kind: str, classes, *, episodes: int,
                  lo: int, hi: int, steps: int, lrs: dict, lp_steps: int | None = None,
                  m: int = 3, n_way: int = 5, k_shot: int = 5, n_query: int = 15,
                  seed: int = 0, temperature: float | str = "loo", split: str = "test",
                  methods=FEWSHOT_METHODS, ft_classifier: str = "head") -> dict:
    """Episodes ``lo..hi-1`` of ``episodes`` 5-way 5-shot episodes drawn from the ``split``
    images of ``kind`` restricted to ``classes`` (:func:`bpfree.fewshot.sample_episodes` with
    ``seed``, so chunks of the same draw agree). Per episode and method
    (:data:`FEWSHOT_METHODS`): zero-shot ProtoNet, or ``steps`` (FT; ``lp_steps``, default
    ``steps``, for the LP rows) full-batch AdamW steps on the
    25 support images from the prototype-initialised episode head (logit scale
    ``temperature``, default the leave-one-out choice of
    :func:`bpfree.fewshot.prototype_temperature`) at the rate ``lrs[method]`` -- BP, or FF
    (QZO-FF sign-m-SPSA, fp32 or 16w8a) -- then the queries are classified: by the fine-tuned
    model for FT (or ProtoNet on its adapted features: ``ft_classifier``), by the trained head
    for LP.

    Returns ``{"accuracies": {method: [per-episode %]}, "seconds": {method: s},
    "forwards": {method: per-sample forwards per episode}, "support_losses": {method:
    [(first step's, last step's) support loss per episode]}, "lrs"}``.
    """
    torch.set_num_threads(1)
    missing = [mth for mth in methods if mth != "zero-shot" and mth not in lrs]
    if missing:
        raise ValueError(f"lrs has no learning rate for {missing}")
    eps_all = _fewshot_episodes(kind, classes, split, episodes, n_way, k_shot, n_query, seed)
    backbone = build_backbone(num_classes, state)
    accs = {mth: [] for mth in methods}
    secs = dict.fromkeys(methods, 0.0)
    fw = dict.fromkeys(methods, 0)
    losses = {mth: [] for mth in methods if mth != "zero-shot"}
    for e_i in range(lo, hi):
        ep = eps_all[e_i]
        feats: dict = {}
        for mth in methods:
            t0 = time.perf_counter()
            acc, fw[mth], loss = _fewshot_method(mth, backbone, ep, lr=lrs.get(mth, 0.0),
                                                 steps=_steps_of(mth, steps, lp_steps), m=m,
                                                 seed=seed + e_i,
                                                 temperature=temperature, feats=feats,
                                                 ft_classifier=ft_classifier)
            secs[mth] += time.perf_counter() - t0
            accs[mth].append(acc)
            if loss is not None:
                losses[mth].append(loss)
    return {"accuracies": accs, "seconds": secs, "forwards": fw, "lo": lo, "hi": hi,
            "support_losses": losses,
            "lrs": {k: v for k, v in lrs.items() if k in methods}}


def fewshot_validate(state: dict, num_classes: int, kind: str, classes, *, method: str,
                     episodes: int, steps: int, lrs=FEWSHOT_LRS, lp_steps: int | None = None,
                     m: int = 3, n_way: int = 5,
                     k_shot: int = 5, n_query: int = 15, seed: int = 0,
                     temperature: float | str = "loo", split: str = "train",
                     ft_classifier: str = "head") -> dict:
    """Learning-rate selection for one few-shot method on ``episodes`` *validation* episodes:
    drawn from the ``split`` (default training) images of the held-out ``classes`` -- images
    that neither pretraining (other classes) nor the test episodes (test split) use. Each rate
    of ``lrs`` runs ``method`` on every validation episode (as :func:`fewshot_chunk`, with
    ``steps`` / ``lp_steps`` and ``ft_classifier``); the
    chosen rate has the best mean query accuracy (ties: the smaller rate).

    Returns ``{"method", "lr", "scores": {lr: mean %}, "zero_shot": mean %, "episodes"}``.
    """
    torch.set_num_threads(1)
    if method == "zero-shot":
        raise ValueError("zero-shot has no learning rate to select")
    eps_all = _fewshot_episodes(kind, classes, split, episodes, n_way, k_shot, n_query, seed)
    backbone = build_backbone(num_classes, state)
    steps = _steps_of(method, steps, lp_steps)
    scores = {float(lr): [] for lr in lrs}
    zero = []
    for e_i, ep in enumerate(eps_all):
        feats: dict = {}
        zero.append(_fewshot_method("zero-shot", backbone, ep, lr=0.0, steps=steps, m=m,
                                    seed=seed + e_i, temperature=temperature, feats=feats)[0])
        for lr in scores:
            scores[lr].append(_fewshot_method(method, backbone, ep, lr=lr, steps=steps, m=m,
                                              seed=seed + e_i, temperature=temperature,
                                              feats=feats, ft_classifier=ft_classifier)[0])
    means = {lr: float(np.mean(v)) for lr, v in scores.items()}
    best = max(means, key=lambda r: (means[r], -r))
    return {"method": method, "lr": best, "scores": means, "zero_shot": float(np.mean(zero)),
            "episodes": episodes}


def fewshot_diagnostic(state: dict, num_classes: int, kind: str, classes, *, lrs: dict,
                       episodes: int, steps: int, lp_steps: int | None = None, m: int = 3,
                       eps_values=(1e-3, 1e-2, 1e-1), draws: int = 4, n_way: int = 5,
                       k_shot: int = 5, n_query: int = 15, seed: int = 0,
                       temperature: float | str = "loo", split: str = "train",
                       ft_classifier: str = "head") -> dict:
    """Is ε too small for FF to change a prediction? On ``episodes`` *validation* episodes
    (as :func:`fewshot_validate`), FF FT and FF LP at their chosen rates ``lrs`` for every ε
    of ``eps_values``, and BP FT / BP LP for reference: mean query accuracy, the number of
    episodes whose accuracy differs from zero-shot, and the cosine between the first step's
    FF estimate and the true support-loss gradient (:func:`estimate_alignment`).

    Returns ``{"zero_shot", "episodes", "dims": {method: d}, "methods": {method: {eps (str;
    "-" for BP): {"accuracy", "changed", "cosine"}}}}``."""
    torch.set_num_threads(1)
    eps_all = _fewshot_episodes(kind, classes, split, episodes, n_way, k_shot, n_query, seed)
    backbone = build_backbone(num_classes, state)
    plan = {"BP FT": [None], "FF FT": list(eps_values), "BP LP": [None],
            "FF LP": list(eps_values)}
    acc = {mth: {e: [] for e in v} for mth, v in plan.items()}
    cos = {mth: {e: [] for e in v} for mth, v in plan.items() if mth.startswith("FF")}
    dims: dict = {}
    zero = []
    for e_i, ep in enumerate(eps_all):
        feats: dict = {}
        zero.append(_fewshot_method("zero-shot", backbone, ep, lr=0.0, steps=steps, m=m,
                                    seed=seed + e_i, temperature=temperature, feats=feats)[0])
        for mth, eps_list in plan.items():
            for eps in eps_list:
                acc[mth][eps].append(_fewshot_method(
                    mth, backbone, ep, lr=lrs[mth], steps=_steps_of(mth, steps, lp_steps),
                    m=m, seed=seed + e_i, temperature=temperature, feats=feats,
                    ff_overrides=None if eps is None else {"eps": eps},
                    ft_classifier=ft_classifier)[0])
                if eps is None:
                    continue
                if mth == "FF FT":
                    model, x = (with_episode_head(backbone, ep, temperature=temperature),
                                ep.support_x)
                else:
                    fs = feats["fp32"][0]
                    model, x = prototype_head(fs, ep.support_y, n_way, temperature), fs
                dims[mth] = sum(p.numel() for p in model.parameters())
                cos[mth][eps].append(estimate_alignment(model, x, ep.support_y, m=m, eps=eps,
                                                        draws=draws, seed=seed + e_i))
    out = {}
    for mth, per in acc.items():
        out[mth] = {}
        for eps, v in per.items():
            key = "-" if eps is None else f"{eps:g}"
            out[mth][key] = {"accuracy": float(np.mean(v)),
                             "changed": int(sum(a != z for a, z in zip(v, zero, strict=True))),
                             "cosine": (float(np.mean(cos[mth][eps])) if eps is not None
                                        else None)}
    return {"zero_shot": float(np.mean(zero)), "episodes": episodes, "dims": dims,
            "methods": out}


# --------------------------------------------------------------------------- OOD (§4.3)

def ood_data(corruption: str, severity: int, *, n_train: int = 1000, n_test: int = 1000,
             seed: int = 0):
    """Corrupted MNIST: the last ``n_train`` training images (adaptation set) and the first
    ``n_test`` test images, corrupted with ``corruption`` at ``severity``
    (:func:`bpfree.data.corrupt`, seeds ``seed`` and ``seed + 1``)."""
    xtr, ytr = _load("mnist", "train")
    xte, yte = _load("mnist", "test")
    a = corrupt(xtr[-n_train:], corruption, severity, seed=seed,
                start_index=len(xtr) - n_train)
    b = corrupt(xte[:n_test], corruption, severity, seed=seed + 1)
    return ((_to_tensor(a), torch.from_numpy(ytr[-n_train:].astype(np.int64))),
            (_to_tensor(b), torch.from_numpy(yte[:n_test].astype(np.int64))))


def _variant_config(variant: dict, seed: int) -> QZOFFConfig:
    kw = {k: v for k, v in variant.items()
          if k not in ("method", "precision", "label", "lr", "lrs")}
    return ff_config(variant.get("precision", "fp32"), seed=seed, **kw)


def _select_lr(head, variant, ftr, ytr, lrs, epochs, batch_size, seed,
               trainable=None) -> tuple[float, dict]:
    """The rate of ``lrs`` with the best accuracy on a held-out fifth of the training set
    (ties to the smaller rate)."""
    n = len(ytr)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 7))
    cut = n // 5
    val, tr = perm[:cut], perm[cut:]
    scores = {}
    for lr in lrs:
        cfg = None if variant["method"] == "bp" else _variant_config(variant, seed)
        out = train_head(head, variant["method"], ftr[tr], ytr[tr], epochs=epochs,
                         batch_size=batch_size, lr=lr, seed=seed, config=cfg,
                         trainable=trainable)
        scores[lr] = accuracy(out["model"], ftr[val], ytr[val])
    best = max(lrs, key=lambda r: (scores[r], -r))
    return best, scores


def ood_task(state: dict, corruption: str, severity: int, variants: dict, *, epochs: int,
             batch_size: int = 100, lrs=(3e-4, 1e-3, 3e-3, 1e-2), seeds=(0, 1, 2),
             n_train: int = 1000, n_test: int = 1000, data_seed: int = 0,
             select_lr: dict | None = None) -> dict:
    """Linear-probe adaptation ("LP 1 LN") of the pretrained 10-class backbone on one
    corrupted task.

    ``variants``: ``{label: {"method": "bp" | "ff" | "zero-shot", "precision": ...,
    **QZOFFConfig overrides, optional "lr", optional "lrs"}}``. Each variant's learning rate
    is its ``"lr"``, else ``select_lr[label]`` names another variant whose chosen rate it
    shares, else it is chosen from its ``"lrs"`` (default ``lrs``) on a held-out fifth of the
    adaptation images; then it trains the
    pretrained decoder once per seed on all ``n_train`` images and is tested on the corrupted
    test images. Returns ``{label: {"accuracy": [per seed], "lr", "lr_scores", "loss" (seed
    0 curve), "forwards", "seconds", "eps_underflow"}}`` plus ``"_meta"``.
    """
    torch.set_num_threads(1)
    t_all = time.perf_counter()
    (xtr, ytr), (xte, yte) = ood_data(corruption, severity, n_train=n_train, n_test=n_test,
                                      seed=data_seed)
    backbone = build_backbone(10, state)
    head = nn.Sequential(copy.deepcopy(backbone[-1]))
    feats = {}

    def features(prec):
        key = prec if prec in ("fp32", "fp16") else f"a{precision_bits(prec)[1]}"
        if key not in feats:
            feats[key] = (frozen_features(backbone, xtr, prec),
                          frozen_features(backbone, xte, prec, calibration=xtr))
        return feats[key]

    out: dict = {}
    chosen: dict = {}
    select_lr = select_lr or {}
    for label, variant in variants.items():
        t0 = time.perf_counter()
        prec = variant.get("precision", "fp32")
        ftr, fte = features(prec)
        if variant["method"] == "zero-shot":
            out[label] = {"accuracy": [accuracy(head, fte, yte)], "seconds": 0.0}
            continue
        if "lr" in variant:
            lr, scores = variant["lr"], {}
        elif label in select_lr:
            lr, scores = chosen[select_lr[label]], {}
        else:
            lr, scores = _select_lr(head, variant, ftr, ytr, variant.get("lrs", lrs), epochs,
                                    batch_size, data_seed)
        chosen[label] = lr
        res = {"accuracy": [], "lr": lr, "lr_scores": {str(k): v for k, v in scores.items()},
               "seeds": list(seeds)}
        for s in seeds:
            cfg = None if variant["method"] == "bp" else _variant_config(variant, s)
            r = train_head(head, variant["method"], ftr, ytr, epochs=epochs,
                           batch_size=batch_size, lr=lr, seed=s, config=cfg)
            res["accuracy"].append(accuracy(r["model"], fte, yte))
            if s == seeds[0]:
                res["loss"] = r["loss"]
                res["forwards"] = r["forwards"]
                res["eps_underflow"] = r.get("eps_underflow", [])
        res["seconds"] = time.perf_counter() - t0
        out[label] = res
    out["_meta"] = {"corruption": corruption, "severity": severity, "n_train": n_train,
                    "n_test": n_test, "data_seed": data_seed,
                    "seconds": time.perf_counter() - t_all}
    return out


def alignment_task(state: dict, corruption: str, severity: int, *, m_values=(1, 3, 10),
                   eps: float = 1e-3, draws: int = 16, batch_size: int = 100,
                   n_train: int = 1000, data_seed: int = 0) -> dict:
    """:func:`estimate_alignment` of the pretrained linear decoder on one batch of a corrupted
    adaptation set, for every ``m``: ``{"cosine": {m: mean}, "expected": {m: sqrt(2m/πd)},
    "dims": d}`` -- what averaging m directions buys per step."""
    torch.set_num_threads(1)
    (xtr, ytr), _ = ood_data(corruption, severity, n_train=n_train, n_test=1, seed=data_seed)
    backbone = build_backbone(10, state)
    head = nn.Sequential(copy.deepcopy(backbone[-1]))
    ftr = frozen_features(backbone, xtr[:batch_size])
    d = sum(p.numel() for p in head.parameters())
    return {"cosine": {str(m): estimate_alignment(head, ftr, ytr[:batch_size], m=m, eps=eps,
                                                  draws=draws, seed=data_seed)
                       for m in m_values},
            "expected": {str(m): expected_alignment(m, d) for m in m_values}, "dims": d}


# --------------------------------------------------------------------------- landscape (App. E)

def landscape_task(state: dict, corruption: str, severity: int, runs: dict, paths: dict, *,
                   epochs: int, batch_size: int = 100, seed: int = 0, n_train: int = 1000,
                   steps: int = 21, data_seed: int = 0) -> dict:
    """Fig. 6 analogue: train the pretrained decoder with each of ``runs`` (``{label:
    {"method", "precision", "lr", ...}}``) on one corrupted task while recording its
    trajectory, then for each ``paths`` entry ``{centre label: png path}`` draw the loss
    contours (training loss on the adaptation set) around that run's final weights in the
    PCA plane of all trajectories, with every trajectory on it. Returns per run the final
    training loss, the test accuracy and per figure the explained variance."""
    torch.set_num_threads(1)
    (xtr, ytr), (xte, yte) = ood_data(corruption, severity, n_train=n_train, seed=data_seed)
    backbone = build_backbone(10, state)
    head = nn.Sequential(copy.deepcopy(backbone[-1]))
    feats = {}
    results, finals, trajs = {}, {}, {}
    for label, run in runs.items():
        prec = run.get("precision", "fp32")
        if prec not in feats:
            feats[prec] = (frozen_features(backbone, xtr, prec),
                           frozen_features(backbone, xte, prec, calibration=xtr))
        ftr, fte = feats[prec]
        cfg = None if run["method"] == "bp" else _variant_config(run, seed)
        r = train_head(head, run["method"], ftr, ytr, epochs=epochs, batch_size=batch_size,
                       lr=run["lr"], seed=seed, config=cfg,
                       recorder=lambda mdl: TrajectoryRecorder(
                           mdl, [n for n, _ in mdl.named_parameters()]))
        finals[label] = (r["model"], prec)
        trajs[label] = r["recorder"]
        with torch.no_grad():
            final_loss = float(nn.functional.cross_entropy(r["model"](ftr), ytr))
        results[label] = {"final_train_loss": final_loss, "lr": run["lr"],
                          "test_accuracy": accuracy(r["model"], fte, yte),
                          "distance": float((trajs[label].snapshots[-1]
                                             - trajs[label].snapshots[0]).norm())}
    figures = {}
    for centre, path in paths.items():
        model, prec = finals[centre]
        ftr = feats[prec][0]
        model = copy.deepcopy(model)

        def loss_fn(mdl, ftr=ftr):
            return nn.functional.cross_entropy(mdl(ftr), ytr)

        names = [n for n, _ in model.named_parameters()]
        fig = landscape_figure(model, loss_fn, trajs, path, names=names,
                               center=flatten_params(model, names), steps=steps,
                               title=f"Loss landscape around the {centre} decoder "
                                     f"({corruption.replace('_', ' ')}, severity {severity})")
        figures[centre] = {"path": str(fig["path"]),
                           "explained_variance_ratio": [float(v) for v in
                                                        fig["explained_variance_ratio"]]}
    return {"runs": results, "figures": figures}


# --------------------------------------------------------------------------- pool entry

TASKS = {"pretrain": pretrain, "fewshot": fewshot_chunk, "fewshot_validate": fewshot_validate,
         "fewshot_diagnostic": fewshot_diagnostic, "ood": ood_task, "alignment": alignment_task,
         "landscape": landscape_task}


def run_task(task: tuple[str, dict]) -> dict:
    """Process-pool entry point: ``(kind, kwargs)`` with kind in :data:`TASKS`, run on one
    CPU thread; returns the task's dict with ``"wall_seconds"`` added."""
    return run_named_task(TASKS, task, seconds_key="wall_seconds")
