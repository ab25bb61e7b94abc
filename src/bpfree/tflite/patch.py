"""Write a trained model back into the ``.tflite`` file it was loaded from, changing nothing but
the weights and biases.

Deployed code depends on more than the values a file computes: its operator sequence (the
converter's padding form, QUANTIZE / DEQUANTIZE edges), the ``serving_default`` signature that
``get_signature_runner()`` reads, tensor names looked up by string, and metadata (minimum
runtime version, model descriptions). :mod:`bpfree.tflite.writer` builds a new graph from
bpfree's stages and keeps none of these. So a model loaded by :func:`bpfree.tflite.load` carries
its file (``model.tflite_file``) and each convolution and fully-connected layer the indices of
the tensors it was read from (``layer.tflite_source``, set by the reader); :func:`patched_bytes`
copies the file and overwrites, in place, only the bytes of those constant buffers, in the
file's layout (the reader's transposes undone). Training changes weights and biases only, so
every other byte of the file is the original's.

The result is checked before it is returned: loaded back, it must hold exactly the model's
state and compute exactly its outputs on a probe batch; otherwise (the model's structure was
changed after loading) :class:`PatchError` says why and :func:`bpfree.tflite.save` falls back
to writing a new graph.
"""

from __future__ import annotations

import numpy as np
import torch

from .reader import from_bytes
from .schema import tflite
from .source import TFLiteSource

__all__ = ["PatchError", "TFLiteSource", "patched_bytes"]


class PatchError(ValueError):
    """The model can no longer be written into its original file (the message says why)."""


def file_weight(weight: np.ndarray, source: TFLiteSource) -> np.ndarray:
    """The file's layout of a bpfree weight (the inverse of the reader's transposes)."""
    if source.kind == "depthwise":  # [O, 1, KH, KW] -> [1, KH, KW, O]
        return weight.transpose(1, 2, 3, 0)
    if source.kind == "conv":  # [O, I, KH, KW] -> [O, KH, KW, I]
        return weight.transpose(0, 2, 3, 1)
    if source.flatten_hwc is not None:  # columns from NCHW back to NHWC flattening order
        h, w, c = source.flatten_hwc
        return weight.reshape(-1, c, h, w).transpose(0, 2, 3, 1).reshape(weight.shape[0], -1)
    return weight


def _buffer_view(root, graph, t: int, data: bytearray) -> tuple[int, np.ndarray]:
    """(buffer index, writable uint8 view of tensor ``t``'s bytes inside ``data``)."""
    index = int(graph.Tensors(t).Buffer())
    buf = root.Buffers(index)
    if buf is None:
        raise PatchError(f"tensor {t} has no buffer in the file")
    if buf.DataLength() == 0 and buf.Offset():  # data stored after the flatbuffer (> 2 GB)
        start, size = int(buf.Offset()), int(buf.Size())
        return index, np.frombuffer(data, np.uint8, size, start)
    return index, buf.DataAsNumpy()


def _integers(array: torch.Tensor, dtype: str, low: int, high: int, what: str) -> bytes:
    a = array.detach().cpu().numpy()
    if a.size and (a.min() < low or a.max() > high):
        raise PatchError(f"{what} holds values in [{a.min()}, {a.max()}], outside the file's "
                         f"{np.dtype(dtype).name} range [{low}, {high}]")
    return np.ascontiguousarray(a.astype(dtype)).tobytes()


def _overwrite(data: bytearray, model) -> None:
    root = tflite.Model.GetRootAsModel(data, 0)
    graph = root.Subgraphs(0)
    written: dict[int, bytes] = {}
    for name, layer in model.named_modules():
        source = getattr(layer, "tflite_source", None)
        if source is None:
            continue
        parts = [(source.weight, _integers(torch.from_numpy(file_weight(
            layer.weight.detach().cpu().numpy(), source)), "<i1", -128, 127,
            f"layer {name!r} weight"))]
        if source.bias >= 0:
            parts.append((source.bias, _integers(layer.bias, "<i4", -2**31, 2**31 - 1,
                                                 f"layer {name!r} bias")))
        for t, raw in parts:
            index, view = _buffer_view(root, graph, t, data)
            if view.nbytes != len(raw):
                raise PatchError(f"layer {name!r}: tensor {t} holds {view.nbytes} bytes in the "
                                 f"file, the layer {len(raw)}")
            if written.setdefault(index, raw) != raw:
                raise PatchError(f"layer {name!r}: buffer {index} is shared with another layer "
                                 "whose trained values differ")
            view[:] = np.frombuffer(raw, np.uint8)


def _probe(model) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(-128, 128, (2, *model.input_shape), generator=g, dtype=torch.int8)


def patched_bytes(model) -> bytes:
    """The file ``model`` was loaded from, with its trained weights and biases written in; every
    other byte unchanged. Raises :class:`PatchError` when the model was not loaded from a file,
    or no longer matches it (a layer added, removed or replaced)."""

    original = getattr(model, "tflite_file", None)
    if original is None:
        raise PatchError("the model was not loaded from a .tflite file")
    data = bytearray(original)
    _overwrite(data, model)
    result = bytes(data)
    loaded = from_bytes(result)
    ours, theirs = model.state_dict(), loaded.state_dict()
    if ours.keys() != theirs.keys() or any(
            ours[k].shape != theirs[k].shape or not torch.equal(ours[k], theirs[k]) for k in ours):
        raise PatchError("the model's layers or state no longer match the file it was loaded "
                         "from")
    x = _probe(model)
    with torch.no_grad():
        if not torch.equal(model.forward_int(x), loaded.forward_int(x)):
            raise PatchError("the model no longer computes what its patched file computes")
    return result
