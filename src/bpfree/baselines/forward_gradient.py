"""Forward-gradient baselines of TT-ZO Table 3: exact directional derivatives, no backward.

* :class:`ForwardGradientW` -- FG-W, weight-perturbed (Baydin et al. 2022): the foundation's
  :func:`~bpfree.estimators.forward_gradient` estimator in a :class:`~bpfree.optim.ZOOptimizer`
  (the same composition as ``bpfree.ttzo.ZOTrainer(model, "forward_gradient")``).
* :class:`ForwardGradientA` -- FG-A, activity-perturbed (Ren et al. 2022) without local losses.

Both are :class:`~bpfree.harness.Method` trainers: ``model``, a ``forwards`` counter of
per-sample forward passes (a forward-mode JVP pass counts as one forward) and
``step(x, y, lr) -> dict(loss=...)`` with the batch loss *before* the update.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.autograd.forward_ad as fwAD
from torch import nn

from .._deprecation import renamed_argument
from ..estimators import forward_gradient
from ..harness import check_batch, check_learning_rate
from ..objective import cross_entropy_per_sample
from ..optim import ZOMethod, ZOOptimizer
from ..optim.params import named_trainable
from ..transforms import momentum as momentum_transform

__all__ = ["ForwardGradientA", "ForwardGradientW"]


class ForwardGradientW(ZOMethod):
    """FG-W: weight-perturbed forward gradient (Baydin et al. 2022; TT-ZO Table 3).

    ``ĝ = (1/N) Σ_q (∇L·v_q) v_q`` with ``N = num_queries`` Gaussian ``v_q`` and the directional
    derivative computed exactly by one JVP (``torch.func.jvp``) per direction: unbiased,
    ``E[ĝ] = ∇L``. A :class:`~bpfree.optim.ZOOptimizer` with the foundation's
    :func:`~bpfree.estimators.forward_gradient` estimator (and heavy-ball ``momentum`` as the
    :func:`~bpfree.transforms.momentum` transform); ``batch_forwards`` counts one forward-mode
    pass per direction.

    Args:
        model: any ``nn.Module``. num_queries: ``N`` directions per step (default 1).
        momentum: heavy-ball coefficient (0 = none). params: names (or ``(name, tensor)``
            pairs) to train; default every parameter with ``requires_grad``.
        seed: seed of the directions. loss_fn: per-sample loss; default cross-entropy.
    """

    name = "forward_gradient"

    def __init__(self, model: nn.Module, *, num_queries: int | None = None,
                 momentum: float = 0.0, params=None, seed: int = 0,
                 loss_fn: Callable = cross_entropy_per_sample,
                 num_directions: int | None = None) -> None:
        # num_directions: the old name of num_queries, accepted with a DeprecationWarning
        num_queries = renamed_argument("num_directions", num_directions, "num_queries",
                                       num_queries, 1)
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        self.estimator = forward_gradient(num_queries)
        self.named_params = named_trainable(model, params)
        transforms = [momentum_transform(momentum)] if momentum else []
        super().__init__(model, ZOOptimizer(self.named_params, lr=1.0, estimator=self.estimator,
                                            distribution="gaussian", transforms=transforms,
                                            seed=seed),
                         loss_fn)

    @property
    def num_parameters(self) -> int:
        """``d``: the number of trainable scalars."""
        return sum(p.numel() for _, p in self.named_params)

    def batch_forwards_per_step(self) -> int:
        """One forward-mode pass per direction."""
        return self.estimator.num_queries

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        return {**super().step(x, y, lr), "estimator": self.name}


def _linear_layers(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    linear_ids = {id(p) for _, m in layers for p in m.parameters()}
    others = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in linear_ids]
    if not layers or others:
        raise TypeError(
            "FG-A needs a model whose trainable parameters all belong to nn.Linear layers; "
            f"{type(model).__name__} has " + (f"other parameters {others[:4]}" if others
                                              else "no nn.Linear layer"))
    return layers


class ForwardGradientA:
    """FG-A: activity-perturbed forward gradient (Ren et al. 2022), without local losses.

    For every ``nn.Linear`` layer ``l`` with input ``h`` and pre-activation ``z = W h + b``, a
    Gaussian ``u`` of ``z``'s shape (independent per sample) is the tangent of ``z`` in one
    forward-mode pass; the per-sample directional derivatives ``d_n = ∇_{z_n} ℓ_n · u_n``
    give the activity gradient ``ĝ_z = (d ⊙ u) / B`` of the mean loss and the weight
    gradients follow from the local outer products ``ĝ_W = ĝ_zᵀ h``, ``ĝ_b = Σ_n ĝ_{z,n}``.

    With ``independent_layers=True`` (default) each layer gets its own forward-mode pass (only
    its activity is perturbed, L passes per step); with False one pass perturbs all layers at
    once and every layer uses the global directional derivative ``Σ_l ∇_{z_l}ℓ·u_l`` (still
    unbiased, more variance, 1 pass). Ren et al.'s local losses are not used. Works for any
    model whose trainable parameters all belong to ``nn.Linear`` modules (hooks, so any
    wiring between them).
    """

    def __init__(self, model: nn.Module, *, independent_layers: bool = True, seed: int = 0,
                 loss_fn: Callable = cross_entropy_per_sample) -> None:
        self.model = model
        self.layers = _linear_layers(model)
        self.independent_layers = bool(independent_layers)
        self.loss_fn = loss_fn
        self.generator = torch.Generator().manual_seed(int(seed))
        self.forwards = 0
        self.batch_forwards = 0
        self.steps = 0

    def _pass(self, x, y, perturbed: set[int]):
        """One forward-mode pass; returns (loss, per-sample derivatives, inputs, tangents)."""
        inputs: dict[int, torch.Tensor] = {}
        tangents: dict[int, torch.Tensor] = {}
        handles = []

        def make_hook(i):
            def hook(module, args, out):
                inputs[i] = fwAD.unpack_dual(args[0]).primal.detach()
                if i not in perturbed:
                    return None
                primal = fwAD.unpack_dual(out).primal
                u = torch.randn(primal.shape, generator=self.generator).to(primal)
                tangents[i] = u
                return out + fwAD.make_dual(torch.zeros_like(primal), u)
            return hook

        for i, (_, layer) in enumerate(self.layers):
            handles.append(layer.register_forward_hook(make_hook(i)))
        try:
            with torch.no_grad(), fwAD.dual_level():
                losses = self.loss_fn(self.model(x), y)
                primal, deriv = fwAD.unpack_dual(losses)
                if deriv is None:
                    deriv = torch.zeros_like(primal)
        finally:
            for h in handles:
                h.remove()
        return primal.detach(), deriv.detach(), inputs, tangents

    @torch.no_grad()
    def gradients(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, list[dict]]:
        """The FG-A estimate: ``(loss, [{"weight": ĝ_W, "bias": ĝ_b, "g_z", "input", "u", "d"}])``."""
        check_batch(x, y)
        n = int(x.shape[0])
        groups = [{i} for i in range(len(self.layers))] if self.independent_layers \
            else [set(range(len(self.layers)))]
        out: list[dict] = [{} for _ in self.layers]
        loss = float("nan")
        for group in groups:
            losses, d, inputs, tangents = self._pass(x, y, group)
            loss = float(losses.mean())
            self.batch_forwards += 1
            self.forwards += n
            for i in group:
                if i not in tangents:
                    raise RuntimeError(f"layer {self.layers[i][0]!r} was not called in the forward")
                u, h = tangents[i], inputs[i]
                g_z = d.view(-1, *([1] * (u.ndim - 1))) * u / n
                g_z2 = g_z.reshape(-1, g_z.shape[-1])
                h2 = h.reshape(-1, h.shape[-1])
                out[i] = {"g_z": g_z, "input": h, "u": u, "d": d, "weight": g_z2.T @ h2,
                          "bias": g_z2.sum(0)}
        return loss, out

    @torch.no_grad()
    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        lr = check_learning_rate(lr)
        loss, grads = self.gradients(x, y)
        for (_, layer), g in zip(self.layers, grads):
            if layer.weight.requires_grad:
                layer.weight.sub_(g["weight"].to(layer.weight.dtype), alpha=lr)
            if layer.bias is not None and layer.bias.requires_grad:
                layer.bias.sub_(g["bias"].to(layer.bias.dtype), alpha=lr)
        self.steps += 1
        return {"loss": loss}
