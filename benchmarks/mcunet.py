"""BP-free transfer learning of the real INT8 MCUNet-in1 (ImageNet) to Fashion-MNIST and MNIST.

PMT §4.3 (Table 9, sparse BP-free training on the MCU) on the real imported model
(the copy bundled with bpfree, :func:`bpfree.models.mcunet.mcunet_in1`) instead of a
small CNN: the 160 -> 1000 ImageNet classifier is replaced by a 10-class int8 head initialised
from the frozen backbone's pooled features (:func:`_mcunet_transfer.init_head`), digits are
upsampled to 128x128 and replicated to 3 channels, and every method trains a copy of that
model (:func:`_mcunet_transfer.transfer_task`): head only (PMT on cached features), PMT
sparse with BP-free block selection among four backbone blocks (each trained with the head),
INT8 sparse BP on the same block + head, FP32 BP of all layers, and PMT dense where the budget
allows (full runs). Reported: test accuracy, forward passes, analytic memory (bpfree.memory
rules on the float mirror at the run's batch size and Q) and the measured peak tensor memory
of one step. The paper's numbers are for CIFAR-10-C, so they are quoted in the notes only.
"""

from __future__ import annotations

import concurrent.futures as cf
import time

from bpfree.bench.claims import claim
from bpfree.bench.parallel import default_workers, spawn_pool

NAME = "mcunet"
DESCRIPTION = __doc__.split("\n\n")[0].replace("\n", " ")
SEED = 0

DATASETS = ("fashion-mnist", "mnist")
TABLE_ACC = "Transfer accuracy (%) from the ImageNet INT8 MCUNet-in1"
TABLE_COST = "Cost per method"
TABLE_SEL = "BP-free block selection (held-out gain of each trial, points)"
TABLE_HW = "MCUNet-in1 INT8 (analytic, bpfree memory)"
SRAM_H7B3_KB = 1024   # STM32H7B3, full-model training (PMT §4.3.1)
SRAM_F746_KB = 256    # STM32F746 / MCUTrain's budget, sparse training
LABELS = {
    "head-init": "No adaptation (head init only)",
    "classifier-only": "Classifier only (PMT on the head)",
    "pmt-sparse": "PMT sparse (selected block + head)",
    "pmt-dense": "PMT dense (all layers)",
    "int8-sparse-bp": "Sparse BP, INT8 (same block + head)",
    "fp32-bp": "FullTrain BP, FP32 (all layers)",
}
MEMORY_BATCH = 8


def _setup(quick: bool):
    from _mcunet_transfer import TransferSetup

    if quick:
        return TransferSetup(train_images=200, test_images=300, queries=2, epochs=1,
                             head_epochs=20, batch_size=50, bp_lrs=(1e-3, 1e-2),
                             fp32_lrs=(1e-2,), head_init="means", dense=False, seed=SEED)
    # Full run: 698 s on 2 idle CPU cores (results/mcunet.json). CPU only: the int8 kernels
    # run on the CPU here. PMT dense is the largest cost.
    return TransferSetup(train_images=500, test_images=2000, queries=4, epochs=2,
                         head_epochs=50, batch_size=50, bp_lrs=(3e-4, 1e-3, 3e-3, 1e-2),
                         fp32_lrs=(1e-3, 3e-3, 1e-2), head_init="means", dense=True, seed=SEED)


