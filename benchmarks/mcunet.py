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

from bpfree.bench.claims import (all_hold, binomial_se, claim, exceeds, order, paired_se,
                                 sanity_claim, tolerance)
from bpfree.bench.outcomes import unpack_outcomes
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
                             fp32_lrs=(1e-4,), head_init="means", dense=False, seed=SEED)
    # Full run: its wall time is results/mcunet.json's `seconds`. CPU only: the int8 kernels
    # run on the CPU here. PMT dense is the largest cost. FP32 BP's rates are float-unit SGD
    # rates (to_float_units): on a 200-image MNIST pilot, 8 steps at 1e-3 drove every logit
    # past one bound (loss log 10), 1e-4 trained. Six epochs for every method (two until
    # 2026-11-28): at two, FP32 BP's 20 SGD steps left its Fashion-MNIST test accuracy inside
    # the noise of its start although its training loss fell (fp32-bp-trains-fashion-mnist
    # failed); on a validation pilot (2000 training-split images outside the 500, never the
    # test split) six epochs moved it further off its start than two.
    return TransferSetup(train_images=500, test_images=2000, queries=4, epochs=6,
                         head_epochs=50, batch_size=50, bp_lrs=(3e-4, 1e-3, 3e-3, 1e-2),
                         fp32_lrs=(1e-5, 3e-5, 1e-4, 3e-4), head_init="means", dense=True,
                         seed=SEED)


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
            "fake_quant=False, its parameters in float units: to_float_units) and is "
            "evaluated in float; INT8 sparse BP uses the fake-quant "
            "twin (STE + QAS) and, as MCUTrain's SGDScale, keeps an unrounded copy of the "
            "trained weights in integer units whose rounding it writes into the int8 model "
            "every step (SparseBP(latent_weights=True)); BP learning rates chosen on a "
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
    extra["claims"] = ledger(rows, extra)
    return rows, extra


def ledger_from_result(document: dict) -> list[dict]:
    """:func:`ledger` recomputed from a committed result file (its rows and ``extra``)."""
    return ledger(document["rows"], document["extra"])


def _table_row(rows: list[dict], table: str, start: str) -> dict:
    """The analytic Table 8 / 9 row whose quantity starts with ``start``."""
    title = f"PMT Table {table} (analytic, N=1, Q=50)"
    return next(r for r in rows if r["table"] == title and r["method"].startswith(start))


def _accuracies(rows: list[dict], dataset: str) -> tuple[dict[str, float], int]:
    """method key -> test accuracy (%) on ``dataset``, and the number of test images."""
    out, n_test = {}, 0
    for key, label in LABELS.items():
        for r in rows:
            if (r["table"] == TABLE_ACC and r["method"] == label and r["metric"] ==
                    "accuracy (%)" and r["setting"].startswith(f"{dataset}, ")):
                out[key] = r["value"]
                n_test = int(r["setting"].split("/ ")[1].split()[0])
    return out, n_test


#: "similar validation accuracy (0.5% lower)" than MCUTrain (PMT §4.3.3): the bound, rounded up.
NEAR_MCUTRAIN = 1.0
TEST_NOISE = ("one seed, so no seed spread: the tolerance is 2 binomial standard errors of the "
              "two test accuracies (test-set sampling noise, treated as independent)")
TEST_NOISE_PAIRED = ("one seed, so no seed spread: the tolerance is 2 paired standard errors of "
                     "the difference on the same test images (only the images the two methods "
                     "disagree on add noise; extra.per_method's outcomes)")


def _outcomes(extra: dict, dataset: str, key: str, n: int, field: str = "outcomes"):
    """Which test images method ``key`` got right on ``dataset`` (runs since the outcomes
    were recorded), else None."""
    text = extra.get("per_method", {}).get(dataset, {}).get(key, {}).get(field)
    return None if text is None else unpack_outcomes(text, n)


def _paired_change(start, end) -> float | None:
    """The paired standard error of end - start where both outcomes were recorded."""
    return None if start is None or end is None else paired_se(end, start)


