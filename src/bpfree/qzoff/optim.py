"""Float optimizers fed by the forward gradient (QZO-FF §3.4: "quantized forward gradient
learning can also be combined with other optimizers such as Adam or SGD with momentum").

Each returns the *step* ``Δ`` (the weights become ``w − Δ``) rather than applying it, so the
quantized trainer can re-quantize ``Δ`` to the weight scale. Plain SGD in the quantized mode does
not come here: it is the integer Eq. 8 update.
"""

from __future__ import annotations

import math

import torch

from ..transforms.shaping import Momentum

__all__ = ["OPTIMIZERS", "FloatOptimizer", "make_optimizer"]

OPTIMIZERS = ("sgd", "momentum", "adamw")


class FloatOptimizer:
    """``sgd``: ``Δ = η·g``. ``momentum``: heavy ball ``b = μ·b + g`` (``b_0 = g_0``, the
    :class:`bpfree.transforms.Momentum` transform), ``Δ = η·b``. ``adamw``: Loshchilov & Hutter,
    ``Δ = η·(m̂/(√v̂ + eps) + λ·w)`` with bias correction; defaults ``betas=(0.9, 0.95)``,
    ``λ = 0`` (the paper's Table 9)."""

    def __init__(self, name: str = "sgd", *, momentum: float = 0.9,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        if name not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {name!r}; use one of {OPTIMIZERS}")
        b1, b2 = betas
        for label, v in (("beta1", b1), ("beta2", b2)):
            if not (math.isfinite(v) and 0.0 <= v < 1.0):
                raise ValueError(f"AdamW {label} must be in [0, 1), got {v}")
        if not (math.isfinite(eps) and eps > 0):
            raise ValueError(f"AdamW eps must be a finite number > 0, got {eps}")
        if not (math.isfinite(weight_decay) and weight_decay >= 0):
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        self.name = name
        self.momentum = Momentum(momentum) if name == "momentum" else None
        self.betas = (float(b1), float(b2))
        self.eps = float(eps)
        self.weight_decay = float(weight_decay)
        self.state: dict = {}
        self.t = 0

    def steps(self, grads: list[torch.Tensor], params: list[torch.Tensor], lr: float
              ) -> list[torch.Tensor]:
        """The steps ``Δ_k`` for the (float) gradients and current (float) weights."""
        self.t += 1
        if self.name == "sgd":
            return [lr * g for g in grads]
        if self.name == "momentum":
            if not self.state:
                self.state = self.momentum.init(grads)
            bufs = self.momentum.update(grads, self.state, None, params)
            return [lr * b for b in bufs]
        if not self.state:
            self.state = {"m": [torch.zeros_like(g) for g in grads],
                          "v": [torch.zeros_like(g) for g in grads]}
        b1, b2 = self.betas
        out = []
        for g, w, m, v in zip(grads, params, self.state["m"], self.state["v"], strict=True):
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            m_hat = m / (1 - b1 ** self.t)
            v_hat = v / (1 - b2 ** self.t)
            out.append(lr * (m_hat / (v_hat.sqrt() + self.eps) + self.weight_decay * w))
        return out


def make_optimizer(name: str, **kwargs) -> FloatOptimizer:
    """:class:`FloatOptimizer` by name; ValueError for unknown names."""
    return FloatOptimizer(name, **kwargs)
