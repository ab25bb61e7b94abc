"""Weights of a real-quantized layer: BatchNorm folded into the convolution, then symmetric
per-output-channel int8 weights and an int32 bias (TFLite int8 specification; PMT §4.1)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .params import WeightQuant

__all__ = ["BIAS_MAX", "WEIGHT_QMAX", "fold_batchnorm", "quantize_weights"]

#: Weights are quantized to [-127, 127] (TFLite spec: symmetric int8 weights avoid -128).
WEIGHT_QMAX = 127
#: Largest |int32 bias| PTQ produces: 2**24 keeps every bias exact in float32 (so the float
#: twin of :mod:`.twin` holds it exactly) and far from int32 saturation. A channel whose bias
#: would exceed it (tiny weights, large folded BN shift) gets a larger weight scale instead.
BIAS_MAX = 2**24


def fold_batchnorm(conv: nn.Conv2d, bn: nn.BatchNorm2d | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Float (weight, bias) of ``conv`` with the eval-mode ``bn`` folded in (PMT §4.1).

    ``BN(conv(x)) = gamma (W x + b - mean) / sqrt(var + eps) + beta``, so
    ``W' = W * gamma / sqrt(var + eps)`` (per output channel) and
    ``b' = beta + (b - mean) * gamma / sqrt(var + eps)``. Computed in float64, returned float32.
    """
    w = conv.weight.detach().to(torch.float64)
    b = (conv.bias.detach().to(torch.float64) if conv.bias is not None
         else torch.zeros(w.shape[0], dtype=torch.float64, device=w.device))
    if bn is None:
        return w.to(torch.float32), b.to(torch.float32)
    mean = bn.running_mean.detach().to(torch.float64)
    inv_std = torch.rsqrt(bn.running_var.detach().to(torch.float64) + bn.eps)
    gamma = (bn.weight.detach().to(torch.float64) if bn.weight is not None
             else torch.ones_like(mean))
    beta = bn.bias.detach().to(torch.float64) if bn.bias is not None else torch.zeros_like(mean)
    factor = gamma * inv_std
    w = w * factor.view(-1, *([1] * (w.dim() - 1)))
    b = beta + (b - mean) * factor
    return w.to(torch.float32), b.to(torch.float32)


def _round_half_away(x: torch.Tensor) -> torch.Tensor:
    """std::round (TFLite's rounding of weights and biases), not torch's half-to-even."""
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def quantize_weights(weight: torch.Tensor, bias: torch.Tensor, input_scale: float, name: str
                     ) -> tuple[torch.Tensor, torch.Tensor, WeightQuant]:
    """Symmetric per-output-channel int8 weights and int32 bias (TFLite spec).

    ``s_w[c] = max|w[c]| / 127`` (raised where needed so that ``|bias| <= BIAS_MAX``; an all-zero
    channel borrows the layer's largest scale, or 1/127), ``W = round(w / s_w)``,
    ``B = round(b / (s_in * s_w))``. Returns (int8 weight, int32 bias, WeightQuant).
    """
    w = weight.detach().to(torch.float64).cpu()
    b = bias.detach().to(torch.float64).cpu()
    if not bool(torch.isfinite(w).all()) or not bool(torch.isfinite(b).all()):
        raise ValueError(f"layer {name!r}: folded weights / bias are not finite (check the "
                         "weights and BatchNorm statistics for nan / inf)")
    s_in = float(np.float32(input_scale))
    amax = w.abs().reshape(w.shape[0], -1).amax(dim=1)
    scales = amax / WEIGHT_QMAX
    fallback = float(scales.max()) if float(scales.max()) > 0 else 1.0 / WEIGHT_QMAX
    scales = torch.where(scales > 0, scales, torch.full_like(scales, fallback))
    scales = torch.maximum(scales, b.abs() / (s_in * BIAS_MAX))
    # Round the scales to float32 first (TFLite stores float32 scales) and quantize with them.
    scales = scales.to(torch.float32).to(torch.float64)
    if not bool(torch.isfinite(scales).all()) or not bool((scales > 0).all()):
        raise ValueError(f"layer {name!r}: weight scales must be finite and > 0, got "
                         f"{scales.tolist()}")
    try:
        wq = WeightQuant(scales.to(torch.float32))
    except ValueError as err:
        raise ValueError(f"layer {name!r}: {err}") from None
    shape = (-1,) + (1,) * (w.dim() - 1)
    w_int = _round_half_away(w / scales.view(shape)).clamp_(-WEIGHT_QMAX, WEIGHT_QMAX)
    b_int = _round_half_away(b / (s_in * scales)).clamp_(-BIAS_MAX, BIAS_MAX)
    return w_int.to(torch.int8), b_int.to(torch.int32), wq
