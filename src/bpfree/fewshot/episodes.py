"""N-way K-shot episodes: :class:`Episode` and :func:`sample_episodes` (QZO-FF §4.1 /
App. B: 5-way 5-shot episodes from held-out classes)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor


__all__ = ["Episode", "sample_episodes"]

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
