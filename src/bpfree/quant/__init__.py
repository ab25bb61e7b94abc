"""Integer (real-quantized) inference engine following the TFLite int8 specification.

PMT (§2.1, §3.1) trains a *real-quantized* model: int8 weights and activations, int32 bias and
accumulators, requantization by fixed-point multipliers, no float copy. This package is the
inference engine such a trainer runs its forward passes on, bit-exact with the TFLite reference
kernels used by TFLite Micro, CMSIS-NN and TinyEngine:

* :mod:`.fixed_point`: :func:`quantize_multiplier`, :func:`multiply_by_quantized_multiplier`
  and the gemmlowp primitives, plus the vectorised requantization epilogues.
* :mod:`.params`: :class:`TensorQuant` (activations), :class:`WeightQuant` (per-channel
  weights), :class:`Requantization`, :class:`ActivationRange`, :class:`AddRequantization`.
* :mod:`.layers`: :class:`QLinear`, :class:`QConv2d`, :class:`QAdd`, :class:`QAvgPool2d`,
  :class:`QGlobalAvgPool2d`, :class:`QReLU`, :class:`QFlatten` (int8 in, int8 out).
* :mod:`.reference`: slow scalar / int64 reference used by the tests.
* :mod:`.ptq`: post-training quantization of a float model into a :class:`QuantizedModel`
  (PMT §4.1), from :mod:`.weights` (BN folding, int8 weights / int32 bias) and
  :mod:`.calibrate` (activation ranges).
* :mod:`.twin`: the float twin of a quantized model in integer parameter units, for BP
  baselines and gradient diagnostics, and :func:`write_back`.
"""

from .calibrate import calibrate_ranges, tensor_quant_from_range
from .fixed_point import (
    INT8_MAX,
    INT8_MIN,
    INT32_MAX,
    INT32_MIN,
    multiply_by_quantized_multiplier,
    quantize_multiplier,
    requantize,
    requantized_add,
    rounding_divide_by_pot,
    rounding_integer_divide,
    saturating_rounding_doubling_high_mul,
)
from .layers import (
    QAdd,
    QAvgPool2d,
    QConv2d,
    QFlatten,
    QGlobalAvgPool2d,
    QLinear,
    QReLU,
    accumulator_bound,
    float32_chunk,
)
from .params import (
    ActivationRange,
    AddRequantization,
    Requantization,
    TensorQuant,
    WeightQuant,
)
from .ptq import quantize_model
from .stages import QInvertedResidual, QMaxPool2d, QuantizedModel, stage_output_quant
from .twin import (
    FloatTwin,
    TwinConv2d,
    TwinLinear,
    float_twin,
    to_float_units,
    trainable_layers,
    write_back,
)
from .weights import fold_batchnorm, quantize_weights

__all__ = [
    "INT8_MAX",
    "INT8_MIN",
    "INT32_MAX",
    "INT32_MIN",
    "ActivationRange",
    "AddRequantization",
    "QAdd",
    "QAvgPool2d",
    "QConv2d",
    "QFlatten",
    "QGlobalAvgPool2d",
    "QLinear",
    "QReLU",
    "Requantization",
    "TensorQuant",
    "WeightQuant",
    "accumulator_bound",
    "float32_chunk",
    "multiply_by_quantized_multiplier",
    "quantize_multiplier",
    "requantize",
    "requantized_add",
    "rounding_divide_by_pot",
    "rounding_integer_divide",
    "saturating_rounding_doubling_high_mul",
    "FloatTwin",
    "QInvertedResidual",
    "QMaxPool2d",
    "QuantizedModel",
    "TwinConv2d",
    "TwinLinear",
    "float_twin",
    "to_float_units",
    "calibrate_ranges",
    "fold_batchnorm",
    "quantize_model",
    "quantize_weights",
    "stage_output_quant",
    "tensor_quant_from_range",
    "trainable_layers",
    "write_back",
]
