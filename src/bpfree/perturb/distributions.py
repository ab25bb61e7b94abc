"""A common interface for perturbation directions, and the registry optimizers look them up in.

Every distribution is a small frozen dataclass with a registry ``name`` and
``sample(seed, shape, *, dtype, device)`` returning float directions xi that regenerate exactly
from ``seed``. ``second_moment`` is ``E[xi**2]`` per coordinate, which zeroth-order estimators
divide by so that ``E[xi xi^T] / second_moment = I`` (1 for Rademacher and Gaussian,
``dz**2 E[z_q**2]`` for QZO-FF's quantized Gaussian). Integer-valued distributions also
provide ``sample_int`` (codes with ``sample == sample_int * int_scale``) for integer-weight
perturbation on quantized models (QZO-FF §3.3, Eq. 6).

Registered names:

* ``"rademacher"``: +-1 signs; kwarg ``generator`` = ``"counter"`` (fast stateless counter-based
  signs of :mod:`.counter`, the simulation default), ``"xorshift"`` (device-parity XORShift32 of
  PMT Appendix F, :mod:`.xorshift`) or ``"torch"`` (``torch.randint``).
* ``"rademacher_xorshift"``, ``"rademacher_torch"``: aliases of ``"rademacher"`` with that
  generator.
* ``"gaussian"``: ``torch.randn``.
* ``"quantized_gaussian"``: QZO-FF §3.3, kwargs ``bits`` (2..16, default 8) and ``z_max``
  (default 3.5).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from ._validation import (
    check_float_dtype,
    check_int_dtype,
    check_seed32_nonzero,
    check_seed64,
)
from .counter import rademacher_fast
from .gaussian import (
    _check_bits,
    _check_z_max,
    gaussian,
    quantized_gaussian,
    quantized_second_moment,
    rademacher_torch,
)
from .xorshift import rademacher_xorshift


@dataclass(frozen=True)
class Distribution(ABC):
    """Base class of perturbation distributions (see the module docstring)."""

    #: Registry name, e.g. ``"rademacher"``.
    name: ClassVar[str] = ""
    #: Whether :meth:`sample_int` is available (values are integer codes times ``int_scale``).
    integer_valued: ClassVar[bool] = False

    @property
    def second_moment(self) -> float:
        """``E[xi**2]`` per coordinate of :meth:`sample`."""
        return 1.0

    @property
    def int_scale(self) -> float:
        """Scale with ``sample == sample_int * int_scale`` (integer-valued distributions only)."""
        raise ValueError(f"distribution {self.name!r} is not integer-valued")

    def check_seed(self, seed: object) -> int:
        """Validate ``seed`` for this distribution: an int in [0, 2**64 - 1] unless overridden.

        Seeds from :func:`bpfree.perturb.derive_seed` are valid for every distribution."""
        return check_seed64(seed)

    @abstractmethod
    def sample(self, seed: int, shape, *, dtype: torch.dtype = torch.float32,
               device="cpu") -> torch.Tensor:
        """Float directions of ``shape``; the same arguments always give the same tensor."""

    def sample_int(self, seed: int, shape, *, dtype: torch.dtype | None = None,
                   device="cpu") -> torch.Tensor:
        """Integer codes z with ``sample(...) == z * int_scale`` (integer-valued only).

        ``dtype=None`` picks the narrowest signed dtype holding every code (int8 for signs)."""
        raise ValueError(
            f"distribution {self.name!r} is not integer-valued; integer codes are available for "
            f"{[n for n in list_distributions() if get_distribution(n).integer_valued]}"
        )


_REGISTRY: dict[str, type[Distribution]] = {}


def register_distribution(cls: type[Distribution]) -> type[Distribution]:
    """Class decorator registering a :class:`Distribution` subclass under ``cls.name``."""
    if not (isinstance(cls, type) and issubclass(cls, Distribution)) or not cls.name:
        raise ValueError("register_distribution expects a Distribution subclass with a name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"distribution name {cls.name!r} is already registered")
    _REGISTRY[cls.name] = cls
    return cls


def list_distributions() -> list[str]:
    """Registered names and aliases, the default (``"rademacher"``) first."""
    return list(_REGISTRY) + [a for a in _ALIASES if a not in _REGISTRY]


def get_distribution(name: str | Distribution, **kwargs) -> Distribution:
    """Instantiate the distribution registered as ``name`` with ``kwargs``.

    A :class:`Distribution` instance (with no kwargs) is returned unchanged, so callers can
    accept either a name or a configured object.
    """
    if isinstance(name, Distribution):
        if kwargs:
            raise ValueError("kwargs are only accepted with a distribution name, not an instance")
        return name
    if not isinstance(name, str) or name not in list_distributions():
        raise ValueError(f"unknown distribution {name!r}; known names: {list_distributions()}")
    cls, preset = _ALIASES.get(name, (_REGISTRY.get(name), {}))
    allowed = [f.name for f in dataclasses.fields(cls) if f.name not in preset]
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown argument(s) {unknown} for distribution {name!r}; allowed: {allowed or 'none'}"
        )
    return cls(**preset, **kwargs)


def _rademacher_counter(seed, shape, dtype, device):
    return rademacher_fast(seed, shape, dtype=dtype, device=device)


def _rademacher_xorshift(seed, shape, dtype, device):
    return rademacher_xorshift(seed, shape).to(device=device, dtype=dtype)


def _rademacher_torch(seed, shape, dtype, device):
    return rademacher_torch(seed, shape, dtype=dtype, device=device)


#: Rademacher sign generators: one distribution, three streams of the same law.
RADEMACHER_GENERATORS = {
    "counter": _rademacher_counter,    # stateless SplitMix64 counter: the simulation default
    "xorshift": _rademacher_xorshift,  # PMT Appendix F's XORShift32: bit parity with a device
    "torch": _rademacher_torch,        # torch.randint with a seeded generator
}


@dataclass(frozen=True)
class Rademacher(Distribution):
    """+-1 signs, ``E[xi**2] = 1``; ``generator`` picks the stream (:data:`RADEMACHER_GENERATORS`).

    ``"xorshift"`` is the device-parity stream of PMT Appendix F and takes seeds in
    [1, 2**32 - 1] (XORShift32 has no zero state); the others take any 64-bit seed.
    """

    integer_valued: ClassVar[bool] = True
    generator: str = "counter"

    @property
    def name(self) -> str:
        """The registry name that builds this distribution (the alias for a non-default
        generator), so results and messages say which stream ran."""
        return "rademacher" if self.generator == "counter" else f"rademacher_{self.generator}"

    def __post_init__(self):
        if self.generator not in RADEMACHER_GENERATORS:
            raise ValueError(f"Rademacher generator must be one of "
                             f"{list(RADEMACHER_GENERATORS)}, got {self.generator!r}")

    @property
    def int_scale(self) -> float:
        return 1.0

    def check_seed(self, seed):
        if self.generator == "xorshift":
            return check_seed32_nonzero(seed)
        return check_seed64(seed)

    def sample(self, seed, shape, *, dtype=torch.float32, device="cpu"):
        check_float_dtype(dtype)
        return RADEMACHER_GENERATORS[self.generator](self.check_seed(seed), shape, dtype, device)

    def sample_int(self, seed, shape, *, dtype=None, device="cpu"):
        dtype = check_int_dtype(torch.int8 if dtype is None else dtype)
        return RADEMACHER_GENERATORS[self.generator](self.check_seed(seed), shape, dtype, device)


_REGISTRY["rademacher"] = Rademacher  # registered by hand: its name is per instance

# Registry names kept from when each generator was its own class.
_ALIASES: dict[str, tuple[type[Distribution], dict]] = {
    "rademacher_xorshift": (Rademacher, {"generator": "xorshift"}),
    "rademacher_torch": (Rademacher, {"generator": "torch"}),
}


@register_distribution
@dataclass(frozen=True)
class Gaussian(Distribution):
    """Standard normal directions from ``torch.randn`` with a seeded generator."""

    name: ClassVar[str] = "gaussian"

    def sample(self, seed, shape, *, dtype=torch.float32, device="cpu"):
        return gaussian(self.check_seed(seed), shape, dtype=dtype, device=device)


@register_distribution
@dataclass(frozen=True)
class QuantizedGaussian(Distribution):
    """QZO-FF §3.3 quantized Gaussian: ``sample`` is ``z_q * dz``, ``sample_int`` is ``z_q``.

    Attributes:
        bits: bit width b in [2, 16] (8 in the paper).
        z_max: static clipping range > 0 (3.5 in the paper, giving dz = 0.0276, 1_q = 36).
    """

    name: ClassVar[str] = "quantized_gaussian"
    integer_valued: ClassVar[bool] = True
    bits: int = 8
    z_max: float = 3.5

    def __post_init__(self):
        # Normalise through the validators so equal configurations compare and hash equal.
        object.__setattr__(self, "bits", _check_bits(self.bits))
        object.__setattr__(self, "z_max", _check_z_max(self.z_max))

    @property
    def int_scale(self) -> float:
        """``dz = z_max / (2**(bits-1) - 1)``."""
        return self.z_max / (2 ** (self.bits - 1) - 1)

    @property
    def second_moment(self) -> float:
        """``dz**2 E[z_q**2]``, slightly below 1 (clipping) for the paper's settings."""
        return quantized_second_moment(self.bits, self.z_max)

    def sample(self, seed, shape, *, dtype=torch.float32, device="cpu"):
        check_float_dtype(dtype)
        q = quantized_gaussian(self.check_seed(seed), shape, self.bits, self.z_max, device=device)
        return q.values(dtype)

    def sample_int(self, seed, shape, *, dtype=None, device="cpu"):
        if dtype is None:
            dtype = torch.int8 if self.bits <= 8 else torch.int16
        dtype = check_int_dtype(dtype)
        if torch.iinfo(dtype).max < 2 ** (self.bits - 1) - 1:
            raise ValueError(
                f"dtype {dtype} cannot hold {self.bits}-bit codes; use torch.int16 or wider"
            )
        q = quantized_gaussian(self.check_seed(seed), shape, self.bits, self.z_max, device=device)
        return q.codes.to(dtype)


