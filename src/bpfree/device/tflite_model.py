"""A deployed ``.tflite`` as a device program's model, and the trained weights written back.

``bpfree device export --model MODEL.tflite`` reads the file with :func:`bpfree.tflite.load`
(a FlatBuffer parser: nothing in the file is executed), refuses a model that is not a
classifier, and trains the logits before a trailing SOFTMAX, as ``bpfree adapt`` does (the
output head: :func:`bpfree.tflite.adapt.check_classifier`; SOFTMAX is inference only). The
program keeps a byte copy of the file (:data:`SOURCE_FILE`), so ``bpfree device run ...
--out-tflite OUT`` can write the C-trained weights and biases into a copy of it with
:func:`bpfree.tflite.file_bytes`, as ``bpfree adapt`` does: patched in place, nothing else
changed (operators, signature, tensor names, metadata), and checked to compute what the trained
model computes; a new graph where the file cannot hold the trained values.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from ..io import atomic_write_bytes, check_input_file
from ..quant.stages import QuantizedModel
from ..tflite.adapt import check_classifier
from ..tflite.reader import from_bytes
from ..tflite.writer import file_bytes
from ..tflite.softmax import QSoftmax

#: The copy of the exported .tflite inside a program directory.
SOURCE_FILE = "source.tflite"
#: Attributes the reader attaches to a loaded model and its layers (the file's bytes, the
#: tensors a layer came from): not part of the integer model a program saves.
TFLITE_ATTRIBUTES = ("tflite_file", "tflite_source")


def training_model(model: QuantizedModel) -> QuantizedModel:
    """The integer model a device program trains for a loaded .tflite: a copy without the
    reader's file attributes, and without a trailing SOFTMAX (training and the loss use the
    logits before it, as ``bpfree adapt`` does). Raises ValueError for a model that is not a
    classifier or is a lone SOFTMAX."""
    check_classifier(model)
    body = list(model.body)
    stage_quants = list(model.stage_quants)
    if isinstance(body[-1], QSoftmax):
        if len(body) == 1:
            raise ValueError("the model is a lone SOFTMAX: nothing to train")
        body, stage_quants = body[:-1], stage_quants[:-1]
    out = QuantizedModel(nn.Sequential(*copy.deepcopy(body)), model.input_quant, stage_quants)
    for module in out.modules():
        for name in TFLITE_ATTRIBUTES:
            module.__dict__.pop(name, None)
    out.input_shape = tuple(model.input_shape)
    out.sample_shape = tuple(model.input_shape)
    return out


def load_tflite_for_device(path) -> tuple[QuantizedModel, torch.Tensor, bytes]:
    """(training model, one int8 example input, the file's bytes) of a .tflite."""
    path = check_input_file(path, "--model")
    data = Path(path).read_bytes()
    model = training_model(from_bytes(data))
    return model, torch.zeros(1, *model.input_shape, dtype=torch.int8), data


def written_back(source: bytes, trained: nn.Module) -> bytes:
    """``source`` (the exported .tflite) with the weights and biases of ``trained`` (the
    program's C-trained model, whose stages are the file's, a trailing SOFTMAX aside) written
    in, as ``bpfree adapt`` writes its result (:func:`bpfree.tflite.file_bytes`): every other
    byte unchanged where the file can hold the trained values; where it cannot (a layer whose
    file has no bias tensor, while node perturbation trains its bias), a new graph with a
    warning, which LiteRT runs as well."""
    model = from_bytes(source)
    layers = dict(model.named_modules())
    state = trained.state_dict()
    with torch.no_grad():
        for key, value in state.items():
            name, _, attr = key.rpartition(".")
            target = getattr(layers.get(name), attr, None) if name in layers else None
            if not isinstance(target, torch.Tensor) or target.shape != value.shape:
                raise ValueError(f"the trained model's {key} has no counterpart of shape "
                                 f"{tuple(value.shape)} in the exported .tflite")
            target.copy_(value)
    return file_bytes(model)


def write_tflite(program_dir, trained: nn.Module, out) -> None:
    """Write the program's source .tflite with the trained weights to ``out`` (atomically)."""
    source = Path(program_dir) / SOURCE_FILE
    if not source.is_file():
        raise ValueError(f"{program_dir} was not exported from a .tflite (no {SOURCE_FILE}); "
                         "--out-tflite needs `bpfree device export --model MODEL.tflite`")
    atomic_write_bytes(out, written_back(check_input_file(source, "program").read_bytes(),
                                         trained))


__all__ = ["SOURCE_FILE", "load_tflite_for_device", "training_model", "write_tflite",
           "written_back"]
