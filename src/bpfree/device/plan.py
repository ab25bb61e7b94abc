"""The static arena of a device program, planned from buffer lifetimes of the stage schedule.

One training step (Algorithm 1, PMT appendix A) runs in this order, per (micro-)batch:

1. the clean forward of the whole model (line 4), which keeps the input ``A_k0`` of the first
   stage that holds a trainable layer;
2. for each stage ``k`` with trainable layers, in forward order: the Q perturbed partial
   forwards of each of its layers, all starting from the stage input ``A_k`` (lines 9-11 and
   19-24); then the *stage pass*, which recomputes the stage's operators with the step-t
   weights (line 34) and, right after each trainable operator, forms that layer's estimate from
   the regenerated perturbations and either updates its weights in place (line 33) or, with
   micro-batches, adds it to the layer's integer sums. The stage pass ends with ``A_{k+1}``,
   from which the next stage starts (frozen stages in between are run clean).

So at any time one stage input is held, and no buffer grows with the number of trainable
weights: a layer's estimate is never stored, only its Q (WP) or Q*N (NP) loss differences,
from which :c:func:`bpf_step` regenerates it (the XORShift32 streams are replayed from their
seeds, Algorithm 1 lines 12 and 25).

Activation tensors are placed twice over:

* ``off``: where the clean forward and the stage passes write them. These follow the operator
  order, so a first-fit over the lifetimes [producer, last consumer] is safe for both; the
  kept ``A_k0`` lives until the end of the clean forward.
* per trainable stage ``k``, where the perturbed partial forwards from ``k`` write them. Those
  run while ``off`` holds only the stage input ``A_k`` (stages are cut points of the graph),
  so each of these placements is a first-fit that avoids ``off(A_k)`` and nothing else; the
  tables cost ``4 * tensors`` bytes of flash per trainable stage.

First-fit is a heuristic; a few orders (largest first, longest-lived first, earliest first)
are tried and the smallest arena is kept.

The fixed buffers (per-sample losses, loss differences, replayed generator states, one
channel of the regenerated node gradient, the WP weight backup and, with micro-batches only,
the int64 sums of every trainable layer) sit below the activations.
"""

from __future__ import annotations

from dataclasses import dataclass

from .lower import Graph

ALIGN = 8
#: The im2col block's least size in int16 elements: small reductions get blocks of many
#: columns, so each output channel's requantization constants are loaded once per block.
SCRATCH_FLOOR = 1024
#: bpfree_runtime.c's BPF_DW_MAX_TAPS: larger depthwise kernels take the direct loops.
DW_MAX_TAPS = 64


