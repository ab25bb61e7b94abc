"""TinyFoA §3 memory and computation rules (Tables 1–3), per training phase.

The paper counts, per phase, activations, parameters (weights and biases) and their
gradients — scratch buffers excluded — at 4 bytes per full-precision value and 1 bit per
binary one (``4/32`` bytes), in MB = 2^20 bytes (one ``2048 × 2048`` fp32 matrix is 16.00):

=========  ================================================================================
phase      what is held (``W`` weights, ``b`` biases, ``a`` activations; ``w``/``x`` the
           forward bytes of a weight/activation: 4 or 4/32; ``s = M²`` FC, ``M`` LC, 1 w/o V)
=========  ================================================================================
forward    BP, DRTP, PEPITA: ``ΣW·w + Σb·4 + Σa·x`` (the whole network);
           TinyFoA: ``W·w + b·4 + (a_in + a_out)·x`` of the largest layer;
           FF: the same with positive and negative activations (``2·(a_in + a_out)·x``)
gradient   BP: ``ΣW·4/s`` (gradients) ``+ ΣW·w/s`` (weights for the backward pass)
           ``+ Σb·4 + Σa·x``; DRTP: ``ΣW·4/s + Σa·x`` (no weights: the target is projected);
           PEPITA: ``W·4/s + (a_in + a_out)·x`` of the largest layer; TinyFoA: that
           ``+ b·4``; FF: ``W·4 + b·4 + 2·(a_in + a_out)·x``
update     end-to-end (BP, DRTP): ``2·ΣW·4/s + 2·Σb·4/M``; layer-wise (PEPITA, FF,
           TinyFoA): ``2·W·4/s + 2·b·4/M`` of the largest layer (latent weights + gradients)
comp       inference ``FLOPs × bytes`` = ``Σ 2·W · 4`` × 1/2 (BW: additions only) × 1/2
           (BA only) or × 1/64 (BW + BA: XNOR + pop-count); PEPITA is normalised to the
           four-hidden-layer network (Table 1's †)
=========  ================================================================================

Inferred network for Table 1: four hidden layers of width **2048**. How: every
layer-wise forward entry is ``16.0x`` MB = one ``2048²`` fp32 matrix (16 MiB) and BP's
is ``48.06`` = three of them + ``0.0625`` = 8 × 2048 fp32 vectors (four biases and four
activations); binary weights give ``48/32 = 1.5`` (``1.56``), PEPITA's three hidden layers
``32.04``; the compute column ``96 = 3 · 2 · 2048² · 4 B``. So the paper counts the three
hidden-to-hidden matrices and the four hidden biases/activations — the input projection
(``D_x × 2048``) and the classifier are outside its count. :func:`fc_shape` encodes that
convention; :func:`paper_table1` reproduces Table 1/2's memory and computation columns
to within ±0.012 MB (the paper's own rounding/truncation is not consistent to the last
digit), and so all their ratios.

Registered with :mod:`bpfree.memory` as method ``"tinyfoa"`` (the full TinyFoA variant,
M = 2; ``bpfree memory --method tinyfoa``): :func:`memory_rule` builds a rule
``fn(profile, **options) -> MemoryReport`` from :func:`phase_bytes` for any variant. It reads
the Linear layers of the profile as the network (every Linear weight counted, so it is *not*
the paper's hidden-only convention of :func:`fc_shape`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..memory.report import MemoryReport
from ..memory.rules import register_rule
from .variants import TABLE1, TABLE2, Variant, parse_variant

__all__ = ["LayerShape", "NetShape", "PAPER_TABLE1", "fc_shape", "lc_shape", "memory_rule",
           "paper_table1", "phase_bytes", "phase_mb"]

MB = 2 ** 20
FP = 4.0          # bytes per full-precision value
BIT = 4.0 / 32    # bytes per binary value, as the paper counts it (32× smaller)


@dataclass(frozen=True)
class LayerShape:
    weights: int
    biases: int
    acts_in: int
    acts_out: int


@dataclass(frozen=True)
class NetShape:
    """The counted layers, plus biases/activations counted without a weight (see above)."""

    layers: tuple[LayerShape, ...]
    extra_biases: int = 0
    extra_acts: int = 0
    locally_connected: bool = False
    notes: dict = field(default_factory=dict)

    @property
    def total_weights(self) -> int:
        return sum(layer.weights for layer in self.layers)

    @property
    def total_biases(self) -> int:
        return sum(layer.biases for layer in self.layers) + self.extra_biases

    @property
    def total_acts(self) -> int:
        return sum(layer.acts_out for layer in self.layers) + self.extra_acts

    def largest(self) -> LayerShape:
        return max(self.layers, key=lambda layer: (layer.weights, layer.acts_in + layer.acts_out))


def fc_shape(widths: list[int]) -> NetShape:
    """The paper's FC convention: hidden widths ``[D_1 … D_L]``; weights ``D_l × D_{l+1}``
    between consecutive hidden layers, every hidden layer's bias and activation counted."""
    if len(widths) < 2:
        raise ValueError("fc_shape needs at least two hidden widths")
    layers = tuple(LayerShape(a * b, b, a, b) for a, b in zip(widths[:-1], widths[1:]))
    return NetShape(layers, extra_biases=widths[0], extra_acts=widths[0])


