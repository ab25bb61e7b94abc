"""Node (activation) perturbation, PMT §3.2 (Eq. 9–10).

Instead of perturbing a layer's weights, perturb its pre-activation output
``z = W a + b`` by ``μ ξ`` (i.i.d. per sample, PMT §4.1), estimate the activation gradient

    ĝ_z = (1/Q) Σ_q (ℓ_q(x_n) − ℓ(x_n)) / μ · ξ_{q,n}                       (Eq. 9)

and turn it into weight and bias gradients with the layer's own input ``a``:

    ĝ_W = ĝ_z · aᵀ,   ĝ_b = ĝ_z                                            (Eq. 10)

(summed over the batch and, for convolutions, over positions). The variance scales with
``d_a`` instead of ``d_w``, a large win for layers with few outputs and many weights.

``layerwise=True`` perturbs one layer at a time with ``Q`` queries each (PMT §3.2.2);
``layerwise=False`` perturbs every layer's output at once (vanilla, model-wise NP).
All layers are estimated at the same parameters θ_t and updated together afterwards: the
synchronized "global" update of PMT Algorithm 1.

For an ``nn.Sequential`` model the layer input is computed once and only the suffix after the
perturbed layer is re-run per query (PMT Algorithm 1's layer-by-layer schedule); other models
are re-run whole with a forward hook doing the perturbation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .base import Estimate, QueryContext, check_mu, check_positive_int
from .weight import _require_objective

SUPPORTED = (nn.Linear, nn.Conv1d, nn.Conv2d)


# Tensor indices >= this offset name node directions, so they never collide with the weight
# directions of the same step (which use tensor indices 0..P-1).
NODE_SEED_OFFSET = 1_000_003


@dataclass(frozen=True)
class NodePerturbation:
    num_queries: int = 16
    mu: float = 1e-3
    layerwise: bool = True
    name: str = "node_perturbation"

    def __post_init__(self):
        check_positive_int("num_queries", self.num_queries)
        check_mu(self.mu)

    def estimate(self, ctx: QueryContext) -> Estimate:
        objective = _require_objective(ctx, "node perturbation")
        layers = _layers(ctx)
        grads = [None] * len(ctx.params)
        ndirs = [1] * len(ctx.params)
        dims = [1] * len(ctx.params)
        forwards, dropped, losses = 0, 0, []
        groups = [[layer] for layer in layers] if self.layerwise else [layers]
        for g, group in enumerate(groups):
            result = self._estimate_group(ctx, objective, [m for m, _ in group], g)
            forwards += result["forwards"]
            dropped += result["dropped"]
            losses.append(result["loss"])
            for (module, idx), (gz, a) in zip(group, result["pairs"]):
                gw, gb = weight_gradients(module, a, gz)
                d_a = gz[0].numel()  # nodes per sample: the d of PMT Eq. 8 for NP
                for attr, i in idx.items():
                    grads[i] = gw if attr == "weight" else gb
                    ndirs[i] = result["directions"]
                    dims[i] = d_a
        return Estimate(loss=losses[0], forward_passes=forwards,
                        queries=self.num_queries * len(groups), dropped=dropped,
                        num_directions=ndirs, dims=dims, grads=grads)

    def _estimate_group(self, ctx, objective, modules, g):
        n, q_count, mu = objective.batch_size, self.num_queries, self.mu
        dist = ctx.distribution

        def seed(q, k):
            return ctx.seed_for(g * q_count + q, NODE_SEED_OFFSET + k)

        seq = _sequential_split(objective, modules)
        if seq is not None:
            a, z, suffix = seq
            inputs, shapes = [a], [z.shape]
            base = objective.loss_from_outputs(_run(suffix, z))
        else:
            inputs, shapes, base = _capture(objective, modules)

        # Batched mode runs the queries one after another as lean mode does: stacking Q copies
        # of the batch was never faster in ``bench throughput`` and 3x slower on the CNN at
        # Q = 64, where the stacked activations leave the cache (retired, issue 30).
        if seq is not None:
            losses = [objective.loss_from_outputs(_run(suffix, z + dist.sample(
                seed(q, 0), z.shape, dtype=z.dtype, device=z.device) * mu)) for q in range(q_count)]
        else:
            losses = []
            for q in range(q_count):
                hooks = [m.register_forward_hook(_adder(dist, seed(q, k), mu))
                         for k, m in enumerate(modules)]
                try:
                    losses.append(objective.per_sample())
                finally:
                    for h in hooks:
                        h.remove()

        base64 = base.double()
        coef = (torch.stack([lq.double() for lq in losses]) - base64) / mu  # [Q, N]
        valid = torch.isfinite(coef) & torch.isfinite(base64)
        coef = torch.where(valid, coef, torch.zeros((), dtype=coef.dtype))
        # Average over each sample's finite queries, then over the batch (mean loss).
        weights = coef / valid.sum(0).clamp_min(1).to(coef.dtype) / n
        pairs = []
        for k in range(len(modules)):
            gz = torch.zeros(shapes[k], dtype=inputs[k].dtype, device=inputs[k].device)
            for q in range(q_count):
                xi = dist.sample(seed(q, k), shapes[k], dtype=gz.dtype, device=gz.device)
                gz.add_(xi * weights[q].to(gz.dtype).reshape(-1, *([1] * (gz.ndim - 1))))
            pairs.append((gz, inputs[k]))
        finite = base64[torch.isfinite(base64)]
        return {"pairs": pairs, "forwards": 1 + q_count, "dropped": int((~valid).sum()),
                "directions": n * q_count,
                "loss": float(finite.mean()) if finite.numel() else float("nan")}


def _adder(dist, seed, mu):
    def hook(mod, inp, out):
        return out + dist.sample(seed, out.shape, dtype=out.dtype, device=out.device) * mu
    return hook


def _capture(objective, modules):
    """One base forward: per-sample losses, each target layer's input and output shape."""
    inputs, shapes = [None] * len(modules), [None] * len(modules)

    def make(k):
        def hook(mod, inp, out):
            inputs[k] = inp[0].detach()
            shapes[k] = out.shape
        return hook

    hooks = [m.register_forward_hook(make(k)) for k, m in enumerate(modules)]
    try:
        base = objective.per_sample()
    finally:
        for h in hooks:
            h.remove()
    for k, m in enumerate(modules):
        if inputs[k] is None:
            raise ValueError(f"layer {type(m).__name__} was not called by the model's forward")
    return inputs, shapes, base


