"""Learning-rate schedules: ``schedule(step) -> multiplier`` of the base learning rate."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Constant:
    def __call__(self, step: int) -> float:
        return 1.0


@dataclass(frozen=True)
class Cosine:
    """Cosine decay from 1 to ``final`` over ``total_steps`` (PMT §4.1 uses cosine decay)."""

    total_steps: int
    final: float = 0.0

    def __post_init__(self):
        if not (isinstance(self.total_steps, int) and self.total_steps >= 1):
            raise ValueError(f"total_steps must be an int >= 1, got {self.total_steps!r}")
        if not (0.0 <= self.final <= 1.0):
            raise ValueError(f"final must be in [0, 1], got {self.final!r}")

    def __call__(self, step: int) -> float:
        t = min(step, self.total_steps) / self.total_steps
        return self.final + (1.0 - self.final) * 0.5 * (1.0 + math.cos(math.pi * t))


@dataclass(frozen=True)
class Exponential:
    """Multiply by ``gamma`` every ``every`` steps (TT-ZO §5.1: 0.9 every 10 epochs)."""

    gamma: float
    every: int = 1

    def __post_init__(self):
        if not (0.0 < self.gamma <= 1.0):
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma!r}")
        if not (isinstance(self.every, int) and self.every >= 1):
            raise ValueError(f"every must be an int >= 1, got {self.every!r}")

    def __call__(self, step: int) -> float:
        return self.gamma ** (step // self.every)


def constant() -> Constant:
    return Constant()


def cosine(total_steps: int, final: float = 0.0) -> Cosine:
    return Cosine(total_steps, final)


def exponential(gamma: float, every: int = 1) -> Exponential:
    return Exponential(gamma, every)
