"""Saving a checkpoint atomically, loading it with every check of :mod:`.format` passed
first, and restoring it into a live model and optimizer all-or-nothing."""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as _st_load
from safetensors.torch import save as _st_save

from .. import __version__
from ..io import (atomic_write_bytes, check_input_file, check_output_path,
                  remove_stale_temporaries)
from .format import (_K_DIGEST, _K_FORMAT, _K_LIBRARY, _K_SKELETON, _K_TENSORS, _K_VERSION,
                     _MAGIC, _SECTIONS, FORMAT_VERSION, Checkpoint, CheckpointError, _check_header,
                     _decode, _digest, _dumps, _Encoder, _tensor_bytes)

__all__ = ["load_checkpoint", "restore_checkpoint", "save_checkpoint", "serialize_checkpoint"]


# ---------------------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------------------


def _state_of(obj: Any, name: str) -> Any:
    state_dict = getattr(obj, "state_dict", None)
    if not callable(state_dict):
        raise TypeError(f"{name} must have a state_dict() method, got {type(obj).__name__}")
    return state_dict()


def serialize_checkpoint(*, model_state: Mapping | None = None,
                         optimizer_state: Mapping | None = None,
                         extra: Mapping | None = None) -> bytes:
    """Return the bytes of a checkpoint file holding the given sections (see
    :func:`save_checkpoint`). Raises ``TypeError`` naming the offending entry for values
    that cannot be stored without pickle."""
    for name, value in (("model_state", model_state), ("optimizer_state", optimizer_state),
                        ("extra", extra)):
        if value is not None and not isinstance(value, Mapping):
            raise TypeError(f"{name} must be a dict (or None), got {type(value).__name__}")
    enc = _Encoder()
    skeleton: dict[str, Any] = {}
    for name, value in (("model_state", model_state), ("optimizer_state", optimizer_state),
                        ("extra", extra)):
        skeleton[name] = None if value is None else enc.encode(value, (name.split("_")[0],), name)
    # nn.Module.state_dict() carries per-module versions in ``_metadata``; load_state_dict
    # uses them to migrate old layouts, so keep them.
    module_meta = getattr(model_state, "_metadata", None)
    skeleton["model_state_metadata"] = (
        None if module_meta is None else enc.encode(dict(module_meta), ("meta",), "model_state._metadata"))

    records = {}
    for key, t in enc.tensors.items():
        records[key] = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                        "sha256": hashlib.sha256(_tensor_bytes(t)).hexdigest()}
    meta = {_K_FORMAT: _MAGIC, _K_VERSION: str(FORMAT_VERSION), _K_LIBRARY: __version__,
            _K_SKELETON: _dumps(skeleton), _K_TENSORS: _dumps(records)}
    meta[_K_DIGEST] = _digest(meta)
    meta["format"] = "pt"  # the safetensors convention, so other tools recognise the file
    return _st_save(enc.tensors, metadata=meta)


def save_checkpoint(path: str | os.PathLike, *, model: torch.nn.Module | None = None,
                    model_state: Mapping | None = None, optimizer: Any = None,
                    optimizer_state: Mapping | None = None,
                    extra: Mapping | None = None) -> Path:
    """Atomically save a checkpoint to ``path`` and return it as a ``Path``.

    ``model`` (its ``state_dict()`` is saved) or ``model_state``; ``optimizer`` (any object
    with ``state_dict()``) or ``optimizer_state``; ``extra``: a dict of small values and
    tensors (seeds, step counters, ``capture_rng_state()``). Tensors are saved with their
    exact dtype and bits, from a CPU copy; their device is not recorded.

    Everything is serialized before the file system is touched, so a value that cannot be
    saved raises ``TypeError`` and leaves any existing file at ``path`` intact.
    """
    if model is not None and model_state is not None:
        raise ValueError("pass model or model_state, not both")
    if optimizer is not None and optimizer_state is not None:
        raise ValueError("pass optimizer or optimizer_state, not both")
    if model is not None:
        model_state = _state_of(model, "model")
    if optimizer is not None:
        optimizer_state = _state_of(optimizer, "optimizer")
    if model_state is None and optimizer_state is None and extra is None:
        raise ValueError("nothing to save: pass model/model_state, optimizer/optimizer_state "
                         "or extra")
    check_output_path(path, what="checkpoint path")
    try:
        data = serialize_checkpoint(model_state=model_state, optimizer_state=optimizer_state,
                                    extra=extra)
    except RecursionError:
        raise ValueError("the state to save is nested too deeply (or holds a reference to "
                         "itself); checkpoints hold plain nested dicts, lists and tensors"
                         ) from None
    remove_stale_temporaries(path)  # left by a save that was killed (SIGKILL, power cut)
    return atomic_write_bytes(path, data, what="checkpoint path")


