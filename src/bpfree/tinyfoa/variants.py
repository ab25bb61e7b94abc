"""The named variants of TinyFoA Tables 1–3 and their parsing.

TinyFoA's names *remove* schemes from the full method (``TinyFoA`` = vertical training +
binary weights + binary activations; ``TinyFoA-V-BA`` drops vertical training and binary
activations); the baselines' names *add* them (``BP+BW+BA+V``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BASES", "TABLE1", "TABLE2", "TABLE3", "Variant", "parse_variant"]

BASES = ("TinyFoA", "BP", "DRTP", "PEPITA", "FF")
_FLAGS = {"V": "vertical", "BW": "binary_weights", "BA": "binary_activations"}


@dataclass(frozen=True)
class Variant:
    base: str
    binary_weights: bool
    binary_activations: bool
    vertical: bool

    @property
    def name(self) -> str:
        if self.base == "TinyFoA":
            # the paper writes TinyFoA-V-BA-BW but TinyFoA-BW-BA (Tables 1–2)
            order = ((("V", self.vertical), ("BA", self.binary_activations),
                      ("BW", self.binary_weights)) if not self.vertical else
                     (("BW", self.binary_weights), ("BA", self.binary_activations)))
            off = [k for k, f in order if not f]
            return "TinyFoA" + "".join(f"-{k}" for k in off)
        on = [k for k, f in (("BW", self.binary_weights), ("BA", self.binary_activations),
                             ("V", self.vertical)) if f]
        return self.base + "".join(f"+{k}" for k in on)


def parse_variant(name: str) -> Variant:
    """``"TinyFoA-V-BA"`` / ``"BP+BW+BA+V"`` → :class:`Variant`; ValueError when unknown."""
    if not isinstance(name, str):
        raise TypeError(f"variant name must be a str, got {type(name).__name__}")
    bad = ValueError(f"unknown variant {name!r}: expected one of {list(BASES)} followed by "
                     "'-V'/'-BA'/'-BW' (TinyFoA) or '+BW'/'+BA'/'+V' (baselines), e.g. "
                     "'TinyFoA-V-BA', 'BP+BW+BA+V'")
    if name.startswith("TinyFoA"):
        parts = name[len("TinyFoA"):].split("-")
        if parts[0] != "":
            raise bad
        flags = parts[1:]
        if any(f not in _FLAGS for f in flags) or len(set(flags)) != len(flags):
            raise bad
        return Variant("TinyFoA", "BW" not in flags, "BA" not in flags, "V" not in flags)
    base, *flags = name.split("+")
    if base not in BASES or base == "TinyFoA":
        raise bad
    if any(f not in _FLAGS for f in flags) or len(set(flags)) != len(flags):
        raise bad
    return Variant(base, "BW" in flags, "BA" in flags, "V" in flags)


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