def lc_shape(specs: list[tuple[int, int, int, int]]) -> NetShape:
    """LC layers ``(in_channels, out_channels, in_size, kernel, stride)``-style tuples given as
    ``(C, O, positions P, kernel k)``: weights ``P·O·C·k²``, biases and outputs ``P·O``."""
    layers = []
    prev_out = None
    for c, o, p, k in specs:
        a_in = prev_out if prev_out is not None else c * p
        layers.append(LayerShape(p * o * c * k * k, p * o, a_in, p * o))
        prev_out = p * o
    return NetShape(tuple(layers), locally_connected=True)


def phase_bytes(variant: str | Variant, shape: NetShape, *, m: int = 2,
                comp_shape: NetShape | None = None) -> dict[str, float]:
    """Bytes of the forward / gradient / update phases and the ``comp`` FLOPs×bytes."""
    v = parse_variant(variant) if isinstance(variant, str) else variant
    if m < 1:
        raise ValueError(f"the slice count M must be >= 1, got {m}")
    mm = m if v.vertical else 1
    s = mm if shape.locally_connected else mm * mm
    w = BIT if v.binary_weights else FP
    x = BIT if v.binary_activations else FP
    big = shape.largest()
    sw, sb, sa = shape.total_weights, shape.total_biases, shape.total_acts
    io = big.acts_in + big.acts_out
    if v.base in ("BP", "DRTP"):
        fwd = sw * w + sb * FP + sa * x
        if v.base == "BP":
            grad = sw * FP / s + sw * w / s + sb * FP + sa * x
        else:
            grad = sw * FP / s + sa * x
        upd = 2 * sw * FP / s + 2 * sb * FP / mm
    elif v.base == "PEPITA":
        fwd = sw * w + sb * FP + sa * x
        grad = big.weights * FP / s + io * x
        upd = 2 * big.weights * FP / s + 2 * big.biases * FP / mm
    elif v.base == "FF":
        fwd = big.weights * w + big.biases * FP + 2 * io * x
        grad = big.weights * FP / s + big.biases * FP + 2 * io * x
        upd = 2 * big.weights * FP / s + 2 * big.biases * FP / mm
    else:  # TinyFoA
        fwd = big.weights * w + big.biases * FP + io * x
        grad = big.weights * FP / s + big.biases * FP + io * x
        upd = 2 * big.weights * FP / s + 2 * big.biases * FP / mm
    cs = comp_shape or shape
    factor = 1.0
    if v.binary_weights and v.binary_activations:
        factor = 1 / 64
    elif v.binary_weights or v.binary_activations:
        factor = 0.5
    comp = 2 * cs.total_weights * FP * factor
    return {"forward": fwd, "gradient": grad, "update": upd, "comp": comp}


