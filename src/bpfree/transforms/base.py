"""Composable gradient transforms, in the manner of optax.

A transform is a small object with ``init(params) -> state`` and
``update(grads, state, infos, params) -> grads``. Unlike optax's functional
``update(grads, state) -> (grads, state)``, ``update`` changes ``state`` in place and returns
only the transformed gradients: a momentum buffer is as large as the parameters, and a
device that trains without back-propagation cannot afford a second copy for a functional
swap. ``update`` never writes into the ``grads`` it is given; the tensors it returns may be
its own state (:class:`~bpfree.transforms.Momentum` returns its buffers), so a caller reads
them, or passes them to the next transform, and does not write into them either. A paper's
update rule is a short chain of transforms, and an ablation is the same chain with one piece
removed.

Two kinds exist because a zeroth-order estimate need not be materialized: ``ScaleTransform``
only contributes a scalar per tensor (gradient-norm scaling, quantization-aware scaling), so
the optimizer can apply the update straight from the perturbation seeds with no gradient
buffer (the memory-lean path of MeZO / PMT); ``MapTransform`` needs the gradient as a tensor
(sign, momentum, normalization, clipping) and so forces a gradient buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class TensorInfo:
    """What a transform may know about one parameter tensor at this step.

    Attributes:
        name: parameter name.
        num_directions: number of independent perturbation directions behind this tensor's
            estimate (``N·Q`` with per-sample perturbations, else ``Q``; PMT Eq. 8's ``NQ``).
        dim: dimension ``d`` of the perturbed space behind the estimate (the whole perturbed
            parameter set for model-wise WP, the layer's ``d_w`` for layer-wise WP, ``d_a`` for
            NP; PMT §3.2.2).
        scale: quantization scale ``s_θ`` of the parameter (1.0 for float parameters); a
            float64 tensor of per-output-channel scales for an integer group given one.
        step: optimizer step index (0-based).
    """

    name: str
    num_directions: int
    dim: int
    scale: float | Tensor = 1.0
    step: int = 0


class ScaleTransform:
    """A transform that only multiplies each tensor's update by a scalar (or, for a tensor of
    per-channel scales, by one scalar per output channel)."""

    def factor(self, info: TensorInfo) -> float | Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class MapTransform:
    """A transform that needs the materialized gradient tensors."""

    def init(self, params: list[Tensor]) -> dict:
        return {}

    def update(self, grads: list[Tensor], state: dict,
               infos: list[TensorInfo], params: list[Tensor]) -> list[Tensor]:
        """Return the transformed gradients, updating ``state`` in place and leaving
        ``grads`` unchanged (see the module docstring for why this is not optax's functional
        ``(grads, state)``)."""
        raise NotImplementedError  # pragma: no cover - interface

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


Transform = ScaleTransform | MapTransform


def split_transforms(transforms) -> tuple[list[ScaleTransform], list[MapTransform]]:
    """Separate scalar and tensor transforms, validating every item."""
    scales, maps = [], []
    for t in transforms:
        if isinstance(t, ScaleTransform):
            scales.append(t)
        elif isinstance(t, MapTransform):
            maps.append(t)
        else:
            raise TypeError(
                f"transforms must be bpfree transforms (ScaleTransform or MapTransform), got "
                f"{type(t).__name__}; see bpfree.transforms")
    return scales, maps
