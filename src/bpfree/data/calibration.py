"""Calibrate a corruption's strength to a target accuracy of a given model.

A corruption table made for another dataset and resolution (ImageNet-C at 224 px, CIFAR-10-C at
32 px, MNIST-C at 28 px) does not put a different model in the same regime: PMT's Table 7
starts from "No Adaptation" accuracies between 17 % and 83 % on CIFAR-10-C, while MNIST-C's
severity 5 leaves a small MNIST CNN at chance on fog and brightness, and at 90 % on shot noise.
To reproduce the paper's *regime*, each corruption's parameter is chosen so that the deployed
model's accuracy matches the paper's No Adaptation row — on training images only.

Every corruption gets one scalar knob, its ``strength`` (larger is stronger), mapped to the
corruption's parameter by :data:`KNOBS`; :func:`calibrate` bisects the strength until the
model's accuracy on the corrupted images is within ``tolerance`` points of the target.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from .corruptions import CORRUPTIONS, ELASTIC_SIGMA, apply_corruption


def _disk_shells(max_radius: float) -> np.ndarray:
    """The distinct distances sqrt(i^2 + j^2) <= max_radius: the radii at which the
    reference's aliased disk gains pixels."""
    r = np.arange(math.ceil(max_radius) + 1)
    d = np.unique(np.sqrt(r[:, None] ** 2 + r[None, :] ** 2))
    return d[d <= max_radius]


_SHELLS = _disk_shells(12.0)
_ALIAS_BLUR = (0.1, 1.0)


def _defocus(t: float):
    """Strength ``t`` walks the reference's ``(radius, alias_blur)`` space without big steps.

    The reference's disk is aliased: its radius changes the kernel only where it crosses a
    pixel shell, and one crossing (radius sqrt(5): 13 -> 21 pixels) moved the benchmark's
    INT8 MNIST model from 83.8 % to 70.5 %, a step bisection cannot land inside. So the
    integer part of ``t`` picks the shell (radius half-way to the next) and its fraction
    raises the anti-aliasing sigma from 0.1 to 1.0. On that model the path is not exactly
    monotone: at a shell crossing accuracy moves by up to 3 points either way (a softened
    small disk can blur more than the next sharp one), which the closest-probe rule of
    :func:`calibrate` absorbs.
    """
    k = min(int(t), len(_SHELLS) - 2)
    radius = 0.5 * (_SHELLS[k] + _SHELLS[k + 1])
    lo, hi = _ALIAS_BLUR
    return (float(radius), lo + (hi - lo) * min(t - k, 1.0))


def _motion(t: float):
    # ImageMagick's (radius, sigma): a 3-sigma radius keeps the Gaussian tail of the streak.
    return (max(1.0, 3.0 * t), t)


#: name -> (strength -> parameter, lowest strength, highest strength). Accuracy falls as the
#: strength grows (monotone in expectation; per-pixel randomness makes it step-wise at places).
KNOBS: dict[str, tuple[Callable[[float], object], float, float]] = {
    "gaussian_noise": (lambda t: t, 0.0, 2.0),
    "shot_noise": (lambda t: 1.0 / t, 1e-3, 100.0),          # strength = 1 / photons
    "impulse_noise": (lambda t: t, 0.0, 1.0),
    "speckle_noise": (lambda t: t, 0.0, 100.0),
    "defocus_blur": (_defocus, 0.0, float(len(_SHELLS) - 1)),  # pixel shell + anti-aliasing
    "motion_blur": (_motion, 0.1, 15.0),
    "fog": (lambda t: (t, 2.0), 0.0, 12.0),                  # haze amount, decay 2
    "contrast": (lambda t: 1.0 - t, 0.0, 1.0),               # strength = 1 - factor
    "brightness": (lambda t: t, 0.0, 1.0),                   # + V
    "elastic_transform": (lambda t: (t, ELASTIC_SIGMA, 0.05 * t), 0.0, 4.0),
}


def corruption_param(name: str, strength: float):
    """The parameter of corruption ``name`` at ``strength`` (see :data:`KNOBS`)."""
    if name not in KNOBS:
        raise ValueError(f"no calibration knob for {name!r}; calibratable: {sorted(KNOBS)}")
    fn, lo, hi = KNOBS[name]
    if not lo <= strength <= hi:
        raise ValueError(f"strength for {name!r} must lie in [{lo}, {hi}], got {strength!r}")
    return fn(float(strength))


@dataclass(frozen=True)
class Calibration:
    """The outcome for one corruption: strength, parameter, reached accuracy, search trace."""

    name: str
    target: float
    strength: float
    param: object
    accuracy: float
    trace: list[tuple[float, float]]

    @property
    def error(self) -> float:
        return self.accuracy - self.target

    def as_dict(self) -> dict:
        d = asdict(self)
        d["param"] = _plain(self.param)
        d["error"] = self.error
        return d


def _plain(param):
    if isinstance(param, tuple):
        return [float(p) for p in param]
    return float(param)


def calibrate(images: np.ndarray, labels: np.ndarray, name: str, target: float,
              score: Callable[[np.ndarray, np.ndarray], float], *, seed: int = 0,
              start_index: int = 0, tolerance: float = 1.0, iterations: int = 20) -> Calibration:
    """Bisect the strength of ``name`` so that ``score(corrupted, labels)`` (an accuracy in %)
    is within ``tolerance`` of ``target``; return the closest point found.

    ``images`` are uint8 ``[N, H, W]`` training images (never the test split), corrupted with
    the given ``seed`` / ``start_index`` exactly as the experiment will corrupt them.
    """
    if not 0.0 <= target <= 100.0:
        raise ValueError(f"target accuracy must lie in [0, 100], got {target!r}")
    if name not in CORRUPTIONS or name not in KNOBS:
        raise ValueError(f"no calibration knob for {name!r}; calibratable: {sorted(KNOBS)}")
    if tolerance <= 0 or iterations < 1:
        raise ValueError(f"tolerance must be > 0 and iterations >= 1, got {tolerance}, "
                         f"{iterations}")
    _, lo, hi = KNOBS[name]
    trace: list[tuple[float, float]] = []

    def measure(t: float) -> float:
        x = apply_corruption(images, name, corruption_param(name, t), seed=seed,
                             start_index=start_index)
        acc = float(score(x, labels))
        trace.append((float(t), acc))
        return acc

    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        acc = measure(mid)
        if abs(acc - target) <= tolerance:
            break
        if acc > target:
            lo = mid   # too easy: stronger
        else:
            hi = mid
    best_t, best_acc = min(trace, key=lambda p: abs(p[1] - target))
    return Calibration(name, float(target), best_t, corruption_param(name, best_t), best_acc,
                       trace)
