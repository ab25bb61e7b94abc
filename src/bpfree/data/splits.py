"""Train / validation / test splits that keep the test split untouched.

Hyper-parameters are chosen on a validation split carved from the *training* split; the test
split is read only for the reported number. :func:`split_indices` carves it;
:func:`flat_image_splits` applies it to MNIST / Fashion-MNIST as flattened images in [0, 1]
(the input of the MLPs of TT-ZO §5.1 and TinyFoA §4).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from .idx import load_mnist

__all__ = ["flat_image_splits", "split_indices"]


def split_indices(n: int, n_train: int | None, n_val: int, *, shuffle: bool
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(train, val)`` index arrays into a training split of ``n`` samples: ``val`` is the
    last ``n_val`` samples (after a fixed seed-0 permutation when ``shuffle``), ``train`` the
    first ``n_train`` (None: all) of the others. Raises when they do not fit."""
    if n_val < 0 or n_val >= n:
        raise ValueError(f"the validation split must hold 0 to {n - 1} of the {n} training "
                         f"samples, got {n_val}")
    order = np.random.default_rng(0).permutation(n) if shuffle else np.arange(n)
    rest, val = order[:n - n_val], order[n - n_val:]
    if n_train is not None and n_train > len(rest):
        raise ValueError(f"{n_train} training samples requested but only {len(rest)} remain "
                         f"after the {n_val} validation samples")
    return rest[:n_train], val


def _flat(images: np.ndarray) -> torch.Tensor:
    # flatten(1), not reshape(n, -1): an empty validation split stays [0, 784]
    return torch.from_numpy(images).float().div_(255.0).flatten(1)


def flat_image_splits(kind: str = "mnist", *, n_train: int | None, n_val: int,
                      n_test: int | None, root: str | os.PathLike | None = None
                      ) -> tuple[torch.Tensor, ...]:
    """``(x_train, y_train, x_val, y_val, x_test, y_test)`` of an IDX dataset
    (:func:`~bpfree.data.load_mnist` ``kind``): images flattened to ``[N, 784]`` float32 in
    [0, 1], labels int64.

    The validation images are the *last* ``n_val`` of the training split (no shuffle, see
    :func:`split_indices`), the training images the first ``n_train`` (None: all) of the
    rest, the test images the first ``n_test`` (None: all) of the test split.
    """
    xi, yi = load_mnist(root, split="train", kind=kind)
    xt, yt = load_mnist(root, split="test", kind=kind)
    tr, va = split_indices(len(yi), n_train, n_val, shuffle=False)
    return (_flat(xi[tr]), torch.from_numpy(yi[tr]).long(), _flat(xi[va]),
            torch.from_numpy(yi[va]).long(), _flat(xt[:n_test]),
            torch.from_numpy(yt[:n_test]).long())
