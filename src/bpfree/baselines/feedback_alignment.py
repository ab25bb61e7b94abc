"""Feedback alignment baselines of TT-ZO Table 3, for MLPs of ``nn.Linear`` + ``ReLU``.

* :class:`FeedbackAlignment` -- FA (Lillicrap et al. 2016): the error travels back through
  fixed random matrices instead of the transposed weights.
* :class:`DirectFeedbackAlignment` -- DFA (Nøkland 2016): the output error is projected
  straight to every hidden layer.

Both are :class:`~bpfree.harness.Method` trainers (``model``, ``forwards``,
``step(x, y, lr) -> dict(loss=...)`` with the batch loss before the update).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..harness import check_batch, check_learning_rate

__all__ = ["DirectFeedbackAlignment", "FeedbackAlignment"]


def _mlp_layers(model: nn.Module, what: str) -> list[nn.Linear]:
    """The Linear layers of an ``nn.Sequential`` MLP: [Flatten] Linear (ReLU Linear)*."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"{what} supports nn.Sequential MLPs of nn.Linear + nn.ReLU only, got "
                        f"{type(model).__name__}")
    mods = list(model)
    if mods and isinstance(mods[0], nn.Flatten):
        mods = mods[1:]
    layers = mods[0::2]
    acts = mods[1::2]
    ok = (len(mods) % 2 == 1 and all(isinstance(m, nn.Linear) for m in layers)
          and all(isinstance(a, nn.ReLU) for a in acts))
    if not ok:
        raise TypeError(f"{what} supports nn.Sequential MLPs of the form [Flatten] Linear "
                        f"(ReLU Linear)* only, got [{', '.join(type(m).__name__ for m in model)}]")
    return layers


def _uniform_like(shape, fan_in: int, generator) -> torch.Tensor:
    bound = 1.0 / math.sqrt(fan_in)
    return (torch.rand(shape, generator=generator) * 2 - 1) * bound


class _AlignmentBase:
    what = "feedback alignment"

    def __init__(self, model: nn.Module, loss_fn_name: str = "cross_entropy") -> None:
        self.model = model
        self.layers = _mlp_layers(model, self.what)
        self.flatten = isinstance(model[0], nn.Flatten)
        self.forwards = 0
        self.steps = 0

    def _forward(self, x):
        h = x.flatten(1) if self.flatten else x
        hs, zs = [h], []
        for i, layer in enumerate(self.layers):
            z = F.linear(h, layer.weight, layer.bias)
            zs.append(z)
            if i < len(self.layers) - 1:
                h = torch.relu(z)
                hs.append(h)
        return hs, zs

    def _deltas(self, delta_out: torch.Tensor, hs, zs) -> list[torch.Tensor]:  # pragma: no cover
        raise NotImplementedError

    @torch.no_grad()
    def gradients(self, x: torch.Tensor, y: torch.Tensor):
        """``(loss, [(grad_W, grad_b) per layer])`` with the feedback rule of this class."""
        check_batch(x, y)
        hs, zs = self._forward(x)
        logits = zs[-1]
        loss = F.cross_entropy(logits, y)
        n = int(x.shape[0])
        delta_out = (torch.softmax(logits, dim=-1) - F.one_hot(y, logits.shape[-1]).to(logits)) / n
        deltas = self._deltas(delta_out, hs, zs)
        grads = [(d.T @ h, d.sum(0)) for d, h in zip(deltas, hs)]
        self.forwards += n
        return float(loss), grads

    @torch.no_grad()
    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        lr = check_learning_rate(lr)
        loss, grads = self.gradients(x, y)
        if not math.isfinite(loss):
            raise FloatingPointError("non-finite loss; model unchanged")
        for layer, (gw, gb) in zip(self.layers, grads):
            layer.weight.sub_(gw, alpha=lr)
            if layer.bias is not None:
                layer.bias.sub_(gb, alpha=lr)
        self.steps += 1
        return {"loss": loss}


class FeedbackAlignment(_AlignmentBase):
    """FA (Lillicrap et al. 2016): back-propagate the error through fixed random matrices.

    ``δ_L = softmax(z_L) − onehot(y)`` (over B), ``δ_{l−1} = (δ_l B_l) ⊙ relu'(z_{l−1})`` with a
    fixed ``B_l`` of ``W_l``'s shape (out × in) where BP would use ``W_l`` (i.e. ``B_lᵀ``
    replaces ``W_lᵀ``); ``∇W_l = δ_lᵀ h_{l−1}``. With ``B_l = W_l`` this is exactly BP.

    Args:
        model: ``nn.Sequential`` of [Flatten] Linear (ReLU Linear)* (TypeError otherwise).
        feedback: list of ``B_l`` for layers 2..L (one per layer after the first), or None
            for uniform ``±1/√in_l`` random matrices drawn from ``seed``.
    """

    what = "FeedbackAlignment"

    def __init__(self, model: nn.Module, *, feedback: Sequence[torch.Tensor] | None = None,
                 seed: int = 0) -> None:
        super().__init__(model)
        g = torch.Generator().manual_seed(int(seed))
        shapes = [tuple(layer.weight.shape) for layer in self.layers[1:]]
        if feedback is None:
            feedback = [_uniform_like(s, s[1], g).to(self.layers[0].weight) for s in shapes]
        feedback = [torch.as_tensor(b).detach().clone() for b in feedback]
        if [tuple(b.shape) for b in feedback] != shapes:
            raise ValueError(f"feedback matrices must have shapes {shapes} (those of W_2..W_L), "
                             f"got {[tuple(b.shape) for b in feedback]}")
        self.feedback = feedback

    def _deltas(self, delta_out, hs, zs):
        deltas = [delta_out]
        for l in range(len(self.layers) - 1, 0, -1):
            d = (deltas[0] @ self.feedback[l - 1]) * (zs[l - 1] > 0).to(delta_out)
            deltas.insert(0, d)
        return deltas


class DirectFeedbackAlignment(_AlignmentBase):
    """DFA (Nøkland 2016): the output error projected straight to every hidden layer.

    ``δ_l = (δ_L B_l) ⊙ relu'(z_l)`` for every hidden layer with a fixed random ``B_l`` of
    shape (classes × hidden_l); the output layer uses the true error ``δ_L``. For one hidden
    layer DFA equals FA with the same matrix.

    Args:
        feedback: list of ``B_l`` for the hidden layers 1..L−1, or None for uniform
            ``±1/√classes`` random matrices drawn from ``seed``.
    """

    what = "DirectFeedbackAlignment"

    def __init__(self, model: nn.Module, *, feedback: Sequence[torch.Tensor] | None = None,
                 seed: int = 0) -> None:
        super().__init__(model)
        g = torch.Generator().manual_seed(int(seed))
        classes = self.layers[-1].weight.shape[0]
        shapes = [(classes, layer.weight.shape[0]) for layer in self.layers[:-1]]
        if feedback is None:
            feedback = [_uniform_like(s, classes, g).to(self.layers[0].weight) for s in shapes]
        feedback = [torch.as_tensor(b).detach().clone() for b in feedback]
        if [tuple(b.shape) for b in feedback] != shapes:
            raise ValueError(f"feedback matrices must have shapes {shapes} (classes × hidden_l), "
                             f"got {[tuple(b.shape) for b in feedback]}")
        self.feedback = feedback

    def _deltas(self, delta_out, hs, zs):
        deltas = [(delta_out @ b) * (z > 0).to(delta_out) for b, z in zip(self.feedback, zs[:-1])]
        return deltas + [delta_out]
