"""Quantization parameters of the TFLite int8 scheme as validated, frozen dataclasses.

The TFLite int8 specification (``https://www.tensorflow.org/lite/performance/quantization_spec``)
that TFLite Micro, CMSIS-NN and TinyEngine implement fixes:

* activations: int8, per-tensor affine ``real = scale * (q - zero_point)`` with
  ``zero_point`` in [-128, 127] (:class:`TensorQuant`);
* weights: int8, symmetric per output channel (``zero_point = 0``, :class:`WeightQuant`);
* bias: int32 with ``scale = input_scale * weight_scale[c]`` and zero point 0;
* requantization of the int32 accumulator by ``input_scale * weight_scale[c] / output_scale``
  turned into a fixed-point multiplier and shift (:class:`Requantization`);
* fused activations as clamps of the output range (:class:`ActivationRange`);
* residual ADD with its own three multipliers and a left shift of 20 (:class:`AddRequantization`).

Scales are stored as float32 values, like TFLite's ``TfLiteAffineQuantization``; effective
multipliers are then computed from them in double, as TFLite's ``Prepare`` functions do, so a
model exported to an MCU gets the same integers. PMT §2.1 (Eq. 1) is the real-valued model this
approximates.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .fixed_point import INT8_MAX, INT8_MIN, MAX_SHIFT, MIN_SHIFT, quantize_multiplier

ACTIVATIONS = (None, "relu", "relu6")


def as_float32_scale(value, name: str) -> float:
    """``value`` rounded to float32, validated finite and > 0 (also after rounding)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a finite float > 0, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite float > 0, got {value!r}")
    with np.errstate(over="ignore", under="ignore"):
        f32 = float(np.float32(v))
    if not math.isfinite(f32) or f32 <= 0:
        raise ValueError(f"{name} must be representable as a positive finite float32 "
                         f"(about 1.4e-45 to 3.4e38), got {value!r}")
    return f32


