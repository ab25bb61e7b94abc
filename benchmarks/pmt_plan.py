"""How long ``bench pmt``, ``pmt-seeds`` and ``pmt-t6`` take at the paper's budget: a projection.

Times one training step of each kind of task in ``bench pmt``'s full protocol (PMT on each of
the four blocks at Q = 100 and batch 100, the BP baselines, MeZO and DeepZero at PMT's budget,
the Fig. 7 ablations) on the engine the benchmark uses, multiplies by the steps the protocol
runs (``_pmt_experiment.Protocol``: 50 epochs of 8 steps, four rates per grid, ten
corruptions), and divides by the worker count. Weights do not change a step's cost, so the
model is the benchmark's architecture with random weights (no pretraining): about a minute.
Issue 30 asks for this projection when the full run needs more than about five hours.
``bench pmt-t6`` (Table 6: MeZO, DeepZero-0, DeepZero-0.9 and PMT on PMT's selected block) is
projected for each block its selection may pick, with the grid as started and with every
method's grid widened the most times the benchmark allows (an upper bound).
"""

from __future__ import annotations

import copy

import torch

NAME = "pmt-plan"
DESCRIPTION = __doc__.split("\n\n")[0].replace("\n", " ")
SEED = 0
TABLE = "Projected cost of the full PMT runs (paper's budget), from timed steps"


