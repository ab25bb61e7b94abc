"""Smoke tests of benchmarks/_qzoff_experiment.py (the driver of `bpfree bench qzo-ff`) and the
library pieces it uses (bpfree.qzoff.features, bpfree.fewshot.prototype_head): fast, tiny
models, no MNIST files needed except where marked."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch import nn

from _qzoff_experiment import (BPAdamW, build_backbone, ff_config, load_images, run_task,
                               train_head)

from bpfree.fewshot import prototype_head, sample_episodes, with_episode_head
from bpfree.qzoff import PRECISIONS, QZOFF, frozen_features


def _blobs(n=200, d=8, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(k, d, generator=g) * 3
    y = torch.arange(n) % k
    x = centres[y] + torch.randn(n, d, generator=g)
    return x, y


def test_ff_config_precisions():
    assert ff_config("fp32").mode == "fp32"
    assert ff_config("fp16").mode == "fp16"
    q = ff_config("16w8a")
    assert (q.mode, q.w_bits, q.a_bits, q.w_headroom) == ("quantized", 16, 8, 4.0)
    assert ff_config("8w8a", w_headroom=1.0).w_bits == 8
    assert ff_config("fp32", m=10).m == 10
    assert set(PRECISIONS) == {"fp32", "fp16", "16w8a", "8w8a"}
    with pytest.raises(ValueError, match="precision"):
        ff_config("4w4a")


def test_backbone_and_frozen_features():
    torch.manual_seed(0)
    model = build_backbone(5)
    assert model[-1].out_features == 5
    x = torch.rand(6, 1, 28, 28)
    f32 = frozen_features(model, x)
    assert f32.shape == (6, 1568)
    f8 = frozen_features(model, x, "16w8a")
    f16 = frozen_features(model, x, "fp16")
    assert f8.shape == f32.shape == f16.shape
    # 8-bit activations change the features a little, not a lot; the model keeps no hooks
    rel = float((f8 - f32).norm() / f32.norm())
    assert 0 < rel < 0.2
    assert torch.equal(frozen_features(model, x), f32)
    state = model.state_dict()
    assert torch.equal(build_backbone(5, state)[0].weight, model[0].weight)


def test_prototype_head_is_protonet():
    x, y = _blobs()
    head = prototype_head(x, y, 3)
    protos = torch.stack([x[y == k].mean(0) for k in range(3)])
    dist = ((x[:, None] - protos[None]) ** 2).sum(-1)
    assert torch.equal(head(x).argmax(1), dist.argmin(1))


def test_prototype_head_temperature_gives_a_training_signal():
    """Audit: with raw (large) features the τ = 1 ProtoNet head has logit gaps of ~10², the
    support loss underflows to 0 in float32 and no method can train it; the leave-one-out τ
    keeps the same predictions with a support loss that carries a gradient."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(25) % 5
    centres = 0.5 * torch.randn(5, 64, generator=g)  # overlapping classes, 5 shots each
    x = 8 * (centres[y] + torch.randn(25, 64, generator=g))   # squared distances ~10⁴
    plain = prototype_head(x, y, 5)
    loo = prototype_head(x, y, 5, "loo")
    with torch.no_grad():
        assert torch.equal(plain(x).argmax(1), loo(x).argmax(1))
        l_plain = float(nn.functional.cross_entropy(plain(x), y))
        l_loo = float(nn.functional.cross_entropy(loo(x), y))
    assert l_plain < 1e-6 < 1e-3 < l_loo < 2.0
    tau = float(loo[0].weight[0].detach().norm() / plain[0].weight[0].detach().norm())
    assert 0 < tau < 1
    for t in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            prototype_head(x, y, 5, t)
    # BP on the τ = 1 head: the gradient is exactly 0 and nothing moves; on the LOO head it does
    out_plain = train_head(plain, "bp", x, y, epochs=5, batch_size=25, lr=1e-2)
    out_loo = train_head(loo, "bp", x, y, epochs=5, batch_size=25, lr=1e-2)
    assert torch.equal(out_plain["model"][0].weight, plain[0].weight)
    assert not torch.equal(out_loo["model"][0].weight, loo[0].weight)


