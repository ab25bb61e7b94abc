"""PMT sparse training (§3.3), the gradient-cosine diagnostic (Fig. 5/8) and the experiment."""

from __future__ import annotations

import pytest
import torch

from bpfree.models import mnist_mobilenet
from bpfree.pmt import PMTConfig, PMTTrainer, find_layers
from bpfree.pmt.diagnostic import SCHEMES, bp_gradients, gradient_cosines, plot_cosines, \
    zo_gradients
from bpfree.pmt.experiment import METHODS, Setup, adapt
from bpfree.pmt.sparse import block, holdout_split, select_block, split_blocks
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
    sel = select_block(qmodel, x, y, blocks=blocks, lr=0.1, batch_size=16, seed=0,
                       make_method=lambda m, names: PMTTrainer(
                           m, PMTConfig(queries=2), example=x[:2], trainable=names))
    assert all(torch.equal(before[k], v) for k, v in qmodel.state_dict().items())
    assert sel.gains == [a - sel.base_accuracy for a in sel.accuracies]
    assert sel.gains[sel.chosen - 1] == max(sel.gains)
    assert sel.forwards > 0
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
    assert all(-1.0 <= c <= 1.0 for c in result["cosine"]["adaptive"][1])
    path = plot_cosines(result, tmp_path / "cos.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="scheme"):
        zo_gradients(qmodel, x, y, "np-everything", 1)
    assert set(SCHEMES) >= {"wp-model", "np-layer"}


def test_adapt_runs_every_method_with_budget_accounting(models):
    float_model, qmodel, x, y = models
    setup = Setup(queries=1, epochs=1, batch_size=32, pmt_lrs=(0.05, 0.1))
    out = adapt(float_model, qmodel, (x, y), (x, y), setup)
    for name in ("pmt-dense", "pmt-sparse"):  # rates chosen on held-out data, as BP's are
        extra = out[name].extra
        assert set(extra["lr_holdout_accuracy"]) == {0.05, 0.1}
        assert extra["lr"] == max((0.05, 0.1), key=lambda r: (extra["lr_holdout_accuracy"][r], -r))
    layers = len(find_layers(qmodel, x))
    budget = 64 * (1 + layers * 1)
    assert out["pmt-dense"].forwards == budget
    assert out["deepzero"].forwards == budget
    assert out["no-adaptation"].forwards == 0
    assert out["pmt-sparse"].forwards == out["selection"]["forwards"] + out["pmt-sparse"].forwards \
        - out["pmt-sparse"].extra["selection_forwards"]
    assert out["int8-sparse-bp"].extra["block"] == out["selection"]["chosen"]
    assert set(METHODS) <= set(out)
    with pytest.raises(ValueError, match="unknown method"):
        Setup(methods=("pmt",))
    with pytest.raises(ValueError, match="pmt_lrs"):
        Setup(pmt_lrs=())


def test_benchmark_maps_every_integer_layer_to_its_float_module(models):
    """bench pmt accounts memory on the float graph: the name map must hit the right convs."""
    from bpfree.bench.runner import load_module

    bench = load_module("pmt")
    float_model, qmodel, x, _ = models
    assert set(METHODS) <= set(bench.LABELS) and set(METHODS) <= set(bench.MEMORY_RULE)
    for layer in find_layers(qmodel, x):
        module = float_model.get_submodule(bench._qname_to_float(layer.name))
        assert tuple(module.weight.shape) == tuple(layer.module.weight.shape)
