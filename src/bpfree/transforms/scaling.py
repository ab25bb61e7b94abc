"""Learning-rate scalings of PMT §3.1.2 (Eq. 8)."""

from __future__ import annotations

from .base import ScaleTransform, TensorInfo


class GradientNormScaling(ScaleTransform):
    """Gradient-norm scaling ``NQ / (NQ + d − 1)`` (PMT §3.1.2, Eq. 8).

    The squared norm of an RGE estimate is about ``(NQ + d − 1)/NQ`` times that of the true
    stochastic gradient (PMT Eq. 7), so the learning rate is shrunk by the inverse to keep
    one global learning rate meaningful across ``N``, ``Q`` and ``d``.
    """

    def factor(self, info: TensorInfo) -> float:
        nq = info.num_directions
        return nq / (nq + info.dim - 1)


class QuantizationAwareScaling(ScaleTransform):
    """Quantization-aware scaling ``1 / s_θ²`` (PMT §3.1.2, Appendix B; Lin et al. 2022).

    For a quantized parameter ``θ̄ = θ / s_θ``, the gradient w.r.t. ``θ̄`` is ``s_θ`` times
    smaller while ``θ̄`` is ``1/s_θ`` times larger, so the update in the integer domain is
    rescaled by ``1/s_θ²`` to follow the float update. Float parameters have ``s_θ = 1``.
    """

    def factor(self, info: TensorInfo) -> float:
        if not info.scale > 0:
            raise ValueError(f"quantization scale of {info.name!r} must be > 0, got {info.scale}")
        return 1.0 / (info.scale * info.scale)


def gradient_norm_scaling() -> GradientNormScaling:
    return GradientNormScaling()


def quantization_aware_scaling() -> QuantizationAwareScaling:
    return QuantizationAwareScaling()
