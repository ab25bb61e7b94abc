"""Gradient transforms and learning-rate schedules (compose like optax / torch.optim)."""

from .base import MapTransform, ScaleTransform, TensorInfo, split_transforms
from .scaling import (GradientNormScaling, QuantizationAwareScaling, gradient_norm_scaling,
                      quantization_aware_scaling)
from .schedules import Constant, Cosine, Exponential, constant, cosine, exponential
from .shaping import (AdamW, ClipByNorm, ClipByValue, KernelwiseNormalization, Momentum, Sign,
                      adamw, clip_by_norm, clip_by_value, kernelwise_normalization, momentum,
                      sign)

__all__ = [
    "MapTransform", "ScaleTransform", "TensorInfo", "split_transforms",
    "GradientNormScaling", "QuantizationAwareScaling", "gradient_norm_scaling",
    "quantization_aware_scaling", "Constant", "Cosine", "Exponential", "constant", "cosine",
    "exponential", "AdamW", "ClipByNorm", "ClipByValue", "KernelwiseNormalization", "Momentum",
    "Sign", "adamw", "clip_by_norm", "clip_by_value", "kernelwise_normalization", "momentum",
    "sign",
]
