"""Checks on a device program's ``program.json`` before any of it reaches C.

``program.json`` sizes the C driver's static buffers (``-DBPFREE_CLASSES``,
``-DBPFREE_SAMPLE_BYTES``, ...) and the host's ctypes buffers. An edited value that disagrees
with the compiled model makes the C read or write out of bounds (issue 34: an edited
``classes`` crashed ``run_c`` with SIGSEGV; an edited ``sample_shape`` read past the input).
So every value is checked for type and range, and the shapes against the program's own model
(lowered again from ``model.pt``): a mismatch is a ``ValueError`` naming the key.
"""

from __future__ import annotations

import math
from pathlib import Path

from torch import nn

from .lower import lower

#: Bounds of the sizes main.c's static buffers are declared with (int32 indices in C).
MAX_SAMPLES = 1 << 20
MAX_BATCH = 1 << 16
MAX_SAMPLE_BYTES = 1 << 26
TARGETS = ("host", "cortex-m7")


class ProgramError(ValueError):
    """``program.json`` of a device program is malformed or disagrees with its model."""


def _positive_int(meta: dict, key: str, where: str, upper: int) -> int:
    value = meta.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= upper:
        raise ProgramError(f"{where}: {key!r} must be an int in [1, {upper}], got {value!r}")
    return value


def check_meta(meta, where) -> dict:
    """``meta`` (a parsed ``program.json``) if its values have the right types and ranges;
    otherwise :class:`ProgramError` naming ``where`` and the key."""
    where = str(where)
    if not isinstance(meta, dict):
        raise ProgramError(f"{where}: must hold a JSON object, got {type(meta).__name__}")
    if meta.get("target") not in TARGETS:
        raise ProgramError(f"{where}: 'target' must be one of {TARGETS}, got "
                           f"{meta.get('target')!r}")
    shape = meta.get("sample_shape")
    if (not isinstance(shape, list) or len(shape) not in (1, 3)
            or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape)
            or math.prod(shape) > MAX_SAMPLE_BYTES):
        raise ProgramError(f"{where}: 'sample_shape' must be a list of 1 or 3 positive ints "
                           f"of at most {MAX_SAMPLE_BYTES} elements, got {shape!r}")
    _positive_int(meta, "classes", where, MAX_SAMPLE_BYTES)
    _positive_int(meta, "max_batch", where, MAX_BATCH)
    _positive_int(meta, "max_samples", where, MAX_SAMPLES)
    for key in ("sram_kib", "flash_kib"):
        if meta.get(key) is not None:
            _positive_int(meta, key, where, 1 << 30)
    config = meta.get("config")
    if not isinstance(config, dict):
        raise ProgramError(f"{where}: 'config' must be an object, got {config!r}")
    micro = config.get("micro_batch")
    if micro is not None and (isinstance(micro, bool) or not isinstance(micro, int)
                              or not 1 <= micro <= MAX_BATCH):
        raise ProgramError(f"{where}: 'config.micro_batch' must be null or an int in "
                           f"[1, {MAX_BATCH}], got {micro!r}")
    _positive_int(config, "queries", f"{where} config", 1 << 20)
    rows = meta.get("trainable")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and isinstance(r.get("name"),
                                                                             str) for r in rows):
        raise ProgramError(f"{where}: 'trainable' must be a list of objects with a 'name'")
    return meta


def check_against_model(meta: dict, model: nn.Module, where: Path) -> None:
    """``meta``'s classes, sample shape and trainable layers against ``model`` itself."""
    try:
        graph = lower(model, tuple(meta["sample_shape"]))
    except (ValueError, RuntimeError, IndexError) as err:
        raise ProgramError(f"{where}: 'sample_shape' {meta['sample_shape']} does not fit the "
                           f"program's model: {err}") from None
    if graph.tensors[0].numel != math.prod(meta["sample_shape"]):
        raise ProgramError(f"{where}: 'sample_shape' {meta['sample_shape']} disagrees with "
                           f"the model's input of {graph.tensors[0].numel} values")
    if graph.tensors[-1].numel != meta["classes"]:
        raise ProgramError(f"{where}: 'classes' is {meta['classes']} but the program's model "
                           f"has {graph.tensors[-1].numel} outputs")
    modules = dict(model.named_modules())
    for row in meta["trainable"]:
        m = modules.get(row["name"])
        if m is None or not hasattr(m, "weight"):
            raise ProgramError(f"{where}: trainable layer {row['name']!r} is not a layer of "
                               "the program's model")


__all__ = ["ProgramError", "check_against_model", "check_meta"]
