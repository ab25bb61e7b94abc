"""bpfree: train neural networks without back-propagation.

Gradients come only from forward evaluations: zeroth-order estimates, forward gradients and
local layer-wise rules. The usual entry points::

    from bpfree import Objective, ZOOptimizer, select_parameters
    from bpfree.estimators import rge, spsa, sign_spsa, cge, node_perturbation
    from bpfree.transforms import gradient_norm_scaling, cosine

See README.md for the tour and docs/ for how each module maps to the papers.
"""

__version__ = "0.1.0"

from .objective import Objective, cross_entropy_per_sample
from .optim import StepStats, ZOOptimizer, select_parameters

__all__ = ["Objective", "StepStats", "ZOOptimizer", "cross_entropy_per_sample",
           "select_parameters", "__version__"]