@pytest.mark.parametrize("method,precision", [("bp", None), ("ff", "fp32"), ("ff", "16w8a")])
def test_train_head_lowers_loss(method, precision):
    x, y = _blobs()
    torch.manual_seed(0)
    head = nn.Sequential(nn.Linear(8, 3))
    with torch.no_grad():
        before = float(nn.functional.cross_entropy(head(x), y))
    cfg = None if method == "bp" else ff_config(precision, seed=0)
    out = train_head(head, method, x, y, epochs=15, batch_size=50, lr=3e-2, config=cfg)
    after = float(nn.functional.cross_entropy(out["model"](x), y))
    assert after < before
    assert len(out["loss"]) == 15 * 4
    # the input head is untouched; forwards: BP 1 per sample, FF 2m per sample
    with torch.no_grad():
        assert float(nn.functional.cross_entropy(head(x), y)) == pytest.approx(before)
    assert out["forwards"] == 15 * 200 * (1 if method == "bp" else 6)


def test_train_head_records_trajectory_and_8w8a_underflow():
    from bpfree.landscape import TrajectoryRecorder

    x, y = _blobs()
    head = nn.Sequential(nn.Linear(8, 3))
    out = train_head(head, "ff", x, y, epochs=2, batch_size=100, lr=1e-2,
                     config=ff_config("8w8a", w_headroom=1.0),
                     recorder=lambda m: TrajectoryRecorder(m))
    assert len(out["recorder"]) == 1 + 4
    # eps = 1e-3 is below half an 8-bit weight step: the paper's reason 8w8a fails
    assert out["eps_underflow"]


def test_bp_adamw_method():
    x, y = _blobs()
    model = nn.Sequential(nn.Linear(8, 3))
    bp = BPAdamW(model)
    first = bp.step(x, y, 1e-2)["loss"]
    for _ in range(20):
        last = bp.step(x, y, 1e-2)["loss"]
    assert last < first and bp.forwards == 21 * 200


def test_run_task_rejects_unknown_and_config_is_picklable():
    with pytest.raises(ValueError, match="unknown task kind"):
        run_task(("nope", {}))
    cfg = ff_config("16w8a", m=1)
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert isinstance(QZOFF(nn.Linear(2, 2), cfg), QZOFF)


