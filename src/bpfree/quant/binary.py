"""Binary weights and activations with straight-through gradients (TinyFoA §2.2, Eq. 4–5).

- weights: ``W_b = mean|W| · sign(W)`` (XNOR-Net scaling, one scale per layer, Rastegari et
  al. 2016); the straight-through gradient is passed to the latent ``W`` only where
  ``|W| <= 1`` (Hubara et al. 2016) — :func:`weight_ste_mask`;
- activations: ``h_b = sign(z)`` (``sign(0) = +1``); the gradient passes where ``|z| <= 1``
  (hardtanh straight-through) — :func:`act_ste_mask`; the paper's ``1_{|h_l| <= 1}`` is
  read as a mask on the pre-sign value ``z`` (``|sign(z)|`` is always 1). Without binary
  activations the activation is ReLU and its derivative ``1_{z > 0}`` (Eq. 2).

  Deviation: Eq. 5 as printed keeps Eq. 2's ``1_{z > 0}`` next to the STE mask (the
  authors' code applies ReLU after the sign, so their ``h ∈ {0, α}``). We use symmetric
  ``±1`` activations and drop ``1_{z > 0}`` — the usual BinaryNet form; a by-hand run of
  the quick setting (MNIST 8,000 images, 3 epochs, 3 seeds) gave about the same error for
  TinyFoA-V and a higher one for TinyFoA with the ``{0, 1}`` form.

Layers: :class:`BinaryLinear` (fully connected) and :class:`LocallyConnected2d` (a
convolution without weight sharing: one kernel per output position), both autograd-friendly
(used by the BP / DRTP / PEPITA / FF baselines of :mod:`bpfree.baselines.local_rules`).
TinyFoA's own sliced layers live in :mod:`bpfree.tinyfoa.local` and compute Eq. 5 by hand.
This module moved here from ``bpfree.tinyfoa.binary`` (which re-exports it): binary weights
and activations are a number format that TinyFoA and the baselines share.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["BinarizeWeight", "BinaryLinear", "LocallyConnected2d", "SignSTE", "act_ste_mask",
           "activate", "activation_grad_mask", "binarize_weight", "sign", "weight_ste_mask"]


def sign(x: torch.Tensor) -> torch.Tensor:
    """``+1`` where ``x >= 0``, ``-1`` elsewhere (never 0, so every value is one bit)."""
    return torch.where(x >= 0, 1.0, -1.0).to(x.dtype)


def binarize_weight(w: torch.Tensor) -> torch.Tensor:
    """``mean|W| · sign(W)`` — XNOR-Net's binary weights with one scale for the tensor."""
    return w.abs().mean() * sign(w)


def weight_ste_mask(w: torch.Tensor) -> torch.Tensor:
    """``1_{|W| <= 1}``: where the straight-through gradient reaches the latent weight (Eq. 5)."""
    return (w.abs() <= 1).to(w.dtype)


def act_ste_mask(z: torch.Tensor) -> torch.Tensor:
    """``1_{|z| <= 1}``: where the straight-through gradient passes a binary activation."""
    return (z.abs() <= 1).to(z.dtype)


def activate(z: torch.Tensor, binary: bool) -> torch.Tensor:
    """The hidden activation: ``sign(z)`` with binary activations, else ``ReLU(z)``."""
    return sign(z) if binary else torch.relu(z)


def activation_grad_mask(z: torch.Tensor, binary: bool) -> torch.Tensor:
    """``dh/dz`` as used by every method here: STE mask or ReLU's ``1_{z > 0}``."""
    return act_ste_mask(z) if binary else (z > 0).to(z.dtype)


class BinarizeWeight(torch.autograd.Function):
    """Forward ``mean|W|·sign(W)``; backward ``grad ⊙ 1_{|W| <= 1}`` (straight through)."""

    @staticmethod
    def forward(ctx, w):
        ctx.save_for_backward(w)
        return binarize_weight(w)

    @staticmethod
    def backward(ctx, grad):
        (w,) = ctx.saved_tensors
        return grad * weight_ste_mask(w)


class SignSTE(torch.autograd.Function):
    """Forward ``sign(z)``; backward ``grad ⊙ 1_{|z| <= 1}``."""

    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return sign(z)

    @staticmethod
    def backward(ctx, grad):
        (z,) = ctx.saved_tensors
        return grad * act_ste_mask(z)


def act(z: torch.Tensor, binary: bool) -> torch.Tensor:
    """Autograd version of :func:`activate`."""
    return SignSTE.apply(z) if binary else torch.relu(z)


class BinaryLinear(nn.Module):
    """Fully connected layer whose forward uses binary weights when ``binary_weights``.

    ``weight`` is the full-precision latent weight (what SGD updates); the forward pass
    sees :func:`binarize_weight` of it, and gradients flow back through the STE mask.
    """

    def __init__(self, in_features: int, out_features: int, *, binary_weights: bool = False,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        bound = math.sqrt(6.0 / in_features)  # Kaiming uniform (ReLU)
        self.weight = nn.Parameter(
            (torch.rand(out_features, in_features, generator=generator) * 2 - 1) * bound)
        self.bias = nn.Parameter(torch.zeros(out_features))
        self.binary_weights = bool(binary_weights)

    def effective_weight(self) -> torch.Tensor:
        return BinarizeWeight.apply(self.weight) if self.binary_weights else self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.effective_weight(), self.bias)


class LocallyConnected2d(nn.Module):
    """Convolution without weight sharing: every output position has its own kernels.

    Input ``[B, C, H, W]``; ``weight`` is ``[P, O, C·k·k]`` with ``P`` the output positions,
    ``bias`` ``[P, O]``; output ``[B, O, H', W']``. ``binary_weights`` as in
    :class:`BinaryLinear` (one scale for the layer).
    """

    def __init__(self, in_channels: int, out_channels: int, in_size: int, kernel_size: int,
                 stride: int = 1, *, binary_weights: bool = False,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if kernel_size > in_size:
            raise ValueError(f"kernel_size {kernel_size} exceeds the input size {in_size}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.in_size = kernel_size, stride, in_size
        self.out_size = (in_size - kernel_size) // stride + 1
        positions = self.out_size ** 2
        fan_in = in_channels * kernel_size ** 2
        bound = math.sqrt(6.0 / fan_in)
        self.weight = nn.Parameter(
            (torch.rand(positions, out_channels, fan_in, generator=generator) * 2 - 1) * bound)
        self.bias = nn.Parameter(torch.zeros(positions, out_channels))
        self.binary_weights = bool(binary_weights)

    def patches(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C·k·k, P]`` input patches."""
        return F.unfold(x, self.kernel_size, stride=self.stride)

    def effective_weight(self) -> torch.Tensor:
        return BinarizeWeight.apply(self.weight) if self.binary_weights else self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.einsum("bcp,poc->bpo", self.patches(x), self.effective_weight()) + self.bias
        return z.permute(0, 2, 1).reshape(x.shape[0], self.out_channels, self.out_size,
                                          self.out_size)
