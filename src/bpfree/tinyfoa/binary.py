"""Binary weights and activations (TinyFoA §2.2, Eq. 4–5), kept at their old import path.

They live in :mod:`bpfree.quant.binary` (the local-rule baselines use them too); this module
re-exports them.
"""

from ..quant.binary import (BinarizeWeight, BinaryLinear, LocallyConnected2d, SignSTE,
                            act_ste_mask, activate, activation_grad_mask, binarize_weight, sign,
                            weight_ste_mask)

__all__ = ["BinarizeWeight", "BinaryLinear", "LocallyConnected2d", "SignSTE", "act_ste_mask",
           "activate", "activation_grad_mask", "binarize_weight", "sign", "weight_ste_mask"]