def test_fewshot_and_ood_tasks_on_mnist():
    from bpfree.data import require_data_root

    require_data_root("mnist")
    from _qzoff_experiment import FEWSHOT_METHODS, fewshot_chunk, ood_task

    torch.manual_seed(0)
    state = build_backbone(5).state_dict()
    lrs = dict.fromkeys(FEWSHOT_METHODS[1:], 1e-3)
    out = run_task(("fewshot", dict(state=state, num_classes=5, kind="mnist",
                                    classes=(5, 6, 7, 8, 9), episodes=3, lo=1, hi=3, steps=2,
                                    lp_steps=3, lrs=lrs)))
    assert set(out["accuracies"]) == set(FEWSHOT_METHODS)
    assert all(len(v) == 2 for v in out["accuracies"].values())
    # Zero-shot, recomputed here: nearest class mean of the backbone's features (squared
    # Euclidean) on episodes 1 and 2 of the same draw; the methods score 5 x 15 queries.
    images, labels = load_images("mnist", "test", (5, 6, 7, 8, 9))
    episodes = sample_episodes(images, labels, (5, 6, 7, 8, 9), n_way=5, k_shot=5, n_query=15,
                               episodes=3, seed=0)
    features = build_backbone(5, state).eval()[:-1]
    for ep, acc in zip(episodes[1:], out["accuracies"]["zero-shot"]):
        with torch.no_grad():
            fs, fq = features(ep.support_x), features(ep.query_x)
        classes = ep.support_y.unique()
        protos = torch.stack([fs[ep.support_y == c].mean(0) for c in classes])
        pred = classes[torch.cdist(fq, protos).argmin(1)]
        assert acc == pytest.approx(100.0 * float((pred == ep.query_y).double().mean()))
    assert all((a * 75 / 100) == pytest.approx(round(a * 75 / 100))
               for v in out["accuracies"].values() for a in v)
    assert out["forwards"]["FF FT"] == 2 * 6 * 25          # FT: `steps`
    assert out["forwards"]["FF LP"] == 3 * 6 * 25          # LP: `lp_steps`
    assert out["forwards"]["BP LP"] == 3 * 25
    # support losses: one (first step, last step) pair per episode and trained method; BP LP's
    # first-step loss is the prototype head's cross-entropy on the frozen support features
    assert set(out["support_losses"]) == set(FEWSHOT_METHODS[1:])
    assert all(len(v) == 2 for v in out["support_losses"].values())
    ep1 = episodes[1]
    fs1 = frozen_features(build_backbone(5, state), ep1.support_x, "fp32")
    with torch.no_grad():
        ce = nn.functional.cross_entropy(prototype_head(fs1, ep1.support_y, 5, "loo")(fs1),
                                         ep1.support_y)
    assert out["support_losses"]["BP LP"][0][0] == pytest.approx(float(ce), rel=1e-5)
    # chunks of one draw agree with a single call
    again = fewshot_chunk(state, 5, "mnist", (5, 6, 7, 8, 9), episodes=3, lo=2, hi=3, steps=2,
                          lrs={}, methods=("zero-shot",))
    assert again["accuracies"]["zero-shot"] == out["accuracies"]["zero-shot"][1:]
    with pytest.raises(ValueError, match="no learning rate"):
        fewshot_chunk(state, 5, "mnist", (5, 6, 7, 8, 9), episodes=3, lo=0, hi=1, steps=1,
                      lrs={"BP FT": 1e-3}, methods=("zero-shot", "BP FT", "FF LP"))
    # validation episodes: training images of the held-out classes, never the test episodes
    val = run_task(("fewshot_validate", dict(state=state, num_classes=5, kind="mnist",
                                             classes=(5, 6, 7, 8, 9), method="BP LP",
                                             episodes=2, steps=1, lp_steps=2,
                                             lrs=(1e-3, 1e-1))))
    assert set(val["scores"]) == {1e-3, 1e-1} and val["lr"] in (1e-3, 1e-1)
    assert val["scores"][val["lr"]] == max(val["scores"].values())
    from _qzoff_experiment import _fewshot_episodes
    test_eps = _fewshot_episodes("mnist", (5, 6, 7, 8, 9), "test", 3, 5, 5, 15, 0)
    val_eps = _fewshot_episodes("mnist", (5, 6, 7, 8, 9), "train", 2, 5, 5, 15, 0)
    assert not any(torch.equal(v.support_x, t.support_x) for v in val_eps for t in test_eps)
    with pytest.raises(ValueError, match="zero-shot"):
        run_task(("fewshot_validate", dict(state=state, num_classes=5, kind="mnist",
                                           classes=(5, 6, 7, 8, 9), method="zero-shot",
                                           episodes=1, steps=1)))
    state10 = build_backbone(10).state_dict()
    res = ood_task(state10, "contrast", 5,
                   {"Zero-shot": {"method": "zero-shot"}, "BP": {"method": "bp"},
                    "FF": {"method": "ff", "lr": 1e-2}, "FF m1": {"method": "ff", "m": 1}},
                   epochs=1, seeds=(0,), n_train=100, n_test=50, lrs=(1e-3, 1e-2),
                   select_lr={"FF m1": "FF"})
    assert res["FF m1"]["lr"] == res["FF"]["lr"] == 1e-2
    assert res["BP"]["lr"] in (1e-3, 1e-2)
    assert res["FF"]["forwards"] == 100 * 6 and res["FF m1"]["forwards"] == 100 * 2