def as_int(value, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {value!r}") from None
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {v}")
    return v


def _round_half_away_f32(x: np.float32) -> int:
    """TfLiteRound (std::round) of a float32, exactly."""
    t = np.trunc(x)
    return int(t) + (int(np.sign(x)) if abs(x - t) >= np.float32(0.5) else 0)


@dataclass(frozen=True)
class TensorQuant:
    """Per-tensor asymmetric int8 quantization of an activation: ``real = scale * (q - zp)``."""

    scale: float
    zero_point: int = 0

    def __post_init__(self):
        object.__setattr__(self, "scale", as_float32_scale(self.scale, "scale"))
        object.__setattr__(self, "zero_point",
                           as_int(self.zero_point, "zero_point", INT8_MIN, INT8_MAX))

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """TFLite QUANTIZE: ``clamp(round(x / scale) + zero_point, -128, 127)`` as int8.

        The division is in float32 like TFLite's reference ``AffineQuantize``, and rounding is
        half away from zero (``std::round``), not torch's half-to-even. NaN and infinities are
        refused (``ValueError``): clamping would silently turn them into 0 and +-127.
        """
        if x.is_floating_point() and not bool(torch.isfinite(x).all()):
            bad = int((~torch.isfinite(x)).sum())
            raise ValueError(f"cannot quantize an input with {bad} non-finite value(s) (nan / "
                             f"inf) of {x.numel()}; clean or drop those samples first")
        v = x.to(torch.float32) / torch.tensor(self.scale, dtype=torch.float32, device=x.device)
        t = torch.trunc(v)
        # v - t is exact in float, so ties are detected exactly (floor(|v| + 0.5) is not).
        r = t + torch.sign(v) * ((v - t).abs() >= 0.5)
        return (r + self.zero_point).clamp_(INT8_MIN, INT8_MAX).to(torch.int8)

    def dequantize(self, q: torch.Tensor) -> torch.Tensor:
        """``scale * (q - zero_point)`` in float32."""
        return (q.to(torch.float32) - self.zero_point) * self.scale


@dataclass(frozen=True)
class WeightQuant:
    """Symmetric per-output-channel int8 weight scales (zero point 0), TFLite's per-axis scheme."""

    scales: tuple[float, ...]

    def __post_init__(self):
        raw = self.scales
        if isinstance(raw, torch.Tensor):
            raw = raw.detach().cpu().reshape(-1).tolist()
        elif isinstance(raw, np.ndarray):
            raw = raw.reshape(-1).tolist()
        elif isinstance(raw, numbers.Real):
            raw = [raw]
        if not isinstance(raw, Sequence) or isinstance(raw, str) or len(raw) == 0:
            raise ValueError(f"weight scales must be a non-empty sequence of floats > 0, "
                             f"got {self.scales!r}")
        scales = tuple(as_float32_scale(s, f"weight_scale[{i}]") for i, s in enumerate(raw))
        object.__setattr__(self, "scales", scales)

    @property
    def channels(self) -> int:
        return len(self.scales)

    def broadcast(self, channels: int) -> WeightQuant:
        """One scale per channel: a single (per-tensor) scale is repeated."""
        if self.channels == channels:
            return self
        if self.channels == 1:
            return WeightQuant(self.scales * channels)
        raise ValueError(f"weight_scale must have 1 or {channels} entries (one per output "
                         f"channel), got {self.channels}")


@dataclass(frozen=True)
class Requantization:
    """Per-channel fixed-point multipliers and shifts, ``M[c] ~= multiplier[c] * 2**(shift[c]-31)``
    (TFLite's ``per_channel_output_multiplier`` / ``per_channel_output_shift``)."""

    multipliers: tuple[int, ...]
    shifts: tuple[int, ...]

    def __post_init__(self):
        ms = tuple(as_int(m, f"multiplier[{i}]", 0, 2**31 - 1)
                   for i, m in enumerate(self.multipliers))
        ss = tuple(as_int(s, f"shift[{i}]", MIN_SHIFT, MAX_SHIFT)
                   for i, s in enumerate(self.shifts))
        if len(ms) != len(ss) or not ms:
            raise ValueError(f"multipliers and shifts must be non-empty and of equal length, "
                             f"got {len(ms)} and {len(ss)}")
        object.__setattr__(self, "multipliers", ms)
        object.__setattr__(self, "shifts", ss)

    @classmethod
    def from_real(cls, reals: Sequence[float]) -> Requantization:
        """:func:`quantize_multiplier` of each real multiplier; its shift must be <= 31."""
        pairs = [quantize_multiplier(r) for r in reals]
        for i, (r, (_, s)) in enumerate(zip(reals, pairs)):
            if s > MAX_SHIFT:
                raise ValueError(f"effective scale[{i}] = {r!r} is too large: the real "
                                 f"multiplier must be < 2**31 (shift <= {MAX_SHIFT})")
        return cls(tuple(m for m, _ in pairs), tuple(s for _, s in pairs))

    @classmethod
    def for_affine(cls, input_quant: TensorQuant, weight_quant: WeightQuant,
                   output_quant: TensorQuant) -> Requantization:
        """TFLite's ``PopulateConvolutionQuantizationParams``:
        ``double(s_in) * double(s_w[c]) / double(s_out)`` per output channel."""
        s_in, s_out = input_quant.scale, output_quant.scale
        return cls.from_real([s_in * s_w / s_out for s_w in weight_quant.scales])

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(multipliers int32, shifts int32) as 1-D tensors."""
        return (torch.tensor(self.multipliers, dtype=torch.int32),
                torch.tensor(self.shifts, dtype=torch.int32))


@dataclass(frozen=True)
class ActivationRange:
    """The int8 output clamp ``[qmin, qmax]``; fused ReLU / ReLU6 narrow it."""

    qmin: int = INT8_MIN
    qmax: int = INT8_MAX

    def __post_init__(self):
        qmin = as_int(self.qmin, "qmin", INT8_MIN, INT8_MAX)
        qmax = as_int(self.qmax, "qmax", INT8_MIN, INT8_MAX)
        if qmin > qmax:
            raise ValueError(f"qmin must be <= qmax, got qmin={qmin}, qmax={qmax}")
        object.__setattr__(self, "qmin", qmin)
        object.__setattr__(self, "qmax", qmax)

    @classmethod
    def from_activation(cls, activation: str | None, output: TensorQuant) -> ActivationRange:
        """TFLite's ``CalculateActivationRangeQuantized`` for int8 outputs.

        ReLU clamps below at ``Quantize(0) = zero_point``; ReLU6 also clamps above at
        ``Quantize(6) = zero_point + round(6 / scale)`` (float32 division, std::round).
        """
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        if activation is None:
            return cls(INT8_MIN, INT8_MAX)
        qmin = max(INT8_MIN, output.zero_point)
        if activation == "relu":
            return cls(qmin, INT8_MAX)
        six = _round_half_away_f32(np.float32(6.0) / np.float32(output.scale))
        return cls(qmin, min(INT8_MAX, output.zero_point + six))


@dataclass(frozen=True)
class AddRequantization:
    """Integer parameters of TFLite's int8 ADD (``add.cc: PrepareGeneralAdd``).

    Both inputs are moved to a common scale ``2 * max(s1, s2) / 2**left_shift`` (left_shift = 20
    keeps ``255 * 2**20`` inside int32 and leaves 20 fractional bits), then the sum is rescaled to
    the output. All three real multipliers must be < 1 ("SmallerThanOneExp"); the output one is
    only if ``output_scale > max(s1, s2) / 2**19``.
    """

    input1_offset: int
    input2_offset: int
    output_offset: int
    left_shift: int
    input1_multiplier: int
    input1_shift: int
    input2_multiplier: int
    input2_shift: int
    output_multiplier: int
    output_shift: int

    @classmethod
    def from_quant(cls, input1: TensorQuant, input2: TensorQuant,
                   output: TensorQuant) -> AddRequantization:
        left_shift = 20
        twice_max = 2.0 * max(input1.scale, input2.scale)
        reals = {
            "input1": input1.scale / twice_max,
            "input2": input2.scale / twice_max,
            "output": twice_max / ((1 << left_shift) * output.scale),
        }
        q = {}
        for name, real in reals.items():
            m, s = quantize_multiplier(real)
            if s > 0:
                raise ValueError(
                    f"{name} real multiplier {real!r} must be < 1 for TFLite's ADD; the output "
                    f"scale must be > max(input scales) / 2**19 = {twice_max / 2**20!r}, got "
                    f"{output.scale!r}")
            q[name] = (m, s)
        return cls(-input1.zero_point, -input2.zero_point, output.zero_point, left_shift,
                   *q["input1"], *q["input2"], *q["output"])