def run(quick: bool):
    from bpfree.pmt.mcunet_tables import mcunet_tables
    from bpfree.models.mcunet import default_model_dir
    from _mcunet_transfer import HEAD, run_task

    t_start = time.perf_counter()
    setup = _setup(quick)
    model_dir = default_model_dir()
    workers = default_workers()
    tasks = {("transfer", d): ("transfer", dict(kind=d, setup=setup)) for d in DATASETS}
    results = {}
    with spawn_pool(workers) as pool:
        futures = {pool.submit(run_task, task): key for key, task in tasks.items()}
        for fut in cf.as_completed(futures):
            results[futures[fut]] = fut.result()
        first = results[("transfer", DATASETS[0])]
        sel = first["selection"]
        trainable = sel["blocks"][sel["chosen"] - 1]
        mem = pool.submit(run_task, ("memory", dict(
            trainable=trainable, batch_size=MEMORY_BATCH, queries=setup.queries,
            seed=SEED))).result()

    rows = []

    def row(table, method, setting, metric, value, paper=None):
        rows.append({"table": table, "method": method, "setting": setting, "metric": metric,
                     "value": float(value), "paper": paper})

    methods = [m for m in LABELS if m in results[("transfer", DATASETS[0])]]
    for d in DATASETS:
        out = results[("transfer", d)]
        for m in methods:
            setting = f"{d}, {out['train_images']} train / {out['test_images']} test"
            row(TABLE_ACC, LABELS[m], setting, "accuracy (%)", out[m]["accuracy"])
            row(TABLE_ACC, LABELS[m], setting, "forward passes", out[m]["forwards"])
    setting = f"Q={setup.queries}, block {sel['chosen']} + head"
    for m in methods:
        row(TABLE_COST, LABELS[m], setting, "analytic memory, N=1 (KiB)",
            mem["analytic_n1"][m] / 1024)
        row(TABLE_COST, LABELS[m], setting, f"analytic memory, N={MEMORY_BATCH} (KiB)",
            mem["analytic"][m] / 1024)
        row(TABLE_COST, LABELS[m], setting, f"measured step peak, N={MEMORY_BATCH} (KiB)",
            mem["measured"][m] / 1024)
    for d in DATASETS:
        s = results[("transfer", d)]["selection"]
        for i, gain in enumerate(s["gains"]):
            row(TABLE_SEL, f"block {i + 1}" + (" (chosen)" if i + 1 == s["chosen"] else ""),
                d, "held-out gain", gain)

    tables = mcunet_tables(model_dir)
    for r in tables:
        row(TABLE_HW if r.table == "model" else f"PMT Table {r.table} (analytic, N=1, Q=50)",
            r.quantity, "N=1, Q=50", r.unit, r.ours, r.paper)

    blocks = results[("transfer", DATASETS[0])]["blocks"]
    extra = {
        "claims": ledger(results, tables),
        "setup": setup.as_dict(),
        "model": str(model_dir),
        "workers": workers,
        "blocks": [[b[0], b[-1], len(b)] for b in blocks],
        "head": {d: results[("transfer", d)]["head"] for d in DATASETS},
        "selection_head": {d: results[("transfer", d)]["selection_head"] for d in DATASETS},
        "selection": {d: results[("transfer", d)]["selection"] for d in DATASETS},
        "per_method": {d: {m: results[("transfer", d)][m]["extra"] for m in methods}
                       for d in DATASETS},
        "memory": mem,
        "seconds_single_run": {d: {m: results[("transfer", d)][m]["seconds"] for m in methods}
                               for d in DATASETS},
        "total_seconds": time.perf_counter() - t_start,
        "notes": [
            "ImageNet-pretrained INT8 MCUNet-in1 (tflite requantization) adapted to 10-class "
            "digit tasks: 28x28 images upsampled bilinearly to 128x128, replicated to 3 "
            "channels, pixel p -> p - 128; seeded random subsets of the train and test splits",
            f"new int8 head ({HEAD}, 160 -> 10) initialised by {setup.head_init} "
            "('lsq': ridge least squares on one-hot targets; 'means': class means) on the "
            "pooled int8 features of the training images, scaled by the temperature that "
            "minimises the training cross-entropy, quantized per output channel, output range "
            "1.5x the training logits",
            "block selection (PMT §3.3.1): the 42 backbone convs split at stage boundaries into "
            "four blocks; each 1-epoch trial trains one block together with the head on 80% "
            "of the training images and is scored on the other 20%; the trials (and the BP "
            "learning-rate picks) start from a head initialised on the 80% only, so the "
            "held-out images are unseen; the chosen block + head is then trained, from the "
            "head initialised on all training images, by PMT sparse and by INT8 sparse BP",
            "forward passes per sample (PMT Table 5's unit) include the feature pass for the "
            "head initialisation (N) and, for PMT sparse, its four selection trials; BP rows "
            "count forwards only (each also runs a backward); a pass of the head alone on a "
            "cached feature counts as one",
            "FP32 BP trains every layer of the float graph of the same model (float_twin, "
            "fake_quant=False) and is evaluated in float; INT8 sparse BP uses the fake-quant "
            "twin (STE + QAS) and writes integer updates; BP learning rates chosen on a "
            "held-out fifth of the training images",
            f"memory for the block chosen on {DATASETS[0]} (+ head), Q={setup.queries}, at N=1 "
            f"and N={MEMORY_BATCH}: analytic = bpfree.memory "
            "rules on the float mirror (mcunet_in1_float, 10-class head; 'inference', "
            "'pmt-sparse' on the head or block + head, 'pmt', 'sparse-bp', 'bp'); measured = "
            "peak tensor bytes of one step (bpfree.memory.measure_peak; inference peak for the "
            "head-init row; classifier-only measured on cached features, so it leaves out the "
            "one feature pass per image). The measured peaks include PyTorch's float "
            "accumulators and im2col buffers of the int8 kernels (the first conv's dominate), "
            "which an MCU kernel does not allocate",
            "per-method wall times (single runs on a shared 2-core machine, not medians) are "
            "in extra.seconds_single_run, not in the tables",
            f"PMT learning rates (GNS + QAS, cosine): {setup.lr:g} for the head, "
            f"{setup.block_lr:g} for backbone layers (0.1 diverged in 1-epoch block "
            "trials, 0.01 lost accuracy; probed on an MNIST subset, not the test split); when "
            "both train (selection trials, PMT sparse / dense) the head keeps its own rate "
            f"(PMTTrainer lr_scale {setup.lr / setup.block_lr:g}): at {setup.block_lr:g} its "
            "integer updates round to zero (no head weight changed in MNIST pilots); Q="
            f"{setup.queries} per layer, batch {setup.batch_size}; classifier-only trains the "
            f"head for {setup.head_epochs} epochs on cached features",
            "least-squares heads (head_init='lsq') fit 200 training images almost exactly "
            "(training loss ~0), leaving nothing to train; the class-means head keeps a "
            "training loss, so the benchmark uses it",
            "quick mode shows the pipeline, not the accuracy: tiny subsets, one epoch, Q=2",
            "paper, for reference only (different task: CIFAR-10-C, MCUNet, Table 9): sparse "
            "BP-free training reaches 62.33% accuracy in 209 KB",
        ],
    }
    if not setup.dense:
        extra["notes"].append("PMT dense not run in this mode (budget); the full run runs it")
    return rows, extra


