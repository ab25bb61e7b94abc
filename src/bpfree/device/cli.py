"""``bpfree device export|run|report``: the generated C training engine from the shell."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from ..data import load_digits_split
from ..data.idx import load_mnist
from ..data.npz import load_npz
from ..io import refuse_output_over_input, write_json
from ..memory_cli import DEFAULT_BATCH_QUERIES
from ..models import digits_mlp, mcunet_in1, mnist_cnn
from ..models.mcunet import load_quantized
from ..pmt import PMTConfig, PMTTrainer
from ..pmt.sparse import block, split_blocks
from ..quant import quantize_model
from .export import DeviceProgram, export_c
from .model_file import load_model
from .validate import MAX_BATCH, MAX_SAMPLES
from .report import format_report, program_report
from .rate import check_rate, choose_rate
from .run import run_c
from .tflite_model import load_tflite_for_device, write_tflite

MODELS = ("digits-mlp", "mnist-cnn", "mcunet-in1")
#: Largest values of the count options: the C driver indexes its static buffers with int32,
#: and these keep them (and a run) far below that (bpfree.device.validate has the same bounds).
LIMITS = {"queries": 10_000, "batch_size": MAX_BATCH, "max_samples": MAX_SAMPLES,
          "samples": 1 << 24, "steps": 1 << 24}
DATASETS = ("digits", "mnist")

#: The examples of each action's --help, in an order that runs (export, then run and report
#: the exported folder); tests/test_help_examples.py runs them all.
EXAMPLES = {
    "export": ("  bpfree device export --model digits-mlp --out prog\n"
               "  bpfree device export --model mcunet-in1 --target cortex-m7 --out mcunet\n"
               "  bpfree device export --model mcunet-in1 --target cortex-m7 --sparse --block 3 \\\n"
               "      --sram-kib 320 --out mcunet-b3\n"),
    "run": ("  bpfree device run prog --data digits --steps 5\n"
            "  bpfree device run prog --data digits --steps 20 --lr 0.03 --json run.json\n"),
    "report": "  bpfree device report prog\n",
}
EPILOG = "examples:\n" + "".join(EXAMPLES.values()) + (
    "\nThe C program, its targets and memory: docs/DEVICE.md. The cortex-m7 target needs "
    "`make device-toolchain`.\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(title="device commands", metavar="ACTION", dest="action")
    fmt = {"formatter_class": parser.formatter_class}
    ex = sub.add_parser("export", help="write the C99 PMT program of a model",
                        description="Write a self-contained C99 project that trains the model "
                                    "with PMT (device-exact arithmetic).",
                        epilog="examples:\n" + EXAMPLES["export"], **fmt)
    ex.add_argument("--model", required=True,
                    help=f"one of {', '.join(MODELS)}, a model folder (graph.json + "
                         "weights.npz, the format of the bundled MCUNet-in1), an int8 .tflite "
                         "(trained on its logits, before a trailing SOFTMAX, as `bpfree adapt`; "
                         "`device run --out-tflite` writes the weights back), or a saved "
                         "QuantizedModel (.pt, read without unpickling code)")
    ex.add_argument("--target", default="host", choices=["host", "cortex-m7"],
                    help="host: system C compiler; cortex-m7: arm-none-eabi + QEMU mps2-an500")
    ex.add_argument("--out", required=True, help="project directory to create (must not exist)")
    ex.set_defaults(out_folder_file="program.json")
    ex.add_argument("--sparse", action="store_true",
                    help="train only one of four blocks (PMT §3.3 sparse update); see --block")
    ex.add_argument("--block", type=int, default=4, choices=(1, 2, 3, 4),
                    help="with --sparse: the block to train (default 4, the last; PMT §4.4 "
                         "trains block 3, whose MCUNet-in1 program fits 256 KiB)")
    ex.add_argument("--seed", type=int, default=1, help="perturbation seed (>= 1)")
    ex.add_argument("--queries", type=int,
                    help="queries Q per layer and step (default: 50 for mcunet-in1, PMT Tables "
                         "8-9, as `bpfree memory`; else 2)")
    ex.add_argument("--batch-size", type=int,
                    help="largest batch the arena holds (default: 1 for mcunet-in1, PMT Tables "
                         "8-9; else 8)")
    ex.add_argument("--max-samples", type=int, default=256,
                    help="most training samples main.c reads")
    ex.add_argument("--sram-kib", type=int,
                    help="MCU SRAM (cortex-m7; default 1024): export links the program and "
                         "fails (exit 2, nothing written) if it does not fit")
    ex.add_argument("--flash-kib", type=int, help="MCU flash (cortex-m7; default 2048)")
    run = sub.add_parser("run", help="compile if needed and run K PMT steps",
                         description="Compile the program if needed and run K PMT steps on "
                                     "cyclic batches of a dataset.",
                         epilog="examples:\n" + EXAMPLES["run"], **fmt)
    run.add_argument("dir", help="program directory written by `bpfree device export`")
    run.add_argument("--data", required=True,
                     help=f"one of {', '.join(DATASETS)}, or an .npz with arrays x and y")
    run.add_argument("--steps", type=int, default=20, help="PMT steps K")
    run.add_argument("--batch-size", type=int, default=8, help="mini-batch size")
    run.add_argument("--lr", type=float,
                     help="learning rate (PMT Eq. 8); checked first by two steps on the first "
                          "batch, refused if that one update more than doubles the batch's loss "
                          "or moves no weight (default: the first of 0.01, 0.003, 0.001, ... "
                          "(or 0.03, 0.1, ...) that passes this check)")
    run.add_argument("--no-rate-check", action="store_true",
                     help="run --lr as given, without the two-step probe")
    run.add_argument("--samples", type=int, default=256, help="training samples to cycle over")
    run.add_argument("--json", metavar="OUT", help="write losses and timing as JSON to OUT")
    run.add_argument("--out-tflite", metavar="OUT.tflite",
                     help="for a program exported from a .tflite: write the trained weights "
                          "into a copy of that file (nothing else changes; LiteRT runs it)")
    rep = sub.add_parser("report", help="sizes, arena plan and analytic memory of a program",
                         description="Print text/data/bss (cortex-m7), the arena plan per "
                                     "buffer and the analytic PMT memory of a program.",
                         epilog="examples:\n" + EXAMPLES["report"], **fmt)
    rep.add_argument("dir", help="program directory")
    rep.add_argument("--json", metavar="OUT", help="also write the report as JSON to OUT")
    parser.set_defaults(device_parser=parser)


def _calibration(name: str) -> torch.Tensor:
    if name == "digits-mlp":
        return torch.tensor(load_digits_split(0)[0][:256])
    images, _ = load_mnist(split="train")
    return torch.tensor(images[:256], dtype=torch.float32).div_(255).unsqueeze(1)


def build_model(name: str):
    """(integer model, one example input) for a built-in name or a saved QuantizedModel."""
    if name == "mcunet-in1":
        return mcunet_in1(), torch.zeros(1, 3, 128, 128, dtype=torch.int8)
    if name in ("digits-mlp", "mnist-cnn"):
        x = _calibration(name)
        torch.manual_seed(0)
        builder = digits_mlp if name == "digits-mlp" else mnist_cnn
        rng = (0.0, 1.0)
        return quantize_model(builder().eval(), x, input_range=rng), x[:1]
    path = Path(name)
    if path.is_dir():  # graph.json + weights.npz, as bpfree.models.mcunet reads them
        model = load_quantized(path)
        return model, torch.zeros(1, *model.sample_shape, dtype=torch.int8)
    if not path.exists():
        raise ValueError(f"--model must be one of {MODELS}, a model folder (graph.json + "
                         f"weights.npz), a .tflite file or a saved .pt QuantizedModel, "
                         f"got {name!r}")
    if path.suffix.lower() == ".tflite":  # parsed, never executed; adapt's output head
        model, example, _ = load_tflite_for_device(path)
        return model, example
    model = load_model(path, what="--model")  # restricted unpickler: never runs code
    shape = getattr(model, "sample_shape", None)
    if shape is None:
        raise ValueError(f"{path}: a saved model needs a `sample_shape` attribute (per-sample "
                         "input shape) so the exporter can size the arena")
    return model, torch.zeros(1, *shape, dtype=torch.int8)


def _check_export_options(args) -> None:
    for name in ("queries", "batch_size", "max_samples"):
        value = getattr(args, name)
        if not 1 <= value <= LIMITS[name]:
            raise ValueError(f"--{name.replace('_', '-')} must lie in [1, {LIMITS[name]}], "
                             f"got {value}")
    out = Path(args.out)
    if out.exists():
        raise ValueError(f"--out: {out} already exists; export writes a new project directory "
                         "(remove it or choose another --out)")
    if Path(args.model).exists():
        refuse_output_over_input({"--out": args.out}, {"--model": args.model})


def _export(args) -> int:
    # (batch, Q): the paper's for MCUNet-in1 (PMT Tables 8-9), the same as `bpfree memory`'s
    batch, queries = DEFAULT_BATCH_QUERIES.get(args.model, (8, 2))
    args.batch_size = batch if args.batch_size is None else args.batch_size
    args.queries = queries if args.queries is None else args.queries
    _check_export_options(args)
    source = None
    if Path(args.model).suffix.lower() == ".tflite" and Path(args.model).exists():
        model, example, source = load_tflite_for_device(args.model)
    else:
        model, example = build_model(args.model)
    config = PMTConfig(queries=args.queries, seed=args.seed, device_exact=True)
    trainable = None
    if args.sparse:
        probe = PMTTrainer(model, config, example=example)
        # Four blocks as in the paper (Table 4); fewer when the model has fewer stages, as
        # `bpfree adapt --method pmt-sparse` splits them.
        count = min(4, len({layer.stage for layer in probe.layers}))
        if args.block > count:
            raise ValueError(f"--block must lie in [1, {count}]: this model's trainable layers "
                             f"split into {count} blocks, got {args.block}")
        trainable = block(split_blocks(probe.layers, count), args.block)
    trainer = PMTTrainer(model, config, example=example, trainable=trainable)
    program = export_c(trainer, args.out, target=args.target, sram_kib=args.sram_kib,
                       flash_kib=args.flash_kib, max_batch=args.batch_size,
                       max_samples=args.max_samples,
                       model_name=args.model if args.model in MODELS else None,
                       source_tflite=source)
    print(f"wrote {program.path} ({args.target}, {len(program.meta['trainable'])} trainable "
          f"layers, Q={args.queries}, batch {args.batch_size}, arena "
          f"{program.meta['arena_bytes']} bytes)")
    print(_fit_line(program))
    return 0


def _fit_line(program: DeviceProgram) -> str:
    """How the export decided that the program fits (bpfree.device.fit.check_fits)."""
    fit, meta = program.fit, program.meta
    if not fit:
        return ("not checked against an MCU (host target; pass --sram-kib to bound it, or "
                "export --target cortex-m7 to link it)")
    if fit["linked"]:
        used = fit["data"] + fit["bss"]
        return (f"links into SRAM {meta['sram_kib']} KiB (data + bss {used / 1024:.1f} KiB) "
                f"and flash {meta['flash_kib']} KiB (text + data "
                f"{(fit['text'] + fit['data']) / 1024:.1f} KiB)")
    why = ("host target" if meta["target"] == "host" else
           "the cortex-m7 toolchain is missing: `make device-toolchain`")
    return (f"needs at least {fit['sram_floor'] / 1024:.1f} KiB of SRAM ({meta['sram_kib']} "
            f"KiB given): a lower bound, not linked ({why})")


def _dataset(name: str, samples: int):
    if name == "digits":
        x, y, _, _ = load_digits_split(0)
        return torch.tensor(x[:samples]), torch.tensor(y[:samples])
    if name == "mnist":
        images, labels = load_mnist(split="train")
        x = torch.tensor(images[:samples], dtype=torch.float32).div_(255).unsqueeze(1)
        return x, torch.tensor(labels[:samples])
    if not Path(name).exists():
        raise ValueError(f"--data must be one of {DATASETS} or an .npz file, got {name!r}")
    x, y = load_npz(name, what="--data", rows=samples)
    return torch.from_numpy(x), torch.from_numpy(y)


def _run(args) -> int:
    _check_run_options(args)
    program = DeviceProgram.load(args.dir)
    x, y = _dataset(args.data, args.samples)
    _pick_rate(args, program, x, y)
    result = run_c(program, x, y, steps=args.steps, batch_size=args.batch_size, lr=args.lr)
    for t, loss in enumerate(result.losses):
        print(f"step {t + 1:4d}  loss {loss:.6f}")
    doc = {"program": str(program.path), "target": program.target, "steps": args.steps,
           "batch_size": args.batch_size, "lr": args.lr, "losses": result.losses,
           "loss_sums": result.loss_sums, "wall_s": result.wall_s}
    if args.out_tflite:
        write_tflite(program.path, result.model, args.out_tflite)
        print(f"wrote {args.out_tflite}")
    if args.json:
        write_json(doc, args.json)
    return 0


def _pick_rate(args, program: DeviceProgram, x, y) -> None:
    """Check ``--lr`` on the program (bpfree.device.rate), or choose it when not given."""
    if args.lr is None:
        args.lr, probes = choose_rate(program, x, y, args.batch_size)
        tried = ", ".join(f"{p.lr:g} {p.verdict}" for p in probes[:-1])
        print(f"lr {args.lr:g} (chosen: {probes[-1].describe()}"
              + (f"; tried {tried}" if tried else "") + ")")
    elif not args.no_rate_check:
        check_rate(program, x, y, args.batch_size, args.lr)


def _check_run_options(args) -> None:
    if args.lr is not None and not (np.isfinite(args.lr) and args.lr >= 0):
        raise ValueError(f"--lr must be a finite number >= 0, got {args.lr}")
    for name in ("steps", "batch_size", "samples"):
        value = getattr(args, name)
        low = 0 if name == "steps" else 1
        if not low <= value <= LIMITS[name]:
            raise ValueError(f"--{name.replace('_', '-')} must lie in [{low}, {LIMITS[name]}], "
                             f"got {value}")
    inputs = {"DIR": args.dir}
    if args.data not in DATASETS:
        inputs["--data"] = args.data
    refuse_output_over_input({"--json": args.json, "--out-tflite": args.out_tflite}, inputs)


def _main_report(args) -> int:
    refuse_output_over_input({"--json": args.json}, {"DIR": args.dir})
    report = program_report(args.dir)
    print(format_report(report))
    if args.json:
        write_json(report, args.json)
    return 0


def main(args: argparse.Namespace) -> int:
    action = getattr(args, "action", None)
    if action is None:
        args.device_parser.print_help(sys.stderr)
        return 2
    return {"export": _export, "run": _run, "report": _main_report}[action](args)


__all__ = ["add_arguments", "main"]
