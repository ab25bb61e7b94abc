"""Integer (real-quantized) inference layers: int8 in, int8 out, integer buffers only.

Each layer follows the matching TFLite int8 reference kernel bit for bit
(``tensorflow/lite/kernels/internal/reference/integer_ops/``): :class:`QLinear`
(``FullyConnectedPerChannel``), :class:`QConv2d` (``ConvPerChannel`` /
``DepthwiseConvPerChannel``; stride, padding, dilation, groups), :class:`QAdd` (``Add``),
:class:`QAvgPool2d` (``AveragePool``), :class:`QGlobalAvgPool2d` (``Mean`` over H and W),
:class:`QReLU` (a clamp) and :class:`QFlatten`. ReLU / ReLU6 fused into a layer are clamps of its
output range (:class:`~bpfree.quant.params.ActivationRange`). Layout is PyTorch's NCHW.

The state is integer, as on an MCU (PMT §2.1, §3.1: there is no float copy of the model):
``weight`` (int8), ``bias`` (int32), ``multiplier`` / ``shift`` (int32, per output channel)
are buffers, so a trainer may perturb and update ``weight`` / ``bias`` in place between forward
passes; nothing derived from them is cached. Scales and zero points are frozen attributes.

The package's parts: :mod:`.arith` (the accumulator bound that makes float accumulation
exact, and the checks of integer inputs the layers share), :mod:`.affine` (:class:`QLinear`,
:class:`QConv2d`), :mod:`.pooling` (:class:`QAvgPool2d`, :class:`QGlobalAvgPool2d`) and
:mod:`.elementwise` (:class:`QAdd`, :class:`QReLU`, :class:`QFlatten`).
"""

from .affine import QConv2d, QLinear
from .arith import FLOAT32_EXACT, FLOAT64_EXACT, _check_int8_input, accumulator_bound, float32_chunk
from .elementwise import QAdd, QFlatten, QReLU
from .pooling import QAvgPool2d, QGlobalAvgPool2d

__all__ = ["FLOAT32_EXACT", "FLOAT64_EXACT", "QAdd", "QAvgPool2d", "QConv2d", "QFlatten",
           "QGlobalAvgPool2d", "QLinear", "QReLU", "_check_int8_input", "accumulator_bound",
           "float32_chunk"]