def test_ft_rows_classify_with_their_fine_tuned_head_or_protonet():
    """FT's score is the fine-tuned model's own prediction ("head") or ProtoNet on its
    adapted features ("protonet"), both recomputed here from the same training run."""
    from bpfree.data import require_data_root

    require_data_root("mnist")
    from _qzoff_experiment import _fewshot_episodes, _fewshot_method

    torch.manual_seed(0)
    backbone = build_backbone(5)
    ep = _fewshot_episodes("mnist", (5, 6, 7, 8, 9), "test", 1, 5, 5, 15, 0)[0]
    kw = dict(lr=1e-2, steps=3, m=3, seed=0, temperature="loo")
    head_acc, fw, (l0, l1) = _fewshot_method("BP FT", backbone, ep, feats={},
                                             ft_classifier="head", **kw)
    proto_acc, fw2, losses2 = _fewshot_method("BP FT", backbone, ep, feats={},
                                              ft_classifier="protonet", **kw)
    assert fw == fw2 == 3 * 25 and losses2 == (l0, l1)  # the same training run
    model = with_episode_head(backbone, ep, temperature="loo")
    out = train_head(model, "bp", ep.support_x, ep.support_y, epochs=3, batch_size=25,
                     lr=1e-2, seed=0)
    trained = out["model"]
    with torch.no_grad():
        by_head = trained(ep.query_x).argmax(1)
        fs, fq = trained[:-1](ep.support_x), trained[:-1](ep.query_x)
    protos = torch.stack([fs[ep.support_y == c].mean(0) for c in range(5)])
    by_proto = torch.cdist(fq, protos).argmin(1)
    assert head_acc == pytest.approx(100.0 * float((by_head == ep.query_y).double().mean()))
    assert proto_acc == pytest.approx(100.0 * float((by_proto == ep.query_y).double().mean()))
    with pytest.raises(ValueError, match="ft_classifier must be one of"):
        _fewshot_method("BP FT", backbone, ep, feats={}, ft_classifier="knn", **kw)


def test_few_shot_rows_name_their_classifier():
    mod = _bench_module()
    assert mod.few_classifier("zero-shot", "head") == "ProtoNet"
    assert mod.few_classifier("BP LP", "protonet") == "head"
    assert mod.few_classifier("FF FT", "head") == "head"
    assert mod.few_classifier("FF FT", "protonet") == "ProtoNet"
    r = mod._Rows([dict(table=mod.T_FEW, method="BP FT", setting="D, ProtoNet",
                        metric="accuracy (%)", value=70.0),
                   dict(table=mod.T_FEW, method="FF FT", setting="D, head",
                        metric="accuracy (%)", value=71.0)])
    assert r.few_accuracy("BP FT", "D") == 70.0 and r.few_accuracy("FF FT", "D") == 71.0
    with pytest.raises(KeyError):
        r.few_accuracy("BP LP", "D")


def _bench_module():
    from bpfree.bench.runner import load_module

    return load_module("qzo_ff")


def test_rate_grid_extends_past_a_chosen_edge_and_merges():
    bench = _bench_module()
    assert bench.rate_beyond_edge({1e-3: 80.0, 1e-2: 79.0, 1e-1: 70.0}, 1e-3) == \
        pytest.approx(1e-4)
    assert bench.rate_beyond_edge({1e-3: 70.0, 3e-3: 75.0, 1e-2: 79.0}, 1e-2) == \
        pytest.approx(1e-2 * 1e-2 / 3e-3)
    assert bench.rate_beyond_edge({1e-3: 70.0, 3e-3: 80.0, 1e-2: 79.0}, 3e-3) is None
    # a flat curve: the smallest rate wins the tie, but a smaller one would change nothing
    assert bench.rate_beyond_edge({1e-3: 75.1, 3e-3: 75.1, 1e-2: 74.9}, 1e-3) is None
    first = {"lr": 1e-3, "scores": {1e-3: 80.0, 1e-2: 79.0}, "zero_shot": 75.0,
             "episodes": 4, "wall_seconds": 2.0}
    lower = bench.merge_validation(first, {"lr": 1e-4, "scores": {1e-4: 81.0},
                                           "wall_seconds": 1.0})
    assert lower["lr"] == 1e-4 and lower["extensions"] == 1 and lower["wall_seconds"] == 3.0
    assert bench.rate_beyond_edge(lower["scores"], lower["lr"]) == pytest.approx(1e-5)
    tie = bench.merge_validation(lower, {"lr": 1e-5, "scores": {1e-5: 81.0}})
    assert tie["lr"] == 1e-5 and tie["extensions"] == 2     # ties go to the smaller rate
    assert bench.rate_beyond_edge(tie["scores"], tie["lr"]) is None   # and stop there


