"""Output files: check a destination before the work, then write it atomically.

Every command that writes a result (``--json``, ``--out``, checkpoints) goes through here:

- :func:`check_output_path` runs *before* any work, so a bad destination (an empty string,
  a directory, a device node, a folder under a regular file, an unwritable folder) fails in
  a second with a message naming the option, instead of after a long run.
- :func:`atomic_write_bytes` / :func:`atomic_write_text` / :func:`write_json` write a
  temporary file in the destination's folder, flush and fsync it, ``os.replace`` it over the
  destination and fsync the folder: an interrupted write (Ctrl-C, a full disk, ``ulimit -f``,
  SIGKILL) leaves the previous file intact and never a partial file under the final name.
  A symlink destination is kept: the file it points to is replaced. The new file gets the
  mode a plain ``open()`` would give it (``0o666`` less the umask).
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import time
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "check_input_file",
    "check_output_path",
    "refuse_output_over_input",
    "first_missing_folder",
    "remove_stale_temporaries",
    "temporary_name",
    "write_json",
]

_TMP_SUFFIX = ".tmp"
_PROBE_SUFFIX = ".probe"


def _target(path: str | os.PathLike, what: str) -> Path:
    """The file that will really be written: a symlink is followed to its target."""
    if isinstance(path, str) and not path.strip():
        raise ValueError(f"{what}: empty path; give the name of the file to write")
    return Path(os.path.realpath(os.fspath(path)))


def _refuse_non_file(target: Path, shown: str, what: str) -> None:
    try:
        mode = os.stat(target).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return  # a new file, or a path below a file (check_output_path names that case)
    if stat.S_ISDIR(mode):
        raise ValueError(f"{what}: {shown} is a directory; give a file name inside it")
    if not stat.S_ISREG(mode):
        raise ValueError(f"{what}: {shown} is not a regular file (a device, FIFO or socket); "
                         "give a file name")


def check_output_path(path: str | os.PathLike, *, what: str = "output") -> Path:
    """Check that ``path`` can be written as a file, before any work; return it as a Path.

    Refused with a ``ValueError`` naming ``what`` (the option, e.g. ``--json``): an empty
    path, a directory, a device node or FIFO, a path below a regular file, and a folder
    where a file cannot be created (tested by creating and removing a temporary file).
    Missing folders are fine when they can be created; they are created at write time.
    """
    shown = repr(os.fspath(path))
    target = _target(path, what)
    _refuse_non_file(target, shown, what)
    missing = first_missing_folder(target)
    folder = target.parent if missing is None else missing.parent
    if not folder.is_dir():
        raise ValueError(f"{what}: cannot write {shown}: {folder} is a file, not a directory")
    try:
        probe = folder / f".{target.name}.{secrets.token_hex(6)}{_PROBE_SUFFIX}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as err:
        raise ValueError(f"{what}: cannot write {shown}: {folder} is not writable "
                         f"({err.strerror or err})") from None
    return Path(path)


def check_input_file(path: str | os.PathLike, what: str = "input") -> Path:
    """``path`` as a Path if it is an existing regular file (symlinks followed), before it is
    opened: a directory, FIFO, socket or device is refused with a ``ValueError`` naming
    ``what`` (a FIFO would block the reader for ever, a device would be read without end)."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ValueError(f"{what}: no such file: {path}") from None
    except OSError as err:
        raise ValueError(f"{what}: cannot read {path}: {err.strerror or err}") from None
    if stat.S_ISDIR(mode):
        raise ValueError(f"{what}: {path} is a directory, not a file")
    if not stat.S_ISREG(mode):
        raise ValueError(f"{what}: {path} is not a regular file (a FIFO, socket or device)")
    return path


def _identity(path: str | os.PathLike) -> tuple[str, tuple[int, int] | None]:
    """(resolved path, (device, inode) when it exists): two names of one file agree on the
    second even through hard links, and on the first through symlinks and ``..``."""
    real = os.path.realpath(os.fspath(path))
    try:
        st = os.stat(real)
    except OSError:
        return real, None
    return real, (st.st_dev, st.st_ino)


