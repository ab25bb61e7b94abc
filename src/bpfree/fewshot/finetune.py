"""Per-episode heads and fine-tuning: :func:`prototype_temperature`, a model's episode copy
with a temporary N-way head (:func:`with_episode_head`), that head alone on frozen features
(:func:`prototype_head`, linear probing) and the reference backprop fine-tune
(:func:`bp_finetune`)."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from ..training_modes import apply_mode
from .classifiers import _centroids, _check_feats
from .episodes import Episode, _positive_int
from .evaluate import FeatureFunction

__all__ = ["TEMPERATURE_GRID", "bp_finetune", "prototype_head", "prototype_temperature",
           "with_episode_head"]

#: Grid of :func:`prototype_temperature`: multiples of ``1 / mean squared distance``.
TEMPERATURE_GRID = tuple(float(v) for v in np.logspace(-2, 2, 41))


def prototype_temperature(feats: Tensor, y: Tensor, *, grid: Sequence[float] = TEMPERATURE_GRID
                          ) -> float:
    """Logit scale ``τ`` of a prototype-initialised head, ``τ·(2c_k·f − ||c_k||²)``, chosen
    from the support set alone.

    ProtoNet's head (``W_k = 2c_k``, ``b_k = -||c_k||²``) scores ``-||f − c_k||²`` up to a
    per-sample constant, so its logits scale with the squared feature distances: for raw CNN
    features (``||f||`` ≈ 25) they span hundreds, the support loss is ≈ 0 (or, for a
    misclassified support image, huge) and fine-tuning from that head barely moves. The
    argmax does not depend on ``τ``; the loss does. ``τ = r / s`` with ``s`` the mean squared
    distance of a support feature to its own leave-one-out prototype (the class mean without
    it) and ``r`` the value of ``grid`` minimising the leave-one-out cross-entropy
    ``CE(-τ·||f_i − c_{y_i}^{(-i)}||², ...)`` -- an estimate of the query loss that uses no query
    labels (ties: the smaller ``r``). With one shot per class (no leave-one-out prototype)
    ``τ = 1 / s'`` with ``s'`` the mean squared distance between the prototypes.
    """
    feats = torch.as_tensor(feats).detach().to(torch.float64)
    y = torch.as_tensor(y)
    _check_feats(feats, y, feats)
    labels = torch.unique(y)
    if len(labels) < 2:
        raise ValueError("prototype_temperature needs at least two classes")
    idx = torch.searchsorted(labels, y)
    counts = torch.bincount(idx, minlength=len(labels)).to(torch.float64)
    sums = torch.zeros(len(labels), feats.shape[1], dtype=torch.float64).index_add_(0, idx, feats)
    if int(counts.min()) < 2:
        protos = sums / counts[:, None]
        d2 = ((protos[:, None] - protos[None]) ** 2).sum(-1)
        off = d2[~torch.eye(len(labels), dtype=torch.bool)]
        s = float(off.mean())
        return 1.0 / s if s > 0 else 1.0
    rows = torch.arange(len(y))
    loo = sums[None].repeat(len(y), 1, 1)                     # [N, C, d]
    cnt = counts[None].repeat(len(y), 1)
    loo[rows, idx] -= feats
    cnt[rows, idx] -= 1
    loo = loo / cnt[..., None]
    d2 = ((feats[:, None] - loo) ** 2).sum(-1)                 # [N, C]
    s = float(d2[rows, idx].mean())
    if not s > 0:
        return 1.0
    best, best_loss = None, math.inf
    for r in grid:
        loss = float(nn.functional.cross_entropy(-(r / s) * d2, idx))
        if loss < best_loss - 1e-12:
            best, best_loss = r, loss
    return float(best) / s


def _support_features(model: nn.Module, x: Tensor) -> Tensor:
    return FeatureFunction(model, "features")(x)


def _check_temperature(temperature):
    if temperature == "loo":
        return temperature
    if (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
            or not math.isfinite(temperature) or temperature <= 0):
        raise ValueError(f"temperature must be a finite number > 0 or 'loo', got "
                         f"{temperature!r}")
    return float(temperature)


def with_episode_head(model: nn.Module, episode: Episode, *,
                      head_init: str = "prototype", temperature: float | str = 1.0
                      ) -> nn.Module:
    """A deep copy of ``model`` whose head is a fresh ``Linear(d, n_way)`` for ``episode``.

    The head is ``model.head`` (or the last layer of an ``nn.Sequential``), which must be an
    ``nn.Linear``. ``head_init``: ``"prototype"`` (default) sets ``W_k = 2τ c_k`` and
    ``b_k = -τ||c_k||²`` from the support prototypes ``c_k``, so before any training the head
    ranks classes exactly like ProtoNet (Snell et al. 2017 §2.3; Triantafillou et al. 2020);
    ``"zero"`` zeros it; ``"random"`` keeps ``nn.Linear``'s default init (seeded by the
    caller's torch RNG). ``temperature`` ``τ`` (prototype init only): a number (1.0: the plain
    ProtoNet head) or ``"loo"`` for :func:`prototype_temperature` on the support features.
    """
    if head_init not in ("prototype", "zero", "random"):
        raise ValueError(f"head_init must be 'prototype', 'zero' or 'random', got {head_init!r}")
    temperature = _check_temperature(temperature)
    m = copy.deepcopy(model)
    if isinstance(getattr(m, "head", None), nn.Linear):
        old, setter = m.head, (lambda new: setattr(m, "head", new))
    elif isinstance(m, nn.Sequential) and isinstance(m[-1], nn.Linear):
        old, setter = m[-1], (lambda new: m.__setitem__(len(m) - 1, new))
    else:
        raise ValueError(f"{type(model).__name__} needs an nn.Linear `head` (or an "
                         "nn.Sequential ending in nn.Linear) to take a temporary episode head")
    p0 = next(m.parameters())
    head = nn.Linear(old.in_features, episode.n_way).to(device=p0.device, dtype=p0.dtype)
    with torch.no_grad():
        if head_init == "zero":
            head.weight.zero_()
            head.bias.zero_()
        elif head_init == "prototype":
            feats = _support_features(m, episode.support_x.to(p0.device))
            protos, _ = _centroids(feats, episode.support_y.to(p0.device))
            tau = (prototype_temperature(feats, episode.support_y.to(p0.device))
                   if temperature == "loo" else temperature)
            _set_prototype_weights(head, protos, tau)
    setter(head)
    return m


def _set_prototype_weights(head: nn.Linear, protos: Tensor, tau: float) -> None:
    """ProtoNet's head: ``W_k = 2τ c_k``, ``b_k = -τ||c_k||²`` (Snell et al. 2017 §2.3)."""
    head.weight.copy_(2 * tau * protos)
    head.bias.copy_(-tau * (protos ** 2).sum(1))


