"""Reading a ``torch.save`` file without running code: PyTorch's restricted unpickler.

``torch.load(weights_only=True)`` builds tensors, containers and plain values, and only the
classes it is told about (by ``__new__`` and a ``__dict__`` update: no constructor or other
function is called). A file that names anything else (``os.system``, ``builtins.eval``, a
class of another library) is refused before a byte of it is acted on (issue 34: no user file
is ever unpickled). Device programs (:mod:`bpfree.device.model_file`) and the fleet's shared
setup (:mod:`bpfree.distributed.launch`) read their files through here.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .io import check_input_file


class UnsafeFileError(ValueError):
    """A file is not a regular file, not a torch archive, or names a class or function
    outside the allowed ones (it is refused, never executed)."""


def load_restricted(path: str | os.PathLike, allowed: tuple[type, ...], what: str,
                    kind: str) -> object:
    """The object saved at ``path``, built by the restricted unpickler from tensors, plain
    values and the classes in ``allowed`` only.

    ``what`` names the file in errors (an option or a folder), ``kind`` what it should hold
    ("bpfree integer model"). Raises :class:`UnsafeFileError` naming both for a non-regular
    file, a file that is not a torch archive, or one that names anything outside ``allowed``.
    """
    try:
        path = check_input_file(path, what)
    except ValueError as err:
        raise UnsafeFileError(str(err)) from None
    try:
        with torch.serialization.safe_globals(list(allowed)):
            return torch.load(Path(path), weights_only=True, map_location="cpu")
    except Exception as err:  # noqa: BLE001 - every unreadable or unsafe file is refused alike
        reason = " ".join(str(err).split())[:400]
        raise UnsafeFileError(f"{what}: {path} is not a safe {kind} (only {kind} classes are "
                              f"loaded, nothing is executed): {type(err).__name__}: "
                              f"{reason}") from None


__all__ = ["UnsafeFileError", "load_restricted"]
