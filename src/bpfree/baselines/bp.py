"""The back-propagation baseline: one trainer for every paper's "FO" / "FullTrain" rows."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ..harness import check_batch, check_learning_rate
from ..objective import cross_entropy_per_sample

OPTIMIZERS = ("sgd", "adam", "adamw")


def model_device(model: nn.Module) -> torch.device:
    for t in model.buffers():
        return t.device
    for t in model.parameters():
        return t.device
    return torch.device("cpu")


def _module_names(model: nn.Module) -> tuple[dict[str, nn.Module], list[str]]:
    modules = dict(model.named_modules())
    valid = [name for name, m in modules.items()
             if name and any(True for _ in m.parameters(recurse=False))]
    return modules, valid


def _select(model: nn.Module, trainable, modules, valid) -> list[nn.Parameter]:
    """The parameters to train: those that require grad (``trainable=None``), or those of the
    named modules, which then become the only ones that require grad."""
    all_params = list(model.parameters())
    if trainable is None:
        return [p for p in all_params if p.requires_grad]
    names = [trainable] if isinstance(trainable, str) else list(trainable)
    unknown = [n for n in names if n not in modules or n == ""
               or not any(True for _ in modules[n].parameters())]
    if unknown or not names:
        raise ValueError(f"unknown trainable module(s) {unknown or names}; modules with "
                         f"parameters are {valid}")
    chosen = {id(p) for n in names for p in modules[n].parameters()}
    for p in all_params:
        p.requires_grad_(id(p) in chosen)
    return [p for p in all_params if id(p) in chosen]


def _groups(params, lr_scale, modules, valid) -> list[dict]:
    """Parameter groups with their ``lr_scale``: one group unless some module has its own
    factor (then one group per factor, in parameter order)."""
    scale = {id(p): 1.0 for p in params}
    for name, factor in (lr_scale or {}).items():
        if name not in modules or name == "":
            raise ValueError(f"lr_scale names unknown module {name!r}; modules with "
                             f"parameters are {valid}")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (
                math.isfinite(factor) and factor >= 0):
            raise ValueError(f"lr_scale[{name!r}] must be a finite number >= 0, "
                             f"got {factor!r}")
        for p in modules[name].parameters():
            if id(p) in scale:
                scale[id(p)] = float(factor)
    groups: dict[float, list] = {}
    for p in params:
        groups.setdefault(scale[id(p)], []).append(p)
    return [{"params": ps, "lr_scale": f} for f, ps in groups.items()]


class BPTrainer:
    """First-order training with back-propagation, a :class:`~bpfree.harness.Method`.

    ``step(x, y, lr)`` takes one optimizer step on the batch loss (the mean of ``loss_fn``'s
    per-sample values, or its scalar) and returns ``{"loss": batch loss before the update,
    "forwards": N}``; ``forwards`` counts N per step (Table 5's unit) and ``backwards`` the N
    backward passes BP also runs.

    Args:
        model: any ``nn.Module`` (dense MLP, TT-MLP, MobileNetV2, ...).
        optimizer: ``"sgd"`` (plain, or with ``momentum`` / ``weight_decay``; PMT §4.1 and
            TT-ZO §5.1 use plain SGD), ``"adam"`` or ``"adamw"`` (with ``betas``, default
            torch's; QZO-FF's BP rows use AdamW with ``betas=(0.9, 0.95)``).
        loss_fn: ``(outputs, targets) ->`` per-sample losses ``[N]`` (averaged) or a scalar.
        trainable: names of modules (``model.named_modules()``) whose parameters train; the
            others get ``requires_grad = False``. Default: the parameters that require grad.
        lr_scale: optional ``{module name: factor}``: that module's parameters step at
            ``factor * lr`` (a parameter group): a freshly initialised head beside pretrained
            layers needs a far larger rate than they do.
        frozen_statistics: keep the model in ``eval()`` mode, so BatchNorm uses and keeps its
            running statistics (a trained model stays foldable into an int8 one) and dropout
            is off; otherwise the model's mode is left as it is.
    """

    def __init__(self, model: nn.Module, optimizer: str = "sgd", *, momentum: float = 0.0,
                 weight_decay: float = 0.0, betas: tuple[float, float] | None = None,
                 loss_fn: Callable = cross_entropy_per_sample,
                 trainable=None, lr_scale: dict[str, float] | None = None,
                 frozen_statistics: bool = False) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
        modules, valid = _module_names(model)
        params = _select(model, trainable, modules, valid)
        if not params:
            raise ValueError(f"{type(model).__name__} has no trainable parameters")
        groups = _groups(params, lr_scale, modules, valid)
        if optimizer == "sgd":
            self.optimizer = torch.optim.SGD(groups, lr=0.0, momentum=momentum,
                                             weight_decay=weight_decay)
        else:
            kind = torch.optim.Adam if optimizer == "adam" else torch.optim.AdamW
            extra = {} if betas is None else {"betas": tuple(betas)}
            self.optimizer = kind(groups, lr=0.0, weight_decay=weight_decay, **extra)
        self.model = model
        self.params = params
        self.loss_fn = loss_fn
        self.frozen_statistics = bool(frozen_statistics)
        self.forwards = 0
        self.backwards = 0
        self.steps = 0

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        lr = check_learning_rate(lr)
        check_batch(x, y)
        device = model_device(self.model)
        x, y = x.to(device), y.to(device)
        if self.frozen_statistics:
            self.model.eval()
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group["lr_scale"]
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(x), y)
        if loss.dim() > 0:
            loss = loss.mean()
        if not bool(torch.isfinite(loss)):
            raise FloatingPointError("non-finite loss; model unchanged")
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # the gradients are not kept between steps
        n = int(x.shape[0])
        self.forwards += n
        self.backwards += n
        self.steps += 1
        return {"loss": float(loss.detach()), "forwards": n}
