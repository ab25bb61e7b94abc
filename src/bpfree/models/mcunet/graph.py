"""MCUNet-in1's file format: ``graph.json`` + ``weights.npz``, located, read and checked
(module docstring of :mod:`bpfree.models.mcunet`)."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["BUNDLED_MODEL_DIR", "CHECKSUMS_FILE", "DEFAULT_DIRNAME", "MCUNET_INPUT_SHAPE", "OPS",
           "Graph", "ModelFormatError", "block_of", "default_model_dir", "is_int", "load_graph",
           "verify_checksums"]

#: Folder name of the model under ``$BPFREE_MODELS`` and inside the package.
DEFAULT_DIRNAME = "mcunet-in1-int8"
#: The copy shipped inside the package (package data, 730 KB, MIT: its LICENSE and MANIFEST.txt
#: give the source, the citation and the checksums).
BUNDLED_MODEL_DIR = Path(__file__).resolve().parent / "data" / DEFAULT_DIRNAME
#: ``sha256sum`` output beside a model's files; where present, :func:`load_graph` checks it.
CHECKSUMS_FILE = "SHA256SUMS"
#: One sample's input (C, H, W).
MCUNET_INPUT_SHAPE = (3, 128, 128)
OPS = ("conv2d", "add", "mean_hw")
_CONV_KEYS = ("in_channels", "out_channels", "kernel_size", "stride", "groups", "padding",
              "x_scale", "x_zero", "y_scale", "y_zero")
_ADD_KEYS = ("x_scale", "x_zero", "y_scale", "y_zero")


class ModelFormatError(ValueError):
    """A graph.json / weights.npz that cannot be imported (the message names the layer)."""


def default_model_dir() -> Path:
    """``$BPFREE_MODELS/mcunet-in1-int8`` if ``BPFREE_MODELS`` is set, else the copy bundled
    with the package (:data:`BUNDLED_MODEL_DIR`), so the paper's model works in any install."""
    root = os.environ.get("BPFREE_MODELS")
    if root:
        return Path(root) / DEFAULT_DIRNAME
    return BUNDLED_MODEL_DIR


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_checksums(folder: Path) -> None:
    """Check the files listed in ``folder/SHA256SUMS`` (``sha256sum`` format) against their
    contents; a folder without the list is not checked (a user's own or edited model).
    Raises :class:`ModelFormatError` naming the damaged file."""
    listing = Path(folder) / CHECKSUMS_FILE
    if not listing.is_file():
        return
    for lineno, line in enumerate(listing.read_text().splitlines(), 1):
        if not line.strip():
            continue
        expected, _, name = line.partition("  ")
        name = name.strip()
        if len(expected) != 64 or not name or "/" in name or name.startswith("."):
            raise ModelFormatError(f"{listing}:{lineno}: expected '<sha256>  <file name>', "
                                   f"got {line!r}")
        actual = _sha256(folder / name) if (folder / name).is_file() else "missing"
        if actual != expected:
            raise ModelFormatError(
                f"{folder / name} does not match its checksum in {listing} (sha256 {actual}, "
                f"expected {expected}): the file is damaged or was edited; reinstall bpfree, or "
                f"delete {CHECKSUMS_FILE} from a copy you changed on purpose")


def _resolve_dir(path) -> Path:
    folder = default_model_dir() if path is None else Path(path)
    if not folder.is_dir():
        hint = ("" if path is not None else
                " (BPFREE_MODELS is set: it must hold mcunet-in1-int8/; unset it to use the copy "
                "bundled with bpfree)")
        raise FileNotFoundError(f"MCUNet model folder not found: {folder}{hint}")
    for name in ("graph.json", "weights.npz"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name} is missing (a model folder holds graph.json "
                                    "and weights.npz)")
    return folder


@dataclass
class Graph:
    """The parsed files: ``layers`` (graph.json's list) and ``arrays`` (name -> ndarray)."""

    folder: Path
    layers: list[dict]
    arrays: dict[str, np.ndarray]
    model: str = ""


