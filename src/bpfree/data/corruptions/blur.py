"""ImageNet-C's blur family: Gaussian, glass, defocus, motion and zoom blur.

Each ``fn(x, param, rngs)`` maps float64 ``[N, H, W, C]`` images in [0, 1] to the same shape
(the caller clips); ``rngs`` holds one generator per image, ``None`` for deterministic ones.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import ndimage

from .batch import stack_draws
from .resample import scale_about_centre

__all__ = ["defocus_blur", "disk_kernel", "gaussian_blur", "glass_blur", "motion_blur",
           "zoom_blur"]


def gaussian_blur(x, sigma, rngs):
    # skimage.filters.gaussian's defaults: edge pixels repeated, truncated at 4 sigma.
    return ndimage.gaussian_filter(x, sigma=(0, sigma, sigma, 0), mode="nearest", truncate=4.0)


def glass_blur(x, param, rngs):
    sigma, delta, iterations, p_swap = param
    x = gaussian_blur(x, sigma, None)
    n, h, w, _ = x.shape
    hs, ws = list(range(h - delta, delta, -1)), list(range(w - delta, delta, -1))
    if hs and ws:
        shape = (iterations, len(hs), len(ws), 2)

        def draw(r):
            # randint(-delta, delta) as in the reference: +delta is never drawn.
            offsets = r.integers(-delta, delta, size=shape)
            if p_swap < 1.0:  # MNIST-C swaps each pixel only with probability 1/2
                offsets = offsets * (r.random(size=shape[:3]) < p_swap)[..., None]
            return offsets

        offsets = stack_draws(rngs, draw)  # [N, iters, |hs|, |ws|, (dx, dy)]
        b = np.arange(n)
        x = x.copy()
        # The swaps are sequential within an image (a pixel can be carried along by later
        # swaps), so loop over pixel positions but swap in all images at once.
        for it in range(iterations):
            for i, hh in enumerate(hs):
                dx, dy = offsets[:, it, i, :, 0], offsets[:, it, i, :, 1]
                for j, ww in enumerate(ws):
                    hp, wp = hh + dy[:, j], ww + dx[:, j]
                    here = x[b, hh, ww]
                    x[b, hh, ww] = x[b, hp, wp]
                    x[b, hp, wp] = here
    return gaussian_blur(x, sigma, None)


def _cv2_gaussian_kernel(ksize: int, sigma: float) -> np.ndarray:
    i = np.arange(ksize) - (ksize - 1) / 2.0
    g = np.exp(-(i ** 2) / (2.0 * sigma ** 2))
    return g / g.sum()


def disk_kernel(radius: float, alias_blur: float) -> np.ndarray:
    """The reference's anti-aliased disk: a normalized aliased disk, blurred with a small
    Gaussian, cropped to its nonzero support (the reference keeps a 17x17 frame of zeros)."""
    half = max(8, math.ceil(radius))
    ksize = 3 if radius <= 8 else 5
    pad = ksize // 2
    coords = np.arange(-half - pad, half + pad + 1)
    yy, xx = np.meshgrid(coords, coords, indexing="ij")
    disk = ((xx ** 2 + yy ** 2) <= radius ** 2).astype(np.float64)
    disk /= disk.sum()
    g = _cv2_gaussian_kernel(ksize, alias_blur)
    kernel = ndimage.convolve1d(ndimage.convolve1d(disk, g, axis=0, mode="constant"), g,
                                axis=1, mode="constant")
    nz = np.argwhere(kernel > 1e-12 * kernel.max())
    (r0, c0), (r1, c1) = nz.min(axis=0), nz.max(axis=0)
    # Keep the kernel square and centred so the blur does not shift the image.
    reach = max(abs(r0 - half - pad), abs(r1 - half - pad), abs(c0 - half - pad),
                abs(c1 - half - pad))
    centre = half + pad
    kernel = kernel[centre - reach:centre + reach + 1, centre - reach:centre + reach + 1]
    return kernel / kernel.sum()


def defocus_blur(x, param, rngs):
    radius, alias_blur = param
    kernel = disk_kernel(radius, alias_blur)
    k = kernel.shape[0] // 2
    # cv2.filter2D's default border is BORDER_REFLECT_101 = numpy's "reflect"; numpy refuses
    # padding wider than the image, so clamp (only reachable for tiny images / huge radii).
    k_pad = min(k, x.shape[1] - 1, x.shape[2] - 1)
    padded = np.pad(x, ((0, 0), (k_pad, k_pad), (k_pad, k_pad), (0, 0)), mode="reflect")
    if k_pad < k:
        padded = np.pad(padded, ((0, 0), (k - k_pad,) * 2, (k - k_pad,) * 2, (0, 0)),
                        mode="edge")
    # FFT convolution: radius-10 disks are 21x21, too slow for direct convolution of a batch.
    # lazy: scipy.signal alone costs about a second at `import bpfree.data`
    from scipy.signal import fftconvolve

    return fftconvolve(padded, kernel[None, :, :, None], mode="valid", axes=(1, 2))


def motion_blur(x, param, rngs):
    radius, sigma = param
    width = 2 * math.ceil(radius) + 1
    taps = np.exp(-(np.arange(width) ** 2) / (2.0 * sigma ** 2))
    taps /= taps.sum()
    angles = np.deg2rad(stack_draws(rngs, lambda r: r.uniform(-45.0, 45.0)))
    n, h, w, ch = x.shape
    flat = x.reshape(n * h * w, ch)
    base = (np.arange(n) * (h * w))[:, None, None]
    rows, cols = np.arange(h)[None, :, None], np.arange(w)[None, None, :]
    out = np.zeros_like(x)
    for i, tap in enumerate(taps):
        # ImageMagick rounds offsets with ceil(v - 0.5) and samples p + offset.
        dy = np.ceil(i * np.sin(angles) - 0.5).astype(np.intp)[:, None, None]
        dx = np.ceil(i * np.cos(angles) - 0.5).astype(np.intp)[:, None, None]
        index = base + np.clip(rows + dy, 0, h - 1) * w + np.clip(cols + dx, 0, w - 1)
        out += tap * np.take(flat, index, axis=0)
    return out


def zoom_blur(x, zooms, rngs):
    out = np.zeros_like(x)
    for z in zooms:
        out += scale_about_centre(x, 1.0 / z)
    return (x + out) / (len(zooms) + 1)
