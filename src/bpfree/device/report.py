"""``bpfree device report``: what a program occupies, against the analytic PMT figure.

Per program: text / data / bss from ``arm-none-eabi-size`` (cortex-m7, when the toolchain is
installed), the arena plan per buffer, the MCU limits, and :func:`bpfree.memory.analytic`'s
``pmt`` figure for the same model, batch and Q. For MCUNet-in1 the paper's Tables 8-9 numbers
(:data:`bpfree.pmt.mcunet_tables.PAPER`) are set beside them.
"""

from __future__ import annotations

import torch

from ..memory import analytic
from ..memory.profile import profile_model
from ..memory.report import MemoryReport
from ..models import digits_mlp, mcunet_in1_float, mnist_cnn
from ..pmt.mcunet_tables import PAPER
from .export import DeviceProgram
from .lower import lower
from .mcu import build_elf, missing_tools, size_of


def _float_mirror(name: str | None):
    """The float model whose layer shapes match a built-in program's integer graph."""
    return {"digits-mlp": digits_mlp, "mnist-cnn": mnist_cnn,
            "mcunet-in1": lambda: mcunet_in1_float(num_classes=1000)}.get(name, lambda: None)()


def analytic_report(program: DeviceProgram) -> MemoryReport | None:
    """The ``pmt`` rule's training memory (int8, BN folded) for the program's model, batch, Q
    and trainable layers, part by part, from the float mirror of a built-in model (None for
    others: the integer graph holds buffers, not parameters, so the profiler cannot size it)."""
    meta = program.meta
    mirror = _float_mirror(meta.get("model_name"))
    if mirror is None:
        return None
    profile = profile_model(mirror.eval(), torch.zeros(1, *meta["sample_shape"]))
    affine = [layer.name for layer in profile.layers if layer.macs]
    names = [affine[row["layer_index"]] for row in meta["trainable"]]
    return analytic(profile, "pmt", batch_size=meta["max_batch"],
                    num_queries=meta["config"]["queries"], trainable=names)


def analytic_bytes(program: DeviceProgram) -> int | None:
    """:func:`analytic_report`'s total in bytes (None where it has none)."""
    report = analytic_report(program)
    return None if report is None else int(report.total)


def step_macs(program: DeviceProgram, queries: int | None = None) -> int:
    """Multiply-accumulates of one training step of ``max_batch`` samples, as the C schedules
    it (bpfree.device.plan): the clean forward, Q perturbed passes per trainable layer from its
    stage's first operator to the logits, the stage passes, and each NP layer's Eq. 10 sums
    (one MAC per weight and output position). ``queries`` defaults to the program's Q."""
    meta = program.meta
    q = meta["config"]["queries"] if queries is None else queries
    graph = lower(program.model, tuple(meta["sample_shape"]))
    macs = []
    for op in graph.ops:
        w = op.module.weight if op.kind == "affine" else None
        macs.append(graph.tensors[op.output].numel * (w.numel() // w.shape[0]) if w is not None
                    else 0)
    affine = graph.affine_ops()
    ops = [graph.ops.index(affine[row["layer_index"]]) for row in meta["trainable"]]
    first = graph.stage_first_op[graph.ops[ops[0]].stage]
    total = sum(macs) + sum(macs[first:ops[-1] + 1])
    for op, row in zip(ops, meta["trainable"]):
        total += q * sum(macs[graph.stage_first_op[graph.ops[op].stage]:])
        if row["mode"] == "np":
            total += macs[op]
    return total * meta["max_batch"]


def program_report(path) -> dict:
    program = path if isinstance(path, DeviceProgram) else DeviceProgram.load(path)
    meta = program.meta
    doc = {"program": str(program.path), "target": meta["target"],
           "sram_kib": meta["sram_kib"], "flash_kib": meta["flash_kib"],
           "arena_bytes": meta["arena_bytes"], "arena_plan": meta["arena_plan"],
           "trainable": meta["trainable"], "analytic_bytes": None, "analytic_parts": None,
           "macs_per_step": step_macs(program),
           "text": None, "data": None, "bss": None, "size_note": None}
    rule = analytic_report(program)
    if rule is not None:
        doc["analytic_bytes"], doc["analytic_parts"] = int(rule.total), dict(rule.parts)
    if meta["target"] == "cortex-m7":
        missing = missing_tools()
        if missing:
            doc["size_note"] = f"toolchain missing: {', '.join(missing)}"
        else:
            try:
                doc.update(size_of(build_elf(program)))
            except RuntimeError as err:
                doc["size_note"] = " ".join(str(err).split())[:500]
    else:
        doc["size_note"] = "text/data/bss are reported for the cortex-m7 target"
    if meta["classes"] == 1000 and tuple(meta["sample_shape"]) == (3, 128, 128):
        doc["paper"] = {k: PAPER[k] for k in ("parameter_kb", "inference_peak_kb",
                                              "bpfree_full_kb")}
    return doc


def format_report(doc: dict) -> str:
    lines = [f"program {doc['program']} ({doc['target']})"]
    if doc["text"] is not None:
        lines.append(f"  text {doc['text']} B  data {doc['data']} B  bss {doc['bss']} B  "
                     f"(SRAM {doc['sram_kib']} KiB, flash {doc['flash_kib']} KiB)")
    else:
        lines.append(f"  sizes: {doc['size_note']}")
    lines.append(f"  arena {doc['arena_bytes']} B; analytic pmt rule "
                 f"{doc['analytic_bytes'] if doc['analytic_bytes'] is not None else 'n/a'} B; "
                 f"{doc['macs_per_step']} MACs per step")
    if doc.get("analytic_parts"):
        lines.append("  analytic pmt rule by part: " + ", ".join(
            f"{name} {n} B" for name, n in doc["analytic_parts"].items() if n))
    if "paper" in doc:
        p = doc["paper"]
        lines.append(f"  paper (MCUNet-in1, Tables 8-9): {p['parameter_kb']} KB parameters + "
                     f"{p['inference_peak_kb']} KB inference peak = {p['bpfree_full_kb']} KB")
    lines.append("  arena plan:")
    for row in doc["arena_plan"]:
        lines.append(f"    {row['buffer']:<40s} offset {row['offset']:>9d}  {row['bytes']:>9d} B")
    return "\n".join(lines)
