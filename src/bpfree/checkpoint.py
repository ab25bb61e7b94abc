"""Atomic, verifiable training checkpoints in the safetensors format.

A checkpoint holds up to three sections: the model's ``state_dict``, the optimizer's
``state_dict`` and an ``extra`` dict (RNG states, seeds, step counters, anything small).
Nested containers are flattened: every tensor (and numpy array) goes into the safetensors
payload under a path-like key such as ``optimizer/state/0/momentum_buffer``; the non-tensor
skeleton goes into the safetensors metadata as JSON in which every value carries a type tag,
so int dict keys, tuples, big ints and floats (exactly, as hex; inf and NaN included)
survive the round trip. Nothing is ever pickled, so loading a checkpoint cannot run code.

Integrity: the metadata stores the format version, each tensor's dtype, shape and SHA-256,
and a SHA-256 digest over the metadata itself. :func:`load_checkpoint` checks all of it
before returning anything and raises :class:`CheckpointError` naming the file otherwise.

Durability: :func:`save_checkpoint` serializes everything in memory first, writes a temporary
file in the destination directory, flushes and fsyncs it, ``os.replace``-s it over the
destination and fsyncs the directory. A crash or an exception at any point leaves either the
old checkpoint or the new one, never a mix, and no temporary file.

Resuming from a checkpoint is bit-identical to never stopping, provided the training loop's
own randomness is saved too (see :func:`capture_rng_state` / :func:`restore_rng_state`).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import math
import os
import random
import struct
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as _st_load
from safetensors.torch import save as _st_save

from . import __version__
from .io import atomic_write_bytes, check_output_path, remove_stale_temporaries

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "capture_rng_state",
    "load_checkpoint",
    "restore_checkpoint",
    "restore_rng_state",
    "save_checkpoint",
]

#: Version of the on-disk layout written by this module; readers refuse other versions.
FORMAT_VERSION = 1

_MAGIC = "bpfree-checkpoint"
_K_FORMAT = "bpfree.format"
_K_VERSION = "bpfree.version"
_K_LIBRARY = "bpfree.library_version"
_K_SKELETON = "bpfree.skeleton"
_K_TENSORS = "bpfree.tensors"
_K_DIGEST = "bpfree.digest"
_SECTIONS = ("model_state", "optimizer_state", "extra")
# safetensors itself refuses headers above 100 MB; a larger length field means "not ours".
_MAX_HEADER = 100 * 1024 * 1024

# safetensors dtype codes -> bytes per element, for checking payload sizes before trusting
# the offsets in a header we have not verified yet.
_ST_ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "C64": 8,
    "I64": 8, "U64": 8, "F64": 8,
}


class CheckpointError(ValueError):
    """A checkpoint file is truncated, corrupt, not a bpfree checkpoint, of an unsupported
    format version, or does not match the model/optimizer it is restored into."""


@dataclass
class Checkpoint:
    """What :func:`load_checkpoint` returns. Sections that were not saved are ``None``
    (``extra`` is ``{}``). Tensors are on ``map_location`` (CPU by default)."""

    model_state: dict | None
    optimizer_state: dict | None
    extra: dict = field(default_factory=dict)
    path: Path | None = None
    format_version: int = FORMAT_VERSION


# ---------------------------------------------------------------------------------------
# Skeleton encoding: nested Python values <-> type-tagged JSON + a flat dict of tensors.
# ---------------------------------------------------------------------------------------
#
# Tags (one-key objects, plus a few companions):
#   null / true / false / "string"  as themselves (JSON represents them exactly)
#   {"i": "123"}                    int, as decimal text so no JSON reader rounds it
#   {"f": "0x1.8p+1"}               float via float.hex; NaN as "nan:<64-bit pattern>"
#   {"c": [f, f]}                   complex
#   {"b": "base64"}                 bytes
#   {"l": [...]}, {"u": [...]}      list, tuple
#   {"d": [[k, v], ...]}            dict (any encodable key; insertion order kept)
#   {"t": "key"}                    torch.Tensor stored in the payload under "key"
#   {"n": "key", "dtype": "<f8", "shape": [...], "scalar": bool}   numpy array / scalar,
#                                   stored as raw bytes (uint8) so every numpy dtype's bits
#                                   survive, including ones torch lacks (big-endian, f128)
#   {"dt": "float32"}               torch.dtype


def _encode_float(x: float) -> str:
    if math.isnan(x):
        return "nan:" + struct.pack(">d", x).hex()
    return float.hex(x)


def _decode_float(s: str) -> float:
    if s.startswith("nan:"):
        return struct.unpack(">d", bytes.fromhex(s[4:]))[0]
    return float.fromhex(s)


def _escape(part: object) -> str:
    # Keys become path components; escaping "/" keeps the path unambiguous for readers.
    return str(part).replace("%", "%25").replace("/", "%2F")


class _Encoder:
    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}

    def _key(self, path: tuple) -> str:
        base = "/".join(_escape(p) for p in path) or "value"
        key, n = base, 1
        while key in self.tensors:  # e.g. dict keys 0 and "0" side by side
            key, n = f"{base}#{n}", n + 1
        return key

    def encode(self, value: Any, path: tuple, where: str) -> Any:
        # numpy scalars first: np.float64 subclasses float and would lose its type.
        if isinstance(value, (np.ndarray, np.generic)) and not isinstance(value, (np.str_, np.bytes_)):
            arr = np.asarray(value)
            if arr.dtype.hasobject:
                raise TypeError(f"{where}: numpy arrays of dtype object cannot be saved safely")
            key = self._key(path)
            raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            self.tensors[key] = torch.from_numpy(raw.copy())
            return {"n": key, "dtype": arr.dtype.str, "shape": list(arr.shape),
                    "scalar": isinstance(value, np.generic)}
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return {"i": str(int(value))}
        if isinstance(value, float):
            return {"f": _encode_float(float(value))}
        if isinstance(value, complex):
            return {"c": [_encode_float(value.real), _encode_float(value.imag)]}
        if isinstance(value, (bytes, bytearray)):
            return {"b": base64.b64encode(bytes(value)).decode("ascii")}
        if isinstance(value, torch.dtype):
            return {"dt": str(value).removeprefix("torch.")}
        if isinstance(value, torch.Tensor):
            return {"t": self._add_tensor(value, path, where)}
        if isinstance(value, Mapping):
            items = []
            for k, v in value.items():
                if isinstance(k, (torch.Tensor, np.ndarray)) or isinstance(k, (list, dict)):
                    raise TypeError(f"{where}: dict key {k!r} of type {type(k).__name__} "
                                    "cannot be saved (use str, int, float, bool, None or tuple)")
                items.append([self.encode(k, path + ("key",), f"{where} key"),
                              self.encode(v, path + (k,), f"{where}[{k!r}]")])
            return {"d": items}
        if isinstance(value, (list, tuple)):
            tag = "l" if isinstance(value, list) else "u"
            return {tag: [self.encode(v, path + (i,), f"{where}[{i}]")
                          for i, v in enumerate(value)]}
        raise TypeError(
            f"{where}: cannot save a value of type {type(value).__name__}; checkpoints hold "
            "tensors, numpy arrays, dicts, lists, tuples, str, int, float, complex, bool, "
            "bytes, torch.dtype and None (nothing is pickled)")

    def _add_tensor(self, t: torch.Tensor, path: tuple, where: str) -> str:
        if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
            raise TypeError(f"{where}: only dense tensors can be saved, got layout {t.layout}"
                            f"{' (quantized)' if t.is_quantized else ''} on {t.device}")
        key = self._key(path)
        # A fresh contiguous CPU copy: the payload must not alias live training state (or
        # another entry's storage) while it is hashed and written.
        self.tensors[key] = t.detach().to("cpu", copy=True).contiguous()
        return key


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    # uint8 view: covers dtypes numpy lacks (bfloat16, float8) with the exact stored bits.
    return memoryview(flat.view(torch.uint8).numpy())


def _decode(node: Any, tensors: Mapping[str, torch.Tensor], used: set) -> Any:
    if node is None or isinstance(node, (bool, str)):
        return node
    if not isinstance(node, dict) or not node:
        raise ValueError(f"unexpected node {node!r}")
    if "i" in node:
        return int(node["i"])
    if "f" in node:
        return _decode_float(node["f"])
    if "c" in node:
        return complex(_decode_float(node["c"][0]), _decode_float(node["c"][1]))
    if "b" in node:
        return base64.b64decode(node["b"], validate=True)
    if "dt" in node:
        dtype = getattr(torch, node["dt"], None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown torch dtype {node['dt']!r}")
        return dtype
    if "t" in node:
        used.add(node["t"])
        return tensors[node["t"]]
    if "n" in node:
        used.add(node["n"])
        raw = tensors[node["n"]].numpy().tobytes()
        arr = np.frombuffer(raw, dtype=np.dtype(node["dtype"])).reshape(node["shape"]).copy()
        return arr[()] if node["scalar"] else arr
    if "l" in node:
        return [_decode(v, tensors, used) for v in node["l"]]
    if "u" in node:
        return tuple(_decode(v, tensors, used) for v in node["u"])
    if "d" in node:
        return {_decode(k, tensors, used): _decode(v, tensors, used) for k, v in node["d"]}
    raise ValueError(f"unknown tag in {sorted(node)}")


def _digest(meta: Mapping[str, str]) -> str:
    payload = json.dumps([meta[_K_FORMAT], meta[_K_VERSION], meta[_K_LIBRARY],
                          meta[_K_SKELETON], meta[_K_TENSORS]], separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _dumps(obj: Any) -> str:
    # allow_nan=False: every float is hex-encoded, so a bare NaN here would be a bug.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


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
    data = serialize_checkpoint(model_state=model_state, optimizer_state=optimizer_state,
                                extra=extra)
    remove_stale_temporaries(path)  # left by a save that was killed (SIGKILL, power cut)
    return atomic_write_bytes(path, data, what="checkpoint path")


# ---------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------


def _check_header(data: bytes, path: Path) -> dict:
    """Validate the safetensors framing by hand so every failure gets a precise message
    ("truncated" vs "not a checkpoint") instead of a parser's internal error code."""
    size = len(data)
    if size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes): truncated, or not a "
                              "bpfree checkpoint")
    if size < 8:
        raise CheckpointError(f"checkpoint {path} is truncated: {size} bytes, shorter than "
                              "the 8-byte safetensors header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n == 0 or n > _MAX_HEADER:
        raise CheckpointError(f"{path} is not a bpfree checkpoint: not a safetensors file "
                              f"(header length field {n})")
    if data[8:9] != b"{":
        raise CheckpointError(f"{path} is not a bpfree checkpoint: not a safetensors file "
                              "(header is not a JSON object)")
    if 8 + n > size:
        raise CheckpointError(f"checkpoint {path} is truncated: its header needs {8 + n} bytes "
                              f"but the file has {size}")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
        end = 0
        for key, entry in header.items():
            if key == "__metadata__":
                continue
            begin, stop = (int(v) for v in entry["data_offsets"])
            if _ST_ITEMSIZE.get(entry["dtype"]) is not None:
                expect = _ST_ITEMSIZE[entry["dtype"]] * math.prod(int(d) for d in entry["shape"])
                if stop - begin != expect:
                    raise ValueError(f"tensor {key!r} has {stop - begin} bytes, its shape "
                                     f"needs {expect}")
            end = max(end, stop)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint {path} is corrupt: unreadable safetensors header "
                              f"({e})") from None
    payload = size - 8 - n
    if payload < end:
        raise CheckpointError(f"checkpoint {path} is truncated: the tensor payload needs {end} "
                              f"bytes but the file holds {payload}")
    if payload > end:
        raise CheckpointError(f"checkpoint {path} is corrupt: {payload - end} unexpected bytes "
                              "after the tensor payload")
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or meta.get(_K_FORMAT) != _MAGIC:
        raise CheckpointError(f"{path} is not a bpfree checkpoint: a safetensors file without "
                              "bpfree metadata")
    return meta


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
    except ValueError as e:
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
    except (KeyError, ValueError, TypeError, IndexError) as e:
        raise _corrupt(path, f"malformed structure in the metadata ({e!r})") from None
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


# ---------------------------------------------------------------------------------------
# RNG state helpers (for ``extra``)
# ---------------------------------------------------------------------------------------


def capture_rng_state() -> dict:
    """The global RNG states a training loop usually draws from: torch (CPU, and CUDA when
    available), numpy's legacy global generator and Python's ``random``; save it in
    ``extra`` and hand it back to :func:`restore_rng_state` on resume."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
             "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping) -> None:
    """Undo :func:`capture_rng_state`: set every global RNG present in ``state``."""
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be the dict from capture_rng_state(), got {type(state).__name__}")
    if "torch" in state:
        torch.set_rng_state(state["torch"].cpu())
    if "numpy" in state:
        np.random.set_state(tuple(state["numpy"]))
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([t.cpu() for t in state["cuda"]])
