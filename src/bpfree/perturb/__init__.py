"""Perturbation directions for zeroth-order training: generators, seeds, in-place perturb/restore.

* :func:`xorshift32`, :func:`rademacher_xorshift`: PMT Appendix F's XORShift32 and Rademacher
  sign generator, bit-exact with the MCU C code (device parity).
* :func:`rademacher_fast`, :func:`fill_rademacher_`: stateless counter-based (SplitMix64) signs,
  >1e9 values/s on one core, numba on CPU and a bit-identical torch path elsewhere.
* :func:`gaussian`, :func:`rademacher_torch`, :func:`quantized_gaussian` (QZO-FF §3.3).
* :class:`Distribution`, :func:`get_distribution`, :func:`list_distributions`: the registry
  optimizers choose directions from by name.
* :func:`derive_seed`: portable per-(run, step, query, tensor) seeds.
* :func:`perturb_`, :func:`restore_`: in-place ``t += alpha * xi`` with a bit-exact undo.
"""

from .counter import fill_rademacher_, rademacher_fast
from .distributions import (
    Distribution,
    Gaussian,
    QuantizedGaussian,
    RADEMACHER_GENERATORS,
    Rademacher,
    get_distribution,
    list_distributions,
    register_distribution,
)
from .gaussian import (
    QuantizedSample,
    dequantize,
    gaussian,
    quantization_scale,
    quantized_gaussian,
    quantized_gaussian_codes,
    quantized_one,
    quantized_second_moment,
    rademacher_torch,
)
from .inplace import Repair, add_direction_, perturb_, restore_
from .seeds import derive_seed
from .xorshift import rademacher_xorshift, xorshift32

__all__ = [
    "Distribution",
    "Gaussian",
    "QuantizedGaussian",
    "QuantizedSample",
    "RADEMACHER_GENERATORS",
    "Rademacher",
    "Repair",
    "add_direction_",
    "dequantize",
    "derive_seed",
    "fill_rademacher_",
    "gaussian",
    "get_distribution",
    "list_distributions",
    "perturb_",
    "quantization_scale",
    "quantized_gaussian",
    "quantized_gaussian_codes",
    "quantized_one",
    "quantized_second_moment",
    "rademacher_fast",
    "rademacher_torch",
    "rademacher_xorshift",
    "register_distribution",
    "restore_",
    "xorshift32",
]
