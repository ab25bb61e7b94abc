"""A batch of images in, the same batch out: validation, the float64 working layout, and
one seeded generator per image (module docstring of :mod:`bpfree.data.corruptions`)."""

from __future__ import annotations

import numbers
import sys
import zlib
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["MIN_SIDE", "as_float", "check_int", "image_rngs", "random_signs", "stack_draws"]

# Smallest side we accept: glass blur's swap window and defocus's mirrored padding need a few
# pixels, and anything smaller is not an image these tables were calibrated on.
MIN_SIDE = 8


def _is_torch(images) -> bool:
    # Look torch up only if it is already imported, so numpy users never pay its import.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(images, torch.Tensor)


def as_float(images) -> tuple[np.ndarray, Callable[[np.ndarray], Any]]:
    """Validate ``images``; return float64 ``[N, H, W, C]`` in [0, 1] and a function that
    turns a result of that layout back into the input's type, shape, dtype and device."""
    if _is_torch(images):
        import torch  # lazy: only reached for a torch tensor, so torch is already loaded

        tensor = images.detach()
        if tensor.dtype == torch.uint8:
            kind = "u"
        elif tensor.is_floating_point():
            kind = "f"
        else:
            raise TypeError(f"images must be uint8 (0..255) or floating (0..1), got torch "
                            f"{tensor.dtype}")
        array = tensor.to("cpu", torch.float64).numpy() if kind == "f" else tensor.cpu().numpy()
        t_dtype, device = tensor.dtype, tensor.device

        def back_to_torch(array_out: np.ndarray):
            out = torch.from_numpy(array_out)
            return out.to(device=device, dtype=t_dtype)

        restore_type = back_to_torch
        out_dtype = np.dtype(np.uint8) if kind == "u" else np.dtype(np.float64)
    elif isinstance(images, np.ndarray):
        array = images
        if array.dtype == np.uint8:
            kind = "u"
        elif np.issubdtype(array.dtype, np.floating):
            kind = "f"
        else:
            raise TypeError(f"images must be uint8 (0..255) or floating (0..1), got numpy "
                            f"{array.dtype}")
        out_dtype = array.dtype

        def restore_type(array_out: np.ndarray):
            return array_out
    else:
        raise TypeError(f"images must be a numpy array or a torch tensor, got "
                        f"{type(images).__name__}")

    shape = tuple(array.shape)
    if array.ndim == 3:
        layout = "NHW"
    elif array.ndim == 4:
        if shape[-1] not in (1, 3):
            hint = ""
            if shape[1] in (1, 3):
                hint = (f"; this looks channels-first [N, C, H, W]: pass "
                        f"images.permute(0, 2, 3, 1) (torch) or np.moveaxis(images, 1, -1)")
            raise ValueError(f"images of rank 4 must be channels-last [N, H, W, C] with C in "
                             f"(1, 3), got shape {list(shape)}{hint}")
        layout = "NHWC"
    else:
        hint = "; add a batch axis (images[None]) for a single image" if array.ndim == 2 else ""
        raise ValueError(f"images must have shape [N, H, W] or [N, H, W, C], got rank "
                         f"{array.ndim} shape {list(shape)}{hint}")
    if shape[0] == 0:
        raise ValueError(f"images is an empty batch (shape {list(shape)}); pass at least one "
                         "image")
    if min(shape[1], shape[2]) < MIN_SIDE:
        raise ValueError(f"images must be at least {MIN_SIDE}x{MIN_SIDE} pixels, got "
                         f"H={shape[1]}, W={shape[2]} (shape {list(shape)})")

    if kind == "u":
        x = array.astype(np.float64) / 255.0
    else:
        x = np.asarray(array, dtype=np.float64)
        lo, hi = float(x.min()), float(x.max())
        if not (np.isfinite(lo) and np.isfinite(hi)):
            raise ValueError("floating images must be finite, found NaN or inf")
        if lo < 0.0 or hi > 1.0:
            raise ValueError(f"floating images must hold values in [0, 1], found min {lo:g}, "
                             f"max {hi:g}; divide 0..255 floats by 255 first")
    if layout == "NHW":
        x = x[..., None]

    def restore(y: np.ndarray):
        y = np.clip(y, 0.0, 1.0)
        if layout == "NHW":
            y = y[..., 0]
        if kind == "u":
            y = np.rint(y * 255.0).astype(np.uint8)
        else:
            y = y.astype(out_dtype)
        return restore_type(np.ascontiguousarray(y))

    return np.ascontiguousarray(x), restore


def check_int(value, name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        allowed = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return value


def image_rngs(seed: int, name: str, n: int, start: int) -> list[np.random.Generator]:
    """One generator per image, keyed by (seed, corruption, absolute image index)."""
    # crc32 rather than hash(): str hashes are salted per process, which would break
    # reproducibility across runs.
    key = zlib.crc32(name.encode())
    return [np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed,
                                                                       spawn_key=(key, start + i))))
            for i in range(n)]


def stack_draws(rngs: Sequence[np.random.Generator], draw: Callable[[np.random.Generator], Any]
           ) -> np.ndarray:
    return np.stack([np.asarray(draw(r)) for r in rngs])



def random_signs(rngs, size=None) -> np.ndarray:
    return stack_draws(rngs, lambda r: r.integers(0, 2, size=size) * 2 - 1).astype(np.float64)
