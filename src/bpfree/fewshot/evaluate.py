"""The episodic evaluation loop: a model's feature function, (optional per-episode
fine-tune) -> features -> classifier -> accuracy, and the mean with its confidence interval
over episodes."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from .classifiers import protonet_predict, simpleshot_predict
from .episodes import Episode, _positive_int

__all__ = ["CLASSIFIERS", "EpisodeResults", "FeatureFunction", "base_feature_mean",
           "evaluate_episodes", "feature_function", "mean_confidence_interval"]

#: Query classifiers of :func:`evaluate_episodes`. ``"head"`` takes the feature function's
#: output as ``n_way`` logits (e.g. :func:`bp_finetune` with ``output="logits"``: the
#: fine-tuned temporary head classifies, which is what linear probing needs).
CLASSIFIERS = ("protonet", "simpleshot", "head")

FeatureFn = Callable[[Tensor], Tensor]


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
