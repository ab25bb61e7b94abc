"""The baselines of TT-ZO Tables 1-3 (Zhao et al., §5.1), as Method-protocol trainers.

Every class has ``model``, a ``forwards`` counter of per-sample forward passes (a forward of B
samples counts B; a forward-mode JVP pass counts as one forward) and
``step(x, y, lr) -> dict(loss=...)`` with the batch loss *before* the update, so
:func:`bpfree.pmt.fit` / :func:`bpfree.ttzo.train` run all of them on the same batches.

* :class:`BPTrainer` -- first-order (FO / BP) training of any model with SGD or Adam: the "FO"
  column for the dense MLP, the TT-MLP and the pruned SP-MLP (the shared
  :class:`bpfree.baselines.BPTrainer`, re-exported here).
* :func:`grasp_prune` + :class:`MaskedModel` -- SP-MLP: GraSP pruning at initialization
  (Wang, Zhang & Grosse 2020) to a target number of weights (the TT-MLP's parameter count).
* :class:`ForwardGradientW` -- FG-W: weight-perturbed forward gradient (Baydin et al. 2022),
  ``g = (∇L·v) v`` with the exact JVP (:func:`bpfree.estimators.forward_gradient`).
* :class:`ForwardGradientA` -- FG-A: activity-perturbed forward gradient (Ren et al. 2022)
  without local losses.
* :class:`FeedbackAlignment` (FA, Lillicrap et al. 2016) and
  :class:`DirectFeedbackAlignment` (DFA, Nøkland 2016) for MLPs of ``nn.Linear`` + ``ReLU``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence

import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch import nn

from .._deprecation import renamed_argument
from ..baselines import BPTrainer
from ..harness import check_batch, check_learning_rate
from ..objective import cross_entropy_per_sample
from .hybrid import ZOTrainer

__all__ = ["BPTrainer", "grasp_scores", "grasp_prune", "MaskedModel", "ForwardGradientW",
           "ForwardGradientA", "FeedbackAlignment", "DirectFeedbackAlignment"]


# ---------------------------------------------------------------------------------------------
# GraSP pruning at initialization and the masked (sparse) model
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Forward gradients
# ---------------------------------------------------------------------------------------------


class ForwardGradientW(ZOTrainer):
    """FG-W: weight-perturbed forward gradient (Baydin et al. 2022; TT-ZO Table 3).

    ``ĝ = (1/N) Σ_q (∇L·v_q) v_q`` with ``N = num_queries`` Gaussian ``v_q`` and the directional derivative
    computed exactly by one JVP (``torch.func.jvp``) per direction: unbiased,
    ``E[ĝ] = ∇L``. This is :class:`ZOTrainer` with the foundation's
    :func:`~bpfree.estimators.forward_gradient` estimator; ``batch_forwards`` counts one
    forward-mode pass per direction.
    """

    def __init__(self, model: nn.Module, *, num_queries: int | None = None,
                 momentum: float = 0.0, params=None, seed: int = 0,
                 loss_fn: Callable = cross_entropy_per_sample,
                 num_directions: int | None = None) -> None:
        # num_directions: the old name of num_queries, accepted with a DeprecationWarning
        num_queries = renamed_argument("num_directions", num_directions, "num_queries",
                                       num_queries, 1)
        super().__init__(model, "forward_gradient", num_queries=num_queries, momentum=momentum,
                         distribution="gaussian", params=params, seed=seed, loss_fn=loss_fn)


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


# ---------------------------------------------------------------------------------------------
# Feedback alignment
# ---------------------------------------------------------------------------------------------


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
