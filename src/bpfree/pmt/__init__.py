"""Poor Man's Training (PMT, Zhao et al. 2025): BP-free training of real-quantized INT8 models.

* :mod:`bpfree.quant.graph` (re-exported by :mod:`.graph`): trainable integer layers, d_w / d_a,
  cached stage inputs, partial forwards.
* :mod:`.estimate`: quantized WP (Eq. 6) and NP (Eq. 9–10) estimates, layer- or model-wise.
* :mod:`bpfree.updates.integer_layer` (re-exported by :mod:`.update`): the integer update of
  Eq. 8 with GNS and QAS (Appendix B), rounded, clipped.
* :mod:`.trainer`: :class:`PMTConfig` and :class:`PMTTrainer`, Algorithm 1.
* :mod:`bpfree.baselines` (re-exported by :mod:`.baselines`): MeZO, DeepZero CGE, FullTrain BP
  FP32 / INT8 (STE, QAS), sparse BP.
* :mod:`.sparse`: §3.3 block split and BP-free block selection.
* :mod:`.diagnostic`: Fig. 4/5/8 cosine of ZO estimates with BP gradients.
* :mod:`.memory`: PMT's int8 MCU memory and compute rules and those of its baselines
  (``pmt``, ``pmt-sparse``, ``mezo``, ``cge``, ``bp-int8``, ``sparse-bp``; registered with
  :func:`bpfree.memory.register_rule` on import), :func:`pmt_modes` (WP / NP per layer) and
  :func:`layer_memory` (the per-layer terms).
* :mod:`.harness`: :func:`fit`, :func:`accuracy`, the cosine schedule shared with baselines.
"""

from ..baselines import DeepZeroCGE, FullTrainFP32, FullTrainINT8, MeZO, SparseBP
from .estimate import estimate_group, node_to_parameter_gradients, requant_scale
from ..quant.graph import StagedModel, TrainableLayer, find_layers, per_sample_loss
from .memory import LayerMemory, layer_memory, pmt_modes
from ..harness import History, accuracy, cosine_lr, fit
from .trainer import PERTURBATIONS, PMTConfig, PMTTrainer
from ..transforms.scaling import gradient_norm_factor
from ..updates.integer_layer import LayerEstimate, apply_update, quantization_aware_scales

__all__ = [
    "DeepZeroCGE",
    "FullTrainFP32",
    "FullTrainINT8",
    "MeZO",
    "SparseBP",
    "PERTURBATIONS",
    "History",
    "LayerEstimate",
    "LayerMemory",
    "PMTConfig",
    "PMTTrainer",
    "StagedModel",
    "TrainableLayer",
    "accuracy",
    "apply_update",
    "cosine_lr",
    "estimate_group",
    "find_layers",
    "fit",
    "gradient_norm_factor",
    "layer_memory",
    "node_to_parameter_gradients",
    "per_sample_loss",
    "pmt_modes",
    "quantization_aware_scales",
    "requant_scale",
]
