"""The methods the papers compare against, in one place, one module per concept.

* :mod:`.bp`: :class:`BPTrainer`, the one back-propagation trainer (SGD or Adam, parameter
  groups by module, frozen-statistics mode): TT-ZO's "FO" columns as is, PMT's
  "FullTrain FP32" (:class:`FullTrainFP32`) with PMT's settings.
* :mod:`.forward_gradient`: :class:`ForwardGradientW` (FG-W, Baydin et al. 2022) and
  :class:`ForwardGradientA` (FG-A, Ren et al. 2022), TT-ZO Table 3.
* :mod:`.feedback_alignment`: :class:`FeedbackAlignment` (FA, Lillicrap et al. 2016) and
  :class:`DirectFeedbackAlignment` (DFA, Nøkland 2016), TT-ZO Table 3.
* :mod:`.integer_zo`: :class:`MeZO` and :class:`DeepZeroCGE` on a real-quantized int8 model
  (integer perturbations, loss and update), PMT Tables 5–6.
* :mod:`.integer_bp`: :class:`FullTrainFP32`, :class:`FullTrainINT8` (BP through a
  fake-quantized twin, integer update with QAS) and :class:`SparseBP`, PMT Table 7.
* :mod:`.local_rules`: :class:`DRTP`, :class:`PEPITA`, :class:`FF` (Forward-Forward) and
  end-to-end :class:`BP` on binary / sliced networks, each with TinyFoA's +BW / +BA / +V
  (TinyFoA Tables 1–3); :mod:`.variants` parses those variant names for them and TinyFoA.

GraSP pruning (TT-ZO's SP-MLP) builds a model rather than training one, so it lives with the
models: :mod:`bpfree.models.pruning`. The papers' packages re-export their baselines at the
old paths (``bpfree.ttzo.baselines``, ``bpfree.pmt.baselines``,
``bpfree.tinyfoa.baselines``).
"""

from .bp import BPTrainer
from .feedback_alignment import DirectFeedbackAlignment, FeedbackAlignment
from .forward_gradient import ForwardGradientA, ForwardGradientW
from .integer_bp import FullTrainFP32, FullTrainINT8, SparseBP
from .integer_zo import DeepZeroCGE, MeZO
from .local_rules import BP, DRTP, FF, PEPITA

__all__ = ["BP", "BPTrainer", "DRTP", "DeepZeroCGE", "DirectFeedbackAlignment", "FF",
           "FeedbackAlignment", "ForwardGradientA", "ForwardGradientW", "FullTrainFP32",
           "FullTrainINT8", "MeZO", "PEPITA", "SparseBP"]
