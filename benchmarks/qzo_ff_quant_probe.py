"""Is the 16w8a few-shot gap of `bench qzo-ff` noise? The paired per-episode difference 16w8a - FF LP on the full run's own episodes.

`qzoff-t2-quant-matches-fp` (QZO-FF Table 2's Quant rows) compares the mean accuracies of FF
LP in 16w8a and in fp32, each with its own 95 % interval over 100 episodes. Episodes differ
far more in difficulty than the two methods differ, so the two means' intervals cannot say
whether a 2-point gap is the quantization or the episodes. Pairing each episode's two
accuracies removes the shared difficulty.

This probe replays exactly the full run's few-shot LP rows: the same backbone (BP-pretrained
on MNIST digits 0-4 with the full settings and seed, one thread, as `bench qzo-ff` trains
it), the same 100 test episodes per domain, the learning rates the full run chose (read from
``results/qzo-ff.json``), and only the methods the claim reads (zero-shot, FF LP, FF LP
16w8a). Each method's mean is checked against the full run's row, so the paired difference
is the full run's. The benchmark itself (`bench qzo-ff`) now records the same rows; this
file serves the committed run, which predates them. About 5 minutes on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

NAME = "qzo-ff-quant-probe"
DESCRIPTION = __doc__.split("\n\n")[0].replace("\n", " ")
SEED = 0
ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "results" / "qzo-ff.json"
METHODS = ("zero-shot", "FF LP", "FF LP 16w8a")

TP = "Table 2 (Quant rows): 16w8a minus full-precision FF LP, paired per episode (points)"
TC = "Check: each method's mean against the full run's row (accuracy %)"


def full_run(path: Path) -> dict:
    """The full `bench qzo-ff` result this probe replays: its seed, chosen learning rates and
    few-shot rows. Refuses a missing file or a quick run (other settings, other episodes)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `bpfree bench qzo-ff` (full) first")
    doc = json.loads(path.read_text())
    if doc.get("quick", True):
        raise ValueError(f"{path} is a quick run; the probe replays a full run's episodes")
    return doc


def run(quick: bool) -> tuple[list[dict], dict]:
    import concurrent.futures as cf

    import qzo_ff
    from _qzoff_experiment import run_task

    from bpfree.bench.parallel import default_workers, spawn_pool
    from bpfree.fewshot import mean_confidence_interval

    doc = full_run(SOURCE)
    cfg = qzo_ff._settings(False)
    seed = int(doc["seed"]) % (2**31)
    lrs_all = doc["extra"]["fewshot_learning_rates"]
    full_rows = {(r["table"], r["method"], r["setting"], r["metric"]): r["value"]
                 for r in doc["rows"]}
    # The full run's own task builders, so the replay cannot drift from what it ran.
    with spawn_pool(default_workers()) as pool:
        pre = pool.submit(run_task, qzo_ff.fewshot_backbone_task(cfg, seed)).result()
        futures = {}
        for dom, (kind, classes) in qzo_ff.FEW_DOMAINS.items():
            lrs = {m: lrs_all[dom][m] for m in METHODS if m != "zero-shot"}
            for lo, task in qzo_ff.fewshot_chunk_tasks(cfg, seed, pre["state"], kind, classes,
                                                       lrs, methods=METHODS).items():
                futures[pool.submit(run_task, task)] = (dom, lo)
        chunks = {futures[f]: f.result() for f in cf.as_completed(futures)}
    rows, extra = [], {"source": str(SOURCE.relative_to(ROOT)),
                       "source_revision": doc.get("git_revision"), "pretrain_test_accuracy":
                       pre.get("test_accuracy"), "per_episode": {}}

    def row(table, method, setting, metric, value, paper=None):
        rows.append({"table": table, "method": method, "setting": setting, "metric": metric,
                     "value": float(value), "paper": paper})

    for dom in qzo_ff.FEW_DOMAINS:
        accs = qzo_ff.join_chunks({lo: ch for (d, lo), ch in chunks.items() if d == dom},
                                  METHODS)
        extra["per_episode"][dom] = accs
        for m in METHODS:
            clf = qzo_ff.few_classifier(m, cfg["fs_ft_classifier"])
            full = full_rows.get((qzo_ff.T_FEW, m, f"{dom}, {clf}", "accuracy (%)"))
            row(TC, m, dom, "accuracy (%), this replay", mean_confidence_interval(accs[m])[0],
                full)
        diff, hw = qzo_ff.paired_difference(accs["FF LP 16w8a"], accs["FF LP"])
        row(TP, "FF LP 16w8a - FF LP", dom, "difference (points)", diff)
        row(TP, "FF LP 16w8a - FF LP", dom, "95% CI (±)", hw)
        row(TP, "FF LP 16w8a - FF LP", dom, "episodes where 16w8a is lower",
            sum(a < b for a, b in zip(accs["FF LP 16w8a"], accs["FF LP"])))
        row(TP, "FF LP 16w8a - FF LP", dom, "episodes where 16w8a is higher",
            sum(a > b for a, b in zip(accs["FF LP 16w8a"], accs["FF LP"])))
    extra["notes"] = [
        f"Replays {extra['source']} (revision {extra['source_revision']}): backbone "
        f"pretrained with its full settings and seed {seed}; {cfg['episodes']} test episodes "
        f"per domain, {cfg['fs_lp_steps']} LP steps, m = 3, the learning rates it chose. The "
        "'paper' column of the check table holds the full run's own mean, not the paper's.",
        "95% CI: normal interval over episodes of the per-episode difference.",
    ]
    return rows, extra
