"""``bpfree memory``: training-memory and compute accounting of a model and method.

For each method: its memory as named parts (bytes) and its multiply-accumulates per
iteration; ``--layers`` adds the per-layer profile (d_w, d_a, PMT's WP/NP choice, MACs) and
per-layer bytes: the inference working set, BP's saved activation, PMT's activation peak and
gradient buffer (:func:`bpfree.pmt.layer_memory`), with their totals.
"""

from __future__ import annotations

import argparse
import sys

import torch

from .io import write_json
from .memory.profile import profile_model
from .memory.report import format_bytes
from .memory.rules import (GRAD_BYTES, analytic, available_rules, macs_per_iteration,
                           method_defaults, resolve_trainable)
from .models import get_model, list_models
from .pmt.mcunet_tables import tables_text
from .pmt.memory import cge_coordinates, layer_memory


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


EPILOG = """\
examples:
  bpfree memory
  bpfree memory --model mcunet-in1 --method bp --method pmt
  bpfree memory --model mnist-cnn --method pmt --layers --json memory.json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Analytic training memory (PMT Table 3 rules, per layer) and "
                          "multiply-accumulates per iteration of a reference model for one or "
                          "more methods, memory as named parts in bytes.")
    parser.add_argument("--model", default="mnist-mlp", choices=list_models(), help="reference model")
    parser.add_argument("--method", action="append", choices=available_rules(),
                        help="method rule (repeat for several; default: all)")
    parser.add_argument("--batch-size", type=_positive_int, default=None,
                        help="mini-batch size N (default: 64; 1 for mcunet-in1, PMT Tables 8-9)")
    parser.add_argument("--queries", type=_positive_int, default=None,
                        help="queries Q per step (per layer for the layer-wise methods) "
                             "(default: 16; 50 for mcunet-in1, PMT Tables 8-9)")
    parser.add_argument("--coordinates", type=_positive_int, default=None,
                        help="coordinates per step for cge (default: --queries)")
    parser.add_argument("--dtype-bytes", type=_positive_int, default=None,
                        help="bytes per weight / activation value (4 = fp32, 1 = int8); default: "
                             "the method's own (1 for pmt, pmt-sparse, mezo, cge, bp-int8, "
                             "sparse-bp; 4 otherwise)")
    parser.add_argument("--trainable", nargs="+", action="extend", metavar="GLOB",
                        help="trainable parameters: names, module prefixes or globs "
                             "(e.g. '4.*'); default: all. Names refer to the BatchNorm-folded "
                             "graph for the int8 methods")
    parser.add_argument("--fold-bn", choices=("auto", "yes", "no"), default="auto",
                        help="fold BatchNorm into the preceding conv (auto: the int8 methods do)")
    parser.add_argument("--layers", action="store_true",
                        help="also print the per-layer profile (d_w, d_a, WP/NP, MACs) and per-layer "
                             "bytes (inference working set, BP saved activations, PMT peak "
                             "and gradient buffer)")
    parser.add_argument("--json", metavar="PATH", help="also write the reports as JSON")


def _layer_table(profile, trainable, batch_size: int, dtype_bytes: int) -> str:
    """Per-layer d_w, d_a, PMT mode, MACs and bytes (:func:`bpfree.pmt.layer_memory`)."""
    rows = layer_memory(profile, batch_size=batch_size, dtype_bytes=dtype_bytes,
                        trainable=trainable, fold_bn=False)
    width = max([len("layer"), *(len(r.name or "(root)") for r in rows)])
    type_w = max([len("type"), *(len(r.type) for r in rows)])
    cols = ("d_w", "d_a", "pmt", "macs", "live_B", "bp_saved_B", "pmt_peak_B", "pmt_grad_B")
    widths = (8, 8, 4, 12, 10, 11, 10, 10)

    def line(name, kind, values):
        cells = [f"{v:>{w},}" if isinstance(v, int) else f"{v:>{w}}"
                 for v, w in zip(values, widths)]
        return f"{name:<{width}}  {kind:<{type_w}}  " + "  ".join(cells)

    lines = [line("layer", "type", cols)]
    for r in rows:
        lines.append(line(r.name or "(root)", r.type, (
            r.d_w, r.d_a, r.mode or "-", r.macs, r.live_bytes, r.bp_saved_bytes,
            r.pmt_peak_bytes if r.mode else "-", r.pmt_grad_bytes if r.mode else "-")))
    trained = [r for r in rows if r.mode]
    lines.append(line("total", "", (
        sum(r.d_w for r in rows), "", "", sum(r.macs for r in rows),
        max((r.live_bytes for r in rows), default=0), sum(r.bp_saved_bytes for r in rows),
        max((r.pmt_peak_bytes for r in trained), default=0),
        max((r.pmt_grad_bytes for r in trained), default=0))))
    lines.append("total: d_w, macs and bp_saved_B summed (BP keeps every saved input at "
                 "once); live_B (the inference peak), pmt_peak_B and pmt_grad_B the max over "
                 "layers (PMT estimates one layer at a time and reuses its buffers)")
    return "\n".join(lines)


#: (N, Q) when --batch-size / --queries are not given: the paper's own setting for the model
#: whose tables it prints (PMT Tables 8-9: MCUNet-in1 at N=1, Q=50), else a generic one.
DEFAULT_BATCH_QUERIES = {"mcunet-in1": (1, 50)}


def main(args: argparse.Namespace) -> int:
    spec = get_model(args.model)
    default_n, default_q = DEFAULT_BATCH_QUERIES.get(args.model, (64, 16))
    if getattr(args, "batch_size", None) is None:
        args.batch_size = default_n
    if getattr(args, "queries", None) is None:
        args.queries = default_q
    model = spec.build()
    # Per-sample profile: the rules scale activations linearly to N.
    base = profile_model(model, torch.zeros(1, *spec.input_shape))
    fold_choice = {"auto": None, "yes": True, "no": False}[getattr(args, "fold_bn", "auto")]
    trainable = getattr(args, "trainable", None) or None
    coordinates = getattr(args, "coordinates", None)
    methods = args.method or list(available_rules())

    # Compute everything first so bad input fails before anything is printed.
    results = []
    for method in methods:
        defaults = method_defaults(method)
        fold = defaults["fold_bn"] if fold_choice is None else fold_choice
        dtype_bytes = args.dtype_bytes or defaults["dtype_bytes"]
        options = {"coordinates": coordinates} if method == "cge" and coordinates else {}
        report = analytic(base, method, batch_size=args.batch_size, num_queries=args.queries,
                          dtype_bytes=dtype_bytes, trainable=trainable, fold_bn=fold, **options)
        macs = (macs_per_iteration(base, method, args.batch_size, args.queries,
                                   trainable=trainable, coordinates=coordinates, fold_bn=fold)
                if defaults["has_macs"] else None)
        results.append((method, fold, dtype_bytes, report, macs))
        if method == "cge" and coordinates:
            profile = base.fold_batchnorm() if fold else base
            k = cge_coordinates(profile, args.queries, coordinates,
                                resolve_trainable(profile, trainable))
            if k < coordinates:
                print(f"note: --coordinates {coordinates:,} is more than the {k:,} trainable "
                      f"parameters; cge perturbs each at most once per step, so K = {k:,}",
                      file=sys.stderr)

    if args.layers:
        for fold in dict.fromkeys(fold for _, fold, *_ in results):
            profile = base.fold_batchnorm() if fold else base
            selected = resolve_trainable(profile, trainable)
            note = " (BatchNorm folded into conv)" if fold else ""
            dtype_bytes = args.dtype_bytes or (1 if fold else 4)
            print(f"{spec.name}: layers{note}; d_w, d_a per sample; pmt = WP if d_w < d_a "
                  f"else NP, for trainable layers; macs and bytes for N={args.batch_size} at "
                  f"{dtype_bytes} B/value (gradients {GRAD_BYTES} B)")
            print(_layer_table(profile, list(selected), args.batch_size, dtype_bytes))
            print()

    for method, fold, dtype_bytes, report, macs in results:
        print(f"{spec.name} ({spec.description}), method {method}, N={args.batch_size}, "
              f"Q={args.queries}, {dtype_bytes} B/value{', BN folded' if fold else ''}")
        print(report.table())
        if macs is not None:
            print(f"MACs per iteration: {macs:,}")
        print()

    if len(results) > 1:
        name_w = max(len("method"), *(len(m) for m, *_ in results))
        print(f"{'method':<{name_w}}  {'B/value':>7}  {'total bytes':>14}  {'size':>10}  "
              f"{'MACs/iter':>16}")
        for method, _, dtype_bytes, report, macs in results:
            macs_text = f"{macs:,}" if macs is not None else "-"
            print(f"{method:<{name_w}}  {dtype_bytes:>7}  {report.total:>14,}  "
                  f"{format_bytes(report.total):>10}  {macs_text:>16}")
        print()

    if args.model == "mcunet-in1":  # PMT Tables 8-9, the paper's numbers beside ours
        print(tables_text())
    if args.json is not None:
        rows = [{**report.as_dict(), "macs_per_iteration": macs, "batch_size": args.batch_size,
                 "num_queries": args.queries, "dtype_bytes": dtype_bytes, "fold_bn": fold,
                 "trainable": trainable}
                for method, fold, dtype_bytes, report, macs in results]
        print(f"wrote {write_json(rows, args.json)}")
    return 0
