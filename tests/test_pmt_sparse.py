"""PMT sparse training (§3.3), the gradient-cosine diagnostic (Fig. 5/8) and the experiment."""

from __future__ import annotations

import pytest
import torch

from bpfree.models import mnist_mobilenet
from bpfree.pmt import PMTConfig, PMTTrainer, find_layers
from bpfree.pmt.diagnostic import SCHEMES, bp_gradients, gradient_cosines, plot_cosines, \
    zo_gradients
from _pmt_experiment import METHODS, Protocol, noqas_rates, run_task, split, sweep
from bpfree.pmt.sparse import block, holdout_split, select_block, split_blocks
from bpfree.perturb import derive_seed
from bpfree.quant import quantize_model


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    float_model = mnist_mobilenet().eval()
    g = torch.Generator().manual_seed(1)
    x = torch.rand(64, 1, 28, 28, generator=g)
    qmodel = quantize_model(float_model, x, input_range=(0.0, 1.0))
    with torch.no_grad():
        y = qmodel(x).argmax(-1).roll(1)  # labels the model gets wrong: something to learn
    return float_model, qmodel, x, y


def test_split_blocks_is_contiguous_balanced_and_respects_stages(models):
    _, qmodel, x, _ = models
    layers = find_layers(qmodel, x)
    blocks = split_blocks(layers, 4)
    assert len(blocks) == 4 and all(blocks)
    assert [n for b in blocks for n in b] == [l.name for l in layers]  # contiguous, complete
    stage_of = {l.name: l.stage for l in layers}
    for left, right in zip(blocks, blocks[1:]):
        assert stage_of[left[-1]] < stage_of[right[0]]  # never cut inside a stage
    sizes = [len(b) for b in blocks]
    assert max(sizes) - min(sizes) <= 3
    assert block(blocks, 2) == blocks[1]
    for bad in (0, 5, "1", True):
        with pytest.raises(ValueError, match=r"block index must be an int in \[1, 4\]"):
            block(blocks, bad)
    with pytest.raises(ValueError, match="cannot split"):
        split_blocks(layers, len(layers) + 1)


def test_holdout_split_is_disjoint_and_seeded():
    a, b = holdout_split(50, 0.2, seed=3)
    assert len(b) == 10 and set(a.tolist()).isdisjoint(b.tolist())
    assert torch.equal(b, holdout_split(50, 0.2, seed=3)[1])
    with pytest.raises(ValueError, match="holdout"):
        holdout_split(50, 1.0, seed=0)


def test_select_block_trains_copies_and_picks_the_largest_gain(models):
    _, qmodel, x, y = models
    before = {k: v.clone() for k, v in qmodel.state_dict().items()}
    layers = find_layers(qmodel, x)
    blocks = split_blocks(layers, 4)
    made = []

    def make(m, names):
        made.append(PMTTrainer(m, PMTConfig(queries=2), example=x[:2], trainable=names))
        return made[-1]

    sel = select_block(qmodel, x, y, blocks=blocks, lr=0.1, batch_size=16, seed=0,
                       make_method=make)
    assert all(torch.equal(before[k], v) for k, v in qmodel.state_dict().items())
    assert sel.gains == [a - sel.base_accuracy for a in sel.accuracies]
    assert sel.gains[sel.chosen - 1] == max(sel.gains)
    # Forward passes, counted independently: one epoch of PMT on the n_t training samples
    # costs n_t (1 + L Q) per trial (Algorithm 1: one clean pass, Q perturbed passes per
    # layer), and every held-out evaluation (the base model's and each trial's) costs n_h.
    train_idx, held_idx = holdout_split(x.shape[0], 0.2, 0)
    n_t, n_h = len(train_idx), len(held_idx)
    assert len(made) == len(blocks)
    assert sel.forwards == n_h + sum(n_t * (1 + len(m.trainable) * 2) + n_h for m in made)
    for bad in ([], [blocks[0], []]):
        with pytest.raises(ValueError, match="blocks must be a non-empty list"):
            select_block(qmodel, x, y, blocks=bad, lr=0.1, batch_size=16,
                         make_method=lambda m, names: None)