def run(quick: bool):
    import pmt
    import _pmt_step_cost as pmt_step_cost
    from _pmt_experiment import blocks_of

    from bpfree.baselines import DeepZeroCGE, FullTrainFP32, FullTrainINT8, MeZO, SparseBP
    from bpfree.bench.parallel import default_workers
    from bpfree.models import mnist_mobilenet
    from bpfree.pmt import PMTTrainer
    from bpfree.quant import quantize_model

    torch.set_num_threads(1)
    P = pmt._settings(False)["protocol"]
    cfg = pmt._settings(False)
    gen = torch.Generator().manual_seed(SEED)
    torch.manual_seed(SEED)
    x = torch.rand(P.batch_size, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (P.batch_size,), generator=gen)
    float_model = mnist_mobilenet().eval()
    qmodel = quantize_model(float_model, x, input_range=(0.0, 1.0))
    blocks = blocks_of(qmodel, x[:2], P)
    pointwise = pmt._pointwise_layers(qmodel, x[:2])
    repeats = 1 if quick else 3
    n_train = round(1000 * (1 - P.validation))
    steps_per_epoch = -(-n_train // P.batch_size)
    rates = len(P.zo_lrs)
    corruptions = len(pmt.CORRUPTIONS)

    def step_seconds(method) -> float:
        method.step(x, y, 0.01)  # warm-up (kernel compile, caches)
        return pmt_step_cost.thread_seconds(lambda: method.step(x, y, 0.0), repeats)

    def pmt_trainer(block, config=None):
        from bpfree.pmt import PMTConfig
        return PMTTrainer(copy.deepcopy(qmodel), config or PMTConfig(queries=P.queries),
                          example=x[:2], trainable=block)

    per_step = {f"PMT block {k}": step_seconds(pmt_trainer(b))
                for k, b in enumerate(blocks, start=1)}
    per_step["FP32 BP"] = step_seconds(FullTrainFP32(copy.deepcopy(float_model)))
    per_step["INT8 BP"] = step_seconds(FullTrainINT8(copy.deepcopy(qmodel), qas=True))
    per_step["sparse INT8 BP"] = step_seconds(SparseBP(copy.deepcopy(qmodel),
                                                       trainable=blocks[1], qas=True))
    budget_layers = max(len(b) for b in blocks)  # the largest block: an upper bound
    per_step["MeZO"] = step_seconds(MeZO(copy.deepcopy(qmodel), x[:2], queries=1, seed=0,
                                         gns=True, qas=True, monitor=False))
    per_step["DeepZero"] = step_seconds(DeepZeroCGE(copy.deepcopy(qmodel), x[:2],
                                                    coordinates=budget_layers * P.queries,
                                                    seed=0, qas=True))
    ablation = pmt._ablation_configs(P.queries, len(pointwise))
    per_step["Fig. 7 ablations (mean of 8)"] = sum(
        step_seconds(pmt_trainer(pointwise, conf)) for conf in ablation.values()) / len(ablation)

    steps = P.zo_epochs * steps_per_epoch
    bp_steps = P.bp_epochs * steps_per_epoch
    mezo_epochs = round(P.zo_epochs * n_train * (1 + budget_layers * P.queries) / (2 * n_train))
    counts = {  # training steps of each family in one bench pmt full run
        **{f"PMT block {k}": corruptions * rates * steps for k in range(1, len(blocks) + 1)},
        "FP32 BP": corruptions * rates * bp_steps,
        "INT8 BP": 2 * corruptions * rates * bp_steps,  # with and without QAS
        "sparse INT8 BP": corruptions * rates * bp_steps,
        "MeZO": rates * mezo_epochs * steps_per_epoch,
        "DeepZero": rates * steps,
        "Fig. 7 ablations (mean of 8)": len(ablation) * rates * cfg["ablation_epochs"]
        * steps_per_epoch,
    }
    # The block selection: one trial epoch per block and corruption.
    selection = corruptions * sum(per_step[f"PMT block {k}"] * steps_per_epoch
                                  for k in range(1, len(blocks) + 1))
    rows = []

    def row(method, metric, value):
        rows.append({"table": TABLE, "method": method, "setting": f"Q={P.queries}, batch "
                     f"{P.batch_size}, {P.zo_epochs} epochs, {rates} rates", "metric": metric,
                     "value": float(value), "paper": None})

    total = selection
    for name, s in per_step.items():
        row(name, "seconds per step (1 thread)", s)
        row(name, "steps in the full run", counts[name])
        row(name, "CPU hours", s * counts[name] / 3600)
        total += s * counts[name]
    row("block selection (1 epoch per block)", "CPU hours", selection / 3600)
    workers = default_workers()
    row("bench pmt (full)", "CPU hours", total / 3600)
    row("bench pmt (full)", f"projected wall hours on {workers} workers", total / 3600 / workers)
    # bench pmt-seeds: seeds 1 and 2 on the four noise corruptions (seed 0 is bench pmt's,
    # shared through the task cache): selection, 3 dense BP sweeps, PMT and sparse BP on the
    # selected block (taken as the mean block cost).
    mean_block = sum(per_step[f"PMT block {k}"] for k in range(1, len(blocks) + 1)) / len(blocks)
    seeds_total = 2 * 4 * (sum(per_step[f"PMT block {k}"] * steps_per_epoch
                               for k in range(1, len(blocks) + 1))
                           + rates * (mean_block * steps + per_step["sparse INT8 BP"] * bp_steps
                                      + (per_step["FP32 BP"] + 2 * per_step["INT8 BP"])
                                      * bp_steps))
    row("bench pmt-seeds (seeds 1, 2)", "CPU hours", seeds_total / 3600)
    row("bench pmt-seeds (seeds 1, 2)", f"projected wall hours on {workers} workers",
        seeds_total / 3600 / workers)
    t6 = _pmt_t6_projection(qmodel, x, blocks, per_step, step_seconds, n_train,
                            steps_per_epoch, workers, row)
    extra = {"protocol": P.as_dict(), "workers": workers, "per_step_seconds": per_step,
             "pmt_t6": t6,
             "steps": counts, "budget_layers_upper_bound": budget_layers,
             "engine": PMTTrainer(qmodel, example=x[:2]).staged.engine,
             "notes": ["seconds are thread CPU time of one step (median of repeats) on the "
                       "engine bench pmt uses; wall hours assume the workers stay busy and "
                       "ignore evaluation passes and pretraining (minutes)"]}
    return rows, extra


def _pmt_t6_projection(qmodel, x, blocks, per_step, step_seconds, n_train, steps_per_epoch,
                       workers, row) -> dict:
    """bench pmt-t6's full run if its selection picks block k on every seed: each method's
    step timed on that block, times its steps (``pmt_t6.full_run_steps``: the paper's
    budgets), seeds and rates; plus the §3.3.1 selection per seed."""
    import pmt_t6

    from bpfree.baselines import DeepZeroCGE, MeZO

    counts = pmt_t6.full_run_counts()
    selection = counts["seeds"] * steps_per_epoch * sum(
        per_step[f"PMT block {k}"] for k in range(1, len(blocks) + 1))
    out = {"counts": counts, "per_step_seconds": {}, "cpu_hours": {}}
    for k, block in enumerate(blocks, start=1):
        seconds = {
            "pmt": per_step[f"PMT block {k}"],
            "mezo": step_seconds(MeZO(copy.deepcopy(qmodel), x[:2], queries=1, seed=0,
                                      gns=True, qas=True, monitor=False, trainable=block)),
            "deepzero-0": step_seconds(DeepZeroCGE(copy.deepcopy(qmodel), x[:2], seed=0,
                                                   qas=True, trainable=block)),
            "deepzero-0.9": step_seconds(DeepZeroCGE(copy.deepcopy(qmodel), x[:2], sparsity=0.9,
                                                     seed=0, qas=True, trainable=block)),
        }
        steps = pmt_t6.full_run_steps(len(block), n_train)
        one_grid = sum(seconds[m] * steps[m] for m in pmt_t6.METHODS)
        started = selection + counts["seeds"] * counts["rates"] * one_grid
        widest = started + counts["seeds"] * counts["widenings"] * one_grid
        for m in pmt_t6.METHODS:
            name = f"bench pmt-t6: {pmt_t6.SHORT[m]} on block {k}"
            row(name, "seconds per step (1 thread)", seconds[m])
            row(name, "steps in one run", steps[m])
            row(name, "CPU hours (grid as started)",
                counts["seeds"] * counts["rates"] * seconds[m] * steps[m] / 3600)
        name = f"bench pmt-t6 (full), block {k} selected on every seed"
        row(name, "CPU hours (grid as started)", started / 3600)
        row(name, "CPU hours (every grid widened the most)", widest / 3600)
        row(name, f"projected wall hours on {workers} workers (grid as started)",
            started / 3600 / workers)
        out["per_step_seconds"][str(k)] = seconds
        out["cpu_hours"][str(k)] = {"grid as started": started / 3600,
                                    "every grid widened": widest / 3600}
    return out
