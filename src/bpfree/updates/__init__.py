"""Update rules: how an estimate becomes new parameter values, beside estimators and transforms.

An estimator says *which direction*; transforms (:mod:`bpfree.transforms`) scale or reshape
it; an update rule writes it into the parameters in their own number format:

* :func:`sgd_`: float parameters, ``theta <- theta - lr * g``.
* :func:`round_and_clip_`: integer parameters, PMT Eq. 8 with Eq. 11's rounding,
  ``W <- clip(round(W - eta * GNS * QAS * g))`` (GNS and QAS are the transforms' factors).
* :func:`fixed_point_update`: QZO-FF Eq. 8 / Algorithm 1 lines 15-16, the update as one
  TFLite multiply-and-shift of the integer gradient accumulator, then saturation.
"""

from .fixed_point import fixed_point_update, qmax, saturate, update_multiplier
from .float_sgd import sgd_
from .integer import round_and_clip_

__all__ = ["fixed_point_update", "qmax", "round_and_clip_", "saturate", "sgd_",
           "update_multiplier"]
