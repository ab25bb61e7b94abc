"""Simulated fixed-point model for QZO-FF: integer weights, fake-quantized activations.

:class:`QuantizedParams` holds the selected parameters of a float ``nn.Module`` as ``b_w``-bit
integer codes with static scales (QZO-FF Eq. 5, per tensor or per output channel) and writes
``w_q·Δw`` into the float parameters before every forward. The codes are exact in float32 for
``b_w ≤ 24``; the product ``w_q·Δw`` is computed in float64 and rounded once to float32, which is
what a float simulation of a fixed-point forward computes anyway. All weight, perturbation and
update arithmetic stays integer (:mod:`bpfree.qzoff.fixed_point`); only the forward is
simulated.

:class:`ActivationQuantizer` fake-quantizes activations to ``b_a`` bits (8 in the paper's
16w8a) with forward hooks on the outputs of Linear / Conv / normalization / activation modules.
Quantization is asymmetric per tensor (TFLite int8: ``scale = (hi−lo)/(2**b−1)``, integer zero
point, ``lo ≤ 0 ≤ hi``). Ranges are **static** by default: calibrated as the min/max over the
first ``calibration_batches`` forward passes of unperturbed weights (in float), then frozen, as
on a deployed fixed-point model (a forward before any calibration fixes the range from
itself); ``"dynamic"`` recomputes min/max on every forward instead.
The same hooks can instead round activations to float16 (the emulated fp16 mode: CPU half
matmuls are slow or unsupported, so fp16 is emulated by rounding weights and every hooked
output to float16 while computing in float32).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from ..optim.params import select_parameters as core_select_parameters
from .fixed_point import quantize_weights

__all__ = ["ActivationQuantizer", "QuantizedParams", "select_parameters"]

HOOKED_TYPES = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU,
    nn.Sigmoid, nn.Tanh, nn.LeakyReLU, nn.Hardswish, nn.Hardsigmoid, nn.LayerNorm,
    nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm,
)


def select_parameters(model: nn.Module, patterns=None) -> list[tuple[str, nn.Parameter]]:
    """Parameters named by ``patterns`` (exact names or ``fnmatch`` globs, e.g. ``"2.*"``);
    ``None`` selects every parameter with ``requires_grad``. A pattern that matches nothing is
    an error (a typo would otherwise silently train nothing).

    The matching is :func:`bpfree.optim.select_parameters`'; what QZO-FF adds is the order:
    patterns' order, not the model's, because its per-tensor seeds follow the list.
    """
    named = list(model.named_parameters())
    if patterns is None:
        chosen = [(n, p) for n, p in named if p.requires_grad]
    else:
        chosen, seen = [], set()
        for pat in [patterns] if isinstance(patterns, str) else patterns:
            try:
                hits = core_select_parameters(model, pat)
            except ValueError:
                raise ValueError(f"parameter pattern {pat!r} matches none of "
                                 f"{[n for n, _ in named]}") from None
            for n, p in hits:
                if n not in seen:
                    seen.add(n)
                    chosen.append((n, p))
    if not chosen:
        raise ValueError("no trainable parameters selected")
    for n, p in chosen:
        if not p.dtype.is_floating_point:
            raise ValueError(f"parameter {n!r} is not floating point")
    return chosen


class QuantizedParams:
    """Selected parameters as ``b_w``-bit codes plus static scales (QZO-FF Eq. 5).

    Attributes:
        names, params: the selected parameters (the float tensors are scratch buffers the
            forward reads; the codes are the master copy).
        codes: int32 ``w_q`` per tensor.
        scales: float64 ``Δw`` per tensor (0-d) or per output channel (``[C]``).
    """

    def __init__(self, named_params, bits: int = 16, per_channel: bool = False,
                 w_max: dict | None = None, headroom: float = 1.0) -> None:
        self.names = [n for n, _ in named_params]
        self.params = [p for _, p in named_params]
        self.bits = int(bits)
        self.per_channel = bool(per_channel)
        self.codes: list[torch.Tensor] = []
        self.scales: list[torch.Tensor] = []
        w_max = w_max or {}
        for n, p in named_params:
            c, s = quantize_weights(p.detach(), bits, per_channel, w_max=w_max.get(n),
                                    headroom=headroom)
            self.codes.append(c)
            self.scales.append(s)

    def scale_view(self, k: int) -> torch.Tensor:
        """``Δw`` of tensor ``k`` shaped to broadcast against it."""
        s = self.scales[k]
        return s.reshape(s.shape + (1,) * (self.codes[k].dim() - s.dim()))

    def dequantize(self, k: int, codes: torch.Tensor) -> torch.Tensor:
        """``w_q·Δw`` as float32 (computed in float64, rounded once)."""
        return (codes.to(torch.float64) * self.scale_view(k)).to(torch.float32)

    @torch.no_grad()
    def load(self, codes_list) -> None:
        """Write ``w_q·Δw`` of every tensor into the model's float parameters."""
        for k, (p, c) in enumerate(zip(self.params, codes_list, strict=True)):
            p.data.copy_(self.dequantize(k, c).to(p.dtype))