def kernel_scratch_elems(graph: Graph) -> int:
    """Int16 elements of the kernels' scratch (``bpf_model.scratch``): two im2col columns of
    the largest reduction of a groups-1 layer (at least :data:`SCRATCH_FLOOR`), plus one
    spare column for a non-pointwise one, and the
    kh + 1 padded rows of every depthwise layer's ring (bpfree_runtime.c's DW_ROW_STRIDE)."""
    need = 0
    for op in graph.affine_ops():
        m = op.module
        w = m.weight
        red = w.numel() // w.shape[0]
        groups = getattr(m, "groups", 1)
        if groups == 1:  # a convolution's column is also built in a spare column first
            pointwise = tuple(getattr(m, "kernel_size", (1, 1))) == (1, 1) and \
                tuple(getattr(m, "stride", (1, 1))) == (1, 1) and \
                tuple(getattr(m, "padding", (0, 0))) == (0, 0)
            need = max(need, SCRATCH_FLOOR + (0 if pointwise else red),
                       (2 if pointwise else 3) * red)
        elif groups == w.shape[0] == m.in_channels and tuple(m.dilation) == (1, 1) \
                and red <= DW_MAX_TAPS:
            t = graph.tensors[op.inputs[0]]
            need = max(need, (m.kernel_size[0] + 1) * ((t.w + 2 * m.padding[1] + 2) // 2 * 2))
    return need


@dataclass(frozen=True)
class Buffer:
    name: str
    offset: int
    size: int
    lifetime: tuple[int, int] | None = None  # op interval for activation buffers


@dataclass(frozen=True)
class TrainableSpec:
    """What the planner needs of one trainable layer."""

    op: int
    mode: str  # "wp" or "np"
    d_w: int
    d_a: int
    cout: int


@dataclass(frozen=True)
class ArenaPlan:
    buffers: tuple[Buffer, ...]
    tensor_off: tuple[int, ...]
    #: per trainable stage (forward order): (stage, offset of every tensor in its perturbed
    #: passes; tensors such a pass does not write keep their ``off``)
    perturbed: tuple[tuple[int, tuple[int, ...]], ...]
    diff_off: tuple[int, ...]  # per trainable layer: its first slot in the `diffs` buffer
    total: int

    def offset(self, name: str) -> int:
        return next(b.offset for b in self.buffers if b.name == name)

    def rows(self) -> list[dict]:
        return [{"buffer": b.name, "offset": b.offset, "bytes": b.size} for b in self.buffers]


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


Placed = tuple[int, int, tuple[int, int]]  # offset, size, lifetime
Item = tuple[str, int, tuple[int, int]]  # name, size, lifetime

#: First-fit orders tried: largest first, longest-lived first, earliest first.
ORDERS = (lambda it: (-it[1], it[0]),
          lambda it: (it[2][0] - it[2][1], -it[1], it[0]),
          lambda it: (it[2][0], -it[1], it[0]))


def _first_fit(items: list[Item], base: int, fixed: tuple[Placed, ...] = (),
               order=ORDERS[0]) -> dict[str, int]:
    """Offsets for (name, size, [start, end]) items, visited in ``order``: each at the lowest
    offset that overlaps no placed item (nor any of ``fixed``) alive at the same time."""
    placed: list[Placed] = list(fixed)
    out = {}
    for name, size, (lo, hi) in sorted(items, key=order):
        offset = base
        moved = True
        while moved:
            moved = False
            for off, sz, (plo, phi) in placed:
                if not (hi < plo or phi < lo) and offset < off + sz and off < offset + size:
                    offset, moved = _align(off + sz), True
        placed.append((offset, size, (lo, hi)))
        out[name] = offset
    return out


def _extent(items: list[Item], offsets: dict[str, int]) -> int:
    return max((offsets[name] + size for name, size, _ in items), default=0)


def _best_fit(items: list[Item], base: int, fixed: tuple[Placed, ...] = ()
              ) -> dict[str, int]:
    """The first-fit (over :data:`ORDERS`) with the smallest extent."""
    fits = [_first_fit(items, base, fixed, order) for order in ORDERS]
    return min(fits, key=lambda f: _extent(items, f))


def trainable_stages(graph: Graph, trainable: list[TrainableSpec]) -> list[int]:
    """The stages holding a trainable layer, in forward order."""
    return sorted({graph.ops[t.op].stage for t in trainable})


def stage_input(graph: Graph, stage: int) -> int:
    return graph.ops[graph.stage_first_op[stage]].inputs[0]


def plan_arena(graph: Graph, trainable: list[TrainableSpec], batch: int, queries: int,
               deferred: bool) -> ArenaPlan:
    """Plan the arena for (micro-)batches of ``batch`` samples and Q = ``queries``.

    ``trainable`` must be in forward order. ``deferred``: micro-batch accumulation, which keeps
    an int64 sum per trainable weight and bias until the update after the last micro-batch.
    """
    buffers: list[Buffer] = []
    offset = 0

    def static(name: str, size: int) -> int:
        nonlocal offset
        start = offset
        buffers.append(Buffer(name, start, size))
        offset = _align(offset + size)
        return start

    static("loss", 8 * batch)
    static("loss_q", 8 * batch)
    # Loss differences of the layers pending in one stage: Q (WP, summed over the batch) or
    # Q*N (NP, per sample); stages reuse the same slots.
    diff_off, per_stage = [], {}
    for t in trainable:
        stage = graph.ops[t.op].stage
        diff_off.append(per_stage.get(stage, 0))
        per_stage[stage] = diff_off[-1] + queries * (batch if t.mode == "np" else 1)
    static("diffs", 8 * max(per_stage.values(), default=0))
    any_np = any(t.mode == "np" for t in trainable)
    static("rng_states", 4 * queries * (batch if any_np else 1))
    np_plane = [graph.tensors[graph.ops[t.op].output] for t in trainable if t.mode == "np"]
    static("node_grad_channel", 8 * batch * max((x.h * x.w for x in np_plane), default=0))
    static("wp_backup", max((t.d_w for t in trainable if t.mode == "wp"), default=0))
    static("kernel_scratch", 2 * kernel_scratch_elems(graph))
    if deferred:
        for t in trainable:
            static(f"gw[{graph.ops[t.op].name}]", 8 * t.d_w)
            static(f"gb[{graph.ops[t.op].name}]", 8 * t.cout)

    n_ops = len(graph.ops)
    stages = trainable_stages(graph, trainable)
    kept = stage_input(graph, stages[0]) if stages else 0

    def lifetime(t: int) -> tuple[int, int]:
        tensor = graph.tensors[t]
        end = max(tensor.consumers, default=n_ops)
        return (tensor.producer, n_ops if t == kept else end)

    base = offset
    items = [(f"t{t}", batch * x.numel, lifetime(t)) for t, x in enumerate(graph.tensors)]
    best = None
    for order in ORDERS:
        off = _first_fit(items, base, order=order)
        perturbed = []
        for k in stages:
            held = stage_input(graph, k)
            first = graph.stage_first_op[k]
            pinned = ((off[f"t{held}"], batch * graph.tensors[held].numel, (first, n_ops)),)
            written = [it for it in items if graph.tensors[int(it[0][1:])].producer >= first]
            perturbed.append((k, written, _best_fit(written, base, pinned)))
        end = max([_extent(items, off)] + [_extent(w, f) for _, w, f in perturbed])
        if best is None or end < best[0]:
            best = (end, off, perturbed)
    end, off, perturbed = best

    tensor_off = tuple(off[f"t{t}"] for t in range(len(graph.tensors)))
    for name, size, life in items:
        buffers.append(Buffer(f"act[{name}]", off[name], size, life))
    tables = []
    for k, written, fit in perturbed:
        lo = min(fit.values(), default=base)
        buffers.append(Buffer(f"perturbed passes from stage {k}", lo, _extent(written, fit) - lo))
        tables.append((k, tuple(fit.get(f"t{t}", tensor_off[t])
                                for t in range(len(graph.tensors)))))
    return ArenaPlan(tuple(buffers), tensor_off, tuple(tables), tuple(diff_off), _align(end))


def inference_bytes(graph: Graph, batch: int) -> int:
    """Activation bytes of inference alone for ``batch`` samples: the smallest first-fit of
    the forward's lifetimes (what an inference engine with this planner needs)."""
    n_ops = len(graph.ops)
    items = [(f"t{t}", batch * x.numel, (x.producer, max(x.consumers, default=n_ops)))
             for t, x in enumerate(graph.tensors)]
    return _extent(items, _best_fit(items, 0))
