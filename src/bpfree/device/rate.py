"""``device run``'s learning rate: checked on the program itself before the run, or chosen.

As ``bpfree adapt`` refuses a QZO-FF rate at which no int8 weight can move or one step can
cross the whole int8 range (:meth:`~bpfree.qzoff.IntegerQZOFF.check_lr`), ``device run``
refuses a rate that does nothing or blows up, measured rather than bounded: PMT's step (Eq. 8
and 11) scales integer loss differences whose size only the data tells. The probe runs the
program two steps on its first batch (:func:`probe_rate`): the second step's loss is that
batch's loss after one update. A rate is

* too large when that one update more than doubles the batch's loss and raises it by more than
  :data:`BLOWUP_NATS` (issue 35: 0.1 sent MCUNet-in1 block 3's loss from 0.49 to 11.5), or
  moves a weight by more than :data:`MAX_STEP_CODES` codes, half the int8 range (adapt refuses
  a QZO-FF step that can cross all of it; on an untrained model even lr 1e4 lowers the loss
  while it throws every weight to the clip);
* too small when the update moves no int8 weight (Eq. 11 rounded every change to 0 codes).

Without ``--lr``, :func:`choose_rate` walks :data:`LADDER` from adapt's PMT default
(:data:`DEFAULT_LR`) down while too large, up while too small, and takes the first that passes.
The probe costs two steps of the program (deterministic: the run repeats them exactly).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .run import run_c

#: adapt's default PMT rate (``bpfree adapt --lr``), the ladder's starting point.
DEFAULT_LR = 0.01
#: Rates tried without ``--lr``, largest first (about three per decade).
LADDER = (0.3, 0.1, 0.03, 0.01, 0.003, 0.001, 3e-4, 1e-4, 3e-5, 1e-5)
#: A one-step rise of the batch's loss (nats) below which no rate is called too large.
BLOWUP_NATS = 0.5
#: The largest change of one int8 weight in one step (codes) a rate may cause.
MAX_STEP_CODES = 127


@dataclass(frozen=True)
class RateProbe:
    """One update at ``lr`` on one batch: its loss before and after, and the weights moved."""

    lr: float
    loss_before: float
    loss_after: float
    moved: int
    largest: int = 0

    @property
    def verdict(self) -> str:
        """"too large", "too small" or "ok"."""
        rise = self.loss_after - self.loss_before
        if (rise > BLOWUP_NATS and self.loss_after > 2 * self.loss_before
                or self.largest > MAX_STEP_CODES):
            return "too large"
        return "too small" if self.moved == 0 else "ok"

    def describe(self) -> str:
        return (f"one step at lr {self.lr:g} took the first batch's loss from "
                f"{self.loss_before:.3f} to {self.loss_after:.3f} and moved {self.moved} int8 "
                f"weight(s), the farthest by {self.largest} codes")


def _moved(program, model: torch.nn.Module) -> tuple[int, int]:
    """How many trainable int8 weights differ from the program's, and the largest change."""
    trained = dict(model.named_modules())
    start = dict(program.model.named_modules())
    moved, largest = 0, 0
    for row in program.meta["trainable"]:
        step = (trained[row["name"]].weight.to(torch.int32)
                - start[row["name"]].weight.to(torch.int32)).abs()
        moved += int((step > 0).sum())
        largest = max(largest, int(step.max()))
    return moved, largest


def probe_rate(program, x: torch.Tensor, y: torch.Tensor, batch_size: int,
               lr: float) -> RateProbe:
    """Two steps of ``program`` at ``lr`` on the first ``batch_size`` samples of ``(x, y)``."""
    xb, yb = x[:batch_size], y[:batch_size]
    result = run_c(program, xb, yb, steps=2, batch_size=len(xb), lr=lr)
    return RateProbe(lr, result.losses[0], result.losses[1], *_moved(program, result.model))


def check_rate(program, x, y, batch_size: int, lr: float) -> RateProbe:
    """Refuse (ValueError) a rate whose probe is too large or too small; a rate of 0 (no
    training, as asked) is not probed."""
    if lr == 0:
        return RateProbe(0.0, float("nan"), float("nan"), 0)
    probe = probe_rate(program, x, y, batch_size, lr)
    if probe.verdict != "ok":
        hint = "lower" if probe.verdict == "too large" else "higher"
        raise ValueError(f"--lr {lr:g} is {probe.verdict} for this program: "
                         f"{probe.describe()}; try a {hint} --lr, leave --lr out to let "
                         f"device run choose one, or pass --no-rate-check")
    return probe


def choose_rate(program, x, y, batch_size: int) -> tuple[float, list[RateProbe]]:
    """The first rate of :data:`LADDER` from :data:`DEFAULT_LR` whose probe passes, walking
    down while too large and up while too small; the probes tried, in order. A rate too large
    next to one too small, or the ladder's end, is a ValueError listing the probes."""
    i = LADDER.index(DEFAULT_LR)
    probes: list[RateProbe] = []
    direction = 0
    while 0 <= i < len(LADDER):
        probe = probe_rate(program, x, y, batch_size, LADDER[i])
        probes.append(probe)
        if probe.verdict == "ok":
            return probe.lr, probes
        step = 1 if probe.verdict == "too large" else -1
        if direction and step != direction:
            break
        direction, i = step, i + step
    raise ValueError("device run found no learning rate for this program: "
                     + "; ".join(p.describe() + f" ({p.verdict})" for p in probes)
                     + "; pass --lr (with --no-rate-check to skip the probe)")


__all__ = ["DEFAULT_LR", "LADDER", "RateProbe", "check_rate", "choose_rate", "probe_rate"]
