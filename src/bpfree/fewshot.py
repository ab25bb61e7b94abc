"""Episodic few-shot evaluation: N-way K-shot episodes, ProtoNet and SimpleShot.

QZO-FF (Feng et al., NeurIPS 2024) §4.1 / App. B evaluates adaptation as few-shot learning:
a backbone trained on base classes is tested on 5-way 5-shot *episodes* drawn from held-out
classes, optionally fine-tuned on each episode's support set first (BP or forward
gradients, full fine-tuning / linear probing / deep VPT), and the query set is classified
with ProtoNet (Snell et al. 2017) or SimpleShot (Wang et al. 2019). The accuracy is the
mean over test episodes (100 in the paper's vision tables), reported here with a 95%
confidence interval.

* :func:`sample_episodes` -- deterministic N-way K-shot episodes from a given class set.
* :func:`protonet_predict` / :func:`protonet_logits` -- class-mean prototypes, squared
  Euclidean distance.
* :func:`simpleshot_predict` -- CL2N: subtract the base-class feature mean, L2-normalise,
  nearest centroid (Euclidean).
* :func:`mean_confidence_interval` -- mean and 95% half-width over episodes.
* :func:`evaluate_episodes` -- the loop: (optional per-episode fine-tune) -> features ->
  classifier -> accuracy.
* :func:`prototype_temperature` -- the logit scale of a prototype-initialised head, chosen
  by leave-one-out cross-entropy on the support set.
* :func:`feature_function`, :func:`with_episode_head`, :func:`bp_finetune` -- a frozen
  model's feature function, an episode copy with a temporary N-way head, and the reference
  backprop fine-tune (a forward-gradient fine-tune plugs in the same way: the ``finetune``
  argument of :func:`evaluate_episodes`); :func:`prototype_head` -- that head alone, on
  frozen features (linear probing).

Labels inside an :class:`Episode` are ``0..n_way-1``; ``episode.classes[i]`` is the original
dataset label of episode class ``i``.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from .training_modes import apply_mode

__all__ = [
    "CLASSIFIERS",
    "Episode",
    "EpisodeResults",
    "FeatureFunction",
    "base_feature_mean",
    "bp_finetune",
    "evaluate_episodes",
    "feature_function",
    "mean_confidence_interval",
    "protonet_logits",
    "protonet_predict",
    "prototype_head",
    "prototype_temperature",
    "sample_episodes",
    "simpleshot_predict",
    "with_episode_head",
]

#: Query classifiers of :func:`evaluate_episodes`. ``"head"`` takes the feature function's
#: output as ``n_way`` logits (e.g. :func:`bp_finetune` with ``output="logits"``: the
#: fine-tuned temporary head classifies, which is what linear probing needs).
CLASSIFIERS = ("protonet", "simpleshot", "head")

FeatureFn = Callable[[Tensor], Tensor]


# --------------------------------------------------------------------------- episodes

@dataclass
class Episode:
    """One N-way K-shot task. Labels are ``0..n_way-1``; ``classes[i]`` is the dataset label
    of class ``i``; ``support_idx`` / ``query_idx`` index the arrays it was sampled from."""

    support_x: Tensor
    support_y: Tensor
    query_x: Tensor
    query_y: Tensor
    classes: tuple[int, ...]
    support_idx: np.ndarray | None = field(default=None, repr=False)
    query_idx: np.ndarray | None = field(default=None, repr=False)

    @property
    def n_way(self) -> int:
        return len(self.classes)

    @property
    def k_shot(self) -> int:
        return len(self.support_y) // self.n_way

    @property
    def n_query(self) -> int:
        return len(self.query_y) // self.n_way


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def sample_episodes(x, y, classes: Iterable[int], *, n_way: int = 5, k_shot: int = 5,
                    n_query: int = 15, episodes: int = 100, seed: int) -> list[Episode]:
    """Draw ``episodes`` N-way K-shot tasks from the samples of ``classes``; deterministic.

    Args:
        x: samples ``[N, ...]`` (tensor or numpy array, already preprocessed; indexed, not
            copied as a whole).
        y: integer labels ``[N]``.
        classes: the labels episodes may use (e.g. the held-out digits 5..9); others are
            never sampled.
        n_way, k_shot, n_query: classes per episode, support and query samples per class.
        episodes: number of tasks.
        seed: seed of a ``numpy.random.default_rng``; the same arguments and seed give the
            same episodes.

    Per episode, ``n_way`` distinct classes are drawn without replacement, then
    ``k_shot + n_query`` distinct samples of each (support and query never overlap).
    Support and query are ordered by episode class. Raises ``ValueError`` when ``n_way``
    exceeds the classes given, when a class has fewer than ``k_shot + n_query`` samples
    (or none), and for non-positive sizes or mismatched ``x`` / ``y``.
    """
    n_way = _positive_int("n_way", n_way)
    k_shot = _positive_int("k_shot", k_shot)
    n_query = _positive_int("n_query", n_query)
    episodes = _positive_int("episodes", episodes)
    xt = x if isinstance(x, Tensor) else torch.as_tensor(np.asarray(x))
    yn = y.cpu().numpy() if isinstance(y, Tensor) else np.asarray(y)
    if yn.ndim != 1 or len(yn) != len(xt):
        raise ValueError(f"y must be 1-D with one label per sample of x, got y {list(yn.shape)} "
                         f"and x {list(xt.shape)}")
    cls = sorted({int(c) for c in classes})
    if not cls:
        raise ValueError("classes is empty")
    if n_way > len(cls):
        raise ValueError(f"n_way={n_way} exceeds the {len(cls)} classes available {cls}")
    need = k_shot + n_query
    pools = {}
    for c in cls:
        idx = np.flatnonzero(yn == c)
        if len(idx) < need:
            raise ValueError(f"class {c} has {len(idx)} samples; k_shot + n_query = "
                             f"{k_shot} + {n_query} = {need} are needed per class")
        pools[c] = idx
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(episodes):
        chosen = rng.choice(np.array(cls), size=n_way, replace=False)
        picks = [rng.choice(pools[int(c)], size=need, replace=False) for c in chosen]
        s_idx = np.concatenate([p[:k_shot] for p in picks])
        q_idx = np.concatenate([p[k_shot:] for p in picks])
        s_t, q_t = torch.from_numpy(s_idx), torch.from_numpy(q_idx)
        out.append(Episode(
            support_x=xt[s_t], support_y=torch.arange(n_way).repeat_interleave(k_shot),
            query_x=xt[q_t], query_y=torch.arange(n_way).repeat_interleave(n_query),
            classes=tuple(int(c) for c in chosen), support_idx=s_idx, query_idx=q_idx))
    return out


# --------------------------------------------------------------------------- classifiers

def _check_feats(support_feats: Tensor, support_y: Tensor, query_feats: Tensor):
    if support_feats.ndim != 2 or query_feats.ndim != 2:
        raise ValueError(f"features must be 2-D [n, d], got support {list(support_feats.shape)}"
                         f" and query {list(query_feats.shape)}")
    if support_feats.shape[1] != query_feats.shape[1]:
        raise ValueError(f"support and query feature widths differ: {support_feats.shape[1]} "
                         f"vs {query_feats.shape[1]}")
    support_y = torch.as_tensor(support_y)
    if support_y.shape != (support_feats.shape[0],):
        raise ValueError(f"support_y must hold one label per support feature, got "
                         f"{list(support_y.shape)} for {support_feats.shape[0]} features")
    return support_y


def _centroids(support_feats: Tensor, support_y: Tensor) -> tuple[Tensor, Tensor]:
    labels = torch.unique(support_y)  # sorted
    protos = torch.stack([support_feats[support_y == c].mean(0) for c in labels])
    return protos, labels


def _neg_sq_dist(query: Tensor, protos: Tensor) -> Tensor:
    return -((query[:, None, :] - protos[None, :, :]) ** 2).sum(-1)


def protonet_logits(support_feats: Tensor, support_y: Tensor,
                    query_feats: Tensor) -> tuple[Tensor, Tensor]:
    """ProtoNet scores: ``-||f(q) - c_k||²`` for each query and class prototype ``c_k`` (the
    mean support feature of class k). Returns ``(logits [Q, C], labels [C])``, the classes
    being the sorted distinct values of ``support_y``."""
    support_y = _check_feats(support_feats, support_y, query_feats)
    protos, labels = _centroids(support_feats, support_y)
    return _neg_sq_dist(query_feats, protos), labels


def protonet_predict(support_feats: Tensor, support_y: Tensor, query_feats: Tensor) -> Tensor:
    """ProtoNet (Snell et al. 2017): the label of the nearest class-mean prototype in squared
    Euclidean distance, one per query (ties: the smaller label)."""
    logits, labels = protonet_logits(support_feats, support_y, query_feats)
    return labels[logits.argmax(1)]


def simpleshot_predict(support_feats: Tensor, support_y: Tensor, query_feats: Tensor, *,
                       base_mean: Tensor | None = None, eps: float = 1e-12) -> Tensor:
    """SimpleShot (Wang et al. 2019), CL2N variant: ``f <- (f - base_mean) / ||f - base_mean||``
    for support and query, then nearest class centroid (mean of the normalised support
    features, not re-normalised) in Euclidean distance. ``base_mean`` is the mean feature of
    the base (training) classes (:func:`base_feature_mean`); ``None`` gives the L2N variant
    (no centring)."""
    support_y = _check_feats(support_feats, support_y, query_feats)
    if base_mean is not None:
        base_mean = torch.as_tensor(base_mean, dtype=support_feats.dtype)
        if base_mean.shape != (support_feats.shape[1],):
            raise ValueError(f"base_mean must have shape [{support_feats.shape[1]}], got "
                             f"{list(base_mean.shape)}")
        support_feats, query_feats = support_feats - base_mean, query_feats - base_mean

    def l2n(f: Tensor) -> Tensor:
        return f / f.norm(dim=1, keepdim=True).clamp_min(eps)

    protos, labels = _centroids(l2n(support_feats), support_y)
    return labels[_neg_sq_dist(l2n(query_feats), protos).argmax(1)]


# --------------------------------------------------------------------------- statistics

def mean_confidence_interval(accs: Sequence[float], *, confidence: float = 0.95,
                             method: str = "normal") -> tuple[float, float]:
    """Mean and confidence half-width of per-episode accuracies.

    ``method="normal"`` (default, the few-shot literature's convention):
    ``z · s / sqrt(n)`` with ``z = Φ⁻¹((1 + confidence)/2)`` (1.95996 for 95%) and ``s`` the
    sample standard deviation (ddof=1). ``method="t"`` uses Student's t quantile with n-1
    degrees of freedom instead of z (wider for small n; 1.984 vs 1.960 at n=100).
    One value gives a half-width of ``nan``; an empty input raises ``ValueError``.
    """
    a = np.asarray(accs, dtype=np.float64).reshape(-1)
    if a.size == 0:
        raise ValueError("accs is empty")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if method not in ("normal", "t"):
        raise ValueError(f"method must be 'normal' or 't', got {method!r}")
    mean = float(a.mean())
    n = a.size
    if n < 2:
        return mean, float("nan")
    if method == "normal":
        q = statistics.NormalDist().inv_cdf((1 + confidence) / 2)
    else:
        from scipy import stats  # lazy: heavy optional dependency
        q = float(stats.t.ppf((1 + confidence) / 2, df=n - 1))
    return mean, float(q * a.std(ddof=1) / math.sqrt(n))


# --------------------------------------------------------------------------- features

class FeatureFunction:
    """A model's feature map as a plain function: eval mode, ``torch.no_grad()``, batched.

    ``output="features"`` calls ``model.features`` (or, for an ``nn.Sequential``, every
    layer but the last); ``output="logits"`` calls the whole model. ``model`` is kept as an
    attribute (e.g. the adapted copy returned by :func:`bp_finetune`).
    """

    def __init__(self, model: nn.Module, output: str = "features", batch_size: int = 1024):
        if output not in ("features", "logits"):
            raise ValueError(f"output must be 'features' or 'logits', got {output!r}")
        self.model, self.output = model, output
        self.batch_size = _positive_int("batch_size", batch_size)
        if output == "logits":
            self._fn = model
        elif callable(getattr(model, "features", None)):
            self._fn = model.features
        elif isinstance(model, nn.Sequential) and len(model) > 1:
            self._fn = model[:-1]
        else:
            raise ValueError(f"{type(model).__name__} has no `features` method and is not an "
                             "nn.Sequential; cannot take its features")

    def __call__(self, x: Tensor) -> Tensor:
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                outs = [self._fn(x[i:i + self.batch_size])
                        for i in range(0, len(x), self.batch_size)]
        finally:
            self.model.train(was_training)
        return torch.cat(outs) if outs else self._fn(x[:0])


def feature_function(model: nn.Module, *, output: str = "features",
                     batch_size: int = 1024) -> FeatureFunction:
    """:class:`FeatureFunction` of ``model`` (the model is used as is, not copied)."""
    return FeatureFunction(model, output, batch_size)


def base_feature_mean(feature_fn: FeatureFn, x: Tensor) -> Tensor:
    """Mean feature of base-class samples ``x`` (SimpleShot's centring vector)."""
    return feature_fn(x).mean(0)


# --------------------------------------------------------------------------- evaluation

@dataclass
class EpisodeResults:
    """Per-episode query accuracies (fractions in [0, 1]) and their summary."""

    accuracies: np.ndarray
    classifier: str
    mean: float
    half_width: float
    seconds: float

    def __str__(self) -> str:
        return (f"{self.classifier}: {100 * self.mean:.2f} ± {100 * self.half_width:.2f} % "
                f"over {len(self.accuracies)} episodes")


def evaluate_episodes(feature_fn: FeatureFn | None, episodes: Sequence[Episode],
                      classifier: str = "protonet",
                      finetune: Callable[[Episode], FeatureFn] | None = None, *,
                      base_mean: Tensor | Callable[[FeatureFn], Tensor] | None = None,
                      confidence: float = 0.95, method: str = "normal") -> EpisodeResults:
    """Query accuracy of each episode, with mean and confidence half-width.

    Per episode: ``fn = finetune(episode)`` if ``finetune`` is given (it adapts a copy of
    the backbone on the support set, e.g. :func:`bp_finetune`; ``feature_fn`` is then
    unused and may be ``None``), else ``fn = feature_fn``; support and query are mapped
    through ``fn`` under ``torch.no_grad()`` and the queries classified by ``classifier``
    (:data:`CLASSIFIERS`): ``"protonet"``, ``"simpleshot"`` (needs ``base_mean``: a tensor,
    or a callable ``base_mean(fn) -> tensor`` evaluated per episode so that a fine-tuned
    backbone is centred with its own base mean), or ``"head"`` (``fn`` returns ``n_way``
    logits; the argmax is the prediction).
    """
    if classifier not in CLASSIFIERS:
        raise ValueError(f"unknown classifier {classifier!r}; choose one of "
                         f"{', '.join(CLASSIFIERS)}")
    if classifier == "simpleshot" and base_mean is None:
        raise ValueError("classifier 'simpleshot' needs base_mean: the mean base-class feature "
                         "(see base_feature_mean) or a callable fn -> mean")
    if finetune is None and feature_fn is None:
        raise ValueError("give feature_fn, or finetune(episode) -> feature_fn")
    episodes = list(episodes)
    if not episodes:
        raise ValueError("no episodes")
    start = time.perf_counter()
    accs = []
    for ep in episodes:
        fn = finetune(ep) if finetune is not None else feature_fn
        with torch.no_grad():
            q = fn(ep.query_x)
            if classifier == "head":
                if q.ndim != 2 or q.shape[1] != ep.n_way:
                    raise ValueError(f"classifier 'head' needs [Q, n_way={ep.n_way}] logits, "
                                     f"got {list(q.shape)}")
                pred = q.argmax(1)
            else:
                s = fn(ep.support_x)
                if classifier == "protonet":
                    pred = protonet_predict(s, ep.support_y, q)
                else:
                    mu = base_mean(fn) if callable(base_mean) else base_mean
                    pred = simpleshot_predict(s, ep.support_y, q, base_mean=mu)
        accs.append(float((pred.cpu() == ep.query_y.cpu()).float().mean()))
    acc = np.asarray(accs)
    mean, hw = mean_confidence_interval(acc, confidence=confidence, method=method)
    return EpisodeResults(acc, classifier, mean, hw, time.perf_counter() - start)


# --------------------------------------------------------------------------- fine-tuning

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
