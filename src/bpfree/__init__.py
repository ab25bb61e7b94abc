"""bpfree: train neural networks without back-propagation.

Gradients come only from forward evaluations: zeroth-order estimates, forward gradients and
local layer-wise rules. The usual entry points::

    from bpfree import Objective, ZOOptimizer, select_parameters
    from bpfree.estimators import rge, spsa, sign_spsa, cge, node_perturbation
    from bpfree.transforms import gradient_norm_scaling, cosine

See README.md for the tour and docs/ for how each module maps to the papers.

Names, one per concept (the glossary with each paper's symbol is in docs/PAPERS.md):
``num_queries`` for the perturbed queries per step (Q, m, N in the papers), ``mu`` for the
perturbation radius (μ, ε), ``forwards`` for per-sample forward passes and
``batch_forwards`` for passes over a whole batch. Paper-specific configs keep the paper's
letter where it is written into results (``PMTConfig.queries``, ``QZOFFConfig.m`` / ``eps``);
renamed arguments still accept their old name with a DeprecationWarning.
"""

import importlib

__version__ = "0.1.0"

# The entry points are imported on first use (PEP 562), so that `import bpfree` stays cheap:
# the `bpfree` command then starts without torch and can answer Ctrl-C while torch loads.
_LAZY = {"Objective": "objective", "cross_entropy_per_sample": "objective",
         "StepStats": "optim", "ZOMethod": "optim", "ZOOptimizer": "optim",
         "select_parameters": "optim"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'bpfree' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = ["Objective", "StepStats", "ZOMethod", "ZOOptimizer", "cross_entropy_per_sample",
           "select_parameters", "__version__"]
