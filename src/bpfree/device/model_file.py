"""The integer model of a device program on disk, saved and loaded without running code.

A :class:`~bpfree.quant.ptq.QuantizedModel` holds frozen quantization objects (scales, zero
points, fixed-point multipliers) that its ``state_dict`` does not carry, so it is saved whole
with ``torch.save``. It is read back with ``torch.load(weights_only=True)``: PyTorch's
restricted unpickler, which builds tensors and only the classes named in
:data:`SAFE_CLASSES` (bpfree's integer layers and their parameter records, by ``__new__`` and
``__dict__`` update, never calling a constructor or any other function). A file that names
anything else (``os.system``, ``builtins.eval``, a class of another library) is refused
before a byte of it is acted on: a ``model.pt`` that a user downloads or edits cannot run
code (issue 34).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ..io import check_input_file
from ..models.mcunet.float_rule import FloatRuleConv2d, FloatRuleLinear
from ..quant.layers import QAdd, QAvgPool2d, QConv2d, QFlatten, QGlobalAvgPool2d, QLinear, QReLU
from ..quant.params import (ActivationRange, AddRequantization, Requantization, TensorQuant,
                            WeightQuant)
from ..quant.stages import QInvertedResidual, QMaxPool2d, QuantizedModel
from ..tflite.softmax import QSoftmax
from ..tflite.stages import QPad

#: Every class a saved integer model may contain; the unpickler refuses all others.
SAFE_CLASSES = (QuantizedModel, QInvertedResidual, QMaxPool2d, QLinear, QConv2d, QAdd,
                QAvgPool2d, QGlobalAvgPool2d, QReLU, QFlatten, FloatRuleConv2d, FloatRuleLinear,
                QSoftmax, QPad, TensorQuant, WeightQuant, Requantization, ActivationRange,
                AddRequantization, nn.Sequential, nn.ModuleList, nn.Identity)


class ModelFileError(ValueError):
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
        path = check_input_file(path, what)
    except ValueError as err:
        raise ModelFileError(str(err)) from None
    try:
        with torch.serialization.safe_globals(list(SAFE_CLASSES)):
            model = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # noqa: BLE001 - every unreadable or unsafe file is refused alike
        reason = " ".join(str(err).split())[:400]
        raise ModelFileError(f"{what}: {path} is not a safe bpfree integer model (only "
                             f"bpfree's integer layers are loaded, nothing is executed): "
                             f"{type(err).__name__}: {reason}") from None
    if not isinstance(model, QuantizedModel):
        raise ModelFileError(f"{what}: {path} holds a {type(model).__name__}, not a bpfree "
                             "QuantizedModel")
    return model


__all__ = ["SAFE_CLASSES", "ModelFileError", "load_model", "save_model"]