def test_zo_estimates_align_with_bp_as_queries_grow(models):
    """Eq. 7: more queries, smaller MSE, larger cosine with the BP gradient (Fig. 8)."""
    _, qmodel, x, y = models
    ref = bp_gradients(qmodel, x, y)
    name = find_layers(qmodel, x)[-1].name  # the classifier: the most direct signal
    cos = []
    for q in (1, 64):
        est = zo_gradients(qmodel, x, y, "adaptive", q, seed=2)
        a, b = est[name].reshape(-1), ref[name].reshape(-1)
        cos.append(float(a @ b / (a.norm() * b.norm())))
    assert cos[1] > cos[0] and cos[1] > 0.5


def test_gradient_cosines_table_and_plot(models, tmp_path):
    _, qmodel, x, y = models
    result = gradient_cosines(qmodel, x[:16], y[:16], queries=(1, 2),
                              schemes=("wp-layer", "adaptive"))
    assert set(result["cosine"]) == {"wp-layer", "adaptive"}
    assert len(result["cosine"]["adaptive"][2]) == len(result["layers"])
    # Each cosine is the one between that scheme's estimate (seed derive_seed(0, repeat 0))
    # and autograd's gradient of the same integer model, computed here independently.
    ref = bp_gradients(qmodel, x[:16], y[:16])
    est = zo_gradients(qmodel, x[:16], y[:16], "adaptive", 1, seed=derive_seed(0, 0))
    expected = [float(torch.nn.functional.cosine_similarity(
        est[name].reshape(-1).double(), ref[name].reshape(-1).double(), dim=0))
        for name in result["layers"]]
    assert result["cosine"]["adaptive"][1] == pytest.approx(expected, abs=1e-5)
    path = plot_cosines(result, tmp_path / "cos.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="scheme"):
        zo_gradients(qmodel, x, y, "np-everything", 1)
    assert set(SCHEMES) >= {"wp-model", "np-layer"}


TINY = Protocol(queries=2, zo_epochs=1, bp_epochs=1, batch_size=16, zo_lrs=(0.05, 0.1),
                bp_lrs=(1e-3, 1e-2), noqas_lsb=(0.5, 2.0))


def test_protocol_defaults_are_the_papers_and_grids_share_one_size():
    p = Protocol()
    assert (p.queries, p.zo_epochs, p.bp_epochs, p.batch_size) == (100, 50, 50, 100)
    with pytest.raises(ValueError, match="same search budget"):
        Protocol(zo_lrs=(0.01, 0.03, 0.1))
    with pytest.raises(ValueError, match="zo_lrs"):
        Protocol(zo_lrs=())
    with pytest.raises(ValueError, match="queries"):
        Protocol(queries=0)
    with pytest.raises(ValueError, match="validation"):
        Protocol(validation=1.0)


def test_split_is_disjoint_and_covers_the_training_images(models):
    _, _, x, y = models
    (xt, yt), (xv, yv) = split((x, y), TINY)
    assert xt.shape[0] + xv.shape[0] == x.shape[0] and xv.shape[0] == round(0.2 * x.shape[0])
    rows = {tuple(r.flatten()[:20].tolist()) for r in xt}
    assert not any(tuple(r.flatten()[:20].tolist()) in rows for r in xv)


def test_sweep_chooses_the_rate_by_validation_accuracy_not_test(monkeypatch):
    """Validation and test scores disagree on purpose: the choice must follow validation."""
    import _pmt_experiment as ex

    scores = {0.1: {"val": 40.0, "test": 90.0}, 0.2: {"val": 60.0, "test": 10.0}}
    x, y = torch.zeros(10, 1), torch.zeros(10, dtype=torch.long)
    val, test = (x[:5], y[:5]), (x[5:], y[5:])

    class Model(torch.nn.Module):
        rate = None

    def make():
        model = Model()

        class Method:
            forwards = 0

            def step(self, xb, yb, lr):
                if model.rate is None:
                    model.rate = lr  # the cosine schedule's first step is the base rate
                return {"loss": 1.0}
        return Method(), model

    monkeypatch.setattr(ex, "accuracy", lambda model, xs, ys: scores[model.rate][
        "val" if xs is val[0] else "test"])
    out = sweep(make, (x, y), val, test, epochs=1, rates=(0.1, 0.2),
                protocol=Protocol(batch_size=5, zo_lrs=(1,), bp_lrs=(1,), noqas_lsb=(1,)))
    assert out["chosen"] == 0.2 and out["accuracy"] == 10.0
    assert [r["validation_accuracy"] for r in out["runs"]] == [40.0, 60.0]


def test_int8_bp_without_qas_trains_on_its_integer_grid(models):
    """Float rates round every no-QAS step to zero; the integer-unit grid must move weights."""
    float_model, qmodel, x, y = models
    (xt, yt), _ = split((x, y), TINY)
    rates, rms = noqas_rates(qmodel, xt[:16], yt[:16], (0.5, 2.0))
    assert rms > 0 and rates[1] == pytest.approx(4 * rates[0])
    out = run_task(("bp", dict(method="int8-bp-noqas", float_model=float_model, qmodel=qmodel,
                               train=(x, y), test=(x, y), protocol=TINY)))
    assert out["changed_values"] > 10, out
    assert out["chosen"] in rates and out["gradient_rms_integer_units"] == rms
    float_rate = run_task(("bp", dict(method="int8-bp", float_model=float_model, qmodel=qmodel,
                                      train=(x, y), test=(x, y), protocol=TINY)))
    assert float_rate["changed_values"] > 0


def test_pmt_block_task_trains_only_its_block(models):
    _, qmodel, x, y = models
    layers = find_layers(qmodel, x[:2])
    block_names = [layers[-1].name]
    before = {n: b.clone() for n, b in qmodel.state_dict().items()}
    out = run_task(("pmt", dict(qmodel=qmodel, train=(x, y), test=(x, y), protocol=TINY,
                                block=block_names)))
    assert out["changed_values"] > 0 and out["layers"] == 1
    # Per-sample forwards: N (clean) + L * Q * N per step over the training part.
    n_train = x.shape[0] - round(0.2 * x.shape[0])
    assert out["forwards"] == n_train * (1 + 1 * TINY.queries)
    assert all(torch.equal(before[n], b) for n, b in qmodel.state_dict().items())  # a copy


def test_fp32_bp_loss_falls(models):
    float_model, qmodel, x, y = models
    p = Protocol(queries=1, zo_epochs=1, bp_epochs=5, batch_size=16, zo_lrs=(0.1,),
                 bp_lrs=(0.05,), noqas_lsb=(1.0,))
    out = run_task(("bp", dict(method="fp32-bp", float_model=float_model, qmodel=qmodel,
                               train=(x, y), test=(x, y), protocol=p)))
    assert out["last_loss"] < out["first_loss"]
    assert out["changed_values"] > 0
    with pytest.raises(ValueError, match="unknown BP method"):
        run_task(("bp", dict(method="sgd", float_model=float_model, qmodel=qmodel,
                             train=(x, y), test=(x, y), protocol=p)))
    with pytest.raises(ValueError, match="unknown task kind"):
        run_task(("adapt", {}))
    assert "pmt-sparse" in METHODS


def test_per_rate_tasks_merge_to_the_full_sweep(monkeypatch):
    """A sweep split into one task per rate (resumable full runs) chooses exactly what the
    whole sweep chooses, and flags a choice at the edge of a grid of three or more rates."""
    import _pmt_experiment as ex

    scores = {0.1: 40.0, 0.2: 60.0, 0.4: 55.0}
    calls = []

    def fake_train(make, train, val, test, *, epochs, lr, protocol):
        calls.append(lr)
        return {"lr": lr, "validation_accuracy": scores[lr], "accuracy": 100 - scores[lr],
                "diverged": False, "changed_values": 1, "first_loss": 2.0, "last_loss": 1.0,
                "forwards": 7, "loss": [], "curve_forwards": []}

    monkeypatch.setattr(ex, "train_and_score", fake_train)
    P = Protocol(zo_lrs=(1,), bp_lrs=(1,), noqas_lsb=(1,))
    rates = (0.1, 0.2, 0.4)
    whole = ex.sweep(None, None, None, None, epochs=1, rates=rates, protocol=P)
    parts = [ex.sweep(None, None, None, None, epochs=1, rates=rates, protocol=P, grid_index=i)
             for i in (2, 0, 1)]
    assert calls == [0.1, 0.2, 0.4, 0.4, 0.1, 0.2]  # each part trains its one rate only
    merged = ex.merge(parts)
    assert merged["chosen"] == whole["chosen"] == 0.2 and merged["accuracy"] == 40.0
    assert merged["runs"] == whole["runs"] and not merged["grid_edge"]
    scores[0.4] = 90.0
    assert ex.merge([ex.sweep(None, None, None, None, epochs=1, rates=rates, protocol=P,
                              grid_index=i) for i in range(3)])["grid_edge"] is True


def test_merge_grid_joins_only_the_sweep_parts(monkeypatch):
    """bench pmt's and pmt-seeds' per-rate keys drop their grid index; other keys stay."""
    import _pmt_experiment as ex
    from bpfree.bench.runner import load_module

    part = lambda lr, val: {"lr": lr, "validation_accuracy": val, "accuracy": 1.0,  # noqa: E731
                            "diverged": False, "changed_values": 1, "forwards": 3}
    results = {("bp", "fog", "fp32-bp", 0): part(0.1, 50.0),
               ("bp", "fog", "fp32-bp", 1): part(0.2, 70.0),
               ("select", "fog"): {"chosen": 2}, ("mezo", 0): part(0.3, 10.0)}
    merged = load_module("pmt")._merge_grid(results)
    assert set(merged) == {("bp", "fog", "fp32-bp"), ("select", "fog"), ("mezo",)}
    assert merged[("bp", "fog", "fp32-bp")]["chosen"] == 0.2
    assert merged[("select", "fog")] == {"chosen": 2}
    seeds = load_module("pmt_seeds")._merge_grid(
        {(0, "fog", "pmt-sparse", 0): part(0.1, 5.0), (0, "fog", "pmt-sparse", 1): part(0.3, 9.0),
         (0, "fog", "select"): {"chosen": 1}})
    assert seeds[(0, "fog", "pmt-sparse")]["chosen"] == 0.3 and (0, "fog", "select") in seeds
    assert ex.merge_grid({}, lambda key: True) == {}


def test_widening_adds_one_rate_past_the_edge_a_sweep_chose(monkeypatch):
    """A sweep that chose its grid's largest (smallest) rate gets the next rate past it at the
    grid's own ratio, at the next position; an inside choice, an unfinished sweep, or one that
    has added MOST_PAST_EDGE rates on that side gets none; merged, the parts choose over the
    widened grid with the base grid's extras."""
    import _pmt_experiment as ex

    P = Protocol(zo_lrs=(0.01, 0.03, 0.1, 0.3), bp_lrs=(1e-3, 3e-3, 1e-2, 3e-2),
                 noqas_lsb=(0.25, 0.5, 2.0, 8.0))
    part = lambda lr, val: {"lr": lr, "validation_accuracy": val, "accuracy": val,  # noqa: E731
                            "diverged": False, "changed_values": 1, "forwards": 3}
    tasks, results = {}, {}
    for i, (zo, bp) in enumerate(zip(P.zo_lrs, P.bp_lrs)):
        tasks[("pmt", "fog", 3, i)] = ("pmt", {"block": ["a"], "protocol": P, "grid_index": i})
        tasks[("bp", "fog", "fp32-bp", i)] = ("bp", {"method": "fp32-bp", "protocol": P,
                                                     "grid_index": i})
        tasks[("bp", "fog", "int8-sparse-bp", i)] = ("bp", {"method": "int8-sparse-bp",
                                                            "protocol": P, "grid_index": i})
        results[("pmt", "fog", 3, i)] = part(zo, 50.0 + i)  # top edge
        results[("bp", "fog", "fp32-bp", i)] = part(bp, 50.0 - i)  # bottom edge
        results[("bp", "fog", "int8-sparse-bp", i)] = part(bp, 60.0 if i == 1 else 50.0)
    tasks[("deepzero", 0)] = ("deepzero", {"protocol": P, "grid_index": 0})  # unfinished
    tasks[("select", "fog")] = ("select", {})  # not a sweep
    wider = ex.widening_tasks(results, tasks)
    assert wider == {("pmt", "fog", 3, 4): ("pmt", {"block": ["a"], "protocol": P,
                                                    "rates": (0.9,)}),
                     ("bp", "fog", "fp32-bp", -1): ("bp", {"method": "fp32-bp", "protocol": P,
                                                           "rates": (0.000333,)})}
    tasks.update(wider)
    results[("pmt", "fog", 3, 4)] = part(0.9, 99.0)  # still the best: one more, then the cap
    results[("bp", "fog", "fp32-bp", -1)] = part(0.000333, 10.0)  # worse: bracketed
    again = ex.widening_tasks(results, tasks)
    assert again == {("pmt", "fog", 3, 5): ("pmt", {"block": ["a"], "protocol": P,
                                                    "rates": (2.7,)})}
    tasks.update(again)
    results[("pmt", "fog", 3, 5)] = part(2.7, 99.5)
    assert ex.widening_tasks(results, tasks) == {}  # two past the top: the cap
    assert ex.widening_tasks(results, tasks, most=3) == {
        ("pmt", "fog", 3, 6): ("pmt", {"block": ["a"], "protocol": P, "rates": (8.1,)})}
    assert ex.added_rates(tasks) == {("pmt", "fog", 3): [0.9, 2.7],
                                     ("bp", "fog", "fp32-bp"): [0.000333]}
    merged = ex.merge_grid(results, lambda key: key[0] in ex.SWEEP_KINDS)
    assert merged[("pmt", "fog", 3)]["chosen"] == 2.7 and merged[("pmt", "fog", 3)]["grid_edge"]
    bp = merged[("bp", "fog", "fp32-bp")]
    assert bp["chosen"] == 1e-3 and not bp["grid_edge"] and len(bp["runs"]) == 5
    # INT8 BP without QAS widens its LSB grid, not its rates
    noqas = {("bp", "fog", "int8-bp-noqas", i): ("bp", {"method": "int8-bp-noqas",
                                                        "protocol": P, "grid_index": i})
             for i in range(4)}
    noqas_results = {k: part(lsb / 7.0, 80.0 + i) for i, (k, lsb) in
                     enumerate(zip(noqas, P.noqas_lsb))}
    assert ex.widening_tasks(noqas_results, noqas) == {
        ("bp", "fog", "int8-bp-noqas", 4): ("bp", {"method": "int8-bp-noqas", "protocol": P,
                                                   "rates": (32.0,)})}


def test_fig7_ablation_sweeps_widen_by_their_lr_like_the_others():
    """A Fig. 7 ablation is one task per rate that names its rate as ``lr`` (its key is the
    grid position): at an edge it gets the same task at the next rate's ``lr``, which
    added_rates counts and merge_grid joins, choosing over the widened grid."""
    import _pmt_experiment as ex

    P = Protocol(zo_lrs=(0.01, 0.03, 0.1, 0.3), bp_lrs=(1e-3, 3e-3, 1e-2, 3e-2),
                 noqas_lsb=(0.25, 0.5, 2.0, 8.0))
    part = lambda lr, val: {"lr": lr, "validation_accuracy": val, "accuracy": val,  # noqa: E731
                            "last_loss": 1.0 / val, "modes": {"a": "np"}}
    base = {"protocol": P, "config": "np", "trainable": ["a"], "epochs": 1}
    tasks = {("ablation", "NP", i): ("ablation", {**base, "lr": lr})
             for i, lr in enumerate(P.zo_lrs)}
    tasks[("ablation", "WP", 0)] = ("ablation", {**base, "lr": 0.01})  # unfinished sweep
    results = {k: part(t[1]["lr"], 50.0 - k[2]) for k, t in tasks.items() if k[1] == "NP"}
    wider = ex.widening_tasks(results, tasks)
    assert wider == {("ablation", "NP", -1): ("ablation", {**base, "lr": 0.00333})}
    assert ex.added_rates(tasks) == {}
    tasks.update(wider)
    results[("ablation", "NP", -1)] = part(0.00333, 40.0)  # worse: bracketed
    assert ex.widening_tasks(results, tasks) == {}
    assert ex.added_rates(tasks) == {("ablation", "NP"): [0.00333]}
    merged = ex.merge_grid(results, lambda key: key[0] in ex.SWEEP_KINDS)
    np_ = merged[("ablation", "NP")]
    assert np_["chosen"] == 0.01 and not np_["grid_edge"] and len(np_["runs"]) == 5
    assert np_["modes"] == {"a": "np"} and np_["last_loss"] == 1.0 / 50.0


def test_widen_trains_round_after_round_until_no_sweep_sits_on_an_edge():
    """widen(): each round trains the next rate of the sweeps still at an edge; a sweep
    whose new rate is worse stops; keys of another shape (pmt-seeds') choose the parts."""
    import _pmt_experiment as ex

    P = Protocol(zo_lrs=(0.01, 0.03, 0.1), bp_lrs=(1, 2, 3), noqas_lsb=(1, 2, 3))
    # past 0.1 at the top ratio 0.1 / 0.03: 0.333, then 1.11, which is worse: two rounds
    score = {0.01: 1.0, 0.03: 2.0, 0.1: 3.0, 0.333: 4.0, 1.11: 3.5}
    tasks = {(0, "fog", "pmt-sparse", i): ("pmt", {"protocol": P, "grid_index": i})
             for i in range(3)}
    tasks[(0, "fog", "select")] = ("select", {})
    part = lambda lr: {"lr": lr, "validation_accuracy": score[lr], "accuracy": 0.0}  # noqa
    results = {k: part(P.zo_lrs[k[3]]) for k in tasks if len(k) == 4}
    rounds = []

    def run(wider):
        rounds.append(sorted(wider))
        return {k: part(t[1]["rates"][0]) for k, t in wider.items()}

    ex.widen(run, tasks, results, is_sweep_part=lambda key: len(key) == 4)
    assert rounds == [[(0, "fog", "pmt-sparse", 3)], [(0, "fog", "pmt-sparse", 4)]]
    merged = ex.merge_grid(results, lambda key: len(key) == 4)
    assert merged[(0, "fog", "pmt-sparse")]["chosen"] == 0.333
    assert not merged[(0, "fog", "pmt-sparse")]["grid_edge"]


def test_a_widened_int8_bp_without_qas_task_trains_its_lsb_rate(models):
    """``rates`` past the grid keep the grid's units: LSB per step without QAS."""
    float_model, qmodel, x, y = models
    (xt, yt), _ = split((x, y), TINY)
    base = dict(method="int8-bp-noqas", float_model=float_model, qmodel=qmodel, train=(x, y),
                test=(x, y), protocol=TINY)
    out = run_task(("bp", {**base, "rates": (3.0,)}))
    rates, rms = noqas_rates(qmodel, xt[:TINY.batch_size], yt[:TINY.batch_size], (3.0,))
    assert out["chosen"] == rates[0] == pytest.approx(3.0 / rms)
    assert out["lsb_past_edge"] == [3.0] and "lsb_grid" not in out


def test_pmt_factory_and_calibration_are_kept_in_the_task_cache(tmp_path, monkeypatch):
    """bench pmt's pretrained model and calibrated strengths are memoized in the task cache:
    a run resumed in a new process reads them back (the same weights) instead of pretraining
    again at every start; without a cache they are computed."""
    import numpy as np

    import bpfree.data
    import bpfree.data.calibration
    from bpfree.bench.runner import load_module
    from bpfree.bench.task_cache import TaskCache

    pmt = load_module("pmt")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (96, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, 96)
    monkeypatch.setattr(bpfree.data, "load_mnist", lambda split: (images, labels))
    settings = pmt._settings(True)
    monkeypatch.setattr(pmt, "_settings", lambda quick: dict(
        settings, pretrain_images=64, pretrain_epochs=1, test_images=32))
    pretrained, calibrated = [], []
    real = pmt._pretrain
    monkeypatch.setattr(pmt, "_pretrain", lambda *a: pretrained.append(1) or real(*a))

    class Found:
        def as_dict(self):
            return {"param": 0.5}

    monkeypatch.setattr(bpfree.data.calibration, "calibrate",
                        lambda *a, **k: calibrated.append(a[2]) or Found())
    models = []
    for cache in (TaskCache(tmp_path, salt="rev"), TaskCache(tmp_path, salt="rev"), None):
        _, float_model, qmodel, (xtr, ytr), _ = pmt.factory(True, cache)
        cal = pmt.calibrate_all(qmodel, xtr[:8], ytr[:8], 0, names=("fog", "contrast"),
                                cache=cache)
        assert cal == {"fog": {"param": 0.5}, "contrast": {"param": 0.5}}
        models.append(float_model.state_dict())
    assert len(pretrained) == 2 and calibrated == ["fog", "contrast"] * 2  # not the 2nd run
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])
    assert all(torch.equal(models[0][k], models[2][k]) for k in models[0])  # deterministic


