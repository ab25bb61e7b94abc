"""Choosing the trainable subset of a model: by name pattern or by module."""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

from torch import nn


def select_parameters(model: nn.Module, include: str | Iterable[str] | None = None, *,
                      exclude: str | Iterable[str] | None = None,
                      modules: nn.Module | Iterable[nn.Module] | None = None) -> list[tuple[str, nn.Parameter]]:
    """Named parameters of ``model`` to train, in the model's own (reproducible) order.

    Args:
        include: glob pattern(s) on parameter names (``"fc2.*"``, ``"*.bias"``); default all.
        exclude: glob pattern(s) removed afterwards.
        modules: keep only parameters owned by these sub-modules (or their children).

    Raises ValueError when the selection is empty, naming the patterns and a few names.
    """
    include = [include] if isinstance(include, str) else list(include or [])
    exclude = [exclude] if isinstance(exclude, str) else list(exclude or [])
    if isinstance(modules, nn.Module):
        modules = [modules]
    allowed = None
    if modules is not None:
        allowed = {id(p) for m in modules for p in m.parameters()}
        if not allowed:
            raise ValueError("the given modules own no parameters")
    chosen = []
    for name, p in model.named_parameters():
        if include and not any(fnmatchcase(name, pat) for pat in include):
            continue
        if any(fnmatchcase(name, pat) for pat in exclude):
            continue
        if allowed is not None and id(p) not in allowed:
            continue
        chosen.append((name, p))
    if not chosen:
        names = [n for n, _ in model.named_parameters()][:6]
        raise ValueError(
            f"no parameter matches include={include or '*'} exclude={exclude or '-'} "
            f"modules={'given' if modules is not None else '-'}; the model's parameters start "
            f"with {names}")
    return chosen


def named_trainable(model: nn.Module, params) -> list[tuple[str, nn.Parameter]]:
    """``(name, parameter)`` pairs to train: ``params`` (names or pairs) or all that require grad."""
    named = dict(model.named_parameters())
    if params is None:
        chosen = [(n, p) for n, p in named.items() if p.requires_grad]
    else:
        chosen = []
        for item in params:
            if isinstance(item, str):
                if item not in named:
                    raise ValueError(f"unknown parameter {item!r}; the model has {list(named)[:8]}...")
                chosen.append((item, named[item]))
            else:
                chosen.append(tuple(item))
    if not chosen:
        raise ValueError(f"{type(model).__name__} has no trainable parameters")
    return chosen


def owners(model: nn.Module) -> dict[int, tuple[str, nn.Module, str]]:
    """``id(param) -> (qualified name, owning module, attribute name)`` for every parameter."""
    out = {}
    for mod_name, module in model.named_modules():
        for attr, p in module.named_parameters(recurse=False):
            if id(p) not in out:
                out[id(p)] = (f"{mod_name}.{attr}" if mod_name else attr, module, attr)
    return out
