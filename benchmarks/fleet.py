"""Data-parallel BP-free training on W workers: wall time and bytes per step (issue 19).

PMT with weight perturbation on the demo's INT8 64-64-10 MLP (``bpfree fleet``): W = 1 and
W = 2 spawned gloo workers on the loopback, one thread each, against one process over the
whole batch; the bytes each worker hands to the all-reduce per step against DDP's measured
gradient buckets for BP on the same (float) model.
"""

import copy


from bpfree.bench.claims import claim
from bpfree.distributed.cli import single_process
from bpfree.distributed.ddp import ddp_bytes_per_step
from bpfree.distributed.fleet import FleetOptions, build_setup
from bpfree.distributed.launch import launch

NAME = "fleet"
DESCRIPTION = ("Issue 19: data-parallel PMT (WP) on W=1,2 gloo workers, bit-exact against one "
               "process; bytes per step against DDP with BP on the same model.")
SEED = 0


def run(quick: bool):
    options = FleetOptions(method="pmt", perturbation="wp", epochs=1 if quick else 3,
                           batch_size=64, queries=10)
    setup = build_setup(options)
    reference = single_process(setup, options)
    rows, runs = [], {}
    table = "fleet: PMT WP on the INT8 digits MLP, gloo on one CPU machine"
    setting = f"batch {options.batch_size}, Q={options.queries}, {reference['steps']} steps"
    for workers in (1, 2):
        results = launch(workers, options, setup, timeout_s=60)
        runs[workers] = results
        rows.append({"table": table, "method": f"PMT WP, W={workers}", "setting": setting,
                     "metric": "wall seconds per step (slowest worker)",
                     "value": max(r["seconds_per_step"] for r in results), "paper": None})
        rows.append({"table": table, "method": f"PMT WP, W={workers}", "setting": setting,
                     "metric": "bytes all-reduced per step and worker",
                     "value": float(results[0]["bytes_per_step"]), "paper": None})
    x, y = setup["x"][:options.batch_size], setup["y"][:options.batch_size]
    ddp = ddp_bytes_per_step(copy.deepcopy(setup["float_model"]), x, y)
    rows.append({"table": table, "method": "DDP, BP (float32)", "setting": setting,
                 "metric": "bytes all-reduced per step and worker", "value": float(ddp),
                 "paper": None})
    digests = [r["weights_sha256"] for w in (1, 2) for r in runs[w]]
    exact = set(digests) == {reference["weights_sha256"]}
    wp = runs[2][0]["bytes_by_kind"]["wp"]
    per_layer_query = wp / (runs[2][0]["wp_layers"] * options.queries)
    t1 = max(r["seconds_per_step"] for r in runs[1])
    t2 = max(r["seconds_per_step"] for r in runs[2])
    claims = [
        claim("fleet-bit-exact", "issue 19, Done when",
              "W=1 and W=2 workers end with weights bit-identical to one process",
              paper="all digests equal", ours=f"{len(set(digests))} distinct digest(s)",
              holds=exact),
        claim("fleet-64-bytes", "issue 19, Done when",
              "WP communicates <= 64 bytes per layer per query", paper=64.0,
              ours=per_layer_query, holds=per_layer_query <= 64),
        claim("fleet-vs-ddp", "issue 19 (FedKSeed, DeComFL)",
              "seed-and-scalar ZO all-reduces fewer bytes per step than DDP with BP",
              paper=None, ours=f"{wp} B vs {ddp} B ({ddp / wp:.0f}x)", holds=wp < ddp),
        claim("fleet-speedup", "issue 19, Scaling",
              "W=2 workers take less wall time per step than W=1 on this machine",
              paper=None, ours=f"{t2:.4f} s vs {t1:.4f} s", holds=t2 < t1,
              note="a 2-core machine shared with other jobs: timing, not a law"),
    ]
    return rows, {"claims": claims, "options": options.as_dict(),
                  "acc_before": reference["acc_before"], "acc_after": reference["acc_after"]}
