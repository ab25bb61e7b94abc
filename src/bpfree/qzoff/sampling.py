"""Perturbation sampling for QZO-FF: plain seeded Gaussians and momentum-guided sampling (§3.4).

Plain directions are regenerated from their seed and never stored
(:func:`bpfree.perturb.gaussian`, and :func:`bpfree.perturb.quantized_gaussian_codes` for the
quantized codes of §3.3). Momentum-guided sampling needs the previous direction ``z_t`` and
stores exactly one copy of it per trainable tensor, as the paper describes ("allocating
additional memory to store the perturbation history").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..perturb import gaussian, quantization_scale

__all__ = ["MomentumSampling", "quantize_perturbation"]


def quantize_perturbation(z: torch.Tensor, bits: int = 8, z_max: float = 3.5) -> torch.Tensor:
    """Static symmetric quantization of a float direction (QZO-FF §3.3, Eq. 5 applied to z):
    ``z_q = clamp(round(z/Δz), ±(2**(b-1)-1))`` with ``Δz = z_max/(2**(b-1)-1)``; int32.

    The same rule as :func:`bpfree.perturb.quantized_gaussian`, applied to a given tensor (the
    momentum-guided mixture is not a fresh seeded Gaussian). Raises ValueError for
    ``z_max <= 0``.
    """
    scale = quantization_scale(bits, z_max)  # validates bits and z_max > 0
    q = 2 ** (bits - 1) - 1
    return torch.round(z.to(torch.float32) / scale).clamp_(-q, q).to(torch.int32)


@dataclass
class MomentumSampling:
    """Momentum-guided sampling (QZO-FF §3.4).

    ``z1 ~ N(0, α·I)``, ``z2 ~ N(z_t, (1−α)·I)``, ``z_{t+1} = β·z1 + (1−β)·z2``. We read the
    paper's "N(0, I_n·√α)" as standard deviation ``√α`` (variance ``α``). ``β`` follows a
    schedule that "starts at β = 1": ``β_t = 1`` for the first ``warmup`` draws, then ``beta``.
    At ``β = 1`` the draw is ``√α·n1``; with the default ``α = 1`` it is exactly the plain
    Gaussian of the same seed, so the warm-up phase *is* plain sampling.

    ``z_t`` is the previous draw oriented by its loss-difference sign
    (``sign(l+ − l−)·z``; the unsigned draw when the sign is 0). Orientation matters because a
    sign-m-SPSA direction and its negative give the same estimate, so only the oriented draw
    (which points along the estimated gradient) carries momentum. One copy per tensor is
    stored; the chain runs over directions (``m`` per step) in order.

    Args:
        alpha: variance split in [0, 1].
        beta: smoothing after warm-up, in [0, 1].
        warmup: number of draws (directions) with ``β = 1``.
    """

    alpha: float = 1.0
    beta: float = 0.9
    warmup: int = 0

    def __post_init__(self):
        for name in ("alpha", "beta"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and 0.0 <= v <= 1.0):
                raise ValueError(f"momentum sampling {name} must be in [0, 1], got {v!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup must be an int >= 0, got {self.warmup!r}")
        self.history: list[torch.Tensor | None] | None = None
        self.draws = 0

    def beta_at(self, draw: int) -> float:
        """The schedule: 1 during warm-up, ``beta`` afterwards."""
        return 1.0 if draw < self.warmup else float(self.beta)

    def sample(self, seeds: list[int], noise_seeds: list[int], shapes, device="cpu"
               ) -> list[torch.Tensor]:
        """One draw per tensor: ``n1`` from ``seeds`` (the plain-sampling seeds), ``n2`` from
        ``noise_seeds``; float32."""
        if self.history is None:
            self.history = [None] * len(shapes)
        beta = self.beta_at(self.draws)
        out = []
        for k, shape in enumerate(shapes):
            n1 = gaussian(seeds[k], shape, device=device)
            z1 = n1 if self.alpha == 1.0 else math.sqrt(self.alpha) * n1
            prev = self.history[k]
            if prev is None or beta == 1.0:
                z = z1  # warm-up, or no history yet to centre the second Gaussian on
            else:
                z2 = prev.clone()
                if self.alpha < 1.0:
                    z2 += math.sqrt(1.0 - self.alpha) * gaussian(noise_seeds[k], shape,
                                                                device=device)
                z = beta * z1 + (1.0 - beta) * z2
            out.append(z)
        self.draws += 1
        return out

    def record(self, directions: list[torch.Tensor], sign: int) -> None:
        """Store the oriented draw ``sign·z`` (or ``z`` when ``sign == 0``) as ``z_t``."""
        s = float(sign) if sign else 1.0
        self.history = [d.to(torch.float32) * s for d in directions]