def _sequential_split(objective, modules):
    """(layer input, layer output, suffix) when the lone target is a child of a Sequential."""
    model = objective.model
    if not isinstance(model, nn.Sequential) or len(modules) != 1:
        return None
    children = list(model)
    j = next((i for i, c in enumerate(children) if c is modules[0]), None)
    if j is None:
        return None
    with torch.no_grad():
        a = _run(children[:j], objective.inputs)
        z = children[j](a)
    return a, z, children[j + 1:]


def _run(modules, h: Tensor) -> Tensor:
    with torch.no_grad():
        for m in modules:
            h = m(h)
    return h


def weight_gradients(module: nn.Module, a: Tensor, gz: Tensor) -> tuple[Tensor, Tensor | None]:
    """Eq. 10: weight and bias gradients of a linear/conv layer from its input and ĝ_z."""
    if isinstance(module, nn.Linear):
        gz2 = gz.reshape(-1, gz.shape[-1])
        a2 = a.reshape(-1, a.shape[-1]).to(gz2.dtype)
        gw = gz2.t() @ a2
        gb = gz2.sum(0) if module.bias is not None else None
    elif isinstance(module, (nn.Conv1d, nn.Conv2d)):
        fn = torch.nn.grad.conv2d_weight if isinstance(module, nn.Conv2d) else torch.nn.grad.conv1d_weight
        gw = fn(a.to(gz.dtype), module.weight.shape, gz, stride=module.stride,
                padding=module.padding, dilation=module.dilation, groups=module.groups)
        dims = [0] + list(range(2, gz.ndim))
        gb = gz.sum(dims) if module.bias is not None else None
    else:  # pragma: no cover - filtered by _layers
        raise TypeError(type(module).__name__)
    return gw.to(module.weight.dtype), (gb.to(module.bias.dtype) if gb is not None else None)


def _layers(ctx: QueryContext):
    """Group trainable tensors by owning layer: [(module, {"weight": i, "bias": j}), ...]."""
    by_module: dict[int, tuple[nn.Module, dict]] = {}
    order = []
    for i in range(len(ctx.params)):
        if i not in ctx.modules:
            raise ValueError(f"node perturbation cannot find the layer owning {ctx.names[i]!r}")
        module, attr = ctx.modules[i]
        if not isinstance(module, SUPPORTED) or attr not in ("weight", "bias"):
            raise ValueError(
                f"node perturbation supports the weight/bias of {', '.join(c.__name__ for c in SUPPORTED)}; "
                f"{ctx.names[i]!r} belongs to {type(module).__name__}. Train it with a weight-"
                "perturbation estimator instead")
        key = id(module)
        if key not in by_module:
            by_module[key] = (module, {})
            order.append(key)
        by_module[key][1][attr] = i
    return [by_module[k] for k in order]


def node_perturbation(num_queries: int = 16, mu: float = 1e-3, *, layerwise: bool = True) -> NodePerturbation:
    """Node perturbation (PMT Eq. 9–10), layer-wise by default (PMT §3.2.2)."""
    return NodePerturbation(num_queries, mu, layerwise)