def _inside(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def refuse_output_over_input(outputs: dict[str, Any], inputs: dict[str, Any]) -> None:
    """Refuse, before any work, an output that would replace an input or another output.

    ``outputs`` and ``inputs`` map an option's name (``--out``, ``MODEL``) to its path (None:
    not given). Paths are compared after resolving symlinks and ``..`` and by (device, inode),
    so a hard link or a symlink of an input is caught; an output inside an input folder (a
    data folder of images) is refused too. Raises ``ValueError`` naming both options.
    """
    given_in = {k: _identity(v) for k, v in inputs.items() if v is not None}
    seen: dict[str, tuple[str, tuple[int, int] | None]] = {}
    for name, path in outputs.items():
        if path is None:
            continue
        real, ino = _identity(path)
        for other, (other_real, other_ino) in [*given_in.items(), *seen.items()]:
            same = real == other_real or (ino is not None and ino == other_ino)
            if same or (other in given_in and os.path.isdir(other_real)
                        and _inside(real, other_real)):
                kind = "input" if other in given_in else "output"
                raise ValueError(f"{name} {os.fspath(path)!r} would overwrite the {kind} "
                                 f"{other} {os.fspath((inputs | outputs)[other])!r}; write to "
                                 "another file (no input is ever replaced)")
        seen[name] = (real, ino)


def first_missing_folder(path: str | os.PathLike) -> Path | None:
    """The outermost folder above ``path`` that does not exist yet (the one a write would
    create first), or None when the file's folder exists. Symlinks are followed."""
    missing = None
    folder = Path(os.path.realpath(os.fspath(path))).parent
    while not folder.exists():
        missing = folder
        folder = folder.parent
    return missing


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # platforms (Windows) or filesystems that cannot open a directory for fsync
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename is still atomic
    finally:
        os.close(fd)


#: An empty temporary younger than this is kept: its writer may have created it an instant
#: ago and not yet taken its lock (issue 34: a load deleted a concurrent save's file). Where
#: there are no locks (Windows), every temporary younger than this is kept.
STALE_AFTER_S = 5.0


def _lock(fd: int, *, wait: bool) -> bool:
    """An exclusive ``flock`` on ``fd``; False when another open file holds it (no wait)."""
    if fcntl is None:  # Windows: the age rule alone protects a live writer
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError:  # a filesystem without locks: the age rule alone
        return True
    return True


def _is_stale(tmp: Path) -> bool:
    """Whether ``tmp`` was left by a dead writer: not locked by a live one (a live
    :func:`atomic_write_bytes` holds the lock from its first byte to its rename), and not
    an empty file created an instant ago (a writer before its lock)."""
    try:
        st = tmp.stat()
        young = time.time() - st.st_mtime < STALE_AFTER_S
        if young and (fcntl is None or st.st_size == 0):
            return False
        fd = os.open(tmp, os.O_RDONLY)
    except OSError:
        return False
    try:
        return _lock(fd, wait=False)
    finally:
        os.close(fd)


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporary files a killed write of ``path`` left beside it; return them.

    Only files of dead writers go: a live :func:`atomic_write_bytes` holds a lock on its
    temporary (see :func:`_is_stale`)."""
    target = _target(path, "path")
    if not target.parent.is_dir():
        return []
    removed = []
    # The writability probe of check_output_path leaves one too when a kill lands between its
    # create and its unlink.
    for suffix in (_TMP_SUFFIX, _PROBE_SUFFIX):
        for tmp in target.parent.glob(f".{target.name}.*{suffix}"):
            token = tmp.name[len(target.name) + 2:-len(suffix)]
            if len(token) == 12 and all(c in "0123456789abcdef" for c in token) \
                    and _is_stale(tmp):
                try:
                    tmp.unlink(missing_ok=True)
                except OSError:
                    continue  # a read-only folder: loading must still work
                removed.append(tmp)
    return removed


def temporary_name(path: str | os.PathLike) -> Path:
    """A fresh name beside ``path`` for a tool (a compiler) to write before ``os.replace``:
    unique per call, so two concurrent builds of one file never share a temporary."""
    target = Path(path)
    return target.parent / f".{target.name}.{secrets.token_hex(6)}{_TMP_SUFFIX}"


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, what: str = "output") -> Path:
    """Write ``data`` to ``path`` so that readers see either the old file or the complete
    new one (see the module docstring); returns ``Path(path)``."""
    target = _target(path, what)
    _refuse_non_file(target, repr(os.fspath(path)), what)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{secrets.token_hex(6)}{_TMP_SUFFIX}"
    # os.open with 0o666 lets the umask decide the final mode, like a plain open() would.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        _lock(fd, wait=True)  # held until closed: remove_stale_temporaries leaves it alone
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        # e.g. ENOSPC / EFBIG from write(): say which output, and that the old file is intact
        message = (f"{what}: could not write {os.fspath(path)}: {exc.strerror or exc} "
                   "(the previous file, if any, is unchanged)")
        raise (OSError(exc.errno, message) if exc.errno else OSError(message)) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(target.parent)
    return Path(path)


def atomic_write_text(text: str, path: str | os.PathLike, *, what: str = "output") -> Path:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8 (newlines written as given)."""
    return atomic_write_bytes(path, text.encode("utf-8"), what=what)


def write_json(document: Any, path: str | os.PathLike, *, what: str = "--json",
               indent: int | None = 2, default=None) -> Path:
    """Strict JSON (NaN and infinities refused: they are not JSON), written atomically.

    A document that cannot be serialised raises ``ValueError`` before the file is touched.
    """
    try:
        text = json.dumps(document, indent=indent, default=default, allow_nan=False) + "\n"
    except (TypeError, ValueError) as err:
        raise ValueError(f"{what}: the result for {os.fspath(path)} is not valid JSON: "
                         f"{err}") from None
    return atomic_write_text(text, path, what=what)
