"""The integer update rule of PMT: round and clip (Eq. 8 and Eq. 11)."""

from __future__ import annotations

from torch import Tensor


def round_and_clip_(step: Tensor, weight: Tensor, low: int, high: int) -> Tensor:
    """``clip(round(W + step), low, high)``, computed in ``step``'s buffer and returned.

    ``step`` is the already scaled update ``-eta * GNS * QAS * g`` (PMT Eq. 8); it is overwritten
    so that the update needs no second buffer of the layer's size (§3.2.2: the gradient buffer
    becomes the new weights). Rounding is round-half-to-even (``torch.round``): Eq. 11 only
    says "rounded". ``low``/``high``: the integer range, e.g. [-128, 127] for int8 weights.
    """
    if low > high:
        raise ValueError(f"clip range must have low <= high, got [{low}, {high}]")
    return step.add_(weight).round_().clamp_(low, high)


def integer_update_(grad: Tensor, weight: Tensor, lr: float, low: int, high: int,
                    channel_factor: Tensor | None = None) -> Tensor:
    """PMT Eq. 8 for one integer tensor: ``clip(round(W - lr * c[ch] * g), low, high)``.

    ``lr`` is the scalar part of the rate (``eta_t`` times GNS, ``NQ/(NQ+d-1)``) and
    ``channel_factor`` the optional per-output-channel part (QAS ``1/s[ch]^2``, Appendix B),
    one value per entry of ``grad``'s dim 0. ``grad`` (a float buffer, typically float64) is
    consumed: it becomes the returned new values, so the update needs no second buffer of the
    tensor's size (§3.2.2). The multiplications happen in that order, ``(g * -lr) * c``, which
    the trained-weight digests pin.
    """
    return round_and_clip_(scaled_step_(grad, lr, channel_factor), weight, low, high)


def scaled_step_(grad: Tensor, lr: float, channel_factor: Tensor | None = None) -> Tensor:
    """``-lr * c[ch] * g`` in ``grad``'s buffer (consumed), multiplied in that order,
    ``(g * -lr) * c``: the step of Eq. 8 before it is added to the weights and rounded."""
    step = grad.mul_(-lr)
    if channel_factor is not None:
        if channel_factor.dim() != 1 or channel_factor.numel() != step.shape[0]:
            raise ValueError(f"channel_factor must hold one value per output channel "
                             f"({step.shape[0]}), got shape {tuple(channel_factor.shape)}")
        view = channel_factor.to(device=step.device).view(-1, *[1] * (step.dim() - 1))
        step.mul_(view)
    return step
