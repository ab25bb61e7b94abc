"""Tensor-valued gradient transforms: sign, momentum, AdamW, kernel-wise normalization, clipping."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import MapTransform


class Sign(MapTransform):
    """Keep only the sign of the estimate: ZO-signRGE (TT-ZO §3.2, after signSGD).

    ``θ_t ← θ_{t−1} − α·sign(ĝ)`` de-noises a high-variance RGE estimate.
    """

    def update(self, grads, state, infos, params):
        return [torch.sign(g) for g in grads]


class Momentum(MapTransform):
    """Heavy-ball momentum ``b_t = m·b_{t−1} + g_t``, ``b_0 = g_0`` (TT-ZO §3.2, ZO-CGE).

    The buffers are optimizer state (they are what a memory-starved device cannot afford,
    which is why PMT runs without momentum).
    """

    def __init__(self, beta: float = 0.9) -> None:
        if not (isinstance(beta, (int, float)) and math.isfinite(beta) and 0.0 <= beta < 1.0):
            raise ValueError(f"momentum beta must be a finite number in [0, 1), got {beta!r}")
        self.beta = float(beta)

    def init(self, params):
        return {"buffers": [None] * len(params)}

    def update(self, grads, state, infos, params):
        bufs = state["buffers"]
        out = []
        for i, g in enumerate(grads):
            if bufs[i] is None:
                bufs[i] = g.clone()
            else:
                bufs[i].mul_(self.beta).add_(g)
            out.append(bufs[i])
        return out

    def __repr__(self) -> str:
        return f"Momentum(beta={self.beta})"


class AdamW(MapTransform):
    """AdamW's direction (Loshchilov & Hutter 2019), ``m̂/(√v̂ + eps) + λ·w``, with
    ``m ← β1·m + (1−β1)·g``, ``v ← β2·v + (1−β2)·g²`` and bias correction ``m̂ = m/(1−β1^t)``,
    ``v̂ = v/(1−β2^t)``; ``t`` counts this transform's updates. The learning rate multiplies
    the result (QZO-FF §3.4 pairs the forward gradient with AdamW, Table 9: β = (0.9, 0.95),
    λ = 0)."""

    def __init__(self, betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        b1, b2 = betas
        for label, v in (("beta1", b1), ("beta2", b2)):
            if not (math.isfinite(v) and 0.0 <= v < 1.0):
                raise ValueError(f"AdamW {label} must be in [0, 1), got {v}")
        if not (math.isfinite(eps) and eps > 0):
            raise ValueError(f"AdamW eps must be a finite number > 0, got {eps}")
        if not (math.isfinite(weight_decay) and weight_decay >= 0):
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        self.betas = (float(b1), float(b2))
        self.eps = float(eps)
        self.weight_decay = float(weight_decay)

    def init(self, params):
        # moments are created from the first gradients (their dtype, not the parameters')
        return {"m": [None] * len(params), "v": [None] * len(params), "t": 0}

    def update(self, grads, state, infos, params):
        b1, b2 = self.betas
        state["t"] += 1
        t = state["t"]
        out = []
        for i, (g, w) in enumerate(zip(grads, params, strict=True)):
            if state["m"][i] is None:
                state["m"][i], state["v"][i] = torch.zeros_like(g), torch.zeros_like(g)
            m, v = state["m"][i], state["v"][i]
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            m_hat = m / (1 - b1 ** t)
            v_hat = v / (1 - b2 ** t)
            out.append(m_hat / (v_hat.sqrt() + self.eps) + self.weight_decay * w)
        return out

    def __repr__(self) -> str:
        return f"AdamW(betas={self.betas}, eps={self.eps}, weight_decay={self.weight_decay})"


class KernelwiseNormalization(MapTransform):
    """Kernel-wise normalization ``ĝ(w^i) = ĝ^i / ‖ĝ^i‖ · ‖w^i‖`` (QZO-FF Eq. 9).

    Each tensor's estimate is rescaled to the norm of its weights, so layers move in
    proportion to their size whatever the magnitude of the loss differences.
    """

    def __init__(self, eps: float = 1e-12) -> None:
        self.eps = float(eps)

    def update(self, grads, state, infos, params):
        out = []
        for g, p in zip(grads, params):
            gn = torch.linalg.vector_norm(g.float())
            pn = torch.linalg.vector_norm(p.detach().float())
            out.append(g * (pn / gn.clamp_min(self.eps)).to(g.dtype))
        return out


class ClipByNorm(MapTransform):
    """Rescale all tensors jointly so the global L2 norm is at most ``max_norm``."""

    def __init__(self, max_norm: float) -> None:
        if not (isinstance(max_norm, (int, float)) and math.isfinite(max_norm) and max_norm > 0):
            raise ValueError(f"max_norm must be a finite number > 0, got {max_norm!r}")
        self.max_norm = float(max_norm)

    def update(self, grads, state, infos, params):
        total = torch.sqrt(sum(torch.sum(g.double() ** 2) for g in grads))
        coef = min(1.0, self.max_norm / (float(total) + 1e-12))
        return [g * coef for g in grads]

    def __repr__(self) -> str:
        return f"ClipByNorm(max_norm={self.max_norm})"


class ClipByValue(MapTransform):
    """Clamp every gradient entry to ``[−max_value, max_value]``."""

    def __init__(self, max_value: float) -> None:
        if not (isinstance(max_value, (int, float)) and math.isfinite(max_value) and max_value > 0):
            raise ValueError(f"max_value must be a finite number > 0, got {max_value!r}")
        self.max_value = float(max_value)

    def update(self, grads, state, infos, params):
        return [g.clamp(-self.max_value, self.max_value) for g in grads]

    def __repr__(self) -> str:
        return f"ClipByValue(max_value={self.max_value})"


def sign() -> Sign:
    return Sign()


def momentum(beta: float = 0.9) -> Momentum:
    return Momentum(beta)


def adamw(betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
          weight_decay: float = 0.0) -> AdamW:
    return AdamW(betas, eps, weight_decay)


def kernelwise_normalization() -> KernelwiseNormalization:
    return KernelwiseNormalization()


def clip_by_norm(max_norm: float) -> ClipByNorm:
    return ClipByNorm(max_norm)


def clip_by_value(max_value: float) -> ClipByValue:
    return ClipByValue(max_value)


