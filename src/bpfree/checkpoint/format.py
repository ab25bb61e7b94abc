"""The checkpoint file format: a safetensors file whose metadata holds a type-tagged JSON
skeleton of the saved sections, a record (dtype, shape, SHA-256) per tensor and a SHA-256
digest over the metadata; with the encoder / decoder between nested Python values and that
skeleton, and the hand-made check of the safetensors framing a reader runs first.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

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