class ActivationQuantizer:
    """Fake-quantize (or fp16-round) hooked module outputs; see the module docstring.

    Args:
        model: the network.
        bits: activation bits ``b_a`` (None: no quantization).
        ranges: ``"static"`` (calibrated, then frozen) or ``"dynamic"`` (per forward).
        calibration_batches: forwards used to calibrate static ranges.
        fp16: round outputs to float16 instead of quantizing.
        skip: module names (``named_modules``) to leave in float.
    """

    def __init__(self, model: nn.Module, bits: int | None = 8, *, ranges: str = "static",
                 calibration_batches: int = 1, fp16: bool = False, skip=()) -> None:
        if ranges not in ("static", "dynamic"):
            raise ValueError(f"activation ranges must be 'static' or 'dynamic', got {ranges!r}")
        if bits is not None and not 2 <= int(bits) <= 16:
            raise ValueError(f"activation bits must be in [2, 16] or None, got {bits}")
        if calibration_batches < 1:
            raise ValueError("calibration_batches must be >= 1")
        self.bits = bits
        self.ranges_mode = ranges
        self.fp16 = fp16
        self.calibration_left = calibration_batches
        self.ranges: dict[str, list[float]] = {}
        self.calibrating = False
        self.enabled = True
        self.handles = []
        skip = set(skip)
        if bits is None and not fp16:
            return
        for name, mod in model.named_modules():
            if isinstance(mod, HOOKED_TYPES) and name not in skip:
                self.handles.append(mod.register_forward_hook(self._hook(name)))

    @property
    def needs_calibration(self) -> bool:
        return (self.bits is not None and not self.fp16 and self.ranges_mode == "static"
                and self.calibration_left > 0)

    def calibrate(self, forward) -> None:
        """Run ``forward()`` with float activations, widening the recorded min/max ranges."""
        self.calibrating = True
        try:
            with torch.no_grad():
                forward()
        finally:
            self.calibrating = False
        self.calibration_left -= 1

    def fake_quantize(self, x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
        """Asymmetric ``b_a``-bit quantize-dequantize with range ``[min(lo,0), max(hi,0)]``."""
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        levels = 2 ** self.bits - 1
        scale = (hi - lo) / levels if hi > lo else 1.0
        zero_point = round(-lo / scale)
        q = torch.round(x / scale).add_(zero_point).clamp_(0, levels)
        return (q - zero_point) * scale

    def _hook(self, name: str):
        def hook(module, inputs, output):
            if (not self.enabled or not isinstance(output, torch.Tensor)
                    or not output.dtype.is_floating_point):
                return None
            if self.fp16:
                return output.to(torch.float16).to(output.dtype)
            if self.ranges_mode == "static" and not self.calibrating and name in self.ranges:
                lo, hi = self.ranges[name]
                return self.fake_quantize(output, lo, hi)
            lo, hi = float(output.detach().min()), float(output.detach().max())
            if self.calibrating:
                r = self.ranges.get(name)
                self.ranges[name] = [lo, hi] if r is None else [min(r[0], lo), max(r[1], hi)]
                return None
            if self.ranges_mode == "static":
                # A module never calibrated takes its range from this first forward.
                lo, hi = self.ranges.setdefault(name, [lo, hi])
            return self.fake_quantize(output, lo, hi)
        return hook

    @contextlib.contextmanager
    def disabled(self):
        """Context in which the hooks pass outputs through unchanged (float activations, e.g.
        for an autograd reference gradient)."""
        prev, self.enabled = self.enabled, False
        try:
            yield self
        finally:
            self.enabled = prev

    def remove(self) -> None:
        """Detach every hook (the model returns to float activations)."""
        for h in self.handles:
            h.remove()
        self.handles = []
