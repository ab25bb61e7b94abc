"""``torchrun --nproc-per-node W -m bpfree.distributed [options]``: one fleet worker.

torchrun sets the rendezvous variables; each process builds the same setup (one thread, so
the BP-pretrained factory model is the same bytes everywhere), trains its shards, and rank 0
gathers every worker's digest and writes the JSON (``--json``) with the same keys as
``bpfree fleet``, the single-process reference included.
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
import torch.distributed as dist

from ..io import write_json
from .cli import _options, add_arguments, single_process
from .comm import init_group
from .fleet import build_setup, train, trainable_values


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bpfree.distributed",
                                     description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    options = _options(args)
    torch.set_num_threads(1)
    comm = init_group(timeout_s=args.timeout)
    try:
        setup = build_setup(options)
        d = trainable_values(setup)
        reference_setup = {**setup, "model": copy.deepcopy(setup["model"])}
        result = train(setup, options, comm)
        gathered = [None] * comm.world_size
        dist.all_gather_object(gathered, result)
    finally:
        comm.close()
    if comm.rank == 0:
        reference = single_process(reference_setup, options)
        digests = [r["weights_sha256"] for r in gathered]
        doc = {"mode": "data-parallel", "launcher": "torchrun", "workers": comm.world_size,
               "options": options.as_dict(), "weights_sha256": digests,
               "single_process_sha256": reference["weights_sha256"],
               "equal_to_single_process": set(digests) == {reference["weights_sha256"]},
               "bytes_per_step": result["bytes_per_step"],
               "dense_allreduce_bytes_per_step": 4 * d,
               "acc_before": result["acc_before"], "acc_after": result["acc_after"]}
        print(f"{comm.world_size} workers: digests equal to the single process: "
              f"{doc['equal_to_single_process']}")
        if args.json:
            write_json(doc, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
