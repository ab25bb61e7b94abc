"""Where bpfree looks for datasets on disk. It never downloads anything.

A dataset ``<kind>`` is looked up in, in order:

1. ``$BPFREE_DATA/<kind>`` when the ``BPFREE_DATA`` environment variable is set;
2. ``<repo>/../shared/data/<kind>``, the project's staged copy next to a source checkout;
3. ``<repo>/shared/data/<kind>``, the same staged copy when it sits inside the checkout.

``<repo>`` is found from this file's location (``src/bpfree/data/paths.py``), so the last
two only exist for a source checkout, not an installed wheel.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DATA_ENV_VAR", "candidate_roots", "default_data_root", "require_data_root"]

DATA_ENV_VAR = "BPFREE_DATA"
_REPO_ROOT = Path(__file__).resolve().parents[3]


def candidate_roots(kind: str) -> list[Path]:
    """The folders searched for dataset ``kind``, in order (whether they exist or not)."""
    roots = []
    env = os.environ.get(DATA_ENV_VAR)
    if env:
        roots.append(Path(env).expanduser() / kind)
    roots.append(_REPO_ROOT.parent / "shared" / "data" / kind)
    roots.append(_REPO_ROOT / "shared" / "data" / kind)
    return roots


def default_data_root(kind: str, required: tuple[str, ...] = ()) -> Path | None:
    """The first existing folder among :func:`candidate_roots` that holds every file named
    in ``required`` (any file when empty), or ``None``."""
    for root in candidate_roots(kind):
        if root.is_dir() and all((root / name).is_file() for name in required):
            return root
    return None


def require_data_root(kind: str, required: tuple[str, ...] = ()) -> Path:
    """For tests: :func:`default_data_root`, or skip the calling test with a reason that
    names the folders tried and how to point bpfree at the data."""
    root = default_data_root(kind, required)
    if root is None:
        import pytest  # lazy: a test-only dependency

        tried = ", ".join(str(p) for p in candidate_roots(kind))
        pytest.skip(f"dataset {kind!r} not found (tried {tried}); set {DATA_ENV_VAR} to a "
                    f"folder holding {kind}/ to run this test")
    return root