def phase_mb(variant: str | Variant, shape: NetShape, **kw) -> dict[str, float]:
    return {k: b / MB for k, b in phase_bytes(variant, shape, **kw).items()}


def paper_table1(width: int = 2048, m: int = 2) -> dict[str, dict[str, float]]:
    """Table 1/2's memory and computation columns (MB) for the inferred network."""
    four = fc_shape([width] * 4)
    three = fc_shape([width] * 3)
    out = {}
    for name in (*TABLE1, *TABLE2):
        v = parse_variant(name)
        shape = three if v.base == "PEPITA" else four
        out[name] = phase_mb(v, shape, m=m, comp_shape=four)
    return out


#: The paper's Table 1 + 2 columns (Forward, Gradient, Update, Comp), in MB.
PAPER_TABLE1 = {
    "DRTP": (48.06, 48.03, 96.06, 96.0), "PEPITA": (32.04, 16.02, 32.01, 96.0),
    "FF": (16.04, 16.04, 32.01, 96.0), "TinyFoA-V-BA-BW": (16.02, 16.02, 32.01, 96.0),
    "BP": (48.06, 96.06, 96.06, 96.0),
    "DRTP+BW": (1.56, 48.03, 96.06, 48.0), "PEPITA+BW": (1.04, 16.02, 32.01, 48.0),
    "FF+BW": (0.54, 16.04, 32.01, 48.0), "TinyFoA-V-BA": (0.52, 16.02, 32.01, 48.0),
    "BP+BW": (1.56, 49.56, 96.06, 48.0),
    "DRTP+BW+BA": (1.53, 48.00, 96.06, 1.5), "PEPITA+BW+BA": (1.02, 16.00, 32.01, 1.5),
    "FF+BW+BA": (0.51, 16.00, 32.01, 1.5), "TinyFoA-V": (0.50, 16.00, 32.01, 1.5),
    "BP+BW+BA": (1.53, 49.53, 96.06, 1.5),
    "TinyFoA": (0.50, 4.01, 8.00, 1.5), "BP+BW+BA+V": (1.53, 12.41, 24.03, 1.5),
    "DRTP+BA": (48.03, 48.00, 96.06, 48.0), "PEPITA+BA": (32.02, 16.00, 32.01, 48.0),
    "FF+BA": (16.01, 16.00, 32.01, 48.0), "TinyFoA-V-BW": (16.01, 16.00, 32.01, 48.0),
    "BP+BA": (48.03, 96.03, 96.06, 48.0), "TinyFoA-BW-BA": (16.02, 4.02, 8.00, 96.0),
    "BP+V": (48.06, 24.06, 24.03, 96.0),
}


def memory_rule(variant: str, *, m: int = 2):
    """A ``bpfree.memory`` rule ``fn(profile, **options) -> MemoryReport`` for ``variant``.

    Reads ``profile_model``'s Linear layers as an FC network (every weight counted) and
    reports the three phases as parts ``forward``, ``gradient``, ``update`` (bytes).
    """
    v = parse_variant(variant)

    def rule(profile, **_options):
        dims = [(int(layer.input_shapes[0][-1]), int(layer.output_shapes[0][-1]))
                for layer in profile.layers if layer.type == "Linear"]
        if not dims:
            raise ValueError("the profile has no Linear layers")
        layers = tuple(LayerShape(i * o, o, i, o) for i, o in dims)
        b = phase_bytes(v, NetShape(layers), m=m)
        return MemoryReport(v.name, {k: int(round(b[k])) for k in ("forward", "gradient",
                                                                 "update")})

    return rule


#: TinyFoA §3 (Table 1 "TinyFoA" row) as the :mod:`bpfree.memory` method ``"tinyfoa"``.
register_rule("tinyfoa", memory_rule("TinyFoA"), dtype_bytes=1)
