"""The integer model of a device program on disk, saved and loaded without running code.

A :class:`~bpfree.quant.ptq.QuantizedModel` holds frozen quantization objects (scales, zero
points, fixed-point multipliers) that its ``state_dict`` does not carry, so it is saved whole
with ``torch.save``. It is read back by :func:`bpfree.restricted_load.load_restricted`
(``torch.load(weights_only=True)``), which builds tensors and only the classes named in
:data:`SAFE_CLASSES` (bpfree's integer layers and their parameter records). A file that names
anything else (``os.system``, ``builtins.eval``, a class of another library) is refused
before a byte of it is acted on: a ``model.pt`` that a user downloads or edits cannot run
code (issue 34).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ..models.mcunet.float_rule import FloatRuleConv2d, FloatRuleLinear
from ..quant.layers import QAdd, QAvgPool2d, QConv2d, QFlatten, QGlobalAvgPool2d, QLinear, QReLU
from ..quant.params import (ActivationRange, AddRequantization, Requantization, TensorQuant,
                            WeightQuant)
from ..quant.stages import QInvertedResidual, QMaxPool2d, QuantizedModel
from ..restricted_load import UnsafeFileError, load_restricted
from ..tflite.softmax import QSoftmax
from ..tflite.stages import QPad

#: Every class a saved integer model may contain; the unpickler refuses all others.
SAFE_CLASSES = (QuantizedModel, QInvertedResidual, QMaxPool2d, QLinear, QConv2d, QAdd,
                QAvgPool2d, QGlobalAvgPool2d, QReLU, QFlatten, FloatRuleConv2d, FloatRuleLinear,
                QSoftmax, QPad, TensorQuant, WeightQuant, Requantization, ActivationRange,
                AddRequantization, nn.Sequential, nn.ModuleList, nn.Identity)


class ModelFileError(UnsafeFileError):
    """A model file is not a regular file, not a saved integer model, or names a class or
    function outside :data:`SAFE_CLASSES` (it is refused, never executed)."""


def save_model(model: nn.Module, path: str | os.PathLike) -> None:
    """Write ``model`` so that :func:`load_model` can read it back."""
    torch.save(model, path)


def load_model(path: str | os.PathLike, what: str = "model") -> QuantizedModel:
    """The :class:`QuantizedModel` saved at ``path``, read with the restricted unpickler.

    Raises :class:`ModelFileError` naming the file for anything else: a non-regular file,
    a file that is not a torch archive, one naming a class outside :data:`SAFE_CLASSES`, or
    one holding something other than a QuantizedModel.
    """
    try:
        model = load_restricted(path, SAFE_CLASSES, what, "bpfree integer model")
    except UnsafeFileError as err:
        raise ModelFileError(str(err)) from None
    if not isinstance(model, QuantizedModel):
        raise ModelFileError(f"{what}: {path} holds a {type(model).__name__}, not a bpfree "
                             "QuantizedModel")
    return model


__all__ = ["SAFE_CLASSES", "ModelFileError", "load_model", "save_model"]
