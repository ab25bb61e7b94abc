"""The IDX file format and the datasets shipped in it: MNIST and Fashion-MNIST.

IDX is described on "THE MNIST DATABASE" page (LeCun, Cortes, Burges).
An IDX file is a 4-byte magic number ``0x00 0x00 <type code> <ndim>``, then ``ndim``
big-endian uint32 dimension sizes, then the values in C order, big-endian. The files are
usually distributed gzip-compressed; compression is detected from the content (gzip's magic
bytes), not the file name.
"""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from .paths import DATA_ENV_VAR, candidate_roots

__all__ = ["IDX_DTYPES", "IDX_KINDS", "IdxError", "load_mnist", "mnist_files", "read_idx"]

#: IDX type code -> big-endian numpy dtype.
IDX_DTYPES = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"
# Guards against a corrupt header asking for an absurd allocation before any data is read.
_MAX_BYTES = 1 << 34


class IdxError(ValueError):
    """An IDX file is malformed: bad magic number, truncated, or of the wrong size."""


def _read_exact(f, buf: memoryview) -> int:
    """Fill ``buf`` from ``f``; return how many bytes were read (less means EOF)."""
    got = 0
    while got < len(buf):
        n = f.readinto(buf[got:])
        if not n:
            break
        got += n
    return got


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (gzip-compressed or raw) into a native-endian numpy array.

    Raises ``FileNotFoundError`` if ``path`` does not exist and :class:`IdxError` (a
    ``ValueError``) naming the file for a bad magic number, an unknown type code, a
    truncated file or trailing bytes after the data.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"IDX file not found: {path}")
    with open(path, "rb") as raw:
        compressed = raw.read(2) == _GZIP_MAGIC
    opener = gzip.open if compressed else open
    try:
        with opener(path, "rb") as f:
            return _read_stream(f, path)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise IdxError(f"{path}: corrupt or truncated gzip stream ({e})") from None


def _read_stream(f, path: Path) -> np.ndarray:
    magic = f.read(4)
    if len(magic) < 4:
        raise IdxError(f"{path}: truncated: {len(magic)} bytes, an IDX header needs at least 4")
    if magic[0] != 0 or magic[1] != 0 or magic[2] not in IDX_DTYPES or magic[3] == 0:
        raise IdxError(
            f"{path}: bad IDX magic number 0x{magic.hex()}; expected 0x0000TTNN with type "
            f"code TT in {{{', '.join(f'{c:02x}' for c in IDX_DTYPES)}}} and NN >= 1 dimensions "
            "(e.g. 0x00000803 for MNIST images, 0x00000801 for labels)")
    dtype, ndim = IDX_DTYPES[magic[2]], magic[3]
    dims_raw = f.read(4 * ndim)
    if len(dims_raw) < 4 * ndim:
        raise IdxError(f"{path}: truncated: header declares {ndim} dimensions but ends after "
                       f"{len(dims_raw) // 4}")
    shape = struct.unpack(f">{ndim}I", dims_raw)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > _MAX_BYTES:
        raise IdxError(f"{path}: header declares shape {shape}, {nbytes} bytes; not a plausible "
                       "IDX file")
    out = np.empty(shape, dtype=dtype)
    # readinto straight into the result: no second copy of a 47 MB image file.
    got = _read_exact(f, memoryview(out.reshape(-1).view(np.uint8)))
    if got < nbytes:
        raise IdxError(f"{path}: truncated: shape {shape} of {dtype.name} needs {nbytes} data "
                       f"bytes, found {got}")
    extra = len(f.read(1 << 16))
    if extra:
        raise IdxError(f"{path}: wrong size: {extra if extra < 1 << 16 else 'many'} unexpected "
                       f"bytes after the {nbytes} data bytes of shape {shape}")
    if dtype.byteorder == ">":
        out = out.astype(dtype.newbyteorder("="))
    return out


# ---------------------------------------------------------------------------------------
# MNIST-style datasets
# ---------------------------------------------------------------------------------------

#: Dataset kinds that use MNIST's four-file IDX layout.
IDX_KINDS = ("mnist", "fashion-mnist")
_SPLITS = {"train": "train", "test": "t10k"}


def mnist_files(split: str) -> tuple[str, str]:
    """Standard (gzip) file names of ``split``'s images and labels."""
    prefix = _SPLITS[split]
    return f"{prefix}-images-idx3-ubyte.gz", f"{prefix}-labels-idx1-ubyte.gz"


def _find(root: Path, name: str) -> Path | None:
    """The file ``name`` in ``root``, accepting the uncompressed variant and the dotted
    spelling some mirrors use (``train-images.idx3-ubyte``)."""
    stem = name.removesuffix(".gz")
    dotted = stem.replace("-idx", ".idx")
    for candidate in (name, stem, dotted + ".gz", dotted):
        if (root / candidate).is_file():
            return root / candidate
    return None


def load_mnist(root: str | os.PathLike | None = None, *, split: str = "train",
               kind: str = "mnist") -> tuple[np.ndarray, np.ndarray]:
    """Load MNIST or Fashion-MNIST from the four standard IDX files; never downloads.

    ``root`` is a folder holding ``train-images-idx3-ubyte.gz``, ``train-labels-idx1-ubyte.gz``,
    ``t10k-images-idx3-ubyte.gz`` and ``t10k-labels-idx1-ubyte.gz`` (gzip or uncompressed).
    When ``None``, the folders of :func:`bpfree.data.paths.candidate_roots` are searched
    (``$BPFREE_DATA/<kind>`` first). ``split`` is ``"train"`` (60,000 images) or ``"test"``
    (10,000). Returns ``(images uint8 [N, 28, 28], labels int64 [N])``.

    Raises ``FileNotFoundError`` naming the folders tried, ``ValueError`` for a bad
    ``split``/``kind``, a malformed file or images and labels that disagree.
    """
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {sorted(_SPLITS)}, got {split!r}")
    if kind not in IDX_KINDS:
        raise ValueError(f"kind must be one of {list(IDX_KINDS)}, got {kind!r}")
    names = mnist_files(split)
    roots = [Path(root).expanduser()] if root is not None else candidate_roots(kind)
    found = None
    for folder in roots:
        files = [_find(folder, n) for n in names]
        if all(files):
            found = files
            break
    if found is None:
        tried = ", ".join(str(r) for r in roots)
        hint = ("pass root= a folder holding them" if root is not None else
                f"pass root= a folder holding them, or set {DATA_ENV_VAR} to a folder with "
                f"a {kind}/ subfolder")
        raise FileNotFoundError(
            f"{kind} {split} files {list(names)} not found (tried {tried}); bpfree never "
            f"downloads data: {hint}")
    image_path, label_path = found
    images, labels = read_idx(image_path), read_idx(label_path)
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28):
        raise ValueError(f"{image_path}: expected uint8 images of shape [N, 28, 28], got "
                         f"{images.dtype} {list(images.shape)}")
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise ValueError(f"{label_path}: expected a 1-D uint8 label vector, got "
                         f"{labels.dtype} {list(labels.shape)}")
    if len(images) != len(labels):
        raise ValueError(f"{image_path} holds {len(images)} images but {label_path} holds "
                         f"{len(labels)} labels")
    if labels.size and labels.max() > 9:
        raise ValueError(f"{label_path}: labels must be 0..9, found {int(labels.max())}")
    return images, labels.astype(np.int64)
