"""The BW / BA / V variants of TinyFoA Tables 1–3, which TinyFoA and its baselines share.

A :class:`Variant` says which of TinyFoA's schemes a network uses: binary weights (BW),
binary activations (BA), vertical training in ``M`` slices (V). TinyFoA's names *remove*
schemes from the full method (``TinyFoA`` = vertical training + binary weights + binary
activations; ``TinyFoA-V-BA`` drops vertical training and binary activations); the
baselines' names *add* them (``BP+BW+BA+V``). :func:`check_slices` and :func:`check_batch`
validate the slice count and a batch for both. The tables' row lists stay with the paper
(:mod:`bpfree.tinyfoa.variants`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["BASES", "Variant", "check_batch", "check_slices", "parse_variant"]

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


def check_batch(x: torch.Tensor, y: torch.Tensor, in_features: int, n_classes: int,
                labels_for: str) -> None:
    """Clear errors for a batch a network cannot take: inputs of ``in_features`` values, one
    label per input, labels in ``[0, n_classes)`` (``labels_for`` says what they must fit)."""
    if x.dim() < 1 or x[0].numel() != in_features:
        raise ValueError(f"each input must have {in_features} values (the first "
                         f"layer's input size), got shape {tuple(x.shape)}")
    if y.dim() != 1 or y.shape[0] != x.shape[0]:
        raise ValueError(f"labels must be one class index per input: expected shape "
                         f"({x.shape[0]},), got {tuple(y.shape)}")
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= n_classes):
        raise ValueError(f"labels must lie in [0, {n_classes}) {labels_for}, got "
                         f"[{int(y.min())}, {int(y.max())}]")


def check_slices(m: int, sizes: dict[str, int]) -> int:
    """Validate the slice count ``m`` against named sizes it must divide; returns ``m``."""
    if isinstance(m, bool) or not isinstance(m, int):
        raise TypeError(f"the slice count M must be an int, got {type(m).__name__}")
    if m < 1:
        raise ValueError(f"the slice count M must be >= 1, got {m}")
    bad = [f"{k} = {v}" for k, v in sizes.items() if v % m]
    if bad:
        raise ValueError(f"M = {m} slices do not divide " + ", ".join(bad))
    return m