def load_graph(path=None) -> Graph:
    """Read and check ``graph.json`` + ``weights.npz`` of ``path`` (default:
    :func:`default_model_dir`). Raises FileNotFoundError for a missing folder / file and
    :class:`ModelFormatError` (naming the layer) for malformed JSON, unknown ops, missing keys
    or arrays, wrong dtypes and shape mismatches."""
    folder = _resolve_dir(path)
    verify_checksums(folder)
    try:
        doc = json.loads((folder / "graph.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ModelFormatError(f"{folder / 'graph.json'} is not valid JSON: {err}") from None
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list) or not layers:
        raise ModelFormatError(f"{folder / 'graph.json'} must hold a non-empty 'layers' list")
    if not zipfile.is_zipfile(folder / "weights.npz"):
        raise ModelFormatError(f"{folder / 'weights.npz'} is not an npz (zip) archive: the file "
                               "is truncated or not a numpy.savez output")
    try:
        with np.load(folder / "weights.npz", allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise ModelFormatError(f"{folder / 'weights.npz'} cannot be read as an npz archive: "
                               f"{err}") from None
    seen: set[str] = set()
    for i, layer in enumerate(layers):
        if not isinstance(layer, dict) or not isinstance(layer.get("name"), str):
            raise ModelFormatError(f"graph.json layer #{i} must be an object with a 'name'")
        name, op = layer["name"], layer.get("op")
        if name in seen:
            raise ModelFormatError(f"layer {name!r} (#{i}): the name is used twice in graph.json")
        seen.add(name)
        if op not in OPS:
            raise ModelFormatError(f"layer {name!r}: unknown op {op!r} (supported: "
                                   f"{', '.join(OPS)})")
        keys = _CONV_KEYS if op == "conv2d" else _ADD_KEYS if op == "add" else ()
        missing = [k for k in keys if k not in layer]
        if missing:
            raise ModelFormatError(f"layer {name!r} ({op}): missing {', '.join(missing)}")
        if op == "conv2d":
            _check_conv_fields(layer)
            _check_conv_arrays(layer, arrays)
    return Graph(folder, layers, arrays, str(doc.get("model", "")))


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_conv_fields(layer: dict) -> None:
    """Types and ranges of a conv2d entry, and ``out_hw`` against the conv arithmetic
    ``(in_hw + 2 padding - k) // stride + 1`` where both sizes are given."""
    name = layer["name"]
    for key, low in (("in_channels", 1), ("out_channels", 1), ("groups", 1), ("stride", 1),
                     ("padding", 0)):
        v = layer[key]
        if not is_int(v) or v < low:
            raise ModelFormatError(f"layer {name!r}: {key} must be an int >= {low}, got {v!r}")
    k = layer["kernel_size"]
    if not (isinstance(k, list) and len(k) == 2 and all(is_int(v) and v >= 1 for v in k)):
        raise ModelFormatError(f"layer {name!r}: kernel_size must be [kh, kw], two ints >= 1, "
                               f"got {k!r}")
    for key in ("in_hw", "out_hw"):
        v = layer.get(key)
        if v is not None and (not is_int(v) or v < 1):
            raise ModelFormatError(f"layer {name!r}: {key} must be an int >= 1 or null (after "
                                   f"the global pooling), got {v!r}")
    for key in ("x_scale", "y_scale"):
        v = layer[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ModelFormatError(f"layer {name!r}: {key} must be a number, got {v!r}")
    for key in ("x_zero", "y_zero"):
        if not is_int(layer[key]):
            raise ModelFormatError(f"layer {name!r}: {key} must be an int in [-128, 127], got "
                                   f"{layer[key]!r}")
    hin, hout = layer.get("in_hw"), layer.get("out_hw")
    if hin is not None and hout is not None:
        want = (hin + 2 * layer["padding"] - k[0]) // layer["stride"] + 1
        if hout != want:
            raise ModelFormatError(
                f"layer {name!r}: out_hw={hout}, but a {k[0]}x{k[1]} conv with stride "
                f"{layer['stride']} and padding {layer['padding']} maps {hin}x{hin} to "
                f"{want}x{want}")
    if (hin is None) != (hout is None):
        raise ModelFormatError(f"layer {name!r}: in_hw and out_hw must both be ints or both "
                               f"null, got {hin!r} and {hout!r}")


def _check_conv_arrays(layer: dict, arrays: dict) -> None:
    name = layer["name"]
    cout, cin, groups = layer["out_channels"], layer["in_channels"], layer["groups"]
    kh, kw = layer["kernel_size"]
    if groups < 1 or cin % groups or cout % groups:
        raise ModelFormatError(f"layer {name!r}: groups={groups} must divide in_channels={cin} "
                               f"and out_channels={cout}")
    want = {"weight": ((cout, cin // groups, kh, kw), np.int8),
            "bias": ((cout,), np.int32), "w_scales": ((cout,), np.float32)}
    for part, (shape, dtype) in want.items():
        key = f"{name}.{part}"
        if key not in arrays:
            raise ModelFormatError(f"layer {name!r}: weights.npz has no array {key!r}")
        a = arrays[key]
        if tuple(a.shape) != shape:
            raise ModelFormatError(f"layer {name!r}: {part} has shape {tuple(a.shape)}, the graph "
                                   f"needs {shape}")
        if a.dtype != dtype:
            raise ModelFormatError(f"layer {name!r}: {part} has dtype {a.dtype}, expected "
                                   f"{np.dtype(dtype).name}")
    scales = arrays[f"{name}.w_scales"]
    if not (np.isfinite(scales).all() and (scales > 0).all()):
        raise ModelFormatError(f"layer {name!r}: w_scales must be finite and > 0")


def block_of(name: str) -> str | None:
    """The inverted-residual block ``"blocks.K"`` a layer ``"blocks.K.<conv>"`` belongs to;
    None for a layer outside the blocks."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) >= 3 and parts[0] == "blocks" else None
