"""TT-ZO (Zhao et al.): hybrid zeroth-order training and the baselines of its Tables 1-3.

* :mod:`.hybrid`: :class:`ZOTrainer` (ZO-RGE / ZO-signRGE / ZO-CGE (+momentum) / forward
  gradient on any ``nn.Module``), :class:`StallDetector`, :class:`HybridZO` (signRGE until the
  training loss stalls, then CGE with momentum; switch epoch and per-phase forwards logged).
* :mod:`.layerwise`: :class:`LayerwiseCGE`, ZO-CGE whose ``d + 1`` losses come from one
  forward and the layers after each coordinate (batched mode).
* the baselines, re-exported here from :mod:`bpfree.baselines` (and :mod:`.baselines`, the
  old path): :class:`BPTrainer` (FO), :class:`ForwardGradientW` (FG-W),
  :class:`ForwardGradientA` (FG-A), :class:`FeedbackAlignment` (FA),
  :class:`DirectFeedbackAlignment` (DFA); and from :mod:`bpfree.models.pruning`
  :func:`grasp_prune` + :class:`MaskedModel` (SP-MLP).
* :mod:`.models` / :mod:`.methods`: the §5.1 study's models (:func:`make_model`,
  :func:`compression_ratio`) and trainers (:func:`make_method`) by name.
* :mod:`.train`: :func:`train`, §5.1's schedule (lr 1e-3 × 0.9 every 10 epochs) on the shared
  :func:`bpfree.harness.fit`, with per-epoch validation accuracy and forward counts;
  :func:`queries_to_accuracy`.

All trainers follow the :class:`bpfree.harness.Method` protocol (``forwards`` per-sample
counter, ``step(x, y, lr) -> dict(loss=...)``). The ZO trainers also count
``batch_forwards`` (mini-batch loss evaluations), the paper's unit of "queries".
"""

from ..baselines import (BPTrainer, DirectFeedbackAlignment, FeedbackAlignment,
                         ForwardGradientA, ForwardGradientW)
from ..models.pruning import MaskedModel, grasp_prune, grasp_scores
from .hybrid import ESTIMATORS, HybridZO, StallDetector, ZOTrainer
from .layerwise import LayerwiseCGE, layerwise_losses
from .methods import METHODS, make_method
from .models import DENSE_PARAMS, MODELS, compression_ratio, make_model
from .train import TrainLog, queries_to_accuracy, train

__all__ = [
    "BPTrainer", "DENSE_PARAMS", "DirectFeedbackAlignment", "ESTIMATORS", "METHODS", "MODELS",
    "FeedbackAlignment", "ForwardGradientA", "ForwardGradientW", "HybridZO", "LayerwiseCGE",
    "MaskedModel",
    "StallDetector", "TrainLog", "ZOTrainer", "compression_ratio", "grasp_prune",
    "grasp_scores", "layerwise_losses", "make_method", "make_model", "queries_to_accuracy", "train",
]
