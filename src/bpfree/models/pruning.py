"""Pruning at initialization: GraSP scores (Wang, Zhang & Grosse 2020) and the masked model.

TT-ZO's SP-MLP baseline (Zhao et al. §5.1, Tables 1-3) is a dense MLP pruned with GraSP to the
TT-MLP's parameter count: :func:`grasp_prune` chooses the weights and returns a
:class:`MaskedModel`, in which only the kept weights are parameters, so BP and every ZO
estimator train exactly those (CGE costs ``d + 1`` evaluations for the ``d`` kept values).
It lives with the models because its output is one: any trainer takes a :class:`MaskedModel`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MaskedModel", "grasp_prune", "grasp_scores"]


def _prunable(model: nn.Module, include_bias: bool) -> list[tuple[str, nn.Parameter]]:
    out = []
    for mod_name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            for attr in ("weight", "bias") if include_bias else ("weight",):
                p = getattr(module, attr, None)
                if isinstance(p, nn.Parameter) and p.requires_grad:
                    out.append((f"{mod_name}.{attr}" if mod_name else attr, p))
    if not out:
        raise ValueError(f"{type(model).__name__} has no nn.Linear / nn.Conv weights to prune")
    return out


def grasp_scores(model: nn.Module, data, *, temperature: float = 200.0,
                 include_bias: bool = False, loss_fn: Callable | None = None
                 ) -> dict[str, torch.Tensor]:
    """GraSP scores ``S(−θ) = −θ ⊙ Hg`` of every prunable weight (Wang et al. 2020, Eq. 8).

    ``g = ∇L(θ)`` is accumulated over ``data`` (an ``(x, y)`` pair or an iterable of pairs)
    with the logits divided by ``temperature`` (the reference code's T = 200), then the
    Hessian-gradient product ``Hg = ∇(gᵀ stop_grad(g))`` by double back-propagation. Only
    weights of ``nn.Linear`` / ``nn.Conv`` modules are scored (biases too with
    ``include_bias``). The model is not modified (its ``.grad`` fields are restored to None).
    """
    if isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], torch.Tensor):
        data = [data]
    data = list(data)
    if not data:
        raise ValueError("grasp_scores needs at least one (x, y) batch")
    if loss_fn is None:
        def loss_fn(out, y):
            return F.cross_entropy(out, y)
    named = _prunable(model, include_bias)
    params = [p for _, p in named]
    # First pass: the gradient g, treated as a constant afterwards.
    g = [torch.zeros_like(p) for p in params]
    for x, y in data:
        loss = loss_fn(model(x) / temperature, y)
        for gi, d in zip(g, torch.autograd.grad(loss, params)):
            gi.add_(d)
    # Second pass: Hg = ∇_θ (∇_θ L)ᵀ g.
    hg = [torch.zeros_like(p) for p in params]
    for x, y in data:
        loss = loss_fn(model(x) / temperature, y)
        grads = torch.autograd.grad(loss, params, create_graph=True)
        z = sum((gr * gi).sum() for gr, gi in zip(grads, g))
        for hi, d in zip(hg, torch.autograd.grad(z, params)):
            hi.add_(d)
    return {name: (-p.detach() * h).detach() for (name, p), h in zip(named, hg)}


def grasp_prune(model: nn.Module, data, target_params: int, *, temperature: float = 200.0,
                include_bias: bool = False, count_unprunable: bool = False,
                loss_fn: Callable | None = None, copy_model: bool = True
                ) -> tuple[dict[str, torch.Tensor], MaskedModel]:
    """Prune ``model`` at initialization with GraSP so exactly ``target_params`` weights remain.

    Following Wang et al. (2020) and their reference code, the weights with the *largest*
    scores ``−θ ⊙ Hg`` are removed (removing them reduces the gradient flow least — or
    increases it), i.e. the ``target_params`` weights with the smallest scores are kept; ties
    are broken by position, so the count is exact. Scores are compared globally across layers.

    Args:
        data: an ``(x, y)`` batch or an iterable of batches for the scores.
        target_params: number of prunable weights to keep (e.g. the TT-MLP's 3,962). With
            ``count_unprunable=True`` it is the total trainable count instead, and the
            unprunable parameters (biases, other layers) are subtracted first.
        copy_model: prune a deep copy (default) instead of ``model`` itself.

    Returns ``(masks, masked_model)``: boolean keep-masks by parameter name, and the
    :class:`MaskedModel` that trains only the kept weights.
    """
    if isinstance(target_params, bool) or not isinstance(target_params, int) or target_params < 1:
        raise ValueError(f"target_params must be an int >= 1, got {target_params!r}")
    scores = grasp_scores(model, data, temperature=temperature, include_bias=include_bias,
                          loss_fn=loss_fn)
    total = sum(s.numel() for s in scores.values())
    keep = target_params
    if count_unprunable:
        prunable_ids = {id(p) for _, p in _prunable(model, include_bias)}
        fixed = sum(p.numel() for p in model.parameters()
                    if p.requires_grad and id(p) not in prunable_ids)
        keep = target_params - fixed
        if keep < 1:
            raise ValueError(f"target_params={target_params} is not above the {fixed} "
                             "unprunable parameters")
    if keep > total:
        raise ValueError(f"cannot keep {keep} weights: the model has only {total} prunable ones")
    flat = torch.cat([s.flatten() for s in scores.values()])
    # Stable sort: equal scores keep their position order, so exactly `keep` survive.
    order = torch.sort(flat, stable=True).indices[:keep]
    keep_flat = torch.zeros(total, dtype=torch.bool)
    keep_flat[order] = True
    masks, offset = {}, 0
    for name, s in scores.items():
        masks[name] = keep_flat[offset:offset + s.numel()].view_as(s).clone()
        offset += s.numel()
    return masks, MaskedModel(model, masks, copy_model=copy_model)


class MaskedModel(nn.Module):
    """A model whose pruned weights are structurally zero: only the kept values are parameters.

    Each masked parameter ``<module>.<attr>`` is replaced by a parameter
    ``<module>.<attr>_values`` holding the kept entries (a vector of length ``mask.sum()``)
    and a buffer ``<module>.<attr>_index`` of their flat positions; a forward pre-hook
    rebuilds the dense tensor (zeros elsewhere) before every forward. So BP, ZO estimators
    (RGE / CGE see only the ``d`` kept values: CGE costs ``d + 1`` evaluations, not the dense
    count) and ``torch.func.functional_call`` all train exactly the unmasked weights, and the
    masked ones stay zero whatever the optimizer does.

    Args:
        model: the network; deep-copied unless ``copy_model=False``.
        masks: ``{parameter name: bool tensor of its shape}`` (True = keep).
    """

    def __init__(self, model: nn.Module, masks: dict[str, torch.Tensor], *,
                 copy_model: bool = True) -> None:
        super().__init__()
        self.net = copy.deepcopy(model) if copy_model else model
        modules = dict(self.net.named_modules())
        self._masked: list[tuple[str, str]] = []
        for name, mask in masks.items():
            mod_name, _, attr = name.rpartition(".")
            module = modules.get(mod_name)
            p = getattr(module, attr, None) if module is not None else None
            if not isinstance(p, nn.Parameter):
                raise ValueError(f"{name!r} is not a parameter of the model")
            mask = torch.as_tensor(mask, dtype=torch.bool, device=p.device)
            if mask.shape != p.shape:
                raise ValueError(f"mask for {name!r} has shape {tuple(mask.shape)}, the "
                                 f"parameter {tuple(p.shape)}")
            index = mask.flatten().nonzero().flatten()
            values = nn.Parameter(p.detach().flatten()[index].clone(), requires_grad=p.requires_grad)
            del module._parameters[attr]
            module.register_parameter(f"{attr}_values", values)
            module.register_buffer(f"{attr}_index", index)
            setattr(module, f"_{attr}_shape", tuple(p.shape))
            setattr(module, attr, self._dense(module, attr))
            if not any(a for m, a in self._masked if m == mod_name):
                module.register_forward_pre_hook(self._make_hook())
            module._bpfree_masked = getattr(module, "_bpfree_masked", ()) + (attr,)
            self._masked.append((mod_name, attr))

    @staticmethod
    def _dense(module: nn.Module, attr: str) -> torch.Tensor:
        values = getattr(module, f"{attr}_values")
        index = getattr(module, f"{attr}_index")
        shape = getattr(module, f"_{attr}_shape")
        numel = math.prod(shape)
        dense = values.new_zeros(values.shape[:-1] + (numel,)).index_copy(-1, index, values)
        return dense.view(values.shape[:-1] + shape)

    @staticmethod
    def _make_hook():
        def hook(module, args):
            for attr in module._bpfree_masked:
                setattr(module, attr, MaskedModel._dense(module, attr))
        return hook

    def forward(self, *args, **kwargs):
        return self.net(*args, **kwargs)

    def num_kept(self) -> int:
        """Trainable scalars: kept weights plus every unmasked parameter."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    @torch.no_grad()
    def dense_weights(self) -> dict[str, torch.Tensor]:
        """The dense tensors (zeros at pruned positions) by their original names."""
        modules = dict(self.net.named_modules())
        return {(f"{m}.{a}" if m else a): self._dense(modules[m], a).clone()
                for m, a in self._masked}

    @torch.no_grad()
    def masks(self) -> dict[str, torch.Tensor]:
        modules = dict(self.net.named_modules())
        out = {}
        for m, a in self._masked:
            mod = modules[m]
            shape = getattr(mod, f"_{a}_shape")
            mask = torch.zeros(math.prod(shape), dtype=torch.bool)
            mask[getattr(mod, f"{a}_index").cpu()] = True
            out[f"{m}.{a}" if m else a] = mask.view(shape)
        return out
