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

The kernels' scratch and, with micro-batches only, the int64 sums of every trainable layer sit
below the activations, alive throughout. The step's own buffers (per-sample losses, loss
differences, replayed generator states, one channel of the regenerated node gradient, the WP
weight backup) are first written after the clean forward and read only within the step, so
they are placed like activations alive from the first trainable stage to the end: the frozen
prefix's activations may use their bytes.

**The frozen prefix** (the ops before the first trainable stage) runs only in the clean forward
and in inference, never perturbed; there two of TinyEngine's memory schedules apply
(:func:`prefix_schedule`), both executed channel block by channel block with the unchanged
kernels, so the values are the same:

* *fused*: a groups-1 convolution whose output only a depthwise convolution reads (the
  expansion 1x1 of an inverted residual) computes G of its output channels at a time into a
  G-channel buffer, and the depthwise turns them into its own G output channels at once. The
  expanded tensor never exists whole (MCUNet-in1's 32x64x64: 128 KiB becomes 32 KiB);
* *in place*: a depthwise convolution whose input only it reads, with an output of the same
  shape, writes G channels at a time to a staging buffer and copies them over the input
  channels it has just consumed; output channel c needs input channel c only.
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


#: How bpf_forward runs an affine op of the frozen prefix (bpf_op.a[0] in the C).
EXEC_PLAIN, EXEC_FUSED, EXEC_DONE, EXEC_INPLACE = 0, 1, 2, 3
#: A staging buffer of an in-place depthwise holds at most this share of its output.
INPLACE_STAGING_SHARE = 8
#: Buffers written first after the clean forward and read only within the step.
STEP_BUFFERS = ("loss", "loss_q", "diffs", "rng_states", "node_grad_channel", "wp_backup")


@dataclass(frozen=True)
class OpExec:
    """How one op runs: :data:`EXEC_PLAIN`; :data:`EXEC_FUSED` (with the next op, a depthwise,
    ``channels`` output channels at a time); :data:`EXEC_DONE` (run by the fused op before);
    :data:`EXEC_INPLACE` (over its input, ``channels`` at a time through a staging buffer at
    arena offset ``staging``)."""

    mode: int = EXEC_PLAIN
    channels: int = 0
    staging: int = 0


def _is_depthwise(op) -> bool:
    m = op.module
    return (op.kind == "affine" and getattr(m, "groups", 1) > 1
            and m.groups == m.in_channels == m.out_channels
            and tuple(m.dilation) == (1, 1) and m.kernel_size[0] * m.kernel_size[1] <= DW_MAX_TAPS)


def _largest_divisor(n: int, limit: int, least: int) -> int:
    """The largest divisor d of n with least <= d and d <= limit (0 if none)."""
    return max((d for d in range(least, n + 1) if n % d == 0 and d <= limit), default=0)


def prefix_schedule(graph: Graph, prefix_end: int) -> tuple[OpExec, ...]:
    """The execution mode of every op (staging offsets still 0): fused expansion + depthwise
    pairs and in-place depthwise convolutions among ``ops[:prefix_end]``, the frozen ops that
    run only in the clean forward and in inference.

    A fused pair's channel block G is the largest divisor of the expanded channels (>= 2: the
    GEMM kernel takes output channels in pairs) whose G planes fit in the larger of the
    pair's input and output, so the pair's peak is at most three times that. An in-place
    depthwise stages the largest divisor G whose G planes are at most
    1/:data:`INPLACE_STAGING_SHARE` of its output (at least one plane)."""
    out = [OpExec() for _ in graph.ops]
    for k in range(prefix_end):
        op = graph.ops[k]
        if out[k].mode != EXEC_PLAIN or op.kind != "affine":
            continue
        mid = graph.tensors[op.output]
        nxt = graph.ops[k + 1] if k + 1 < prefix_end else None
        if (nxt is not None and getattr(op.module, "groups", 1) == 1
                and hasattr(op.module, "kernel_size") and _is_depthwise(nxt)
                and nxt.inputs[0] == op.output and mid.consumers == [k + 1]):
            src, dst = graph.tensors[op.inputs[0]], graph.tensors[nxt.output]
            plane = mid.h * mid.w
            g = _largest_divisor(mid.c, max(src.numel, dst.numel) // plane, 2)
            if 2 <= g < mid.c:
                out[k], out[k + 1] = OpExec(EXEC_FUSED, g), OpExec(EXEC_DONE)
                continue
        src = graph.tensors[op.inputs[0]]
        if (_is_depthwise(op) and src.producer >= 0 and src.consumers == [k]
                and (src.c, src.h, src.w) == (mid.c, mid.h, mid.w)):
            g = _largest_divisor(mid.c, max(1, mid.c // INPLACE_STAGING_SHARE), 1)
            out[k] = OpExec(EXEC_INPLACE, g)
    return tuple(out)


@dataclass(frozen=True)
class ArenaPlan:
    buffers: tuple[Buffer, ...]
    tensor_off: tuple[int, ...]
    #: per trainable stage (forward order): (stage, offset of every tensor in its perturbed
    #: passes; tensors such a pass does not write keep their ``off``)
    perturbed: tuple[tuple[int, tuple[int, ...]], ...]
    diff_off: tuple[int, ...]  # per trainable layer: its first slot in the `diffs` buffer
    total: int
    #: per op: how bpf_forward runs it (:class:`OpExec`; the frozen prefix's schedule)
    op_exec: tuple[OpExec, ...] = ()

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


def _step_buffers(graph: Graph, trainable: list[TrainableSpec], batch: int,
                  queries: int) -> tuple[list[tuple[str, int]], tuple[int, ...]]:
    """(name, bytes) of :data:`STEP_BUFFERS`, and each trainable layer's first slot in
    ``diffs``: Q (WP, summed over the batch) or Q*N (NP, per sample) loss differences per
    layer pending in one stage; stages reuse the same slots."""
    diff_off, per_stage = [], {}
    for t in trainable:
        stage = graph.ops[t.op].stage
        diff_off.append(per_stage.get(stage, 0))
        per_stage[stage] = diff_off[-1] + queries * (batch if t.mode == "np" else 1)
    any_np = any(t.mode == "np" for t in trainable)
    np_plane = [graph.tensors[graph.ops[t.op].output] for t in trainable if t.mode == "np"]
    sizes = {"loss": 8 * batch, "loss_q": 8 * batch,
             "diffs": 8 * max(per_stage.values(), default=0),
             "rng_states": 4 * queries * (batch if any_np else 1),
             "node_grad_channel": 8 * batch * max((x.h * x.w for x in np_plane), default=0),
             "wp_backup": max((t.d_w for t in trainable if t.mode == "wp"), default=0)}
    return [(name, sizes[name]) for name in STEP_BUFFERS], tuple(diff_off)


def _activation_items(graph: Graph, batch: int, kept: int, execs: tuple[OpExec, ...]
                      ) -> tuple[list[Item], dict[int, str]]:
    """The activation items and the item of every tensor: an in-place depthwise's output
    shares its input's item (alive over both lifetimes), a fused pair's expanded tensor is a
    buffer of one block of channels of one sample, and every in-place op adds its staging."""
    n_ops = len(graph.ops)
    item_of: dict[int, str] = {}
    size: dict[str, int] = {}
    life: dict[str, tuple[int, int]] = {}
    for t, x in enumerate(graph.tensors):
        end = n_ops if t == kept else max(x.consumers, default=n_ops)
        producer = graph.ops[x.producer] if x.producer >= 0 else None
        mode = execs[x.producer] if x.producer >= 0 else OpExec()
        if mode.mode == EXEC_INPLACE:
            name = item_of[producer.inputs[0]]
            size[name] = max(size[name], batch * x.numel)
            life[name] = (life[name][0], max(life[name][1], end))
        else:
            name = f"t{t}"
            size[name] = mode.channels * x.h * x.w if mode.mode == EXEC_FUSED \
                else batch * x.numel
            life[name] = (x.producer, end)
        item_of[t] = name
    for k, e in enumerate(execs):
        if e.mode == EXEC_FUSED:  # the pair's input is read while the depthwise writes
            src, dst = item_of[graph.ops[k].inputs[0]], item_of[graph.ops[k + 1].output]
            life[src] = (life[src][0], max(life[src][1], k + 1))
            life[dst] = (k, life[dst][1])
    items = [(name, size[name], life[name]) for name in size]
    for k, e in enumerate(execs):
        if e.mode == EXEC_INPLACE:
            x = graph.tensors[graph.ops[k].output]
            items.append((f"staging[{k}]", e.channels * x.h * x.w, (k, k)))
    return items, item_of


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

    static("kernel_scratch", 2 * kernel_scratch_elems(graph))
    if deferred:
        for t in trainable:
            static(f"gw[{graph.ops[t.op].name}]", 8 * t.d_w)
            static(f"gb[{graph.ops[t.op].name}]", 8 * t.cout)

    n_ops = len(graph.ops)
    stages = trainable_stages(graph, trainable)
    kept = stage_input(graph, stages[0]) if stages else 0
    prefix_end = graph.stage_first_op[stages[0]] if stages else 0
    execs = prefix_schedule(graph, prefix_end)
    step, diff_off = _step_buffers(graph, trainable, batch, queries)
    base = offset
    activations, item_of = _activation_items(graph, batch, kept, execs)
    items = activations + [(name, size, (prefix_end, n_ops)) for name, size in step]
    best = None
    for order in ORDERS:
        off = _first_fit(items, base, order=order)
        perturbed = []
        for k in stages:
            first = graph.stage_first_op[k]
            held = item_of[stage_input(graph, k)]
            pinned = tuple((off[name], size, (first, n_ops)) for name, size, _ in items
                           if name == held or name in STEP_BUFFERS)
            written = [it for it in items if it[2][0] >= first and it[0] not in STEP_BUFFERS]
            perturbed.append((k, written, _best_fit(written, base, pinned)))
        end = max([_extent(items, off)] + [_extent(w, f) for _, w, f in perturbed])
        if best is None or end < best[0]:
            best = (end, off, perturbed)
    end, off, perturbed = best

    tensor_off = tuple(off[item_of[t]] for t in range(len(graph.tensors)))
    execs = tuple(OpExec(e.mode, e.channels, off[f"staging[{k}]"]) if e.mode == EXEC_INPLACE
                  else e for k, e in enumerate(execs))
    for name, size, life in items:
        label = name if name in STEP_BUFFERS else f"act[{name}]"
        buffers.append(Buffer(label, off[name], size, life))
    tables = []
    for k, written, fit in perturbed:
        lo = min(fit.values(), default=base)
        buffers.append(Buffer(f"perturbed passes from stage {k}", lo, _extent(written, fit) - lo))
        tables.append((k, tuple(fit.get(item_of[t], tensor_off[t])
                                for t in range(len(graph.tensors)))))
    return ArenaPlan(tuple(buffers), tensor_off, tuple(tables), diff_off, _align(end), execs)


def inference_bytes(graph: Graph, batch: int) -> int:
    """Activation bytes of inference alone for ``batch`` samples: the smallest first-fit of
    the forward's lifetimes, every op frozen, so with :func:`prefix_schedule` over the whole
    graph (what an inference engine with this planner needs)."""
    items, _ = _activation_items(graph, batch, -1, prefix_schedule(graph, len(graph.ops)))
    return _extent(items, _best_fit(items, 0))
