"""MCUNet-in1 (INT8, 128x128), PMT's own model, imported from ``graph.json`` + ``weights.npz``.

PMT (§3.4, §4.1, Tables 8-9) trains the pre-trained, post-training-quantized INT8 MCUNet-in1 of
MIT HAN Lab's tiny-training (``mcunet-5fps.pkl``, MIT license). The package ships it converted
to JSON + npz in ``data/mcunet-in1-int8/`` (its ``MANIFEST.txt`` gives the source and the
citation, ``LICENSE`` the notice, ``SHA256SUMS`` the checksums :func:`load_graph` verifies);
``$BPFREE_MODELS/mcunet-in1-int8`` overrides it:

* ``graph.json``: ``layers`` in execution order, each ``{"name", "op", ...}`` with op
  ``conv2d`` (channels, kernel, stride, groups, padding, spatial sizes, input / output scale
  and zero point), ``add`` (the residual add of a block: input 1 is the block input with
  ``x_scale`` / ``x_zero``, input 2 the block's last conv output, output ``y_scale`` /
  ``y_zero``) and ``mean_hw`` (global average pooling, quantization unchanged);
* ``weights.npz``: ``<name>.weight`` int8 [out, in/groups, kh, kw], ``<name>.bias`` int32
  [out] (scale ``x_scale * w_scale``), ``<name>.w_scales`` float32 [out].

ReLU6 is not an op: a conv whose output has ``y_zero = -128`` and ``y_scale = 6/255`` clamps
to [0, 6] by the int8 range itself; such convs are built with ``activation="relu6"``, whose
TFLite clamp (``[z, z + round(6/s)] = [-128, 127]``) is the same range, so the flag only
documents the graph.

:func:`load_quantized` builds a :class:`~bpfree.quant.ptq.QuantizedModel` whose ``body`` is an
``nn.Sequential`` of int8 stages (the first conv, one
:class:`~bpfree.quant.ptq.QInvertedResidual` per ``blocks.K`` with its requantized residual
add, the global average pooling and the 1x1 classifier as a ``QLinear``), so
:class:`bpfree.pmt.PMTTrainer` trains it unchanged. ``model.graph_names`` maps each graph
layer name to the module's qualified name (``"blocks.3.depthwise" -> "body.4.body.1"``).

Two requantization rules (``requant=``):

* ``"tflite"`` (default): the TFLite int8 reference kernels of :mod:`bpfree.quant.layers`
  (fixed-point multipliers, round half away from zero; the ADD of ``add.cc`` with
  ``left_shift = 20``; ``MEAN`` with rounding division);
* ``"float"``: the model's own rule (tiny-training ``quantized_ops.py``, MANIFEST):
  ``y = clamp(round_half_even((acc + bias) * x_scale * w_scale / y_scale) + y_zero)`` in
  float64, the add ``round_half_even(((a - z1) s1 + (b - z2) s2) / s_y) + z_y`` (products and
  sum in float32, the division in float64, as the source) and the pooling
  ``round_half_even(mean(x))``. Implemented by subclasses of the quant layers that override
  only the epilogue (:class:`FloatRuleConv2d`, :class:`FloatRuleLinear`,
  :class:`FloatRuleAdd`, :class:`FloatRuleGlobalAvgPool2d`), so node perturbation
  (``node_offset``) and the integer state are those of the TFLite layers.

:func:`compare_requant` counts the output values on which the two rules differ.
:func:`mcunet_in1_float` builds the float mirror (dequantized weights, nn.Conv2d / nn.Linear
with biases, fused ReLU6 omitted) that :mod:`bpfree.memory` profiles for the hardware-cost
tables (the int8 layers keep their state in buffers, which the memory profiler does not count as
parameters).

Modules: :mod:`.graph` (the files), :mod:`.quantized` (the integer model),
:mod:`.float_rule` (the model's own rule, :func:`compare_requant`), :mod:`.float_mirror`,
:mod:`.preprocess`.
"""

from .float_mirror import mcunet_in1_float
from .float_rule import (FloatRuleAdd, FloatRuleConv2d, FloatRuleGlobalAvgPool2d,
                         FloatRuleLinear, compare_requant)
from .graph import (BUNDLED_MODEL_DIR, CHECKSUMS_FILE, DEFAULT_DIRNAME, MCUNET_INPUT_SHAPE,
                    ModelFormatError, default_model_dir, load_graph, verify_checksums)
from .preprocess import preprocess_image
from .quantized import REQUANT_RULES, load_quantized, mcunet_in1

__all__ = [
    "BUNDLED_MODEL_DIR",
    "CHECKSUMS_FILE",
    "DEFAULT_DIRNAME",
    "MCUNET_INPUT_SHAPE",
    "REQUANT_RULES",
    "FloatRuleAdd",
    "FloatRuleConv2d",
    "FloatRuleGlobalAvgPool2d",
    "FloatRuleLinear",
    "ModelFormatError",
    "compare_requant",
    "default_model_dir",
    "load_graph",
    "load_quantized",
    "mcunet_in1",
    "mcunet_in1_float",
    "preprocess_image",
    "verify_checksums",
]
