"""Old public names kept working, with a DeprecationWarning, after a rename (issue 15: one
name per concept; the glossary is in docs/PAPERS.md)."""

from __future__ import annotations

import warnings


def warn_renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
    warnings.warn(f"{old} is deprecated; use {new} (same meaning)", DeprecationWarning,
                  stacklevel=stacklevel)


def renamed_argument(old: str, old_value, new: str, new_value, default):
    """The value of argument ``new``, taken from its old name ``old`` (with a warning) when
    only that one is given; both given is a TypeError. ``None`` means not given."""
    if old_value is None:
        return default if new_value is None else new_value
    if new_value is not None:
        raise TypeError(f"give {new} only; {old} is its deprecated old name")
    warn_renamed(f"argument {old!r}", repr(new), stacklevel=4)
    return old_value
