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
from ..models import digits_mlp, mcunet_in1_float, mnist_cnn
from ..pmt.mcunet_tables import PAPER
from .export import DeviceProgram
from .mcu import build_elf, missing_tools, size_of


def _float_mirror(name: str | None):
    """The float model whose layer shapes match a built-in program's integer graph."""
    return {"digits-mlp": digits_mlp, "mnist-cnn": mnist_cnn,
            "mcunet-in1": lambda: mcunet_in1_float(num_classes=1000)}.get(name, lambda: None)()


def analytic_bytes(program: DeviceProgram) -> int | None:
    """The ``pmt`` rule's training memory (int8, BN folded) for the program's model, batch, Q
    and trainable layers, from the float mirror of a built-in model (None for others: the
    integer graph holds buffers, not parameters, so the profiler cannot size it)."""
    meta = program.meta
    mirror = _float_mirror(meta.get("model_name"))
    if mirror is None:
        return None
    profile = profile_model(mirror.eval(), torch.zeros(1, *meta["sample_shape"]))
    affine = [layer.name for layer in profile.layers if layer.macs]
    names = [affine[row["layer_index"]] for row in meta["trainable"]]
    report = analytic(profile, "pmt", batch_size=meta["max_batch"],
                      num_queries=meta["config"]["queries"], trainable=names)
    return int(report.total)


def program_report(path) -> dict:
    program = path if isinstance(path, DeviceProgram) else DeviceProgram.load(path)
    meta = program.meta
    doc = {"program": str(program.path), "target": meta["target"],
           "sram_kib": meta["sram_kib"], "flash_kib": meta["flash_kib"],
           "arena_bytes": meta["arena_bytes"], "arena_plan": meta["arena_plan"],
           "trainable": meta["trainable"], "analytic_bytes": analytic_bytes(program),
           "text": None, "data": None, "bss": None, "size_note": None}
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
                 f"{doc['analytic_bytes'] if doc['analytic_bytes'] is not None else 'n/a'} B")
    if "paper" in doc:
        p = doc["paper"]
        lines.append(f"  paper (MCUNet-in1, Tables 8-9): {p['parameter_kb']} KB parameters + "
                     f"{p['inference_peak_kb']} KB inference peak = {p['bpfree_full_kb']} KB")
    lines.append("  arena plan:")
    for row in doc["arena_plan"]:
        lines.append(f"    {row['buffer']:<40s} offset {row['offset']:>9d}  {row['bytes']:>9d} B")
    return "\n".join(lines)
