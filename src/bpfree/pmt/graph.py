"""The integer model's trainable layers and stages, kept at their old import path.

They live in :mod:`bpfree.quant.graph` (QZO-FF's integer path and the integer ZO baselines
use them too); this module re-exports them.
"""

from ..quant.graph import (AFFINE_TYPES, StagedModel, TrainableLayer, find_layers, per_sample_loss,
                           select_layers)

__all__ = ["AFFINE_TYPES", "StagedModel", "TrainableLayer", "find_layers", "per_sample_loss",
           "select_layers"]
