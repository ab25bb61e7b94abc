"""``bpfree fleet``: data-parallel or federated BP-free training on one machine's loopback.

Data-parallel (default): W spawned gloo workers train the demo's drift adaptation
(:mod:`.fleet`), then one process trains the same run alone; the JSON compares the
workers' weight digests with that single-process digest and reports the bytes each worker
handed to the all-reduce per step beside BP's dense all-reduce. ``--federated`` runs the
seed-ledger protocol (:mod:`.federated`) with C clients for R rounds and checks that a
client joining after the last round replays the ledger to the server's digest.
"""

from __future__ import annotations

import argparse
import copy
import platform
import tempfile
from pathlib import Path

import torch

from ..demo import accuracy_fraction
from ..io import check_output_path, write_json
from ..pmt import PMTConfig
from .comm import DEFAULT_TIMEOUT_S, SingleProcess
from .ddp import ddp_bytes_per_step
from .fleet import (METHODS, PERTURBATIONS, FleetOptions, build_setup,
                         pmt_trainer_digest, train, trainable_values, weights_digest)
from .federated import bytes_per_round, late_client, run_federated
from .launch import check_launch, launch
from .ledger import SeedLedger


EPILOG = """\
examples:
  bpfree fleet --workers 2 --epochs 1
  bpfree fleet --federated --clients 4 --rounds 5 --ledger ledger.json
  bpfree fleet --federated --flower --clients 4 --rounds 5
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = FleetOptions()
    parser.add_argument("--workers", type=int, default=2, help="data-parallel workers W")
    parser.add_argument("--method", choices=METHODS, default=d.method,
                        help="pmt: integer PMT on the INT8 MLP; zo: float RGE (ZOOptimizer)")
    parser.add_argument("--perturbation", choices=PERTURBATIONS, default=d.perturbation,
                        help="PMT's weight / node / adaptive perturbation (method pmt)")
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--batch-size", type=int, default=d.batch_size,
                        help="global mini-batch, split over the workers")
    parser.add_argument("--queries", type=int, default=d.queries, help="Q per layer and step")
    parser.add_argument("--lr", type=float, default=d.lr, help="PMT's base learning rate")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help="a worker that stops makes the others fail within this")
    parser.add_argument("--federated", action="store_true",
                        help="federated rounds with a seed ledger instead of data parallelism")
    parser.add_argument("--clients", type=int, default=4, help="federated clients C")
    parser.add_argument("--rounds", type=int, default=20, help="federated rounds R")
    parser.add_argument("--ledger", metavar="PATH",
                        help="the federated seed ledger (resumed when it exists; default: a "
                             "temporary file)")
    parser.add_argument("--flower", action="store_true",
                        help="with --federated: run the rounds through Flower (flwr, the "
                             "'flower' extra): bpfree.distributed.flower's client and strategy "
                             "in Flower's server loop, in this process; the same weights")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")


def _options(args) -> FleetOptions:
    return FleetOptions(method=args.method, perturbation=args.perturbation, seed=args.seed,
                        epochs=args.epochs, batch_size=args.batch_size, queries=args.queries,
                        lr=args.lr)


def single_process(setup: dict, options: FleetOptions) -> dict:
    """The reference: one process, one thread, the whole batch, the same code path."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train({**setup, "model": copy.deepcopy(setup["model"])}, options, SingleProcess())
    finally:
        torch.set_num_threads(threads)


def data_parallel(workers: int, options: FleetOptions, *, timeout_s: float) -> dict:
    """Run the fleet and the single-process reference; returns the JSON document."""
    check_launch(workers, timeout_s)
    setup = build_setup(options)
    d = trainable_values(setup)
    ddp = ddp_bytes_per_step(copy.deepcopy(setup["float_model"]),
                             setup["x"][:options.batch_size], setup["y"][:options.batch_size])
    results = launch(workers, options, setup, timeout_s=timeout_s)
    reference = single_process(setup, options)
    digests = [r["weights_sha256"] for r in results]
    doc = {
        "mode": "data-parallel", "workers": workers, "options": options.as_dict(),
        "weights_sha256": digests, "single_process_sha256": reference["weights_sha256"],
        "workers_agree": len(set(digests)) == 1,
        "equal_to_single_process": set(digests) == {reference["weights_sha256"]},
        "bytes_per_step": results[0]["bytes_per_step"],
        "collectives_per_step": results[0]["collectives_per_step"],
        "dense_allreduce_bytes_per_step": ddp, "trainable_values": d,
        "dense_allreduce_source": "DDP comm hook, BP on the float model, measured",
        "acc_before": results[0]["acc_before"], "acc_after": results[0]["acc_after"],
        "single_process_acc_after": reference["acc_after"],
        "steps": results[0]["steps"],
        "seconds_per_step": [r["seconds_per_step"] for r in results],
        "single_process_seconds_per_step": reference["seconds_per_step"],
        "backend": "gloo", "device": platform.processor() or platform.machine(),
    }
    if options.method == "pmt":
        r0 = results[0]
        doc["modes"] = r0["modes"]
        doc["bytes_by_kind"] = r0["bytes_by_kind"]
        doc["wp_bytes_per_layer_per_query"] = (
            r0["bytes_by_kind"]["wp"] / (r0["wp_layers"] * options.queries)
            if r0["wp_layers"] else None)
        doc["measured_bytes_per_step_by_collective"] = r0["measured_bytes_per_step_by_collective"]
        doc["np_bytes_per_step"] = r0["measured_bytes_per_step_by_collective"].get(
            "NP gradient sums", 0.0)
        doc["np_bp_bytes_per_step"] = 4 * r0["np_dense_values"]
        doc["pmt_trainer_sha256"] = pmt_trainer_digest(setup, options)
        doc["equal_to_pmt_trainer"] = set(digests) == {doc["pmt_trainer_sha256"]}
    return doc