def test_bp_fewshot_sanity_needs_the_support_loss_to_fall():
    bench = _bench_module()
    doms = ["A", "B"]

    def rows(last_ft):
        out = []
        for d in doms:
            for k in ("FT", "LP"):
                out += [{"table": bench.T_GAIN, "method": f"BP {k}", "setting": d,
                         "metric": "gain (points)", "value": 3.0},
                        {"table": bench.T_GAIN, "method": f"BP {k}", "setting": d,
                         "metric": "95% CI (±)", "value": 1.0},
                        {"table": bench.T_FEW_LOSS, "method": f"BP {k}", "setting": d,
                         "metric": "first step", "value": 1.0},
                        {"table": bench.T_FEW_LOSS, "method": f"BP {k}", "setting": d,
                         "metric": "last step", "value": last_ft if k == "FT" else 0.5}]
        return bench._Rows(out)

    def verdicts(r):
        got = bench.baseline_sanity(r, doms, [], 3, 50.0, (90.0, 1.0))
        return {c["id"]: c for c in got}

    ok = verdicts(rows(0.2))
    assert ok["qzoff-sanity-bp-ft"]["holds"] is True and "note" not in ok["qzoff-sanity-bp-ft"]
    assert "support loss A: 1.000 -> 0.200" in ok["qzoff-sanity-bp-ft"]["ours"]
    assert verdicts(rows(1.5))["qzoff-sanity-bp-ft"]["holds"] is False
    # a run without loss rows (before they were recorded) is decided by the accuracy, and
    # says so
    plain = bench._Rows([{"table": bench.T_GAIN, "method": f"BP {k}", "setting": d,
                          "metric": m, "value": v}
                         for d in doms for k in ("FT", "LP")
                         for m, v in (("gain (points)", 3.0), ("95% CI (±)", 1.0))])
    c = verdicts(plain)["qzoff-sanity-bp-ft"]
    assert c["holds"] is True and "accuracy alone" in c["note"]


def test_bench_findings_helpers():
    """The benchmark's computed notes: how many few-shot episodes an adaptation changed, and
    the 8w8a finding with the tensors whose ε quantizes to 0 (from the trainer's warning)."""
    bench = _bench_module()
    accs = {"zero-shot": [60.0, 80.0, 70.0], "BP FT": [60.0, 84.0, 70.0],
            "FF FT": [60.0, 80.0, 70.0]}
    assert bench.fewshot_changed(accs) == {"BP FT": 1, "FF FT": 0}
    torch.manual_seed(0)
    head = nn.Sequential(nn.Linear(4, 3))
    with torch.no_grad():
        head[0].weight.mul_(100.0)    # Δw = max|w|/127 ≫ 2ε: the matrix cannot be perturbed
        head[0].bias.fill_(0.1)       # Δw = 0.1/127 < 2ε: ε_q = 1, the bias can
    x, y = torch.randn(20, 4), torch.arange(20) % 3
    out = train_head(head, "ff", x, y, epochs=1, batch_size=20, lr=1e-2,
                     config=ff_config("8w8a", w_headroom=1.0))
    assert out["eps_underflow"]
    abl = {"FF fp32": {"accuracy": [80.0, 82.0]}, "FF 16w8a": {"accuracy": [79.0, 79.0]},
           "FF 8w8a": {"accuracy": [50.0, 52.0], "eps_underflow": out["eps_underflow"]},
           "FF 8w8a, tight range (headroom 1)": {"accuracy": [78.0, 80.0]}}
    note = bench.bitwidth_finding(abl)
    assert "FF fp32 81.00%" in note and "FF 16w8a 79.00%" in note
    assert "FF 8w8a: 51.00% (tensors with ε_q = 0: ['0.weight'])" in note
    assert "tight range (headroom 1): 79.00% (tensors with ε_q = 0: none)" in note


