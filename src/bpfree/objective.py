"""The thing a forward-only optimizer queries: a model, a batch and a per-sample loss.

A zeroth-order step needs more than torch's usual zero-argument closure: node perturbation
needs per-sample losses (PMT Eq. 9), and the batched execution mode evaluates many parameter
sets in one vectorized call (``torch.func.vmap`` over ``functional_call``). ``Objective``
bundles what both need while still being a plain closure: ``objective()`` returns the mean
loss, so it works wherever ``optimizer.step(closure)`` expects one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

LossFn = Callable[[Tensor, Tensor], Tensor]


def cross_entropy_per_sample(outputs: Tensor, targets: Tensor) -> Tensor:
    """Per-sample cross-entropy (reduction='none'), the default classification loss."""
    return nn.functional.cross_entropy(outputs, targets, reduction="none")


def _check_vmappable(model: nn.Module) -> None:
    """Refuse models ``vmap(functional_call)`` cannot run, before torch fails deep inside.

    torch's RNN modules (LSTM, GRU, RNN) run fused kernels over a flat list of their weights
    that ``vmap`` cannot batch: K stacked parameter sets fail deep inside torch with an error
    that names neither the module nor the way out (issue 20, probe 14)."""
    for name, module in model.named_modules():
        if isinstance(module, nn.RNNBase):
            raise ValueError(f"mode='batched' evaluates the queries with torch.func.vmap, which "
                             f"cannot run the {type(module).__name__} at "
                             f"{name or 'the model root'!r} (torch's fused RNN kernels cannot be "
                             "batched); use mode='lean' for recurrent models")


class Objective:
    """A mini-batch objective ``L(θ) = (1/N) Σ_n ℓ(θ; x_n, y_n)``.

    Args:
        model: the network; its current parameters are θ.
        inputs: batch of inputs, first dimension N.
        targets: batch of targets, first dimension N.
        loss_fn: ``loss_fn(outputs, targets) -> Tensor[N]`` returning per-sample losses.
    """

    def __init__(self, model: nn.Module, inputs: Tensor, targets: Tensor,
                 loss_fn: LossFn = cross_entropy_per_sample) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(inputs, Tensor) or not isinstance(targets, Tensor):
            raise TypeError("inputs and targets must be tensors")
        if inputs.ndim == 0 or targets.ndim == 0 or inputs.shape[0] != targets.shape[0]:
            raise ValueError(
                "inputs and targets must share their first (batch) dimension, got "
                f"inputs {tuple(inputs.shape)} and targets {tuple(targets.shape)}")
        if inputs.shape[0] == 0:
            raise ValueError("the batch is empty (N = 0)")
        self.model = model
        self.inputs = inputs
        self.targets = targets
        self.loss_fn = loss_fn

    @property
    def batch_size(self) -> int:
        return int(self.inputs.shape[0])

    def per_sample(self) -> Tensor:
        """Per-sample losses ``ℓ(θ; x_n)`` at the model's current parameters, shape [N]."""
        with torch.no_grad():
            losses = self.loss_fn(self.model(self.inputs), self.targets)
        if losses.shape != (self.batch_size,):
            raise ValueError(
                f"loss_fn must return per-sample losses of shape ({self.batch_size},), got "
                f"{tuple(losses.shape)}; use reduction='none'")
        return losses

    def __call__(self) -> Tensor:
        """Mean loss at the current parameters (usable as a torch-style closure)."""
        return self.per_sample().mean()

    def loss_from_outputs(self, outputs: Tensor) -> Tensor:
        """Per-sample losses for given model outputs (used by suffix evaluation)."""
        return self.loss_fn(outputs, self.targets)

    def batched(self, stacked: Mapping[str, Tensor]) -> Tensor:
        """Mean loss for K parameter sets at once.

        ``stacked`` maps parameter names (as in ``model.named_parameters()``) to tensors with
        a leading query dimension K; parameters not named keep their current values. The K
        evaluations run as one vectorized forward (``vmap`` over ``functional_call``).
        Returns a tensor of shape [K].
        """
        if not stacked:
            raise ValueError("stacked must name at least one parameter")
        sizes = {v.shape[0] for v in stacked.values()}
        if len(sizes) != 1:
            raise ValueError(f"stacked parameters disagree on the query dimension: {sorted(sizes)}")

        _check_vmappable(self.model)

        def one(params):
            out = functional_call(self.model, params, (self.inputs,))
            return self.loss_fn(out, self.targets).mean()

        with torch.no_grad():
            return vmap(one)(dict(stacked))

    def subset(self, index) -> Objective:
        """The same objective on a sub-batch (used for per-sample perturbations)."""
        return Objective(self.model, self.inputs[index], self.targets[index], self.loss_fn)
