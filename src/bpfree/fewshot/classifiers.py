"""Query classifiers on frozen features: ProtoNet (Snell et al. 2017; class-mean prototypes,
squared Euclidean distance) and SimpleShot (Wang et al. 2019; CL2N, nearest centroid)."""

from __future__ import annotations


import torch
from torch import Tensor


__all__ = ["protonet_logits", "protonet_predict", "simpleshot_predict"]

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
