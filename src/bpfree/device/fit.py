"""Whether an exported program fits its MCU's SRAM and flash, decided at export.

With the cross toolchain installed the program is linked (:func:`~bpfree.device.mcu.build_elf`
against the generated linker script, as on the board): the linker's verdict is exact. Without
it, :func:`memory_floor` bounds the memory from below from what the exporter itself allocates
(the arena of :func:`~bpfree.device.plan.plan_arena`, the trainable layers' SRAM copies, the
driver's buffers, the linker script's stack and heap; the frozen weights in flash), so a
program that surely cannot fit is refused even there; one that passes the bound is still
linked for real by ``device report`` / ``device run``.
"""

from __future__ import annotations

import re

import numpy as np

from .mcu import STACK_HEAP_BYTES, build_elf, missing_tools, size_of


class ProgramDoesNotFit(ValueError, RuntimeError):
    """The program overflows the MCU's SRAM or flash. A ValueError for the CLI (the export's
    options do not fit the target: usage, exit status 2), a RuntimeError for callers of
    :func:`~bpfree.device.mcu.build_elf`, which has always raised that."""


#: What to change when a program does not fit (the options of ``bpfree device export``).
REMEDY = ("train fewer layers (--sparse --block N; PMT §4.4 trains MCUNet-in1's block 3 in "
          "320 KiB), lower --batch-size or --max-samples, or give the MCU more --sram-kib / "
          "--flash-kib")


def memory_floor(meta: dict, model) -> dict[str, int]:
    """Bytes the program needs at least: ``sram`` (the arena, the trainable weights' and NP
    biases' SRAM copies, main.c's sample, label and logit buffers, stack and heap) and
    ``flash`` (every layer's int8 weights and int32 biases of ``model`` as ``const`` data)."""
    sample = int(np.prod(meta["sample_shape"]))
    batch, samples = meta["max_batch"], meta["max_samples"]
    micro = meta["config"].get("micro_batch") or 0
    copies = sum(r["d_w"] + (4 * r["cout"] if r["mode"] == "np" else 0)
                 for r in meta["trainable"])
    driver = 4 * samples + 4 * (samples if micro else batch) + batch * meta["classes"]
    driver += samples * sample if micro else 0
    sram = meta["arena_bytes"] + copies + driver + STACK_HEAP_BYTES
    flash = sum(t.numel() * t.element_size() for m in model.modules()
                for t in (getattr(m, "weight", None), getattr(m, "bias", None))
                if t is not None and not t.is_floating_point())
    return {"sram": sram, "flash": flash}


def _overflow(stderr: str) -> str:
    """The linker's "region `RAM' overflowed by N bytes" lines, joined."""
    found = re.findall(r"region `?'?(\w+)'? overflowed by (\d+) bytes", stderr)
    return "; ".join(f"{region} overflowed by {int(n)} bytes ({int(n) / 1024:.1f} KiB)"
                     for region, n in found) or "the linker reports an overflow"


def check_fits(program) -> dict:
    """Refuse (:class:`ProgramDoesNotFit`) a program that cannot fit ``sram_kib`` /
    ``flash_kib``; returns how it was decided: ``{"linked": True, text, data, bss}`` or
    ``{"linked": False, "sram_floor": ..., "flash_floor": ...}``. Programs without an SRAM
    figure (the host target without ``sram_kib``) pass unchecked (``{}``)."""
    meta = program.meta
    if meta.get("sram_kib") is None:
        return {}
    if meta["target"] == "cortex-m7" and not missing_tools():
        try:
            elf = build_elf(program)
        except RuntimeError as err:
            if "does not fit" not in str(err):
                raise
            raise ProgramDoesNotFit(
                f"the program does not link into the MCU (SRAM {meta['sram_kib']} KiB, flash "
                f"{meta['flash_kib']} KiB): {_overflow(str(err))}; {REMEDY}") from None
        return {"linked": True, **size_of(elf)}
    floor = memory_floor(meta, program.model)
    limits = {"sram": meta["sram_kib"], "flash": meta.get("flash_kib")}
    for part, need in floor.items():
        kib = limits[part]
        if kib is not None and need > kib * 1024:
            raise ProgramDoesNotFit(
                f"the program cannot fit the MCU: it needs at least {need / 1024:.0f} KiB of "
                f"{part.upper()} (arena {meta['arena_bytes']} B, trainable weight copies, "
                f"driver buffers, stack and heap), more than --{part}-kib {kib}; {REMEDY}")
    return {"linked": False, "sram_floor": floor["sram"], "flash_floor": floor["flash"]}


__all__ = ["ProgramDoesNotFit", "check_fits", "memory_floor"]
