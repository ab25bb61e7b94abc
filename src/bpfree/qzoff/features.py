"""A frozen backbone's features under QZO-FF's activation arithmetic, for linear probing.

Linear probing trains only the decoder, so the frozen backbone's features can be computed
once per data set and the decoder trained on them. With static activation ranges this is the
same computation as running the whole network each step: in ``<w>w<a>a`` the backbone's
activations are fake-quantized to ``a`` bits (ranges calibrated once) and in fp16 rounded to
float16, exactly as :class:`~bpfree.qzoff.ActivationQuantizer` does on the full model.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..fewshot import feature_function
from .model import ActivationQuantizer

__all__ = ["PRECISIONS", "frozen_features", "precision_bits"]

#: Arithmetic of a forward-gradient run: fp32 / fp16 floats or ``<w>w<a>a`` fixed point.
PRECISIONS = ("fp32", "fp16", "16w8a", "8w8a")


def precision_bits(precision: str) -> tuple[int, int]:
    """``(weight bits, activation bits)`` of a fixed-point precision ``"<w>w<a>a"``."""
    if precision not in PRECISIONS or not precision.endswith("a"):
        fixed = [p for p in PRECISIONS if p.endswith("a")]
        raise ValueError(f"precision must be one of {fixed}, got {precision!r}")
    w, a = precision.split("w")
    return int(w), int(a.rstrip("a"))


@torch.no_grad()
def frozen_features(model: nn.Module, x: torch.Tensor, precision: str = "fp32", *,
                    calibration: torch.Tensor | None = None, batch_size: int = 500
                    ) -> torch.Tensor:
    """``model[:-1](x)`` (the backbone's features) with the activation arithmetic of
    ``precision`` (:data:`PRECISIONS`): float32, float16-rounded (``"fp16"``) or ``a``-bit
    fake-quantized (``"<w>w<a>a"``) with static ranges calibrated on ``calibration``
    (default ``x``). ``model`` is not modified."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "fp32":
        return feature_function(model, batch_size=batch_size)(x)
    m = copy.deepcopy(model[:-1]).eval()
    if precision == "fp16":
        acts = ActivationQuantizer(m, None, fp16=True)
    else:
        acts = ActivationQuantizer(m, precision_bits(precision)[1], ranges="static")
        calib = x if calibration is None else calibration
        acts.calibrate(lambda: m(calib))
    out = torch.cat([m(x[i:i + batch_size]) for i in range(0, len(x), batch_size)])
    acts.remove()
    return out
