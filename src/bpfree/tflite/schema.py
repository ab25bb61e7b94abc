"""What the reader and the writer share: the supported operators, activations and the error.

The flatbuffer itself is read and written with the generated schema classes of the ``tflite``
package (``tflite.Model``, ``tflite.Operator``, ... and their ``*Start`` / ``*Add*`` builder
functions) and the ``flatbuffers`` runtime; nothing here parses bytes by hand.
"""

from __future__ import annotations

import tflite
from tflite.ActivationFunctionType import ActivationFunctionType
from tflite.BuiltinOperator import BuiltinOperator
from tflite.TensorType import TensorType

#: Every builtin operator bpfree maps onto its integer layers (docs/TFLITE.md has the table).
SUPPORTED_OPS = {
    BuiltinOperator.FULLY_CONNECTED: "FULLY_CONNECTED",
    BuiltinOperator.CONV_2D: "CONV_2D",
    BuiltinOperator.DEPTHWISE_CONV_2D: "DEPTHWISE_CONV_2D",
    BuiltinOperator.ADD: "ADD",
    BuiltinOperator.MEAN: "MEAN",
    BuiltinOperator.AVERAGE_POOL_2D: "AVERAGE_POOL_2D",
    BuiltinOperator.MAX_POOL_2D: "MAX_POOL_2D",
    BuiltinOperator.RESHAPE: "RESHAPE",
    BuiltinOperator.PAD: "PAD",
    BuiltinOperator.SOFTMAX: "SOFTMAX",
    BuiltinOperator.QUANTIZE: "QUANTIZE",
    BuiltinOperator.DEQUANTIZE: "DEQUANTIZE",
}

#: Fused activation of the file <-> ``activation`` of bpfree's layers.
ACTIVATIONS = {
    ActivationFunctionType.NONE: None,
    ActivationFunctionType.RELU: "relu",
    ActivationFunctionType.RELU6: "relu6",
}
ACTIVATION_CODES = {name: code for code, name in ACTIVATIONS.items()}

#: Model.version of the files written (the current schema) and their file identifier.
SCHEMA_VERSION = 3
FILE_IDENTIFIER = b"TFL3"


class TFLiteFormatError(ValueError):
    """A .tflite file bpfree cannot load: the message names the operator, its index and tensor."""


def op_name(code: int) -> str:
    """``BuiltinOperator`` name of an operator code (``"CUSTOM(17)"`` style when unknown)."""
    for name, value in vars(BuiltinOperator).items():
        if value == code and not name.startswith("_"):
            return name
    return f"UNKNOWN({code})"


def type_name(code: int) -> str:
    for name, value in vars(TensorType).items():
        if value == code and not name.startswith("_"):
            return name
    return f"UNKNOWN({code})"


__all__ = ["ACTIVATIONS", "ACTIVATION_CODES", "FILE_IDENTIFIER", "SCHEMA_VERSION",
           "SUPPORTED_OPS", "TFLiteFormatError", "op_name", "tflite", "type_name"]
