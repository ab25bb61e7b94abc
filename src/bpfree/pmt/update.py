"""PMT's integer update (Eq. 8 with GNS and QAS, Eq. 11), kept at its old import path.

It lives in :mod:`bpfree.updates.integer_layer` beside the other update rules; this module
re-exports it.
"""

from ..updates.integer_layer import (INT32_MAX, INT32_MIN, LayerEstimate, apply_update,
                                     quantization_aware_scales)

__all__ = ["INT32_MAX", "INT32_MIN", "LayerEstimate", "apply_update", "quantization_aware_scales"]
