"""scikit-learn's bundled 8x8 digits (no network), split for the demo and the tests."""

from __future__ import annotations

import numbers

import numpy as np

__all__ = ["load_digits_split"]


def load_digits_split(seed: int = 0, test_fraction: float = 0.3
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Stratified train/test split of ``sklearn.datasets.load_digits`` (1,797 images).

    Returns ``(x_train, y_train, x_test, y_test)``: ``x`` float32 ``[N, 64]`` scaled to
    [0, 1] (the raw pixels are 0..16), ``y`` int64 in 0..9. The same ``seed`` gives the
    same split; every class keeps its share in both parts.
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an int in [0, 2**32 - 1], got {seed!r}")
    if (isinstance(test_fraction, bool) or not isinstance(test_fraction, numbers.Real)
            or not 0.0 < float(test_fraction) < 1.0):
        raise ValueError(f"test_fraction must be a float in (0, 1), got {test_fraction!r}")
    # lazy: scikit-learn is heavy to import and only the digits need it
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    n_test = round(len(y) * float(test_fraction))
    n_classes = len(np.unique(y))
    if not n_classes <= n_test <= len(y) - n_classes:
        raise ValueError(f"test_fraction={test_fraction} leaves {n_test} of {len(y)} samples "
                         f"for testing; a stratified split needs {n_classes} to "
                         f"{len(y) - n_classes}")
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=n_test, stratify=y,
                                              random_state=int(seed))
    return (np.ascontiguousarray(x_tr), np.ascontiguousarray(y_tr),
            np.ascontiguousarray(x_te), np.ascontiguousarray(y_te))
