"""Float optimizers fed by the forward gradient (QZO-FF §3.4: "quantized forward gradient
learning can also be combined with other optimizers such as Adam or SGD with momentum").

Each is a transform of :mod:`bpfree.transforms` (none for SGD, :class:`~bpfree.transforms.Momentum`,
:class:`~bpfree.transforms.AdamW`) followed by the learning rate. Each returns the *step* ``Δ``
(the weights become ``w − Δ``) rather than applying it, so the quantized trainer can re-quantize
``Δ`` to the weight scale. Plain SGD in the quantized mode does not come here: it is the
integer Eq. 8 update (:func:`bpfree.updates.fixed_point_update`).
"""

from __future__ import annotations

import torch

from ..transforms.shaping import AdamW, Momentum

__all__ = ["OPTIMIZERS", "FloatOptimizer", "make_optimizer"]

OPTIMIZERS = ("sgd", "momentum", "adamw")


class FloatOptimizer:
    """``sgd``: ``Δ = η·g``. ``momentum``: heavy ball ``b = μ·b + g`` (``b_0 = g_0``, the
    :class:`bpfree.transforms.Momentum` transform), ``Δ = η·b``. ``adamw``: the
    :class:`bpfree.transforms.AdamW` transform, ``Δ = η·(m̂/(√v̂ + eps) + λ·w)``; defaults
    ``betas=(0.9, 0.95)``, ``λ = 0`` (the paper's Table 9). ``state`` is the transform's state
    (``{"buffers"}`` for momentum, ``{"m", "v", "t"}`` for AdamW), ``t`` the number of steps."""

    def __init__(self, name: str = "sgd", *, momentum: float = 0.9,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        if name not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {name!r}; use one of {OPTIMIZERS}")
        adamw = AdamW(betas, eps, weight_decay)  # validates the AdamW settings for every name
        self.name = name
        self.transform = (Momentum(momentum) if name == "momentum"
                          else adamw if name == "adamw" else None)
        self.state: dict = {}
        self.t = 0

    def steps(self, grads: list[torch.Tensor], params: list[torch.Tensor], lr: float
              ) -> list[torch.Tensor]:
        """The steps ``Δ_k`` for the (float) gradients and current (float) weights."""
        self.t += 1
        if self.transform is not None:
            if not self.state:
                self.state = self.transform.init(grads)
            grads = self.transform.update(grads, self.state, None, params)
        return [lr * g for g in grads]


def make_optimizer(name: str, **kwargs) -> FloatOptimizer:
    """:class:`FloatOptimizer` by name; ValueError for unknown names."""
    return FloatOptimizer(name, **kwargs)
