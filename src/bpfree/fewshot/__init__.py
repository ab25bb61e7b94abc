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

The package's parts: :mod:`.episodes`, :mod:`.classifiers` (ProtoNet, SimpleShot),
:mod:`.evaluate` (feature functions, the loop, the confidence interval) and :mod:`.finetune`
(episode heads, :func:`bp_finetune`).
"""

from .classifiers import protonet_logits, protonet_predict, simpleshot_predict
from .episodes import Episode, sample_episodes
from .evaluate import (CLASSIFIERS, EpisodeResults, FeatureFunction, base_feature_mean,
                       evaluate_episodes, feature_function, mean_confidence_interval)
from .finetune import bp_finetune, prototype_head, prototype_temperature, with_episode_head

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
