"""QZO-FF: quantized zeroth-order forward-gradient learning (Feng et al., NeurIPS 2024,
"Stepping Forward on the Last Mile").

* :mod:`.fixed_point`: the integer arithmetic of §3.3 / Appendix A (Eqs. 5-8).
* :mod:`.model`: integer weights + fake-quantized activations of a float module (16w8a).
* :mod:`.sampling`: momentum-guided sampling (§3.4).
* :mod:`.sparsity`: sparse-update masks (§3.4).
* :mod:`.optim`: SGD / momentum / AdamW steps from the forward gradient.
* :mod:`.trainer`: :class:`QZOFF`, the sign-m-SPSA trainer (Algorithm 1 + §3.4).
* :mod:`.features`: a frozen backbone's features in fp32 / fp16 / ``<w>w<a>a`` arithmetic, for
  linear probing.
* :mod:`.alignment`: the cosine of the Eq. 3 estimate with the true gradient, measured and
  expected.
* :mod:`.integer`: :class:`IntegerQZOFF`, Algorithm 1 on an int8 model's own codes and scales
  (a loaded ``.tflite``; ``bpfree adapt --method qzo-ff``).
* :mod:`.memory`: App. B memory rules ``ff`` and ``bp-ff-compare`` (registered with
  :func:`bpfree.memory.register_rule` on import); :mod:`.scratch`: Figures 3 / 4, scratch vs
  weight memory (:func:`scratch_vs_weights`, :func:`plot_scratch_vs_weights`).
"""

from .alignment import estimate_alignment, expected_alignment
from .features import PRECISIONS, frozen_features, precision_bits
from .fixed_point import (
    EpsilonUnderflowWarning,
    accumulate_gradient,
    displaced_weights,
    perturbation_multiplier,
    perturbed_weights,
    quantize_epsilon,
    quantize_weights,
    quantized_update,
    update_multiplier,
)
from .integer import IntegerQZOFF
from .memory import FF_PRECISIONS, SIGN_BYTES, SPARSE_MASKS
from .model import ActivationQuantizer, QuantizedParams, select_parameters
from .optim import FloatOptimizer, make_optimizer
from .sampling import MomentumSampling, quantize_perturbation
from .scratch import (FF_METHODS, FF_MODES, attention_heads, default_head,
                      plot_scratch_vs_weights, scratch_vs_weights)
from .sparsity import make_mask, random_mask, threshold_mask, topk_magnitude_mask
from .trainer import QZOFF, QZOFFConfig, QZOFFEstimate

__all__ = [
    "FF_METHODS",
    "FF_MODES",
    "FF_PRECISIONS",
    "PRECISIONS",
    "SIGN_BYTES",
    "SPARSE_MASKS",
    "QZOFF",
    "ActivationQuantizer",
    "EpsilonUnderflowWarning",
    "FloatOptimizer",
    "IntegerQZOFF",
    "MomentumSampling",
    "QZOFFConfig",
    "QZOFFEstimate",
    "QuantizedParams",
    "accumulate_gradient",
    "attention_heads",
    "default_head",
    "displaced_weights",
    "estimate_alignment",
    "expected_alignment",
    "frozen_features",
    "make_mask",
    "make_optimizer",
    "perturbation_multiplier",
    "plot_scratch_vs_weights",
    "perturbed_weights",
    "precision_bits",
    "quantize_epsilon",
    "quantize_perturbation",
    "quantize_weights",
    "quantized_update",
    "random_mask",
    "scratch_vs_weights",
    "select_parameters",
    "threshold_mask",
    "topk_magnitude_mask",
    "update_multiplier",
]
