"""`MemoryReport`: a method's training memory split into named parts, in bytes.

Every training method (BP, weight perturbation, node perturbation, ...) reports the same
canonical parts so that figures and tables can stack them side by side; a method may add
extra parts of its own (e.g. ``"activation_gradients"``).
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass, field

__all__ = ["CANONICAL_PARTS", "MemoryReport", "format_bytes"]

#: The parts every built-in rule fills (zeros included), in display order.
CANONICAL_PARTS: tuple[str, ...] = (
    "parameters",  # the model's weights as stored for inference
    "trainable_copy",  # extra copies of trainable weights (e.g. Q perturbed copies)
    "activations",  # activations live at the peak (inference working set or kept for backward)
    "gradient_buffers",  # gradient storage (BP .grad, NP weight-gradient buffer)
    "optimizer_state",  # momentum / Adam moments
    "seeds_losses",  # RNG seeds and loss scalars a ZO estimator keeps
)

_PART_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def format_bytes(n: int) -> str:
    """Human-readable size with binary units: ``"512 B"``, ``"9.41 KiB"``, ``"1.50 MiB"``."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024.0
        if value < 1024.0 or unit == "TiB":
            return f"{value:.2f} {unit}"
    raise AssertionError("unreachable")  # the loop always returns at TiB


def _validated_parts(parts: dict) -> dict[str, int]:
    if not isinstance(parts, dict):
        raise TypeError(f"parts must be a dict of part name -> bytes, got {type(parts).__name__}")
    clean: dict[str, int] = {}
    for name, value in parts.items():
        if not isinstance(name, str) or not _PART_NAME.match(name):
            raise ValueError(
                f"parts: name {name!r} must be a lowercase identifier (letters, digits, '_'); "
                f"canonical names are {', '.join(CANONICAL_PARTS)}"
            )
        # bool is an Integral; True bytes is almost surely a bug, so refuse it.
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"parts[{name!r}] must be an int number of bytes, got {value!r}")
        if value < 0:
            raise ValueError(f"parts[{name!r}] must be >= 0 bytes, got {value}")
        clean[name] = int(value)
    return clean


def _ordered(parts: dict[str, int]) -> dict[str, int]:
    # Canonical parts first so every report lists them in the same order; extras keep theirs.
    head = {k: parts[k] for k in CANONICAL_PARTS if k in parts}
    tail = {k: v for k, v in parts.items() if k not in head}
    return {**head, **tail}


@dataclass(frozen=True)
class MemoryReport:
    """Training memory of one method as named parts, in bytes.

    ``parts`` keys are lowercase identifiers; the canonical ones are
    :data:`CANONICAL_PARTS`. Values are non-negative ints. Reports add (``a + b`` or
    :meth:`merge`) part by part, and ``sum(reports)`` works.
    """

    method: str
    parts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or not self.method:
            raise ValueError(f"method must be a non-empty str, got {self.method!r}")
        object.__setattr__(self, "parts", _ordered(_validated_parts(self.parts)))

    @property
    def total(self) -> int:
        """Sum of all parts, in bytes."""
        return sum(self.parts.values())

    def as_dict(self) -> dict:
        """JSON-friendly ``{"method", "parts", "total"}``."""
        return {"method": self.method, "parts": dict(self.parts), "total": self.total}

    def merge(self, *others: MemoryReport, method: str | None = None) -> MemoryReport:
        """Part-wise sum of this report and ``others``; ``method`` defaults to ``"a+b+..."``."""
        reports = (self, *others)
        for r in others:
            if not isinstance(r, MemoryReport):
                raise TypeError(f"merge: expected MemoryReport, got {type(r).__name__}")
        summed: dict[str, int] = {}
        for r in reports:
            for name, value in r.parts.items():
                summed[name] = summed.get(name, 0) + value
        return MemoryReport(method or "+".join(r.method for r in reports), summed)

    def __add__(self, other: object) -> MemoryReport:
        if not isinstance(other, MemoryReport):
            return NotImplemented
        return self.merge(other)

    def __radd__(self, other: object) -> MemoryReport:
        # sum() starts from 0; treat it as the empty report.
        if other == 0:
            return self
        return NotImplemented

    def table(self) -> str:
        """Text table: one row per part with bytes, human units and percent of total."""
        total = self.total
        rows = [(name, value) for name, value in self.parts.items()] + [("total", total)]
        name_w = max(len("part"), *(len(n) for n, _ in rows))
        byte_w = max(len("bytes"), *(len(f"{v:,}") for _, v in rows))
        human_w = max(len("size"), *(len(format_bytes(v)) for _, v in rows))
        lines = [
            f"memory: {self.method}",
            f"{'part':<{name_w}}  {'bytes':>{byte_w}}  {'size':>{human_w}}  {'share':>6}",
        ]
        for name, value in rows:
            share = f"{100.0 * value / total:5.1f}%" if total else "     -"
            human = format_bytes(value)
            lines.append(f"{name:<{name_w}}  {value:>{byte_w},}  {human:>{human_w}}  {share:>6}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()
