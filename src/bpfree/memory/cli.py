"""``bpfree memory``: training-memory and compute accounting of a model and method.

For each method: its memory as named parts (bytes) and its multiply-accumulates per
iteration; ``--layers`` adds the per-layer profile (d_w, d_a, PMT's WP/NP choice, MACs).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..models import get_model, list_models


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .rules import registered_rules

    parser.description = ("Analytic training memory (PMT Table 3 rules, per layer) and "
                          "multiply-accumulates per iteration of a reference model for one or "
                          "more methods, memory as named parts in bytes.")
    parser.add_argument("--model", default="mnist-mlp", choices=list_models(), help="reference model")
    parser.add_argument("--method", action="append", choices=registered_rules(),
                        help="method rule (repeat for several; default: all)")
    parser.add_argument("--batch-size", type=_positive_int, default=64, help="mini-batch size N")
    parser.add_argument("--queries", type=_positive_int, default=16,
                        help="queries Q per step (per layer for the layer-wise methods)")
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
                        help="also print the per-layer profile (d_w, d_a, WP/NP, MACs)")
    parser.add_argument("--json", metavar="PATH", help="also write the reports as JSON")


def _layer_table(profile, trainable) -> str:
    from .rules import pmt_modes

    modes = pmt_modes(profile, trainable, fold_bn=False)
    width = max([len("layer"), *(len(layer.name) for layer in profile.layers)])
    type_w = max([len("type"), *(len(layer.type) for layer in profile.layers)])
    lines = [f"{'layer':<{width}}  {'type':<{type_w}}  {'d_w':>8}  {'d_a':>8}  {'pmt':>4}  "
             f"{'macs':>10}"]
    for layer in profile.layers:
        mode = modes.get(layer.name, "-")
        lines.append(f"{layer.name or '(root)':<{width}}  {layer.type:<{type_w}}  "
                     f"{layer.d_w:>8}  {layer.d_a:>8}  {mode:>4}  {layer.macs:>10,}")
    lines.append(f"{'total':<{width}}  {'':<{type_w}}  {sum(l.d_w for l in profile.layers):>8}  "
                 f"{'':>8}  {'':>4}  {profile.macs:>10,}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from .profile import profile_model
    from .report import format_bytes
    from .rules import (_resolve_trainable, analytic, macs_per_iteration, method_defaults,
                        registered_rules)
    import torch

    spec = get_model(args.model)
    model = spec.build()
    # Per-sample profile: the rules scale activations linearly to N.
    base = profile_model(model, torch.zeros(1, *spec.input_shape))
    fold_choice = {"auto": None, "yes": True, "no": False}[getattr(args, "fold_bn", "auto")]
    trainable = getattr(args, "trainable", None) or None
    coordinates = getattr(args, "coordinates", None)
    methods = args.method or list(registered_rules())

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

    if args.layers:
        for fold in dict.fromkeys(fold for _, fold, *_ in results):
            profile = base.fold_batchnorm() if fold else base
            selected = _resolve_trainable(profile, trainable)
            note = " (BatchNorm folded into conv)" if fold else ""
            print(f"{spec.name}: layers{note}, per sample; pmt = WP if d_w < d_a else NP, "
                  f"for trainable layers")
            print(_layer_table(profile, list(selected)))
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
        print(__import__("bpfree.memory.mcunet_tables", fromlist=["_"]).tables_text())
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [{**report.as_dict(), "macs_per_iteration": macs, "batch_size": args.batch_size,
                 "num_queries": args.queries, "dtype_bytes": dtype_bytes, "fold_bn": fold,
                 "trainable": trainable}
                for method, fold, dtype_bytes, report, macs in results]
        path.write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {path}")
    return 0
