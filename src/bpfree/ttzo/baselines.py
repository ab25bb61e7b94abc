"""The baselines of TT-ZO Tables 1-3 (Zhao et al., §5.1), kept at their old import path.

They now live where a reader looks for them, and this module re-exports them:

* ``BPTrainer`` (the "FO" columns): :mod:`bpfree.baselines.bp`;
* ``grasp_scores``, ``grasp_prune``, ``MaskedModel`` (SP-MLP): :mod:`bpfree.models.pruning`;
* ``ForwardGradientW``, ``ForwardGradientA`` (FG-W, FG-A): :mod:`bpfree.baselines.forward_gradient`;
* ``FeedbackAlignment``, ``DirectFeedbackAlignment`` (FA, DFA):
  :mod:`bpfree.baselines.feedback_alignment`.
"""

from ..baselines import (BPTrainer, DirectFeedbackAlignment, FeedbackAlignment,
                         ForwardGradientA, ForwardGradientW)
from ..models.pruning import MaskedModel, grasp_prune, grasp_scores

__all__ = ["BPTrainer", "grasp_scores", "grasp_prune", "MaskedModel", "ForwardGradientW",
           "ForwardGradientA", "FeedbackAlignment", "DirectFeedbackAlignment"]
