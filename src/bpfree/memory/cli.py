"""``bpfree memory``: training-memory accounting of a model and method, as named parts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..models import get_model, list_models


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .rules import registered_rules

    parser.description = ("Analytic training memory (PMT Table 3 rules, per layer) of a "
                          "reference model for one or more methods, as named parts in bytes.")
    parser.add_argument("--model", default="mnist-mlp", choices=list_models(), help="reference model")
    parser.add_argument("--method", action="append", choices=registered_rules(),
                        help="method rule (repeat for several; default: all)")
    parser.add_argument("--batch-size", type=int, default=64, help="mini-batch size N")
    parser.add_argument("--queries", type=int, default=16, help="queries Q per step")
    parser.add_argument("--dtype-bytes", type=int, default=4, help="bytes per value (4 = fp32, 1 = int8)")
    parser.add_argument("--layers", action="store_true", help="also print the per-layer profile")
    parser.add_argument("--json", metavar="PATH", help="also write the reports as JSON")


def main(args: argparse.Namespace) -> int:
    from .profile import profile_model
    from .rules import analytic, registered_rules
    import torch

    spec = get_model(args.model)
    model = spec.build()
    profile = profile_model(model, torch.zeros(args.batch_size, *spec.input_shape))
    if args.layers:
        print(profile.table())
        print()
    reports = []
    for method in args.method or registered_rules():
        report = analytic(profile, method, batch_size=args.batch_size, num_queries=args.queries,
                          dtype_bytes=args.dtype_bytes)
        reports.append(report)
        print(f"{spec.name} ({spec.description}), method {method}, N={args.batch_size}, "
              f"Q={args.queries}, {args.dtype_bytes} B/value")
        print(report.table())
        print()
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([r.as_dict() for r in reports], indent=2) + "\n")
        print(f"wrote {path}")
    return 0
