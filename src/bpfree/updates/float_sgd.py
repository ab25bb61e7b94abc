"""The float update rule: plain SGD on a materialized gradient."""

from __future__ import annotations

from torch import Tensor


def sgd_(param: Tensor, grad: Tensor, lr: float) -> Tensor:
    """``theta <- theta - lr * g`` in place; ``grad`` is cast to the parameter's dtype first so a
    float64 estimate updates a float32 parameter with one rounding."""
    return param.sub_(grad.to(param.dtype) * lr)
