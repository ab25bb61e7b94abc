"""``export_c``: a configured :class:`~bpfree.pmt.PMTTrainer` as a self-contained C99 project.

The project (``model.c``, the fixed runtime, a ``main.c`` driver, a Makefile and, for
``cortex-m7``, a linker script and start-up file) needs libc and libm only and allocates
nothing: the arena is static and sized from :func:`~bpfree.device.plan.plan_arena`.
``program.json`` records what the program was built from (config, trainable layers, plan), and
``model.pt`` the integer model it started from (read back without unpickling code,
:mod:`.model_file`), so :func:`~bpfree.device.run.run_c` can load
the C-trained weights back into a copy of it.

The directory appears whole or not at all: everything is written into a temporary sibling and
renamed into place, after :func:`~bpfree.device.fit.check_fits` has linked it (cortex-m7) or
bounded its memory against ``sram_kib`` / ``flash_kib``: a program that cannot fit its MCU is
refused at export, not found out at the first run.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import torch

from ..pmt import PMTTrainer
from ..pmt.estimate import requant_scale
from ..updates.integer_layer import quantization_aware_scales
from .emit import MODEL_H, model_c
from .fit import check_fits
from .lower import Graph, lower
from .mcu import main_defines, mcu_sources
from .model_file import load_model, save_model
from .validate import ProgramError, check_against_model, check_meta
from .plan import ArenaPlan, TrainableSpec, plan_arena
from .tflite_model import SOURCE_FILE

TARGETS = ("host", "cortex-m7")
RUNTIME_FILES = ("bpfree_runtime.c", "bpfree_runtime.h", "main.c")
#: The int8 kernel set the runtime includes, shared with the simulator's fast path
#: (bpfree.quant.engine): one source, copied into every program.
KERNEL_FILES = ("bpf_int8.h",)


@dataclass
class DeviceProgram:
    """An exported program: its directory, metadata and (in memory) the starting model."""

    path: Path
    meta: dict
    model: torch.nn.Module | None = field(default=None, repr=False)
    #: How export decided that it fits (:func:`~bpfree.device.fit.check_fits`; {} unchecked).
    fit: dict = field(default_factory=dict)

    @classmethod
    def load(cls, path) -> DeviceProgram:
        path = Path(path)
        meta_path = path / "program.json"
        if not meta_path.is_file():
            raise ValueError(f"{path} is not a device program (no program.json); create one "
                             "with `bpfree device export`")
        try:
            meta = json.loads(meta_path.read_text())
        except (ValueError, RecursionError) as err:
            raise ProgramError(f"{meta_path}: not valid JSON ({err})") from None
        check_meta(meta, meta_path)
        model = load_model(path / "model.pt", what=f"device program {path}")
        check_against_model(meta, model, meta_path)
        return cls(path, meta, model)

    @property
    def target(self) -> str:
        return self.meta["target"]


def _check_export_args(trainer, target: str, sram_kib, flash_kib, max_batch) -> None:
    if not isinstance(trainer, PMTTrainer):
        raise ValueError(f"export_c needs a bpfree.pmt.PMTTrainer, got {type(trainer).__name__}")
    if not trainer.config.device_exact:
        raise ValueError("export_c needs PMTConfig(device_exact=True): the C program reproduces "
                         "the device-exact loss and update (bpfree.pmt.exact), not the float64 "
                         "path")
    if trainer.config.seed == 0:
        raise ValueError("seed 0 is refused for a device program: the XORShift32 generator of "
                         "PMT Appendix F needs nonzero seeds, and seed 0 is easily a forgotten "
                         "default; pick PMTConfig(seed=...) >= 1")
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    for name, value in (("sram_kib", sram_kib), ("flash_kib", flash_kib)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f"{name} must be None or an int >= 1, got {value!r}")
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be an int >= 1, got {max_batch!r}")


def _trainable_rows(trainer: PMTTrainer, graph: Graph) -> list[dict]:
    op_of = {id(op.module): i for i, op in enumerate(graph.ops) if op.kind == "affine"}
    rows = []
    for layer in trainer.trainable:
        m = layer.module
        qw, qb = quantization_aware_scales(m)
        rows.append(dict(op=op_of[id(m)], name=layer.name, layer_index=trainer.index[layer.name],
                         mode=trainer.modes[layer.name], d_w=layer.d_w, d_a=layer.d_a,
                         cout=m.weight.shape[0], qas_w=qw.numpy(), qas_b=qb.numpy(),
                         requant=requant_scale(m).numpy(),
                         lr_scale=trainer.lr_scale.get(layer.name, 1.0)))
    return rows


def build_sources(trainer: PMTTrainer, sample_shape, max_batch: int
                  ) -> tuple[dict[str, str], Graph, ArenaPlan, list[dict]]:
    """The C sources of a program (file name -> text), its graph, arena plan and layers."""
    graph = lower(trainer.model, tuple(sample_shape))
    rows = _trainable_rows(trainer, graph)
    cfg = trainer.config
    batch = cfg.micro_batch or max_batch
    specs = [TrainableSpec(r["op"], r["mode"], r["d_w"], r["d_a"], r["cout"]) for r in rows]
    plan = plan_arena(graph, specs, batch, cfg.queries, deferred=bool(cfg.micro_batch))
    tables = trainer.loss_tables
    sources = {"model.c": model_c(graph, plan, rows, seed=cfg.seed, queries=cfg.queries,
                                  micro_batch=cfg.micro_batch or 0, gns=cfg.gns, qas=cfg.qas,
                                  max_batch=batch, start_step=trainer.steps,
                                  exp_table=tables.exp_table, logit_table=tables.logit_table),
               "bpfree_model.h": MODEL_H}
    pkg = resources.files("bpfree.device") / "c"
    for name in RUNTIME_FILES:
        sources[name] = (pkg / name).read_text()
    kernels = resources.files("bpfree.quant") / "c"
    for name in KERNEL_FILES:
        sources[name] = (kernels / name).read_text()
    return sources, graph, plan, rows


def _makefile(meta: dict) -> str:
    return f"""# Generated by bpfree.device.export_c. `make` builds the host driver and shared library.