_FACTORY_DIGEST = r"""
import sys
import numpy as np
import torch
import bpfree.data
from bpfree.bench.runner import load_module
from bpfree.bench.task_cache import TaskCache, task_digest

pmt = load_module("pmt")
rng = np.random.default_rng(0)
images = rng.integers(0, 256, (96, 28, 28), dtype=np.uint8)
labels = rng.integers(0, 10, 96)
bpfree.data.load_mnist = lambda split: (images, labels)
settings = pmt._settings(True)
pmt._settings = lambda quick: dict(settings, pretrain_images=64, pretrain_epochs=1,
                                   test_images=32)
cache = None if sys.argv[1] == "-" else TaskCache(__import__("pathlib").Path(sys.argv[1]), "rev")
_, float_model, qmodel, _, _ = pmt.factory(True, cache)
print(task_digest({"float_model": float_model, "qmodel": qmodel}))
"""


def test_pmt_factory_models_have_the_same_task_digest_whether_trained_or_read_back(tmp_path):
    """The tasks that hold bench pmt's factory models keep their cache keys across a resumed
    run: in fresh processes, the models pretrained without a cache, pretrained into one, and
    read back from it give the same task digest. (A pickled module read back shares its
    equal strings, and the digest, like pickle, saw that: every BP task of the resumed full
    run had a new key.)"""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "digest.py"
    script.write_text(_FACTORY_DIGEST)
    folder = tmp_path / "cache"
    folder.mkdir()

    def digest(arg: str) -> str:
        out = subprocess.run([sys.executable, str(script), arg], capture_output=True, text=True,
                             check=True, cwd=Path(__file__).resolve().parents[1])
        return out.stdout.strip().splitlines()[-1]

    fresh, written, read = digest("-"), digest(str(folder)), digest(str(folder))
    assert len(list(folder.glob("*.pkl"))) == 1  # the third process read the weights
    assert fresh == written == read
