"""Baselines shared by the papers' comparisons.

* :class:`BPTrainer`: the one back-propagation trainer (SGD or Adam, parameter groups by
  module, frozen-statistics mode). TT-ZO's "FO" columns use it as is
  (:class:`bpfree.ttzo.BPTrainer` is this class) and PMT's "FullTrain FP32"
  (:class:`bpfree.pmt.FullTrainFP32`) is it with PMT's settings.

Baselines that are another algorithm rather than a setting of this one stay with the paper
that compares against them: the real-quantized BP of PMT (:class:`bpfree.pmt.FullTrainINT8`,
an integer update through a fake-quantized twin), TT-ZO's forward-gradient and feedback
alignment trainers, TinyFoA's binary DRTP / PEPITA / FF variants.
"""

from .bp import BPTrainer

__all__ = ["BPTrainer"]
