"""Optimizers that train with forward evaluations only."""

from .params import owners, select_parameters
from .zo_optimizer import MODES, StepStats, ZOOptimizer

__all__ = ["MODES", "StepStats", "ZOOptimizer", "owners", "select_parameters"]