def prototype_head(feats: Tensor, y: Tensor, n_way: int,
                   temperature: float | str = 1.0) -> nn.Sequential:
    """``Sequential(Linear(d, n_way))`` initialised as ProtoNet's head on features ``feats``
    with labels ``y`` in ``0..n_way-1`` (as :func:`with_episode_head` does for a whole model),
    for linear probing on frozen features. ``temperature`` ``τ``: a number, or ``"loo"`` for
    :func:`prototype_temperature`; the argmax, hence the zero-shot prediction, is the same for
    every ``τ``."""
    temperature = _check_temperature(temperature)
    head = nn.Linear(feats.shape[1], n_way)
    with torch.no_grad():
        protos = torch.stack([feats[y == k].mean(0) for k in range(n_way)])
        tau = prototype_temperature(feats, y) if temperature == "loo" else temperature
        _set_prototype_weights(head, protos, tau)
    return nn.Sequential(head)


def bp_finetune(model: nn.Module, episode: Episode, mode: str = "full", epochs: int = 50,
                lr: float = 1e-3, *, k: int | None = None, batch_size: int | None = None,
                weight_decay: float = 0.0, head_init: str = "prototype",
                temperature: float | str = 1.0, output: str = "features", seed: int = 0
                ) -> FeatureFunction:
    """Reference backprop fine-tune on an episode's support set; returns the adapted copy's
    feature function (``.model`` is the copy; ``model`` itself is untouched).

    The copy gets a temporary ``n_way`` linear head (:func:`with_episode_head`, with
    ``head_init`` and ``temperature``); the
    parameters of ``mode`` (:func:`bpfree.training_modes.apply_mode`, ``k`` for
    ``"last-k"``; the head is trainable in every mode) are trained with AdamW
    (betas 0.9/0.95, as QZO-FF App. C/D) on cross-entropy for ``epochs`` passes over the
    support set in shuffled mini-batches of ``batch_size`` (default: the whole support set,
    so an epoch is one step). The copy stays in eval mode (TinyViT has no dropout or
    BatchNorm; for other models this keeps BatchNorm statistics fixed on tiny support sets).

    ``output="features"`` returns the backbone features (for ProtoNet/SimpleShot);
    ``output="logits"`` returns the temporary head's logits (use ``classifier="head"``) --
    the way to evaluate ``"linear-probe"``, which leaves the features unchanged.
    """
    epochs = _positive_int("epochs", epochs)
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr!r}")
    m = with_episode_head(model, episode, head_init=head_init, temperature=temperature)
    names = set(apply_mode(m, mode, k=k))
    params = [p for n, p in m.named_parameters() if n in names]
    m.eval()
    dev = params[0].device
    xs, ys = episode.support_x.to(dev), episode.support_y.to(dev)
    n = len(ys)
    bs = n if batch_size is None else _positive_int("batch_size", batch_size)
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen).to(dev)
        for i in range(0, n, bs):
            idx = order[i:i + bs]
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(m(xs[idx]), ys[idx])
            loss.backward()
            opt.step()
    for p in m.parameters():
        p.requires_grad_(False)
    return FeatureFunction(m, output)
