"""MNIST-C's geometric corruptions: rotate, shear, scale and translate about the centre.

Each ``fn(x, param, rngs)`` maps float64 ``[N, H, W, C]`` images in [0, 1] to the same shape
(the caller clips); ``rngs`` holds one generator per image, ``None`` for deterministic ones.
"""

from __future__ import annotations

import numpy as np

from .batch import random_signs
from .resample import scale_about_centre, warp_about_centre

__all__ = ["rotate", "scale", "shear", "translate"]


def rotate(x, radians, rngs):
    theta = radians * random_signs(rngs)
    c, s = np.cos(theta), np.sin(theta)
    return warp_about_centre(x, np.stack([np.stack([c, -s], -1), np.stack([s, c], -1)], 1))


def shear(x, radians, rngs):
    # skimage AffineTransform(shear=c) used as the inverse map, in (row, col) order:
    # src_col = col - sin(c) * row, src_row = cos(c) * row, about the centre.
    c = radians * random_signs(rngs)
    zeros, ones = np.zeros_like(c), np.ones_like(c)
    mats = np.stack([np.stack([np.cos(c), zeros], -1), np.stack([-np.sin(c), ones], -1)], 1)
    return warp_about_centre(x, mats)


def scale(x, factor, rngs):
    return scale_about_centre(x, factor)


def translate(x, pixels, rngs):
    n, h, w, _ = x.shape
    shift = pixels * min(h, w) / 28.0 * random_signs(rngs, size=2)
    return warp_about_centre(x, np.broadcast_to(np.eye(2), (n, 2, 2)), shift)
