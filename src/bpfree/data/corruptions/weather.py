"""ImageNet-C's weather family: fog (a plasma-fractal haze) and brightness.

Each ``fn(x, param, rngs)`` maps float64 ``[N, H, W, C]`` images in [0, 1] to the same shape
(the caller clips); ``rngs`` holds one generator per image, ``None`` for deterministic ones.
"""

from __future__ import annotations

import numpy as np

from .batch import stack_draws

__all__ = ["brightness", "fog"]


def _plasma_fractal(noise: np.ndarray, mapsize: int, decay: float) -> np.ndarray:
    """Diamond-square heightmaps [N, mapsize, mapsize] in [0, 1], one per row of ``noise``
    (``mapsize**2 - 1`` uniforms in [-1, 1) each, consumed in the reference's order)."""
    n = noise.shape[0]
    hm = np.zeros((n, mapsize, mapsize))
    used = 0
    step, wibble = mapsize, 100.0

    def wibbled_mean(total):
        nonlocal used
        k = total.shape[1] * total.shape[2]
        # The reference's wibble * uniform(-wibble, wibble): noise scales with wibble**2.
        jitter = wibble * wibble * noise[:, used:used + k].reshape(total.shape)
        used += k
        return total / 4.0 + jitter

    while step >= 2:
        half = step // 2
        corners = hm[:, ::step, ::step]
        squares = corners + np.roll(corners, -1, axis=1)
        squares = squares + np.roll(squares, -1, axis=2)
        hm[:, half::step, half::step] = wibbled_mean(squares)
        centres, corners = hm[:, half::step, half::step], hm[:, ::step, ::step]
        left = centres + np.roll(centres, 1, axis=1) + corners + np.roll(corners, -1, axis=2)
        hm[:, ::step, half::step] = wibbled_mean(left)
        top = centres + np.roll(centres, 1, axis=2) + corners + np.roll(corners, -1, axis=1)
        hm[:, half::step, ::step] = wibbled_mean(top)
        step //= 2
        wibble /= decay
    hm -= hm.min(axis=(1, 2), keepdims=True)
    return hm / hm.max(axis=(1, 2), keepdims=True)


def fog(x, param, rngs):
    amount, decay = param
    n, h, w, _ = x.shape
    mapsize = 1 << (max(h, w) - 1).bit_length()  # next power of two >= max(H, W)
    noise = stack_draws(rngs, lambda r: r.uniform(-1.0, 1.0, size=mapsize * mapsize - 1))
    haze = _plasma_fractal(noise, mapsize, decay)[:, :h, :w, None]
    peak = x.max(axis=(1, 2, 3), keepdims=True)
    # Rescale so the brightest clean pixel keeps its value: fog lifts the dark parts.
    return (x + amount * haze) * peak / (peak + amount)



def brightness(x, shift, rngs):
    if x.shape[-1] == 1:
        return x + shift
    # HSV value V = max over channels; at fixed hue and saturation every channel scales with
    # V, so adding to V in HSV is a per-pixel rescale. Black pixels (V = 0) have S = 0 and
    # become gray at the new V, as skimage's rgb2hsv/hsv2rgb round trip makes them.
    v = x.max(axis=-1, keepdims=True)
    v_new = np.clip(v + shift, 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = x * (v_new / v)
    return np.where(v > 0, scaled, v_new)
