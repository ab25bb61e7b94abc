"""Resampling about the image centre: bilinear gathers with edge pixels repeated, and
separable zooms as two small matrix products."""

from __future__ import annotations

import numpy as np

__all__ = ["bilinear", "grid", "scale_about_centre", "scale_matrix", "warp_about_centre"]


def bilinear(x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Sample ``x`` [N, H, W, C] at source coordinates ``rows``/``cols`` ([N, H, W], or
    [H, W] shared by the batch), bilinearly, repeating edge pixels outside."""
    n, h, w, ch = x.shape
    r0f, c0f = np.floor(rows), np.floor(cols)
    fr, fc = (rows - r0f)[..., None], (cols - c0f)[..., None]
    r0, c0 = r0f.astype(np.intp), c0f.astype(np.intp)
    r1, c1 = np.clip(r0 + 1, 0, h - 1), np.clip(c0 + 1, 0, w - 1)
    r0, c0 = np.clip(r0, 0, h - 1), np.clip(c0, 0, w - 1)
    # Gathering from the flattened batch with one linear index is several times faster than
    # numpy's multi-array fancy indexing.
    flat = x.reshape(n * h * w, ch)
    base = (np.arange(n) * (h * w))[:, None, None]

    def at(r, c):
        return np.take(flat, base + r * w + c, axis=0)

    top = at(r0, c0) * (1.0 - fc) + at(r0, c1) * fc
    bottom = at(r1, c0) * (1.0 - fc) + at(r1, c1) * fc
    return top * (1.0 - fr) + bottom * fr


def scale_matrix(size: int, factor: float) -> np.ndarray:
    """[size, size] bilinear weights for output i sampling ``factor * (i - c) + c`` (c the
    centre), edge pixels repeated: an axis-aligned zoom is separable, so it is two small
    matrix products instead of a gather."""
    centre = (size - 1) / 2.0
    src = factor * (np.arange(size) - centre) + centre
    lo = np.floor(src)
    frac = src - lo
    lo = lo.astype(np.intp)
    m = np.zeros((size, size))
    rows = np.arange(size)
    np.add.at(m, (rows, np.clip(lo, 0, size - 1)), 1.0 - frac)
    np.add.at(m, (rows, np.clip(lo + 1, 0, size - 1)), frac)
    return m


def scale_about_centre(x: np.ndarray, factor: float) -> np.ndarray:
    _, h, w, _ = x.shape
    planes = np.moveaxis(x, -1, 1)  # batched matmul wants the two image axes last
    out = scale_matrix(h, factor) @ planes @ scale_matrix(w, factor).T
    return np.moveaxis(out, 1, -1)


def grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    return np.meshgrid(np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64),
                       indexing="ij")


def warp_about_centre(x: np.ndarray, mats: np.ndarray, shifts: np.ndarray | None = None
                       ) -> np.ndarray:
    """Inverse-map warp: output pixel p samples ``M (p - c) + c + shift``, with ``M`` the
    per-image 2x2 matrix ``mats[n]`` in (row, col) coordinates and ``c`` the image centre."""
    n, h, w, _ = x.shape
    rows, cols = grid(h, w)
    cr, cc = (h - 1) / 2.0, (w - 1) / 2.0
    dr, dc = rows - cr, cols - cc
    src_r = mats[:, 0, 0, None, None] * dr + mats[:, 0, 1, None, None] * dc + cr
    src_c = mats[:, 1, 0, None, None] * dr + mats[:, 1, 1, None, None] * dc + cc
    if shifts is not None:
        src_r = src_r + shifts[:, 0, None, None]
        src_c = src_c + shifts[:, 1, None, None]
    return bilinear(x, src_r, src_c)
