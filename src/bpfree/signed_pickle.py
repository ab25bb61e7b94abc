"""Pickles that only this machine's user can have written: an HMAC tag checked before loading.

The benchmark task cache (``BPFREE_TASK_CACHE``) and the epoch snapshots of
:mod:`bpfree.checkpoint.resume` hold arbitrary Python objects (a task's result dict, a
trainer), which only pickle can store. But unpickling runs code, and the cache folder is a
path the user gives: a folder copied from elsewhere could hold a hostile file. So every such
pickle is written as ``MAGIC + HMAC-SHA256(key, payload) + payload``, with a 32-byte key
that this module creates once per user (``$BPFREE_PICKLE_KEY`` names its file; default
``~/.cache/bpfree/pickle.key``, mode 0600), and :func:`loads` refuses, before unpickling
anything, a file whose tag does not match. A cache written by another user or machine is
therefore treated as missing and recomputed, never executed.

Files this user's own runs wrote before signing existed (a task cache of a revision older
than this module, still being filled by that revision's run) can be vouched for, which signs
them without unpickling anything: ``python -m bpfree.signed_pickle vouch FILE...``
(:func:`vouch`). Vouch only for files you know your own runs wrote, and vouch for copies
when that older revision still reads the folder: it reads plain pickles only.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import io
import os
import pickle
import secrets
import sys
from pathlib import Path
from typing import Any

from .io import atomic_write_bytes

__all__ = ["MAGIC", "SignatureError", "dumps", "key_path", "loads", "verified_payload", "vouch"]

MAGIC = b"BPFSIG1\n"
_TAG = hashlib.sha256().digest_size


class SignatureError(ValueError):
    """The data was not written by :func:`dumps` with this user's key."""


def key_path() -> Path:
    """Where this user's key lives: ``$BPFREE_PICKLE_KEY`` or ``~/.cache/bpfree/pickle.key``."""
    named = os.environ.get("BPFREE_PICKLE_KEY", "")
    if named:
        return Path(named).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "bpfree" / "pickle.key"


def _key() -> bytes:
    path = key_path()
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:  # O_EXCL: two workers creating it at once agree on the first one's key
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return _key()
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(32))
            fh.flush()
            os.fsync(fh.fileno())
        key = path.read_bytes()
    if len(key) != 32:
        raise SignatureError(f"{path} is not a bpfree pickle key (32 bytes, got {len(key)}); "
                             "delete it to make a new one (cached results will be recomputed)")
    return key


def dumps(obj: Any, *, pickler: type[pickle.Pickler] | None = None) -> bytes:
    """``obj`` pickled (protocol 4, optionally by a ``pickler`` subclass) and signed."""
    buffer = io.BytesIO()
    (pickler or pickle.Pickler)(buffer, protocol=4).dump(obj)
    return _signed(buffer.getvalue())


def _signed(payload: bytes) -> bytes:
    return MAGIC + hmac.new(_key(), payload, hashlib.sha256).digest() + payload


def vouch(path: str | os.PathLike) -> None:
    """Sign the plain pickle at ``path`` in place (atomically), as if :func:`dumps` had
    written it; nothing is unpickled. For files this user's own older runs wrote. ValueError
    for a file that is already signed or does not start like a pickle (protocol 2 or later)."""
    path = Path(path)
    data = path.read_bytes()
    if data.startswith(MAGIC):
        raise ValueError(f"{path}: already a signed bpfree pickle")
    if len(data) < 2 or data[0] != 0x80 or not 2 <= data[1] <= pickle.HIGHEST_PROTOCOL:
        raise ValueError(f"{path}: not a pickle of protocol 2 to {pickle.HIGHEST_PROTOCOL} "
                         "(nothing signed)")
    atomic_write_bytes(path, _signed(data), what=str(path))


def main(argv: list[str] | None = None) -> int:
    """``python -m bpfree.signed_pickle vouch FILE...``: :func:`vouch` for each file."""
    parser = argparse.ArgumentParser(
        prog="python -m bpfree.signed_pickle",
        description="Sign plain pickles that your own older bpfree runs wrote (a task cache "
                    "of a revision from before signing), so that this version reads them. "
                    "Nothing is unpickled. Vouch only for files you know you wrote; vouch "
                    "for copies while the older revision still reads the folder.")
    parser.add_argument("command", choices=["vouch"])
    parser.add_argument("files", nargs="+", metavar="FILE")
    args = parser.parse_args(argv)
    failed = 0
    for name in args.files:
        try:
            vouch(name)
        except (OSError, ValueError) as exc:
            print(f"vouch: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())


def verified_payload(data: bytes) -> bytes:
    """The pickle inside ``data`` once its tag checks out; SignatureError otherwise."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + _TAG:
        raise SignatureError("not a signed bpfree pickle")
    tag, payload = data[len(MAGIC):len(MAGIC) + _TAG], data[len(MAGIC) + _TAG:]
    if not hmac.compare_digest(tag, hmac.new(_key(), payload, hashlib.sha256).digest()):
        raise SignatureError("the signature does not match this user's key (a file written "
                             "elsewhere, or altered)")
    return payload


def loads(data: bytes) -> Any:
    """Unpickle ``data`` written by :func:`dumps` with this user's key; SignatureError (and
    nothing unpickled) otherwise."""
    return pickle.loads(verified_payload(data))