# ---------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------


def _corrupt(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {path} is corrupt: {what}")


def load_checkpoint(path: str | os.PathLike, *, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Read and fully verify a checkpoint; tensors are moved to ``map_location``.

    Raises ``FileNotFoundError`` if ``path`` does not exist and :class:`CheckpointError`
    (naming the file) if it is truncated, corrupt (checksum mismatch), not a bpfree
    checkpoint, or of an unsupported format version. Nothing is returned unless every check
    passed.
    """
    path = Path(path)
    remove_stale_temporaries(path)  # left by a save that was killed (SIGKILL, power cut)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.is_dir():
        raise CheckpointError(f"checkpoint path {path} is a directory, not a file")
    try:  # a FIFO or device would block or never end
        check_input_file(path, "checkpoint path")
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    # One read gives a consistent snapshot even if a writer replaces the file meanwhile.
    data = path.read_bytes()
    meta = _check_header(data, path)

    version = meta.get(_K_VERSION, "")
    if not version.isdigit() or int(version) != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has unsupported format version {version} "
                              f"(this bpfree reads version {FORMAT_VERSION})")
    missing = [k for k in (_K_LIBRARY, _K_SKELETON, _K_TENSORS, _K_DIGEST) if k not in meta]
    if missing:
        raise _corrupt(path, f"metadata entries {missing} are missing")
    if _digest(meta) != meta[_K_DIGEST]:
        raise CheckpointError(f"checkpoint {path} is corrupt: checksum mismatch in the metadata")
    try:
        skeleton = json.loads(meta[_K_SKELETON])
        records = json.loads(meta[_K_TENSORS])
    except (ValueError, RecursionError) as e:  # RecursionError: nesting too deep
        raise _corrupt(path, f"unreadable metadata ({e})") from None

    try:
        tensors = _st_load(data)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise _corrupt(path, f"safetensors could not read it ({e})") from None
    del data
    if set(tensors) != set(records):
        raise _corrupt(path, f"tensor list differs from the metadata: payload has "
                             f"{sorted(set(tensors) ^ set(records))[:5]} unaccounted for")
    for key, rec in records.items():
        t = tensors[key]
        if str(t.dtype).removeprefix("torch.") != rec["dtype"] or list(t.shape) != rec["shape"]:
            raise _corrupt(path, f"tensor {key!r} is {t.dtype} {list(t.shape)}, the metadata "
                                 f"says {rec['dtype']} {rec['shape']}")
        if hashlib.sha256(_tensor_bytes(t)).hexdigest() != rec["sha256"]:
            raise CheckpointError(f"checkpoint {path} is corrupt: checksum mismatch in tensor "
                                  f"{key!r}")

    if map_location is not None and torch.device(map_location).type != "cpu":
        tensors = {k: v.to(map_location) for k, v in tensors.items()}
    used: set[str] = set()
    try:
        sections = {name: (None if skeleton[name] is None else _decode(skeleton[name], tensors, used))
                    for name in _SECTIONS}
        module_meta = skeleton.get("model_state_metadata")
        module_meta = None if module_meta is None else _decode(module_meta, tensors, used)
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as e:
        raise _corrupt(path, f"malformed structure in the metadata ({e!r})") from None
    except RecursionError:
        raise _corrupt(path, "the metadata is nested too deeply") from None
    if used != set(tensors):
        raise _corrupt(path, f"{len(set(tensors) - used)} stored tensors are not referenced")
    for name in _SECTIONS:
        if sections[name] is not None and not isinstance(sections[name], dict):
            raise _corrupt(path, f"section {name} is not a dict")
    model_state = sections["model_state"]
    if model_state is not None:
        model_state = OrderedDict(model_state)
        if module_meta is not None:
            model_state._metadata = OrderedDict(module_meta)  # type: ignore[attr-defined]
    return Checkpoint(model_state=model_state, optimizer_state=sections["optimizer_state"],
                      extra=sections["extra"] if sections["extra"] is not None else {},
                      path=path, format_version=int(version))


# ---------------------------------------------------------------------------------------
# Restoring into live objects
# ---------------------------------------------------------------------------------------


def _check_model_state(state: Mapping, model: torch.nn.Module, path: Path) -> None:
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong = []
    for k, ref in expected.items():
        got = state.get(k)
        if isinstance(ref, torch.Tensor) and isinstance(got, torch.Tensor):
            if got.shape != ref.shape or got.dtype != ref.dtype:
                wrong.append(f"{k}: checkpoint {got.dtype} {list(got.shape)} vs model "
                             f"{ref.dtype} {list(ref.shape)}")
        elif isinstance(ref, torch.Tensor) and k in state:
            wrong.append(f"{k}: checkpoint holds {type(got).__name__}, model a tensor")
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing keys {missing}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected}")
        if wrong:
            parts.append("mismatched " + "; ".join(wrong))
        raise CheckpointError(f"checkpoint {path} does not match the model (nothing was "
                              f"loaded): {', '.join(parts)}")


def _check_optimizer_state(state: Mapping, optimizer: Any, path: Path) -> None:
    # torch.optim checks this too, but only after we might have loaded the model.
    check = getattr(optimizer, "check_state_dict", None)  # ZOOptimizer's configuration check
    if callable(check):
        try:
            check(state)
        except ValueError as err:
            raise CheckpointError(f"checkpoint {path} does not match the optimizer (nothing "
                                  f"was loaded): {err}") from None
    groups = getattr(optimizer, "param_groups", None)
    saved = state.get("param_groups")
    if not isinstance(groups, list) or not isinstance(saved, list):
        return
    if len(groups) != len(saved):
        raise CheckpointError(f"checkpoint {path} does not match the optimizer (nothing was "
                              f"loaded): {len(saved)} parameter groups saved, the optimizer "
                              f"has {len(groups)}")
    for i, (g, s) in enumerate(zip(groups, saved)):
        if isinstance(s, Mapping) and len(g.get("params", ())) != len(s.get("params", ())):
            raise CheckpointError(
                f"checkpoint {path} does not match the optimizer (nothing was loaded): group "
                f"{i} has {len(s.get('params', ()))} parameters saved, the optimizer has "
                f"{len(g.get('params', ()))}")


def restore_checkpoint(path: str | os.PathLike, *, model: torch.nn.Module | None = None,
                       optimizer: Any = None) -> Checkpoint:
    """Load ``path`` and restore ``model`` and ``optimizer`` from it; return the checkpoint
    (``extra`` is left to the caller, e.g. ``restore_rng_state(ckpt.extra["rng"])``).

    All-or-nothing: the file is fully verified and the model state's keys, shapes and dtypes
    are checked against ``model`` (and the optimizer's parameter groups against
    ``optimizer``) before either is touched; a mismatch raises :class:`CheckpointError`
    naming the offending keys. If loading the model still fails, the optimizer is put back.
    """
    ckpt = load_checkpoint(path)
    if model is not None:
        if ckpt.model_state is None:
            raise CheckpointError(f"checkpoint {ckpt.path} holds no model state")
        _check_model_state(ckpt.model_state, model, ckpt.path)
    if optimizer is not None:
        if ckpt.optimizer_state is None:
            raise CheckpointError(f"checkpoint {ckpt.path} holds no optimizer state")
        _check_optimizer_state(ckpt.optimizer_state, optimizer, ckpt.path)

    # Optimizer first: its old state stays referenced by ``previous`` (load replaces the
    # state wholesale), so it can be put back cheaply if the model then fails to load.
    previous = None
    if optimizer is not None:
        previous = optimizer.state_dict()
        # A private copy: training updates optimizer state in place, and the caller's
        # Checkpoint should keep showing what is on disk.
        optimizer.load_state_dict(copy.deepcopy(ckpt.optimizer_state))
    if model is not None:
        try:
            model.load_state_dict(ckpt.model_state)
        except BaseException:
            if optimizer is not None:
                optimizer.load_state_dict(previous)
            raise
    return ckpt
