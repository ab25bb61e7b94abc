"""Read arrays from a user's ``.npz`` with the sizes checked from the headers first.

``np.load`` unpacks a whole member before its shape can be looked at, so a 1.5 MB compressed
archive of zeros becomes gigabytes before any check runs (issue 34). Here each member's
``.npy`` header (shape, dtype, order) is read from the zip stream alone, checked (numbers only,
no pickled objects; the declared size against the member's own size and against the memory the
caller allows; the caller's own shape check), and only then is the payload read, and only the
rows asked for: memory stays at the size of the arrays returned.
"""

from __future__ import annotations

import math
import os
import zipfile
from zlib import error as zlib_error
from collections.abc import Callable

import numpy as np

from ..io import check_input_file

def memory_limit() -> int:
    """The default bound on the bytes the requested arrays may decode to: half the physical
    memory (the rest is the model's and the interpreter's)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def _header(zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: str):
    with zf.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0), (3, 0)):
            raise ValueError(f"{where}: unsupported .npy version {version}")
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read(f, max_header_size=10000)
        return shape, fortran, dtype, f.tell()


def npz_headers(path, names, *, what: str = "data") -> dict[str, tuple]:
    """``{name: (shape, dtype)}`` of the named members, read from the headers alone."""
    return {k: (v[0], v[2]) for k, v in _open_headers(path, names, what)[1].items()}


def _open_headers(path, names, what):
    check_input_file(path, what)
    where = f"{what} {os.fspath(path)}"
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise ValueError(f"{where}: not a readable .npz ({err})") from None
    members = {n[:-4]: zf.getinfo(n) for n in zf.namelist() if n.endswith(".npy")}
    missing = [n for n in names if n not in members]
    if missing:
        zf.close()
        raise ValueError(f"{where}: the .npz must hold arrays {list(names)}, missing {missing} "
                         f"(it has {sorted(members)})")
    headers = {}
    try:
        for name in names:
            shape, fortran, dtype, offset = _header(zf, members[name], where)
            if dtype.hasobject or dtype.kind not in "biuf":
                raise ValueError(f"{where}: array {name!r} must hold numbers, got dtype {dtype}")
            nbytes = math.prod(shape) * dtype.itemsize
            if members[name].file_size < offset + nbytes:
                raise ValueError(f"{where}: array {name!r} declares shape {shape} ({nbytes} "
                                 f"bytes) but its member holds {members[name].file_size - offset}"
                                 " (truncated or corrupt)")
            headers[name] = (shape, fortran, dtype, offset)
    except ValueError as err:
        zf.close()
        if str(err).startswith(where):
            raise
        raise ValueError(f"{where}: not a readable .npz ({err})") from None
    except Exception as err:  # noqa: BLE001 - a malformed member is the same usage error
        zf.close()
        raise ValueError(f"{where}: not a readable .npz ({type(err).__name__}: {err})") from None
    return zf, headers, members


def load_npz(path, names=("x", "y"), *, what: str = "data", rows: int | None = None,
             check: Callable[[dict[str, tuple]], None] | None = None,
             max_bytes: int | None = None, bytes_per_element: dict | None = None
             ) -> tuple[np.ndarray, ...]:
    """The named arrays of the ``.npz`` at ``path``, in order, each cut to its first ``rows``.

    Before any payload is read: the file must be a regular file and a zip holding every name,
    each an array of numbers whose declared size fits its member; ``check({name: (shape,
    dtype)})`` may raise ``ValueError`` (e.g. a shape the model cannot take); and the arrays
    must decode to at most ``max_bytes`` (default :func:`memory_limit`), counting each element
    at ``bytes_per_element[name]`` bytes when given (the size the caller converts it to).
    """
    where = f"{what} {os.fspath(path)}"
    zf, headers, members = _open_headers(path, names, what)
    with zf:
        if check is not None:
            check({k: (v[0], v[2]) for k, v in headers.items()})
        limit = memory_limit() if max_bytes is None else max_bytes
        cut = {}
        total = 0
        for name, (shape, fortran, dtype, _) in headers.items():
            n = shape[0] if shape else 1
            keep = min(n, rows) if rows is not None and shape else n
            cut[name] = (keep, *shape[1:]) if shape else shape
            size = (bytes_per_element or {}).get(name, dtype.itemsize)
            total += math.prod(cut[name]) * max(size, dtype.itemsize)
        if total > limit:
            raise ValueError(f"{where}: the arrays {', '.join(f'{k} {cut[k]}' for k in names)} "
                             f"would take {total / 2**30:.2f} GiB in memory, more than the "
                             f"{limit / 2**30:.2f} GiB allowed; use fewer samples")
        try:
            return tuple(_payload(zf, members[name], headers[name], cut[name], where, name)
                         for name in names)
        except (zipfile.BadZipFile, OSError, EOFError, zlib_error) as err:
            raise ValueError(f"{where}: not a readable .npz ({type(err).__name__}: {err})"
                             ) from None


def _payload(zf, info, header, cut, where: str, name: str) -> np.ndarray:
    """The member's array (its first ``cut[0]`` rows), read straight into its own buffer."""
    shape, fortran, dtype, offset = header
    # column-major: the first rows are not contiguous, so the whole array is read
    array = np.empty(shape if fortran else cut, dtype=dtype, order="F" if fortran else "C")
    view = memoryview(array.reshape(-1, order="A")).cast("B")
    with zf.open(info) as f:
        f.seek(offset)
        done = 0
        while done < len(view):
            n = f.readinto(view[done:])
            if not n:
                raise ValueError(f"{where}: array {name!r} is truncated ({done} of "
                                 f"{len(view)} bytes)")
            done += n
    return np.ascontiguousarray(array[:cut[0]]) if fortran and shape else array


__all__ = ["load_npz", "memory_limit", "npz_headers"]
