"""Which parameters a fine-tuning run updates: linear probe, full, last-k, deep VPT.

QZO-FF (Feng et al. 2024) compares forward- and backward-gradient adaptation under
full fine-tuning (FT), linear probing (LP) and deep visual-prompt tuning (D-VPT, Jia et al.
2022); the memory a forward-only method saves depends on how many layers train (App. B.1).
This module names the trainable parameters of each mode so that a BP optimizer
(``requires_grad``) and a forward-only optimizer (a list of parameter names) train the
same set.

Modes (see :data:`MODES`):

* ``"linear-probe"`` -- the head only: the ``head`` submodule when the model has one
  (e.g. :class:`bpfree.models.vit.TinyViT`), else the last parameterised child of an
  ``nn.Sequential``.
* ``"full"`` -- every parameter.
* ``"last-k"`` -- for a model with a ``blocks`` ``nn.ModuleList`` (the ViT): the last ``k``
  blocks and everything after them (the final ``norm``, if any, and the ``head``); for an
  ``nn.Sequential``: its last ``k`` parameterised top-level children (the head counts as
  one, so ``k=1`` equals the linear probe).
* ``"deep-vpt"`` -- the deep prompts (``prompts``) and the head; the rest stays frozen.
"""

from __future__ import annotations

from torch import nn

__all__ = ["MODES", "apply_mode", "trainable_numel", "trainable_parameters"]

#: The supported training modes.
MODES = ("linear-probe", "full", "last-k", "deep-vpt")


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _parameterised_children(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_children() if any(True for _ in m.parameters())]


def _head_prefix(model: nn.Module) -> str:
    head = getattr(model, "head", None)
    if isinstance(head, nn.Module) and any(True for _ in head.parameters()):
        return "head"
    if isinstance(model, nn.Sequential):
        children = _parameterised_children(model)
        if children:
            return children[-1]
    raise ValueError(f"cannot find the head of {type(model).__name__}: expected a `head` "
                     "submodule with parameters or an nn.Sequential with a parameterised layer")


def _check_k(k, available: int, what: str) -> int:
    if k is None:
        raise ValueError(f"mode 'last-k' needs k (1..{available} {what})")
    if isinstance(k, bool) or not isinstance(k, int):
        raise ValueError(f"k must be an int, got {k!r}")
    if not 1 <= k <= available:
        raise ValueError(f"k must be in 1..{available} ({available} {what}), got {k}")
    return k


def trainable_parameters(model: nn.Module, mode: str, *, k: int | None = None) -> list[str]:
    """Names (as in ``model.named_parameters()``, in that order) that ``mode`` trains.

    Raises ``ValueError`` for an unknown mode (listing :data:`MODES`), a missing or out of
    range ``k`` for ``"last-k"``, a ``k`` given to another mode, a model without a head
    (``"linear-probe"``, ``"last-k"``, ``"deep-vpt"``) and a model without prompts
    (``"deep-vpt"``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if mode not in MODES:
        raise ValueError(f"unknown training mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode != "last-k" and k is not None:
        raise ValueError(f"k is only used by mode 'last-k', got k={k!r} with mode {mode!r}")
    names = [n for n, _ in model.named_parameters()]
    if mode == "full":
        return names
    if mode == "linear-probe":
        prefixes = [_head_prefix(model)]
    elif mode == "deep-vpt":
        prompts = getattr(model, "prompts", None)
        if not isinstance(prompts, nn.Parameter):
            raise ValueError(f"mode 'deep-vpt' needs a model with deep prompts (a `prompts` "
                             f"parameter); {type(model).__name__} has none -- build it with "
                             "prompt_tokens > 0")
        prefixes = ["prompts", _head_prefix(model)]
    else:  # last-k
        blocks = getattr(model, "blocks", None)
        if isinstance(blocks, nn.ModuleList):
            k = _check_k(k, len(blocks), "encoder blocks")
            prefixes = [f"blocks.{i}" for i in range(len(blocks) - k, len(blocks))]
            norm = getattr(model, "norm", None)
            if isinstance(norm, nn.Module):
                prefixes.append("norm")
            prefixes.append(_head_prefix(model))
        elif isinstance(model, nn.Sequential):
            children = _parameterised_children(model)
            k = _check_k(k, len(children), "parameterised layers")
            prefixes = children[len(children) - k:]
        else:
            raise ValueError(f"mode 'last-k' needs a model with a `blocks` nn.ModuleList or an "
                             f"nn.Sequential, got {type(model).__name__}")
    return [n for n in names if any(_under(n, p) for p in prefixes)]


def apply_mode(model: nn.Module, mode: str, k: int | None = None) -> list[str]:
    """Set ``requires_grad`` to True exactly for :func:`trainable_parameters`; return them."""
    names = trainable_parameters(model, mode, k=k)
    keep = set(names)
    for name, p in model.named_parameters():
        p.requires_grad_(name in keep)
    return names


def trainable_numel(model: nn.Module, names: list[str]) -> int:
    """Total number of elements of the parameters ``names`` of ``model``."""
    params = dict(model.named_parameters())
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(f"unknown parameter names: {missing}")
    return sum(params[n].numel() for n in names)
