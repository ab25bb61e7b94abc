"""Activation ranges of a float model, observed with forward hooks on calibration inputs, and
the asymmetric int8 quantization of each range (TFLite int8 specification)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from .fixed_point import INT8_MAX, INT8_MIN
from .params import TensorQuant

__all__ = ["MIN_RANGE", "calibrate_ranges", "tensor_quant_from_range"]

#: Smallest calibrated activation range: guards dead (constant zero) activations, whose range
#: [0, 0] has no scale.
MIN_RANGE = 2.0**-20


class _Observer:
    """Running min / max (or mean per-batch percentiles) of one tensor."""

    def __init__(self, percentile: float | None, name: str | None = None) -> None:
        self.percentile = percentile
        self.name = name
        self.lo, self.hi = math.inf, -math.inf
        self.los: list[float] = []
        self.his: list[float] = []

    def update(self, t: torch.Tensor) -> None:
        t = t.detach()
        if not bool(torch.isfinite(t).all()):
            where = ("in the calibration inputs" if self.name is None
                     else f"at the output of layer {self.name!r}")
            raise ValueError(f"calibration produced non-finite values (nan / inf) {where}")
        if self.percentile is None:
            self.lo = min(self.lo, float(t.min()))
            self.hi = max(self.hi, float(t.max()))
            return
        v = t.reshape(-1).to(torch.float32)
        step = max(1, v.numel() // 2**20)  # deterministic subsample keeps quantile() cheap
        v = v[::step]
        q = torch.quantile(v, torch.tensor([1 - self.percentile / 100, self.percentile / 100],
                                           device=v.device))
        self.los.append(float(q[0]))
        self.his.append(float(q[1]))

    def range(self) -> tuple[float, float]:
        if self.percentile is None:
            return self.lo, self.hi
        return float(np.mean(self.los)), float(np.mean(self.his))


def tensor_quant_from_range(lo: float, hi: float) -> TensorQuant:
    """Asymmetric int8 quantization of the real range [lo, hi] extended to contain 0.

    ``scale = (hi - lo) / 255``, ``zero_point = round(-128 - lo / scale)`` clamped to int8
    (the TFLite converter's choice of parameters; the integer zero point makes 0 exact).
    Ranges narrower than ``MIN_RANGE`` (dead activations) are widened to it.
    """
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise ValueError(f"activation range must be finite with lo <= hi, got [{lo!r}, {hi!r}]")
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi - lo < MIN_RANGE:
        hi = lo + MIN_RANGE
    scale = float(np.float32((hi - lo) / (INT8_MAX - INT8_MIN)))
    zp = INT8_MIN - lo / scale
    zp = int(math.floor(abs(zp) + 0.5) * (1 if zp >= 0 else -1))
    return TensorQuant(scale, max(INT8_MIN, min(INT8_MAX, zp)))


def _check_calibration_batch(batch) -> torch.Tensor:
    if not isinstance(batch, torch.Tensor) or not batch.is_floating_point():
        got = (f"a {batch.dtype} tensor" if isinstance(batch, torch.Tensor)
               else type(batch).__name__)
        raise ValueError("calibration must be a float tensor or an iterable of float input "
                         f"tensors (or (input, target) pairs), got {got}")
    if batch.numel() == 0:
        raise ValueError(f"calibration batch of shape {list(batch.shape)} is empty: pass at "
                         "least one input sample")
    return batch


def _batches(calibration) -> Iterable[torch.Tensor]:
    if isinstance(calibration, torch.Tensor):
        yield _check_calibration_batch(calibration)
        return
    for batch in calibration:
        if isinstance(batch, (tuple, list)):  # (inputs, targets) from a DataLoader
            batch = batch[0]
        yield _check_calibration_batch(batch)


def calibrate_ranges(model: nn.Module, keys: list[str], calibration, percentile,
                     input_range) -> tuple[TensorQuant, dict[str, TensorQuant]]:
    """Run ``calibration`` (a float tensor or an iterable of batches / (input, target) pairs)
    through ``model`` in eval mode and return the int8 quantization of its input
    (``input_range`` when given, else the observed one) and of the output of each module named
    in ``keys`` (min / max, or the mean per-batch ``percentile``)."""
    modules = dict(model.named_modules())
    observers = {k: _Observer(percentile, k) for k in dict.fromkeys(keys)}
    input_obs = _Observer(None)
    handles = []
    for key, obs in observers.items():
        handles.append(modules[key].register_forward_hook(
            lambda mod, args, out, obs=obs: obs.update(out)))
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    was_training = model.training
    n = 0
    try:
        model.eval()
        with torch.no_grad():
            for x in _batches(calibration):
                x = x.to(device)
                input_obs.update(x)
                model(x)
                n += 1
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    if n == 0:
        raise ValueError("calibration is empty: pass at least one batch of float inputs")
    if input_range is not None:
        try:
            lo, hi = (float(v) for v in input_range)
        except (TypeError, ValueError):
            raise ValueError(f"input_range must be a pair (lo, hi) of floats, got "
                             f"{input_range!r}") from None
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"input_range must be finite with lo < hi, got {input_range!r}")
        input_quant = tensor_quant_from_range(lo, hi)
    else:
        input_quant = tensor_quant_from_range(*input_obs.range())
    return input_quant, {k: tensor_quant_from_range(*o.range()) for k, o in observers.items()}
