"""Update rules: how an estimate becomes new parameter values, beside estimators and transforms.

An estimator says *which direction*; transforms (:mod:`bpfree.transforms`) scale or reshape
it; an update rule writes it into the parameters in their own number format:

* :func:`sgd_`: float parameters, ``theta <- theta - lr * g``.
* :func:`integer_update_`: integer parameters, PMT Eq. 8 with Eq. 11's rounding,
  ``W <- clip(round(W - eta * GNS * QAS * g))`` (GNS and QAS are the transforms' factors),
  through :func:`round_and_clip_`.
* :func:`fixed_point_update`: QZO-FF Eq. 8 / Algorithm 1 lines 15-16, the update as one
  TFLite multiply-and-shift of the integer gradient accumulator (:func:`update_multiplier`),
  then :func:`subtract_and_saturate`.

:class:`~bpfree.optim.ZOOptimizer` applies them per parameter group (``update=`` one of
:data:`UPDATE_RULES`); PMT (:mod:`bpfree.updates.integer_layer`) and QZO-FF (:mod:`bpfree.qzoff.trainer`)
call the same functions.
"""

from .fixed_point import (fixed_point_update, qmax, quantize_multipliers, saturate,
                          subtract_and_saturate, update_multiplier)
from .float_sgd import sgd_
from .integer import integer_update_, round_and_clip_

#: The update rules a :class:`~bpfree.optim.ZOOptimizer` parameter group can name.
UPDATE_RULES = ("sgd", "round_and_clip", "fixed_point")

__all__ = ["UPDATE_RULES", "fixed_point_update", "integer_update_", "qmax",
           "quantize_multipliers", "round_and_clip_", "saturate", "sgd_",
           "subtract_and_saturate", "update_multiplier"]
