"""The static arena of a device program, planned from buffer lifetimes.

Every buffer of one training step gets an offset in one ``int8_t`` arena, sized at export:

* the int64 integer sums of every trainable layer (``gw``, ``gb``), the clean and perturbed
  per-sample losses, and the NP node-gradient buffer (Eq. 9) of the largest NP layer;
* the WP backup of the largest WP layer's weights (a perturbed weight saturates at +-127, so
  the original cannot be recovered by subtracting the direction);
* the *cached* activations Algorithm 1 keeps for a step: the input of every stage that holds a
  trainable layer (partial forwards start there) and the input of every NP layer (Eq. 10);
* the scratch activations, placed by a first-fit over their lifetimes [producer, last
  consumer]: two tensors share bytes only when no operator needs both.

The same plan serves the clean pass and the perturbed partial passes: a cached tensor has a
second, scratch placement (``alt``) that a partial pass writes, so the cache survives the Q
queries.
"""

from __future__ import annotations

from dataclasses import dataclass

from .lower import Graph

ALIGN = 8


@dataclass(frozen=True)
class Buffer:
    name: str
    offset: int
    size: int
    lifetime: tuple[int, int] | None = None  # op interval for scratch buffers


@dataclass(frozen=True)
class ArenaPlan:
    buffers: tuple[Buffer, ...]
    tensor_off: tuple[int, ...]
    tensor_alt: tuple[int, ...]
    total: int

    def offset(self, name: str) -> int:
        return next(b.offset for b in self.buffers if b.name == name)

    def rows(self) -> list[dict]:
        return [{"buffer": b.name, "offset": b.offset, "bytes": b.size} for b in self.buffers]


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _first_fit(items: list[tuple[str, int, tuple[int, int]]], base: int) -> dict[str, int]:
    """Offsets for (name, size, [start, end]) items: largest first, lowest free offset."""
    placed: list[tuple[int, int, tuple[int, int]]] = []
    out = {}
    for name, size, (lo, hi) in sorted(items, key=lambda it: (-it[1], it[0])):
        offset = base
        for off, sz, (plo, phi) in sorted(placed):
            overlaps_time = not (hi < plo or phi < lo)
            if overlaps_time and offset < off + sz and off < offset + size:
                offset = _align(off + sz)
        # A later placed buffer may now overlap: repeat until stable.
        moved = True
        while moved:
            moved = False
            for off, sz, (plo, phi) in placed:
                if not (hi < plo or phi < lo) and offset < off + sz and off < offset + size:
                    offset, moved = _align(off + sz), True
        placed.append((offset, size, (lo, hi)))
        out[name] = offset
    return out


def cached_tensors(graph: Graph, trainable: list[tuple[int, str]]) -> list[int]:
    """Tensors a step keeps: the model input, trainable stages' inputs, NP layers' inputs.

    ``trainable``: (op index, mode) per trainable layer.
    """
    keep = {0}
    for op_index, mode in trainable:
        op = graph.ops[op_index]
        keep.add(graph.ops[graph.stage_first_op[op.stage]].inputs[0])
        if mode == "np":
            keep.add(op.inputs[0])
    return sorted(keep)


def plan_arena(graph: Graph, trainable: list[tuple[int, str, int, int, int]], batch: int
               ) -> ArenaPlan:
    """Plan the arena for micro-batches of ``batch`` samples.

    ``trainable``: (op index, mode, d_w, d_a, out channels) per trainable layer.
    """
    buffers: list[Buffer] = []
    offset = 0

    def static(name: str, size: int) -> None:
        nonlocal offset
        buffers.append(Buffer(name, offset, size))
        offset = _align(offset + size)

    for i, (op, mode, d_w, d_a, cout) in enumerate(trainable):
        static(f"gw[{graph.ops[op].name}]", 8 * d_w)
        static(f"gb[{graph.ops[op].name}]", 8 * cout)
    static("loss", 8 * batch)
    static("loss_q", 8 * batch)
    np_sizes = [d_a for _, mode, _, d_a, _ in trainable if mode == "np"]
    static("node_grad", 8 * batch * max(np_sizes, default=0))
    wp_sizes = [d_w for _, mode, d_w, _, _ in trainable if mode == "wp"]
    static("wp_backup", max(wp_sizes, default=0))

    keep = cached_tensors(graph, [(op, mode) for op, mode, *_ in trainable])
    n_ops = len(graph.ops)
    tensor_off = [0] * len(graph.tensors)
    tensor_alt = [0] * len(graph.tensors)
    for t in keep:
        static(f"cache[t{t}]", batch * graph.tensors[t].numel)
        tensor_off[t] = tensor_alt[t] = buffers[-1].offset
    items = []
    for t, tensor in enumerate(graph.tensors):
        if t == 0:
            continue
        end = max(tensor.consumers, default=n_ops)
        items.append((f"t{t}", batch * tensor.numel, (tensor.producer, end)))
    placed = _first_fit(items, offset)
    scratch_end = offset
    for name, size, life in items:
        t = int(name[1:])
        tensor_alt[t] = placed[name]
        if t not in keep:
            tensor_off[t] = placed[name]
        buffers.append(Buffer(f"scratch[{name}]", placed[name], size, life))
        scratch_end = max(scratch_end, placed[name] + size)
    return ArenaPlan(tuple(buffers), tuple(tensor_off), tuple(tensor_alt), _align(scratch_end))
