"""QZO-FF on a real-quantized int8 model (a loaded ``.tflite``): the weights stay int8 codes
with the model's own per-channel scales, so the trained model saves back to the same file
format (Feng et al. 2024, §3.3, Algorithm 1, Appendix A).

:class:`~bpfree.qzoff.trainer.QZOFF` quantizes a *float* module to its own 16-bit grid (Eq. 5),
which a ``.tflite`` does not allow: its weights are int8 with fixed scales ``Δw_c`` (one per
output channel) and its biases int32 with scales ``s_in·Δw_c``. Here Eq. 5 is the file's
quantization and Eqs. 6-8 run on those codes:

* perturbation (Eq. 6 / Eq. 10): ``w_q± = sat(w_q ± MBQM(ε_q·z_q, m, k))`` with
  ``m/2**k ≈ Δz`` and ``z_q`` the ``b_z``-bit codes of a seeded Gaussian
  (:func:`~bpfree.qzoff.fixed_point.displaced_weights`). This is Eq. 6 with the ``1.0`` kept
  exact: the paper's ``Δz·(w_q·1_q ± ε_q·z_q)`` multiplies ``w_q`` by ``Δz·1_q = 0.992``
  (defaults), which in int8 moves every ``|w_q| >= 64`` by one code in *both* probes, so the
  two losses would bracket a different point than the weights being updated. Both forms give
  the real value ``w ± εz``.
* ``ε``: ``ε_q = eps_codes`` weight codes for every channel, i.e. ``ε_c = eps_codes·Δw_c``.
  The paper's ``ε = 1e-3`` gives ``ε_q = ⌊ε/Δw⌉ = 0`` at int8 scales (``Δw = w_max/127``), the
  reason it reports 8w8a does not converge (§4.2, App. E); one code is the smallest
  perturbation the file's grid can represent. A bias is perturbed by the same real ``ε_c``,
  ``ε_q = ⌊eps_codes/s_in⌉`` bias codes (a channel whose bias ``ε_q`` rounds to 0 keeps its
  bias frozen).
* gradient (Eq. 7, Algorithm 1 line 10): ``g_q^a = Σ_i sign(l+ − l−)_i·z_q,i``, int32.
* update (Eq. 8, lines 13-16): ``w̄_q = MBQM(g_q^a, m_c, k_c)`` with
  ``m_c/2**k_c ≈ η·Δz/(m·Δw_c)`` per channel (:func:`~bpfree.updates.update_multiplier`),
  ``w_q ← sat(w_q − w̄_q)``: int8 weights saturate to ``[-127, 127]`` (TFLite's weight range),
  int32 biases to ``±(2**31 - 1)``. The learning rate ``η`` is in real (float) units.

All trainable tensors are perturbed together (the model-wise ``z ∈ R^n`` of Eq. 3); each of
the ``2m`` forwards starts at the first trainable stage from the cached input of that stage.
The loss is the cross-entropy of the dequantized int8 logits (as PMT's,
:func:`~bpfree.quant.graph.per_sample_loss`). The §3.4 enhancements (momentum sampling,
sharpness-aware perturbation, sparse update) are not used here.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
from torch import nn

from ..harness import check_batch, check_learning_rate
from ..perturb import derive_seed, quantization_scale, quantized_gaussian_codes
from ..quant.graph import StagedModel, TrainableLayer, find_layers, per_sample_loss, select_layers
from ..quant.fixed_point import INT32_MAX, multiply_by_quantized_multiplier
from ..updates import fixed_point_update, update_multiplier
from ..updates.fixed_point import qmax
from .fixed_point import displaced_weights, perturbation_multiplier

__all__ = ["IntegerQZOFF", "IntegerTensor"]

WEIGHT_BITS = 8
BIAS_BITS = 32


@dataclass
class IntegerTensor:
    """One trained integer tensor: its layer, ``"weight"`` or ``"bias"``, per-channel scale
    ``[C]`` (float64), ``ε_q`` per channel ``[C]`` (int64) and saturation bits."""

    layer: TrainableLayer
    attr: str
    scale: torch.Tensor
    eps_q: torch.Tensor
    bits: int

    @property
    def codes(self) -> torch.Tensor:
        return getattr(self.layer.module, self.attr)

    @property
    def name(self) -> str:
        return f"{self.layer.name}.{self.attr}"


def _int_option(value, name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low or (
            high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an int {bound}, got {value!r}")
    return int(value)


class IntegerQZOFF:
    """QZO-FF (sign-m-SPSA, Algorithm 1) on the int8 weights and int32 biases of a
    :class:`~bpfree.quant.ptq.QuantizedModel`; implements ``bpfree.harness.Method``.

    Args:
        model: the integer model (trained in place).
        example: one input batch (float or int8), to read the layer shapes.
        m: directions per step (Eq. 3); ``2·m`` forward calls per step.
        eps_codes: ``ε_q`` of the weights in codes of their own scale (module docstring).
        z_bits, z_max: bits and static range of the perturbation codes (``Δz = z_max/qmax``).
        seed: direction ``i`` of tensor ``k`` at step ``t`` uses ``derive_seed(seed, t, i, k)``.
        trainable: names of the integer layers to train (default: all).

    ``step(x, y, lr) -> {"loss", "forwards", "moved", "signs"}``; ``forwards`` counts
    per-sample forward passes (``2·m·N`` per step, plus ``N`` for the frozen stages before the
    first trainable one). Call :meth:`check_lr` with the base rate before training: it refuses a
    rate at which no weight can move, or one step can cross the whole int8 range.
    """

    def __init__(self, model: nn.Module, *, example: torch.Tensor, m: int = 3,
                 eps_codes: int = 1, z_bits: int = 8, z_max: float = 3.5, seed: int = 0,
                 trainable=None) -> None:
        self.m = _int_option(m, "m (directions per step)", 1)
        self.z_scale = quantization_scale(z_bits, z_max)  # checks z_bits in [2, 16], z_max > 0
        self.z_bits, self.z_max = int(z_bits), float(z_max)
        # Appendix A's (m, k) with m/2**k ≈ Δz (Eq. 10), applied to ε_q·z_q
        self.pmult = perturbation_multiplier(self.z_scale)
        # The largest perturbation, ε_q·z_max codes, must stay inside the int8 range.
        self.eps_codes = _int_option(eps_codes, "eps_codes (ε in weight codes)", 1,
                                     int((qmax(WEIGHT_BITS) - 1) // z_max))
        self.seed = _int_option(seed, "seed", 0)
        if self.m * qmax(self.z_bits) > INT32_MAX:
            raise ValueError(f"m={self.m} directions of {self.z_bits}-bit codes overflow the "
                             f"int32 gradient accumulator")
        self.model = model
        self.staged = StagedModel(model)
        self.layers = find_layers(model, example)
        self.trainable = select_layers(self.layers, trainable)
        if not self.trainable:
            raise ValueError("no trainable layers selected")
        self.first = min(layer.stage for layer in self.trainable)
        self.tensors = self._tensors()
        self.frozen_biases = [t.layer.name for t in self.tensors
                              if t.attr == "bias" and bool((t.eps_q == 0).any())]
        self.masks = [self._mask(t) for t in self.tensors]
        self.t = 0
        self.forwards = 0

    def _tensors(self) -> list[IntegerTensor]:
        out = []
        for layer in self.trainable:
            module = layer.module
            channels = module.weight.shape[0]
            s_w = torch.tensor(module.weight_quant.broadcast(channels).scales,
                               dtype=torch.float64)
            out.append(IntegerTensor(layer, "weight", s_w,
                                     torch.full((channels,), self.eps_codes, dtype=torch.int64),
                                     WEIGHT_BITS))
            s_b = s_w * module.input_quant.scale
            # the weights' real ε_c = eps_codes·Δw_c in bias codes of scale s_in·Δw_c
            eps_b = torch.round(self.eps_codes * s_w / s_b).to(torch.int64)
            if int(eps_b.max()) * qmax(self.z_bits) > INT32_MAX:
                raise ValueError(f"{layer.name}: ε_q·z_q of its bias (ε_q up to "
                                 f"{int(eps_b.max())}) overflows the int32 accumulator; use a "
                                 f"smaller eps_codes")
            out.append(IntegerTensor(layer, "bias", s_b, eps_b, BIAS_BITS))
        return out

    @staticmethod
    def _mask(t: IntegerTensor) -> torch.Tensor | None:
        """Channels with ``ε_q = 0`` are never perturbed: their update would be pure noise."""
        if bool((t.eps_q > 0).all()):
            return None
        view = (t.eps_q > 0).reshape(-1, *[1] * (t.codes.dim() - 1))
        return view.expand(t.codes.shape).contiguous()

    # -- hyper-parameter check --------------------------------------------------------------
    def largest_steps(self, lr: float) -> torch.Tensor:
        """Per weight channel of every trained layer (concatenated), the largest ``|w̄_q|`` one
        step can apply at rate ``lr``: Eq. 8 at ``g_q^a = m·qmax(z)``, in codes."""
        lr = check_learning_rate(lr)
        steps = []
        for t in self.tensors:
            if t.attr != "weight":
                continue
            mult, shift = update_multiplier(lr, self.z_scale, t.scale, self.m)
            top = torch.full(t.scale.shape, self.m * qmax(self.z_bits), dtype=torch.int64)
            steps.append(multiply_by_quantized_multiplier(top, mult, shift).to(torch.int64))
        return torch.cat(steps)

    def check_lr(self, lr: float) -> dict:
        """Refuse (ValueError) a base learning rate at which no trained weight can ever move
        (Eq. 8 rounds every update to 0 codes) or one step can move a weight across its whole
        int8 range (> 254 codes). Returns ``{"max_step_codes": ...}``."""
        steps = self.largest_steps(lr)
        scales = torch.cat([t.scale for t in self.tensors if t.attr == "weight"])
        reach = self.z_max  # |ĝ| <= z_max: the real step of one update is at most η·z_max
        low = float(scales.min()) / (2 * reach)
        high = 2 * qmax(WEIGHT_BITS) * float(scales.min()) / reach
        span = f"about {low:.3g} to {high:.3g} for this model's weight scales"
        if int(steps.max()) == 0:
            raise ValueError(f"learning rate {lr:g} is too small for QZO-FF on int8 weights: "
                             f"Eq. 8 rounds every update to 0 codes (Δw from "
                             f"{float(scales.min()):.3g} to {float(scales.max()):.3g}), so no "
                             f"weight can move; use {span}")
        if int(steps.max()) > 2 * qmax(WEIGHT_BITS):
            raise ValueError(f"learning rate {lr:g} is too large for QZO-FF on int8 weights: "
                             f"one step can move a weight by {int(steps.max())} codes, more "
                             f"than the whole int8 range ({2 * qmax(WEIGHT_BITS)}); use {span}")
        return {"max_step_codes": int(steps.max())}

    # -- one step ---------------------------------------------------------------------------
    def _directions(self, i: int) -> list[torch.Tensor]:
        zs = [quantized_gaussian_codes(derive_seed(self.seed, self.t, i, k), t.codes.shape,
                                       self.z_bits, self.z_max, dtype=torch.int32)
              for k, t in enumerate(self.tensors)]
        return [z if mk is None else z * mk for z, mk in zip(zs, self.masks)]

    def _load(self, codes: list[torch.Tensor]) -> None:
        for t, c in zip(self.tensors, codes):
            t.codes.copy_(c.to(t.codes.dtype))

    def _loss(self, h: torch.Tensor, y: torch.Tensor) -> float:
        logits = self.staged.from_stage(self.first, h)
        return float(per_sample_loss(logits, y, self.model.output_quant).mean())

    @torch.no_grad()
    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        """One QZO-FF step (Algorithm 1 lines 3-17) on the batch ``(x, y)`` at rate ``lr``."""
        lr = check_learning_rate(lr)
        check_batch(x, y)
        n = int(x.shape[0])
        h = self.staged.quantize(x)
        forwards = 0
        if self.first > 0:  # the frozen stages run once per step
            for stage in self.staged.stages[:self.first]:
                h = stage(h)
            forwards += n
        w = [t.codes.to(torch.int32) for t in self.tensors]
        acc = [torch.zeros_like(c) for c in w]
        losses, signs = [], []
        try:
            for i in range(self.m):
                zs = self._directions(i)
                pair = []
                for sign in (1, -1):
                    self._load([displaced_weights(c, z, sign * t.eps_q, *self.pmult, t.bits)
                                for c, z, t in zip(w, zs, self.tensors)])
                    pair.append(self._loss(h, y))
                forwards += 2 * n
                s = 0 if pair[0] == pair[1] else (1 if pair[0] > pair[1] else -1)
                signs.append(s)
                losses += pair
                if s:
                    acc = [a + s * z for a, z in zip(acc, zs)]
        finally:
            self._load(w)  # line 11: back to the unperturbed weights, also on an error
        new = []
        for t, c, a, mask in zip(self.tensors, w, acc, self.masks):
            mult, shift = update_multiplier(lr, self.z_scale, t.scale, self.m)
            new.append(fixed_point_update(c, a, mult, shift, t.bits, mask)[0])
        self._load(new)
        self.t += 1
        self.forwards += forwards
        moved = sum(int((a != b).sum()) for a, b in zip(w, new))
        return {"loss": sum(losses) / len(losses), "forwards": forwards, "moved": moved,
                "signs": signs}
