"""An RGB image to MCUNet-in1's int8 input."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["preprocess_image"]


def preprocess_image(image, size: int = 128) -> torch.Tensor:
    """An RGB image (H, W, 3) uint8 array (or H, W grayscale; RGBA drops alpha) to the model's
    int8 input (1, 3, size, size): center square crop, bilinear resize (antialiased) to
    ``size`` when it is not already ``size`` x ``size``, pixel p -> p - 128 (MANIFEST)."""
    a = np.asarray(image)
    if a.ndim == 2:
        a = np.stack([a] * 3, axis=-1)
    if a.ndim != 3 or a.shape[2] not in (3, 4):
        raise ValueError(f"image must be (H, W, 3) RGB or (H, W) grayscale, got shape {a.shape}")
    a = a[:, :, :3]
    if a.dtype != np.uint8:
        if np.issubdtype(a.dtype, np.floating) and a.size and a.max() <= 1.0:
            a = np.round(a * 255.0)
        a = np.clip(a, 0, 255).astype(np.uint8)
    h, w = a.shape[:2]
    if (h, w) != (size, size):
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        a = a[top:top + side, left:left + side]
        t = torch.from_numpy(np.ascontiguousarray(a)).permute(2, 0, 1)[None].to(torch.float32)
        t = torch.nn.functional.interpolate(t, size=(size, size), mode="bilinear",
                                            align_corners=False, antialias=True)
        a = t[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()
    x = torch.from_numpy(np.array(a, copy=True)).permute(2, 0, 1).to(torch.int16) - 128
    return x.to(torch.int8)[None]
