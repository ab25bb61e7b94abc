"""Learning-rate scalings of PMT §3.1.2 (Eq. 8): the one home of GNS and QAS.

The factors are pure functions, used by the float optimizer's transforms below and by PMT's
integer update (:mod:`bpfree.updates.integer_layer`), so each formula exists once.
"""

from __future__ import annotations

import torch

from .base import ScaleTransform, TensorInfo


def gradient_norm_factor(directions: int, dimension: int) -> float:
    """GNS, ``NQ / (NQ + d - 1)`` of PMT Eq. 8 (``NQ`` directions averaged, dimension ``d``)."""
    if directions < 1 or dimension < 1:
        raise ValueError(f"directions and dimension must be >= 1, got {directions}, {dimension}")
    return directions / (directions + dimension - 1)


def quantization_aware_factor(scale):
    """QAS, ``1 / s^2`` of PMT Appendix B (Eq. 12), for a float or a tensor of scales."""
    return scale ** -2


class GradientNormScaling(ScaleTransform):
    """Gradient-norm scaling ``NQ / (NQ + d − 1)`` (PMT §3.1.2, Eq. 8).

    The squared norm of an RGE estimate is about ``(NQ + d − 1)/NQ`` times that of the true
    stochastic gradient (PMT Eq. 7), so the learning rate is shrunk by the inverse to keep
    one global learning rate meaningful across ``N``, ``Q`` and ``d``.
    """

    def factor(self, info: TensorInfo) -> float:
        return gradient_norm_factor(info.num_directions, info.dim)


class QuantizationAwareScaling(ScaleTransform):
    """Quantization-aware scaling ``1 / s_θ²`` (PMT §3.1.2, Appendix B; Lin et al. 2022).

    For a quantized parameter ``θ̄ = θ / s_θ``, the gradient w.r.t. ``θ̄`` is ``s_θ`` times
    smaller while ``θ̄`` is ``1/s_θ`` times larger, so the update in the integer domain is
    rescaled by ``1/s_θ²`` to follow the float update. Float parameters have ``s_θ = 1``.
    """

    def factor(self, info: TensorInfo):
        """``1/s²``: a float, or a tensor of per-channel factors for a tensor of scales."""
        if not bool(torch.all(torch.as_tensor(info.scale) > 0)):
            raise ValueError(f"quantization scale of {info.name!r} must be > 0, got {info.scale}")
        return quantization_aware_factor(info.scale)


def gradient_norm_scaling() -> GradientNormScaling:
    return GradientNormScaling()


def quantization_aware_scaling() -> QuantizationAwareScaling:
    return QuantizationAwareScaling()