def ledger(results: dict, tables) -> list[dict]:
    """Tables 8-9 and the transfer's claims, each verdict computed from this run's numbers."""
    by = {(r.table, r.quantity): r for r in tables}

    def find(table, start):
        return next(r for (t, q), r in by.items() if t == table and q.startswith(start))

    paper_acct = find("8", "BP-free memory = parameters")
    rule = find("8", "BP-free memory, bpfree pmt rule")
    bp = find("8", "BP memory, fp32")
    stage = find("8", "BP-free compute, stage-wise")
    sparse = find("9", "BP-free sparse: trainable block")
    out = [
        claim("t8-bpfree-memory", "Table 8",
              "BP-free full-model training needs parameters + inference peak: within 10 % of "
              "the paper's 668 KB",
              paper=paper_acct.paper, ours=round(paper_acct.ours, 1),
              holds=abs(paper_acct.ours / paper_acct.paper - 1) <= 0.10),
        claim("t8-fits-h7b3", "Table 8, §4.3.1",
              f"Full-model BP-free training (bpfree's pmt rule, with the gradient buffer) fits "
              f"the STM32H7B3's {SRAM_H7B3_KB} KB SRAM; FP32 BP does not",
              paper=f"668 KB vs {bp.paper:g} KB", ours=f"{rule.ours:.1f} KB vs {bp.ours:.1f} KB",
              holds=rule.ours <= SRAM_H7B3_KB < bp.ours,
              note=f"bpfree's rule: {rule.note}. The paper's 668 KB counts parameters + "
                   "inference peak only; the largest layer's fp32/int32 gradient buffer (kept "
                   "so the update rounds the summed estimate once, Eq. 8) is what goes past "
                   "1024 KB"),
        claim("t8-compute", "Table 8",
              "BP-free compute per iteration is 7 * Q * F (stage-wise, full forwards): within "
              "1 % of the paper's 7,857.5 MMACs",
              paper=stage.paper, ours=round(stage.ours, 1),
              holds=abs(stage.ours / stage.paper - 1) <= 0.01),
        claim("t9-sparse-fits-f746", "Table 9",
              f"Sparse BP-free training (trainable block + inference peak) fits "
              f"{SRAM_F746_KB} KB",
              paper=sparse.paper, ours=round(sparse.ours, 1), holds=sparse.ours <= SRAM_F746_KB),
    ]
    for d in DATASETS:
        r = results[("transfer", d)]
        base = r["head-init"]["accuracy"]
        fp = r["fp32-bp"]
        fx = fp["extra"]
        first, last = fx.get("train_loss_before"), fx.get("train_loss_after")
        out.append(claim(
            f"fp32-bp-trains-{d}", "baseline sanity (issue 14)",
            f"FP32 FullTrain BP of MCUNet-in1 trains on {d}: its loss on the whole training "
            "set falls",
            paper=None,
            ours=f"training loss {first:.4f} -> {last:.4f}; test accuracy {fx['start_accuracy']:.1f} -> "
                 f"{fp['accuracy']:.1f} %" if first is not None and last is not None
            else "no loss recorded",
            holds=None if first is None or last is None else last < first))
        out.append(claim(
            f"pmt-sparse-adapts-{d}", "§4.3 (transfer with sparse BP-free training)",
            f"PMT sparse (selected block + head) improves on the initialised head on {d}",
            paper=None, ours=f"{base:.1f} -> {r['pmt-sparse']['accuracy']:.1f} %",
            holds=r["pmt-sparse"]["accuracy"] > base))
    return out
