"""The baselines of TinyFoA Tables 1–3 (BP, DRTP, PEPITA, FF with +BW/+BA/+V) and
:func:`make_method`, which builds TinyFoA or any of them from a variant name.

The baselines live in :mod:`bpfree.baselines.local_rules`; this module re-exports them at
their old path.
"""

from __future__ import annotations

from ..baselines.local_rules import BP, DRTP, FF, PEPITA
from ..baselines.variants import parse_variant
from .local import TinyFoA

__all__ = ["BP", "DRTP", "FF", "PEPITA", "make_method"]


def make_method(variant: str, sizes: list[int], n_classes: int = 10, *, m: int = 2,
                seed: int = 0, **kw):
    """Build any Table 1–2 method from its variant name (TinyFoA or a baseline)."""
    v = parse_variant(variant)
    cls = {"TinyFoA": TinyFoA, "BP": BP, "DRTP": DRTP, "PEPITA": PEPITA, "FF": FF}[v.base]
    return cls(sizes, n_classes, variant=v, m=m, seed=seed, **kw)