CC ?= cc
CFLAGS ?= -std=c99 -O2 -Wall -ffp-contract=off -fno-fast-math
DEFS = {" ".join(main_defines(meta, mcu=False))}
SRC = model.c bpfree_runtime.c

all: train libbpfree.so
train: $(SRC) main.c
\t$(CC) $(CFLAGS) $(DEFS) -o $@ $^ -lm
libbpfree.so: $(SRC)
\t$(CC) $(CFLAGS) -shared -fPIC -o $@ $^ -lm
"""


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def export_c(trainer: PMTTrainer, out_dir, target: str = "host", sram_kib: int | None = None,
             flash_kib: int | None = None, *, sample_shape=None, max_batch: int = 64,
             max_samples: int = 256, model_name: str | None = None,
             source_tflite: bytes | None = None,
             require_fit: bool = True) -> DeviceProgram:
    """Write the C99 project of ``trainer`` into ``out_dir`` (which must not exist yet).

    Args:
        trainer: a :class:`PMTTrainer` with ``PMTConfig(device_exact=True)`` and a nonzero seed.
        out_dir: the project directory, created atomically.
        target: "host" (system C compiler) or "cortex-m7" (arm-none-eabi, QEMU mps2-an500).
        sram_kib, flash_kib: the MCU's memory, the linker script's RAM / FLASH lengths
            (cortex-m7; defaults 1024 and 2048, the STM32H7B3 of PMT §4.4).
        sample_shape: per-sample input shape (default: from the trainer's first layer probe).
        max_batch: the largest (micro-)batch the arena holds.
        max_samples: the most training samples ``main.c`` reads (its static sample buffer).
        model_name: a built-in model's name (``bpfree device report`` sizes it analytically).
        source_tflite: the bytes of the .tflite the model was loaded from; kept in the project
            (:data:`~bpfree.device.tflite_model.SOURCE_FILE`) so the trained weights can be
            written back into it (``bpfree device run --out-tflite``).
        require_fit: refuse (:class:`~bpfree.device.fit.ProgramDoesNotFit`, nothing written) a
            program that does not link into ``sram_kib`` / ``flash_kib`` (cortex-m7 with the
            toolchain), or whose memory floor exceeds them (without it, or host with
            ``sram_kib``). False exports it anyway (to size an overflowing program).
    """
    _check_export_args(trainer, target, sram_kib, flash_kib, max_batch)
    out = Path(out_dir)
    if out.exists():
        raise ValueError(f"{out} already exists; export_c writes a new directory (remove it or "
                         "choose another --out)")
    if sample_shape is None:
        sample_shape = trainer.sample_shape
    sources, graph, plan, rows = build_sources(trainer, sample_shape, max_batch)
    meta = {
        "target": target,
        "model_name": model_name,
        "sram_kib": sram_kib if sram_kib is not None else (1024 if target == "cortex-m7" else None),
        "flash_kib": (flash_kib if flash_kib is not None
                      else (2048 if target == "cortex-m7" else None)),
        "sample_shape": list(sample_shape),
        "classes": graph.tensors[-1].numel,
        "max_batch": trainer.config.micro_batch or max_batch,
        "max_samples": max_samples,
        "config": trainer.config.as_dict(),
        "start_step": trainer.steps,
        "trainable": [{k: r[k] for k in ("name", "mode", "d_w", "d_a", "cout", "layer_index")}
                      for r in rows],
        "source_tflite": source_tflite is not None,
        "arena_bytes": plan.total,
        "arena_plan": plan.rows(),
    }
    sources["Makefile"] = _makefile(meta)
    if target == "cortex-m7":
        sources.update(mcu_sources(meta))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        # mkdtemp makes the folder 0700; the project gets a plain mkdir's mode (0777 - umask)
        os.chmod(tmp, 0o777 & ~_umask())
        for name, text in sources.items():
            (tmp / name).write_text(text)
        (tmp / "program.json").write_text(json.dumps(meta, indent=2) + "\n")
        if source_tflite is not None:
            (tmp / SOURCE_FILE).write_bytes(source_tflite)
        model = copy.deepcopy(trainer.model)
        save_model(model, tmp / "model.pt")
        # linked here, the ELF (tmp/build) moves with the project and is not rebuilt by run
        fit = check_fits(DeviceProgram(tmp, meta, model)) if require_fit else {}
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return DeviceProgram(out, meta, model, fit)
