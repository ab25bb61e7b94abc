"""Optimizers that train with forward evaluations only, and :class:`ZOMethod`, which makes
one a :class:`bpfree.harness.Method` that :func:`bpfree.harness.fit` trains."""

from .method import ZOMethod
from .params import owners, select_parameters
from .zo_optimizer import MODES, StepStats, ZOOptimizer

__all__ = ["MODES", "StepStats", "ZOMethod", "ZOOptimizer", "owners", "select_parameters"]