def _flower(args, options: FleetOptions, setup: dict, config: PMTConfig,
            ledger: SeedLedger) -> dict:
    """The rounds through Flower (run_federated's result keys)."""
    # lazy: flwr is the optional 'flower' extra; only --flower needs it
    from .flower import run_flower

    if len(ledger):
        raise ValueError(f"--flower starts a new ledger, and {args.ledger} already holds "
                         f"{len(ledger)} rounds; resume it without --flower, or choose another "
                         "--ledger")
    strategy = run_flower(setup["model"], config, setup["x"], setup["y"], clients=args.clients,
                          rounds=args.rounds, batch_size=options.batch_size, lr=options.lr,
                          ledger=ledger)
    if not all(strategy.agree):
        raise RuntimeError("a Flower client's weights differ from the server's")
    return {"replica": strategy.replica, "ledger": ledger, "replayed": 0,
            "rounds_run": args.rounds}


def federated(args, options: FleetOptions) -> dict:
    if options.method != "pmt":
        raise ValueError("--federated runs PMT with weight perturbation: use --method pmt")

    setup = build_setup(options)
    initial = copy.deepcopy(setup["model"])
    config = PMTConfig(queries=options.queries, perturbation=options.perturbation,
                       seed=options.seed)
    header = {"method": "pmt", "options": options.as_dict(), "clients": args.clients,
              "initial_sha256": weights_digest(initial)}
    with tempfile.TemporaryDirectory(prefix="bpfree-ledger-") as tmp:
        ledger_path = args.ledger or str(Path(tmp) / "ledger.json")
        if args.ledger:
            check_output_path(args.ledger, what="--ledger")
        if args.flower:
            out = _flower(args, options, setup, config, SeedLedger(ledger_path, header))
        else:
            out = run_federated(setup["model"], config, setup["x"], setup["y"],
                                clients=args.clients, rounds=args.rounds,
                                batch_size=options.batch_size, lr=options.lr,
                                ledger_path=ledger_path, header=header)
        server = out["replica"]
        late = late_client(initial, config, setup["x"][:1], out["ledger"])
    d = trainable_values(setup)
    per_round = bytes_per_round(len(server.wp), options.queries, d, args.clients)
    return {
        "mode": "federated", "clients": args.clients, "rounds": args.rounds,
        "transport": "flower" if args.flower else "in-process",
        "options": options.as_dict(), "ledger": args.ledger,
        "rounds_replayed_at_start": out["replayed"], "rounds_run": out["rounds_run"],
        "server_sha256": weights_digest(server.trainer.model),
        "late_client_sha256": weights_digest(late.trainer.model),
        "late_client_agrees": weights_digest(late.trainer.model)
        == weights_digest(server.trainer.model),
        "bytes_per_round": per_round, "trainable_values": d,
        "acc_before": accuracy_fraction(initial, setup["x_test"], setup["y_test"]),
        "acc_after": accuracy_fraction(server.trainer.model, setup["x_test"], setup["y_test"]),
    }


def main(args: argparse.Namespace) -> int:
    options = _options(args)
    if args.flower and not args.federated:
        raise ValueError("--flower applies to --federated (the seed-ledger rounds)")
    if args.federated:
        doc = federated(args, options)
        print(f"federated: {doc['clients']} clients, {doc['rounds']} rounds "
              f"({doc['rounds_run']} run now, {doc['rounds_replayed_at_start']} replayed); "
              f"late client {'agrees' if doc['late_client_agrees'] else 'DIFFERS'}; "
              f"{doc['bytes_per_round']['up_per_client']} B up / "
              f"{doc['bytes_per_round']['down_per_client']} B down per client and round "
              f"(FedAvg {doc['bytes_per_round']['fedavg_up_per_client']:,} B each way); "
              f"accuracy {doc['acc_before']:.1%} -> {doc['acc_after']:.1%}")
        ok = doc["late_client_agrees"]
    else:
        doc = data_parallel(args.workers, options, timeout_s=args.timeout)
        print(f"{doc['workers']} workers, {doc['steps']} steps: digests "
              f"{'agree' if doc['workers_agree'] else 'DIFFER'}, "
              f"{'equal to' if doc['equal_to_single_process'] else 'DIFFERENT from'} the "
              f"single process; {doc['bytes_per_step']:,.0f} B all-reduced per step and worker "
              f"(BP: {doc['dense_allreduce_bytes_per_step']:,} B); accuracy "
              f"{doc['acc_before']:.1%} -> {doc['acc_after']:.1%}")
        ok = doc["workers_agree"]
    if args.json is not None:
        print(f"wrote {write_json(doc, args.json)}")
    return 0 if ok else 1

