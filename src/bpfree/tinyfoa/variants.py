"""The named variants of TinyFoA Tables 1–3.

The rows of each table; the :class:`Variant` spec and :func:`parse_variant` (TinyFoA's
names *remove* schemes, the baselines' names *add* them) live in
:mod:`bpfree.baselines.variants`, which TinyFoA and its baselines share, and are re-exported
here.
"""

from __future__ import annotations

from ..baselines.variants import BASES, Variant, parse_variant

__all__ = ["BASES", "TABLE1", "TABLE2", "TABLE3", "Variant", "parse_variant"]

#: Table 1 rows, in the paper's order.
TABLE1 = ("DRTP", "PEPITA", "FF", "TinyFoA-V-BA-BW", "BP",
          "DRTP+BW", "PEPITA+BW", "FF+BW", "TinyFoA-V-BA", "BP+BW",
          "DRTP+BW+BA", "PEPITA+BW+BA", "FF+BW+BA", "TinyFoA-V", "BP+BW+BA",
          "TinyFoA", "BP+BW+BA+V")
#: Table 2 rows (individual schemes) not already in Table 1.
TABLE2 = ("DRTP+BA", "PEPITA+BA", "FF+BA", "TinyFoA-V-BW", "BP+BA", "TinyFoA-BW-BA", "BP+V")
#: Table 3 rows (locally connected network).
TABLE3 = ("TinyFoA-V-BA-BW", "TinyFoA-V-BA", "TinyFoA-V", "TinyFoA", "BP+BW+BA+V",
          "BP+BW+BA", "BP+BW", "BP")
