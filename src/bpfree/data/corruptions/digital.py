"""ImageNet-C's digital family (contrast, saturate, JPEG, pixelate, elastic transform) and
MNIST-C's quantization.

Each ``fn(x, param, rngs)`` maps float64 ``[N, H, W, C]`` images in [0, 1] to the same shape
(the caller clips); ``rngs`` holds one generator per image, ``None`` for deterministic ones.
"""

from __future__ import annotations

import io

import numpy as np
from scipy import ndimage

from .batch import stack_draws
from .resample import bilinear, grid

__all__ = ["contrast", "elastic_transform", "jpeg_compression", "pixelate", "quantize",
           "saturate"]


def contrast(x, factor, rngs):
    means = x.mean(axis=(1, 2), keepdims=True)
    return (x - means) * factor + means



def _rgb_to_hsv(rgb: np.ndarray) -> np.ndarray:
    """skimage.color.rgb2hsv for [..., 3] arrays in [0, 1]."""
    v = rgb.max(axis=-1)
    delta = v - rgb.min(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(v > 0, delta / v, 0.0)
        r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
        safe = np.where(delta > 0, delta, 1.0)
        hr = (g - b) / safe
        hg = 2.0 + (b - r) / safe
        hb = 4.0 + (r - g) / safe
    hue = np.where(rgb[..., 2] == v, hb, 0.0)
    hue = np.where(rgb[..., 1] == v, hg, hue)
    hue = np.where(rgb[..., 0] == v, hr, hue)
    hue = np.where(delta > 0, (hue / 6.0) % 1.0, 0.0)
    return np.stack([hue, s, v], axis=-1)


def _hsv_to_rgb(hsv: np.ndarray) -> np.ndarray:
    """skimage.color.hsv2rgb for [..., 3] arrays."""
    h, s, v = hsv[..., 0], hsv[..., 1], hsv[..., 2]
    hi = np.floor(h * 6.0)
    f = h * 6.0 - hi
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    hi = hi.astype(np.intp) % 6
    choices = [np.stack(c, axis=-1) for c in
               ((v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q))]
    return np.choose(hi[..., None], choices)


def saturate(x, param, rngs):
    scale, shift = param
    hsv = _rgb_to_hsv(x)
    hsv[..., 1] = np.clip(hsv[..., 1] * scale + shift, 0.0, 1.0)
    return _hsv_to_rgb(hsv)


def jpeg_compression(x, quality, rngs):
    try:
        from PIL import Image  # lazy: Pillow only for this corruption
    except ImportError as e:  # Pillow comes with matplotlib, a bpfree dependency
        raise ImportError("jpeg_compression needs Pillow (pip install pillow)") from e
    pixels = np.rint(np.clip(x, 0.0, 1.0) * 255.0).astype(np.uint8)
    gray = pixels.shape[-1] == 1
    out = np.empty_like(pixels)
    for i, img in enumerate(pixels):
        buf = io.BytesIO()
        Image.fromarray(img[..., 0] if gray else img, mode="L" if gray else "RGB").save(
            buf, format="JPEG", quality=int(quality))
        buf.seek(0)
        decoded = np.asarray(Image.open(buf))
        out[i] = decoded[..., None] if gray else decoded
    return out / 255.0


def _box_matrix(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] weights of PIL's BOX downsampling: output pixel j is the plain mean of
    the input pixels whose centres fall in its footprint ``(j * s, (j + 1) * s]``, s = n_in /
    n_out (PIL counts whole pixels; it does not weight partial overlaps)."""
    scale = n_in / n_out
    centres = np.arange(n_in)[None, :] + 0.5
    j = np.arange(n_out)[:, None]
    inside = ((centres > j * scale) & (centres <= (j + 1) * scale)).astype(np.float64)
    return inside / inside.sum(axis=1, keepdims=True)


def _nearest_matrix(n_in: int, n_out: int) -> np.ndarray:
    src = np.floor((np.arange(n_out) + 0.5) * (n_in / n_out)).astype(np.intp)
    m = np.zeros((n_out, n_in))
    m[np.arange(n_out), np.minimum(src, n_in - 1)] = 1.0
    return m


def pixelate(x, fraction, rngs):
    n, h, w, _ = x.shape
    sh, sw = max(1, int(h * fraction)), max(1, int(w * fraction))  # the reference's int(32 * c)
    rows = _nearest_matrix(sh, h) @ _box_matrix(h, sh)
    cols = _nearest_matrix(sw, w) @ _box_matrix(w, sw)
    return np.moveaxis(rows @ np.moveaxis(x, -1, 1) @ cols.T, 1, -1)


def elastic_transform(x, param, rngs):
    alpha_f, sigma_f, affine_f = param
    n, h, w, _ = x.shape
    size = min(h, w)
    alpha, sigma, jitter = alpha_f * size, sigma_f * size, affine_f * size
    noise = stack_draws(rngs, lambda r: r.uniform(-1.0, 1.0, size=6 + 2 * h * w))
    # Random affine: move three points around the centre by up to `jitter` pixels
    # (cv2.getAffineTransform on the reference's triangle), in (row, col) coordinates.
    centre = np.array([h // 2, w // 2], dtype=np.float64)
    half = size // 3
    src_pts = np.array([centre + half, [centre[0] + half, centre[1] - half], centre - half])
    dst_pts = src_pts[None] + jitter * noise[:, :6].reshape(n, 3, 2)
    design = np.hstack([src_pts, np.ones((3, 1))])  # dst = [src, 1] @ A.T
    a_t = np.linalg.solve(np.broadcast_to(design, (n, 3, 3)), dst_pts)  # [N, 3, 2]
    lin, shift = np.transpose(a_t[:, :2, :], (0, 2, 1)), a_t[:, 2, :]
    inv = np.linalg.inv(lin)
    field = noise[:, 6:].reshape(n, 2, h, w)
    if sigma > 0:
        field = ndimage.gaussian_filter(field, sigma=(0, 0, sigma, sigma), mode="reflect",
                                        truncate=3.0)
    field = field * alpha
    rows, cols = grid(h, w)
    # Output p samples the clean image at A^-1(p + d(p) - t): the affine warp followed by
    # the elastic one, composed so the image is resampled once.
    qr = rows[None] + field[:, 0] - shift[:, 0, None, None]
    qc = cols[None] + field[:, 1] - shift[:, 1, None, None]
    src_r = inv[:, 0, 0, None, None] * qr + inv[:, 0, 1, None, None] * qc
    src_c = inv[:, 1, 0, None, None] * qr + inv[:, 1, 1, None, None] * qc
    return bilinear(x, src_r, src_c)


def quantize(x, bits, rngs):
    levels = 2 ** bits - 1
    return np.round(x * levels) / levels