def ledger(rows: list[dict], extra: dict) -> list[dict]:
    """Tables 8-11 and the transfer's claims, each verdict computed from this run's rows.

    Memory and compute use one figure per quantity: the SRAM, MACs and latency of a BP-free
    step are decided on the linked program (bench device: device-full-fits-h7b3,
    device-sparse-fits-256, device-full-668, device-sparse-209, device-*-macs-table8/9,
    device-*-latency-table8/9), so this ledger keeps the paper's formulas and bpfree's rules
    as rows of PMT Tables 8-9, not as verdicts.
    Accuracy claims are analogues on Fashion-MNIST and MNIST (the paper's CIFAR-10-C, FGVC and
    VWW are not on hand): they check the paper's orderings, not its numbers."""
    paper_acct = _table_row(rows, "8", "BP-free memory = parameters")
    bp = _table_row(rows, "8", "BP memory, fp32")
    out = [
        claim("t8-bpfree-memory", "Table 8",
              "The paper's accounting of full-model BP-free memory (parameters + inference "
              "peak), applied to our MCUNet-in1, gives its 668 KB within 10 % (a check of the "
              "model's size, not of a program)",
              paper=paper_acct["paper"], ours=round(paper_acct["value"], 1),
              holds=abs(paper_acct["value"] / paper_acct["paper"] - 1) <= 0.10,
              note="the SRAM a full-model program needs is decided on the linked program: "
                   "bench device's device-full-fits-h7b3 and device-full-668"),
        claim("t8-bp-exceeds-h7b3", "Table 8, §4.3.1",
              f"FP32 BP of all layers (bpfree's bp rule, N=1) needs more than the "
              f"STM32H7B3's {SRAM_H7B3_KB} KB SRAM",
              paper=bp["paper"], ours=round(bp["value"], 1), holds=bp["value"] > SRAM_H7B3_KB,
              note="the other half of §4.3.1, that full-model BP-free training fits, is "
                   "decided on the linked program (device-full-fits-h7b3); bpfree's pmt rule "
                   "(it keeps an fp32 gradient buffer the C program does not) and the "
                   "paper's formula are rows of PMT Table 8 here"),
    ]
    acc = {d: _accuracies(rows, d) for d in DATASETS}
    hits = {d: {m: _outcomes(extra, d, m, acc[d][1]) for m in acc[d][0]} for d in DATASETS}
    paired = all(v is not None for per in hits.values() for v in per.values())
    test_noise = TEST_NOISE_PAIRED if paired else TEST_NOISE

    def tol(d: str, a: str, b: str) -> float:
        values, n = acc[d]
        if paired:
            return tolerance(paired_se(hits[d][a], hits[d][b]))
        return tolerance(binomial_se(values[a], n), binomial_se(values[b], n))

    for d in DATASETS:
        values, n = acc[d]
        fx = extra["per_method"][d]["fp32-bp"]
        stale = None if fx.get("parameters") == "float units" else (
            "this run predates bpfree.quant.twin.to_float_units: its SGD stepped the twin's "
            "integer-unit parameters, a rate s_w^2 (1e-4 .. 1e-6) times the one asked; "
            "rerun bench mcunet")
        out.append(sanity_claim(
            f"fp32-bp-trains-{d}", f"FP32 FullTrain BP of MCUNet-in1 on {d}",
            accuracy_start=fx["start_accuracy"], accuracy_end=values["fp32-bp"],
            loss_start=fx.get("train_loss_before"), loss_end=fx.get("train_loss_after"),
            paper_ref="baseline sanity (issues 14, 31)", note=stale, n_test=n,
            difference_se=_paired_change(_outcomes(extra, d, "fp32-bp", n, "start_outcomes"),
                                         hits[d]["fp32-bp"])))
        ix = extra["per_method"][d]["int8-sparse-bp"]
        rounded = None if ix.get("weights") == "latent copy (MCUTrain)" else (
            "this run predates SparseBP(latent_weights=True): it rounded the int8 weights "
            "every step, and at the chosen rate every step of the new head was below half an "
            "int8 step; rerun bench mcunet")
        out.append(sanity_claim(
            f"int8-sparse-bp-trains-{d}", f"INT8 sparse BP (MCUTrain) of block + head on {d}",
            accuracy_start=values["head-init"], accuracy_end=values["int8-sparse-bp"],
            loss_start=ix.get("train_loss_before"), loss_end=ix.get("train_loss_after"),
            paper_ref="baseline sanity (issue 31)", n_test=n,
            difference_se=_paired_change(hits[d]["head-init"], hits[d]["int8-sparse-bp"]),
            note="; ".join(t for t in (
                "it starts from the initialised head, whose test accuracy is the start",
                rounded) if t)))
        out.append(claim(
            f"pmt-sparse-adapts-{d}", "§4.3 (transfer with sparse BP-free training)",
            f"PMT sparse (selected block + head) improves on the initialised head on {d}",
            paper=None, ours=f"{values['head-init']:.1f} -> {values['pmt-sparse']:.1f} % "
                             f"(2 SE = {tol(d, 'pmt-sparse', 'head-init'):.2f})",
            holds=order(values["pmt-sparse"], values["head-init"],
                        tol(d, "pmt-sparse", "head-init")), note=test_noise))
    covered = " and ".join(DATASETS)
    sanity_fp32 = {d: next(c for c in out if c["id"] == f"fp32-bp-trains-{d}")["holds"]
                   for d in DATASETS}

    def per_dataset(a: str, b: str) -> str:
        return "; ".join(f"{d}: {acc[d][0][a]:.2f} vs {acc[d][0][b]:.2f} (2 SE = "
                         f"{tol(d, a, b):.2f})" for d in DATASETS)

    out.append(claim(
        "t11-clsonly-below-bpfree", "Table 11, §4.3.3 (analogue)",
        "Training only the classifier converges below BP-free training of a backbone block + "
        f"head (ClsOnly 83.20 < BP-free 86.16 on VWW); analogue on {covered}",
        paper="83.20 < 86.16", ours=per_dataset("classifier-only", "pmt-sparse"),
        holds=all_hold(order(acc[d][0]["pmt-sparse"], acc[d][0]["classifier-only"],
                             tol(d, "pmt-sparse", "classifier-only")) for d in DATASETS),
        note=f"{test_noise}. Our classifier-only trains the head for many epochs on cached "
             "features while the block trains for the run's epochs: the budgets differ as "
             "in the paper's table, which lists accuracy, not forwards"))
    out.append(claim(
        "t11-bpfree-near-mcutrain", "Table 11, §4.3.3 (analogue)",
        f"BP-free training of a block + head is at most {NEAR_MCUTRAIN:g} point below "
        "MCUTrain (INT8 sparse BP of the same block + head; paper: 0.5 lower on VWW); "
        f"analogue on {covered}",
        paper="86.16 vs 86.68", ours=per_dataset("pmt-sparse", "int8-sparse-bp"),
        holds=all_hold(exceeds(acc[d][0]["pmt-sparse"] - acc[d][0]["int8-sparse-bp"],
                               -NEAR_MCUTRAIN, tol(d, "pmt-sparse", "int8-sparse-bp"))
                       for d in DATASETS), note=test_noise))
    if "pmt-dense" in acc[DATASETS[0]][0]:
        out.append(claim(
            "t10-bpfree-beats-mcutrain", "Table 10, §4.3.2 (analogue)",
            "BP-free training of all layers beats MCUTrain's INT8 sparse BP of one block "
            f"(the paper: on 3 of 5 FGVC datasets); analogue on {covered}, each",
            paper="Cars 60.1 vs 54.6, CUB 58.1 vs 57.3, Pets 81.6 vs 81.5; Flowers, Food "
                  "lower", ours=per_dataset("pmt-dense", "int8-sparse-bp"),
            holds=all_hold(order(acc[d][0]["pmt-dense"], acc[d][0]["int8-sparse-bp"],
                                 tol(d, "pmt-dense", "int8-sparse-bp")) for d in DATASETS),
            note=f"{test_noise}. MCUTrain here trains the block BP-free selection chose, not "
                 "three middle layers found by an evolutionary search"))
        out.append(claim(
            "t10-bpfree-near-fullbp", "Table 10, §4.3.2 (analogue)",
            "BP-free training of all layers is within 1.3 points of FP32 BP of all layers "
            f"(the paper's FGVC averages: 66.1 vs 67.4); analogue on {covered}",
            paper="66.1 vs 67.4", ours=per_dataset("pmt-dense", "fp32-bp"),
            holds=(all_hold(exceeds(acc[d][0]["pmt-dense"] - acc[d][0]["fp32-bp"], -1.3,
                                    tol(d, "pmt-dense", "fp32-bp")) for d in DATASETS)
                   if all(v is True for v in sanity_fp32.values()) else None),
            note=test_noise if all(v is True for v in sanity_fp32.values()) else
            "not measured: the FP32 BP rows failed their sanity check (fp32-bp-trains-*), "
            "so they are no baseline to compare with"))
    return out
