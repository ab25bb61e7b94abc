"""Gradient estimators that use forward evaluations only.

Each estimator is a small frozen dataclass with an ``estimate(ctx) -> Estimate`` method;
``get_estimator(name, **options)`` builds one by name.
"""

from __future__ import annotations

from .base import Estimate, QueryContext, materialize
from .coordinate import CoordinateWise, cge
from .forward_gradient import ForwardGradient, forward_gradient
from .node import NodePerturbation, node_perturbation, weight_gradients
from .weight import WeightPerturbation, rge, sign_rge, sign_spsa, spsa

_FACTORIES = {
    "rge": rge,
    "spsa": spsa,
    "sign_rge": sign_rge,
    "sign_spsa": sign_spsa,
    "cge": cge,
    "node_perturbation": node_perturbation,
    "forward_gradient": forward_gradient,
}


def list_estimators() -> list[str]:
    return sorted(_FACTORIES)


def get_estimator(name: str, **options):
    """Build an estimator by name: one of :func:`list_estimators`."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown estimator {name!r}; choose one of {', '.join(list_estimators())}")
    try:
        return _FACTORIES[name](**options)
    except TypeError as exc:
        raise TypeError(f"bad options for estimator {name!r}: {exc}") from None


__all__ = [
    "Estimate", "QueryContext", "materialize", "CoordinateWise", "cge", "ForwardGradient",
    "forward_gradient", "NodePerturbation", "node_perturbation", "weight_gradients",
    "WeightPerturbation", "rge", "sign_rge", "sign_spsa", "spsa", "get_estimator",
    "list_estimators",
]