@pytest.mark.slow
def test_a_partial_report_leaves_out_the_unfinished_vit_blocks(tmp_path, monkeypatch):
    """bench qzo-ff's full code path on tiny settings, through a task cache; then a
    report-only read of the same cache in which the ViT blocks' tasks have not finished:
    the report has every other row, no ViT rows, ViT claims "not measured", and
    extra.partial names the missing tasks. A missing non-ViT task cannot be reported."""
    from bpfree.data import require_data_root

    require_data_root("mnist")
    from bpfree.bench.task_cache import PartialRunError, TaskCache

    mod = _bench_module()
    quick = mod._settings(True)
    tiny = dict(quick, pre_a=dict(images=1000, epochs=1), pre_b=dict(images=1000, epochs=1),
                episodes=2, chunk=1, fs_steps=1, fs_lp_steps=2, fs_val_episodes=1,
                fs_val_episodes_lp=1, fs_diag_episodes=1, fs_lrs=(1e-3, 1e-2),
                corruptions=("gaussian_noise",), ood_epochs=1, ood_train=100, ood_batch=100,
                seeds=(0, 1), landscape_steps=3, alignment_draws=2,
                vit=dict(images=500, epochs=1, lr=3e-3, head_epochs=1,
                         corruptions=("gaussian_noise",), n_train=50, n_test=50,
                         adapt_epochs=1, batch=50))
    monkeypatch.setattr(mod, "_settings", lambda quick: tiny)
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    monkeypatch.setattr(mod, "FIGURES", tmp_path / "figures")
    monkeypatch.setattr(mod, "task_cache", lambda root: TaskCache(tmp_path / "c", salt="r"))
    torch.manual_seed(0)
    rows, extra = mod.run(False)
    assert "partial" not in extra and any(r["table"] in mod.T_VIT.values() for r in rows)

    def report_without(kind):
        """A report-only read of the run's cache in which tasks of ``kind`` never finished."""
        class Unfinished(TaskCache):
            def find(self, fn, task):
                path, found, value = super().find(fn, task)
                return (path, False, None) if task[0] == kind else (path, found, value)

        return lambda root: Unfinished(tmp_path / "c", salt="r", report_only=True)

    monkeypatch.setattr(mod, "task_cache", report_without("vit_ood"))
    torch.manual_seed(0)
    part_rows, part = mod.run(False)
    assert part["partial"]["missing"] == [f"vit gaussian_noise {lev}" for lev in mod.SEVERITIES]
    vit_tables = set(mod.T_VIT.values()) | {mod.T_ENH}
    assert not any(r["table"] in vit_tables for r in part_rows)
    assert [r for r in part_rows if r["table"] not in vit_tables] == [
        r for r in rows if r["table"] not in vit_tables]
    claims = {c["id"]: c for c in part["claims"]}
    assert claims["qzoff-sanity-vit-dvpt"]["holds"] is None
    assert claims["qzoff-sanity-bp-ft"]["holds"] == {c["id"]: c for c in extra["claims"]}[
        "qzoff-sanity-bp-ft"]["holds"]

    monkeypatch.setattr(mod, "task_cache", report_without("alignment"))
    with pytest.raises(PartialRunError, match="has not finished"):
        mod.run(False)
