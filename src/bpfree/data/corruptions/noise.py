"""ImageNet-C's noise family: Gaussian, shot (Poisson), impulse (salt and pepper), speckle.

Each ``fn(x, param, rngs)`` maps float64 ``[N, H, W, C]`` images in [0, 1] to the same shape
(the caller clips); ``rngs`` holds one generator per image.
"""

from __future__ import annotations

import numpy as np

from .batch import stack_draws

__all__ = ["gaussian_noise", "impulse_noise", "shot_noise", "speckle_noise"]


def gaussian_noise(x, std, rngs):
    return x + stack_draws(rngs, lambda r: r.normal(0.0, std, size=x.shape[1:]))


def shot_noise(x, photons, rngs):
    # Poisson photon counts: brighter pixels get more (absolute) noise, black stays black.
    return np.stack([r.poisson(xi * photons) for r, xi in zip(rngs, x)]) / photons


def impulse_noise(x, amount, rngs):
    # scikit-image's random_noise(mode="s&p"): a fraction `amount` of values is replaced,
    # half by 1 (salt) and half by 0 (pepper), independently per channel.
    u = stack_draws(rngs, lambda r: r.random(size=(2,) + x.shape[1:]))
    flipped, salt = u[:, 0] < amount, u[:, 1] < 0.5
    return np.where(flipped, salt.astype(np.float64), x)


def speckle_noise(x, std, rngs):
    return x + x * stack_draws(rngs, lambda r: r.normal(0.0, std, size=x.shape[1:]))
