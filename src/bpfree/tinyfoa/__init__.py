"""TinyFoA (Huang & Aminifar, AAAI 2025): memory-efficient forward-only on-device learning.

- :mod:`bpfree.quant.binary` (re-exported by :mod:`.binary`) — binary weights
  (``mean|W|·sign(W)``) and activations with STE masks; FC and locally connected layers;
- :mod:`.local` — :class:`TinyFoA`: per-layer fixed random projections + local
  cross-entropy, vertical training on ``M × M`` (FC) / ``M`` (LC) slices, the slice
  schedule with ``F`` data exchanges;
- :mod:`bpfree.baselines.local_rules` (re-exported by :mod:`.baselines`) — BP, DRTP,
  PEPITA, FF with +BW / +BA / +V; :func:`make_method` builds TinyFoA or any of them by name;
- :mod:`.variants` — the tables' rows (the variant names' parser,
  :func:`parse_variant`, is :mod:`bpfree.baselines.variants`', shared with the baselines);
- :mod:`.accounting` — §3's memory / computation rules (Tables 1–3);
- :mod:`.train` — :func:`fit_epochs` (the shared harness plus the slice schedule).
"""

from .accounting import PAPER_TABLE1, fc_shape, lc_shape, memory_rule, paper_table1, phase_mb
from ..baselines.local_rules import BP, DRTP, FF, PEPITA
from ..quant.binary import BinaryLinear, LocallyConnected2d, binarize_weight, sign
from .baselines import make_method
from .local import SlicedFC, SlicedLC, TinyFoA, check_slices
from .train import evaluate, fit_epochs
from .variants import TABLE1, TABLE2, TABLE3, Variant, parse_variant

__all__ = ["BP", "DRTP", "FF", "PAPER_TABLE1", "PEPITA", "TABLE1", "TABLE2", "TABLE3",
           "BinaryLinear", "LocallyConnected2d", "SlicedFC", "SlicedLC", "TinyFoA", "Variant",
           "binarize_weight", "check_slices", "evaluate", "fc_shape", "fit_epochs", "lc_shape",
           "make_method", "memory_rule", "paper_table1", "parse_variant", "phase_mb", "sign"]
