"""The baselines PMT is compared with (§4.2.2, §4.3, Tables 5–7), kept at their old import path.

They live in :mod:`bpfree.baselines`, and this module re-exports them:

* ``MeZO``, ``DeepZeroCGE`` (BP-free, on the int8 model): :mod:`bpfree.baselines.integer_zo`;
* ``FullTrainFP32``, ``FullTrainINT8``, ``SparseBP`` (Table 7's BP rows):
  :mod:`bpfree.baselines.integer_bp`.
"""

from ..baselines.integer_bp import FullTrainFP32, FullTrainINT8, SparseBP
from ..baselines.integer_zo import DeepZeroCGE, MeZO

__all__ = ["DeepZeroCGE", "FullTrainFP32", "FullTrainINT8", "MeZO", "SparseBP"]
