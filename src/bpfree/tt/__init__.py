"""Tensor-train (TT) compressed layers (TT-ZO, Zhao et al., §3.1 and §5.1).

* :mod:`.decompose`: the TT matrix format (Eq. 7), :func:`tt_svd` (dense -> TT with a rank
  cap and optional error bound), :func:`tt_to_dense`, :func:`tt_num_parameters`.
* :mod:`.layers`: :class:`TTLinear` (forward by core contraction without forming ``W``,
  :meth:`~TTLinear.forward_batched` over Q copies of the cores, :meth:`~TTLinear.from_dense`),
  :func:`tt_contract`.
* :mod:`.mlp`: :func:`tt_mlp`, the paper's 784-1024-10 TT-MLP, and :func:`dense_mlp`.

Convention: ``W`` is ``(M, N)``, ``y = W x``; ``out_factors`` fold ``M``, ``in_factors`` fold
``N``; core ``k`` is ``(r_{k-1}, m_k = out_factors[k], n_k = in_factors[k], r_k)``.
"""

from .decompose import (
    check_factors,
    check_ranks,
    full_ranks,
    merge_cores,
    tt_num_parameters,
    tt_svd,
    tt_to_dense,
)
from .layers import TTLinear, best_plan, plan_cost, tt_contract
from .mlp import PAPER_FACTORS, dense_mlp, tt_mlp, tt_mlp_num_parameters

__all__ = [
    "PAPER_FACTORS", "TTLinear", "best_plan", "check_factors", "check_ranks", "dense_mlp",
    "full_ranks", "merge_cores", "plan_cost", "tt_contract", "tt_mlp", "tt_mlp_num_parameters",
    "tt_num_parameters", "tt_svd", "tt_to_dense",
]
