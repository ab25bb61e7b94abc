"""The fast channels-last int8 engine (bpfree.quant.engine) against the reference layers.

Integer arithmetic must give the same bits whichever path runs it: every stage type, odd
reduction lengths, channel counts that are not a multiple of the vector width, saturating
accumulators, multipliers above one, node offsets (PMT Eq. 9) and whole PMT steps.
"""

from __future__ import annotations

import copy

import pytest
import torch

from bpfree.models import digits_mlp, mnist_cnn, mnist_mobilenet
from bpfree.pmt import PMTConfig, PMTTrainer
from bpfree.quant import TensorQuant, quantize_model
from bpfree.quant.engine import FastStages, _add_op, fast_stages, kernel_library
from bpfree.quant.graph import StagedModel
from bpfree.quant.layers import QAdd, QConv2d, QLinear

lib = kernel_library()
pytestmark = pytest.mark.skipif(lib is None, reason="no C compiler: the int8 kernels did not "
                                                    "compile (the reference layers still run)")


def _int8(*shape, gen):
    return torch.randint(-128, 128, shape, dtype=torch.int8, generator=gen)


def _fast(stage):
    return FastStages([stage], lib)


def _conv(gen, c_in, c_out, k, *, stride=1, padding=0, dilation=1, groups=1, zp_in=-3,
          zp_out=5, activation="relu6", out_scale=0.05, bias_range=2000):
    w = _int8(c_out, c_in // groups, k, k, gen=gen)
    b = torch.randint(-bias_range, bias_range, (c_out,), generator=gen, dtype=torch.int64)
    scales = (torch.rand(c_out, generator=gen) * 0.02 + 0.001).tolist()
    return QConv2d(w, b, weight_scale=scales, input_quant=TensorQuant(0.02, zp_in),
                   output_quant=TensorQuant(out_scale, zp_out), stride=stride, padding=padding,
                   dilation=dilation, groups=groups, activation=activation)


CONVS = [
    dict(c_in=8, c_out=16, k=1),                                   # pointwise
    dict(c_in=13, c_out=10, k=1, activation=None),                 # odd K, C % 8 != 0
    dict(c_in=3, c_out=10, k=3, stride=2, padding=1),              # stem-like, odd K
    dict(c_in=1, c_out=8, k=3, stride=2, padding=1, zp_in=-128),
    dict(c_in=4, c_out=9, k=3, padding=2, dilation=2, activation="relu"),
    dict(c_in=16, c_out=16, k=3, padding=1, groups=16),            # depthwise
    dict(c_in=12, c_out=12, k=3, stride=2, padding=1, groups=12),  # depthwise, tail
    dict(c_in=24, c_out=24, k=5, padding=2, groups=24, zp_in=127),
    dict(c_in=6, c_out=12, k=3, padding=1, groups=3),              # grouped: reference path
    dict(c_in=72, c_out=80, k=1),                                  # more than one tile
    dict(c_in=13, c_out=24, k=1),                                  # rows kernel, odd K
    dict(c_in=40, c_out=64, k=1, zp_in=-128),                      # rows kernel, 8 blocks
    dict(c_in=7, c_out=8, k=1, activation=None),                   # rows kernel, K < 8
    dict(c_in=32, c_out=32, k=3, stride=2, padding=1, groups=32),  # depthwise interior, s2
    dict(c_in=16, c_out=16, k=3, padding=2, dilation=2, groups=16),  # depthwise, dilated
    dict(c_in=8, c_out=8, k=3, padding=0, groups=8, zp_in=127),    # depthwise, no border
    dict(c_in=300, c_out=16, k=1),                                 # rows kernel, K past pairs
    dict(c_in=3, c_out=16, k=3, stride=2, padding=1, zp_in=-128),  # stem Ci = 3, framed input
    dict(c_in=4, c_out=8, k=3, padding=2, dilation=2, zp_in=127),  # framed conv, dilated
    dict(c_in=5, c_out=16, k=2, stride=(1, 2)),                    # conv tiles, no padding
    dict(c_in=32, c_out=32, k=5, padding=2, groups=32),            # depthwise taps in pairs, odd
    dict(c_in=16, c_out=16, k=3, stride=2, padding=1, groups=16, zp_in=-128),  # framed, s2
]


@pytest.mark.parametrize("spec", CONVS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
@pytest.mark.parametrize("batch", [1, 3])
def test_conv_matches_reference(spec, batch):
    gen = torch.Generator().manual_seed(len(str(spec)) * 7 + batch)
    layer = _conv(gen, **spec)
    x = _int8(batch, spec["c_in"], 9, 11, gen=gen)
    assert torch.equal(_fast(layer).run(0, x), layer(x))


@pytest.mark.parametrize("c_out", [8, 16, 24])  # two rows at a time (B <= 2), one (B = 3)
@pytest.mark.parametrize("c_in", [1, 2, 3, 9, 15, 17, 26])
def test_rows_kernel_tails(c_in, c_out):
    """Point-wise rows whose K leaves a tail past the 16- and 8-lane stores (row_values
    writes it as one 8-lane vector, zeroed past K): every K mod 8, both zero-point extremes."""
    gen = torch.Generator().manual_seed(c_in * 31 + c_out)
    for zp_in in (-128, 127):
        layer = _conv(gen, c_in, c_out, 1, zp_in=zp_in)
        x = _int8(3, c_in, 5, 7, gen=gen)
        assert torch.equal(_fast(layer).run(0, x), layer(x))


def test_conv_extreme_inputs_and_saturating_weights():
    gen = torch.Generator().manual_seed(1)
    layer = _conv(gen, 32, 16, 3, padding=1, zp_in=-128, out_scale=0.5)
    layer.weight.copy_(torch.where(layer.weight > 0, 127, -128).to(torch.int8))
    for fill in (-128, 127, 0):
        x = torch.full((2, 32, 5, 5), fill, dtype=torch.int8)
        assert torch.equal(_fast(layer).run(0, x), layer(x))


@pytest.mark.parametrize("groups,k", [(32, 3), (1, 1)])  # depthwise interior, point-wise rows
def test_fast_kernels_at_the_int8_extremes(groups, k):
    """The rows kernel and the depthwise interior (which subtracts z_x sum w once instead of
    z_x per tap) at saturating weights and inputs, on both zero-point extremes."""
    gen = torch.Generator().manual_seed(3)
    for zp_in in (-128, 127):
        layer = _conv(gen, 32, 32, k, padding=k // 2, groups=groups, zp_in=zp_in, out_scale=0.5)
        layer.weight.copy_(torch.where(layer.weight > 0, 127, -128).to(torch.int8))
        for fill in (-128, 127, 0):
            x = torch.full((2, 32, 6, 6), fill, dtype=torch.int8)
            assert torch.equal(_fast(layer).run(0, x), layer(x))


@pytest.mark.parametrize("rule", ["reference", "litert"])
@pytest.mark.parametrize("hw,scales,zps", [
    ((4, 4), (0.05, 0.02), (-128, 3)),     # M > 1: a left shift
    ((7, 7), (0.02, 0.05), (127, -128)),   # odd count
    ((14, 14), (0.01, 0.01), (0, 0)),      # M = 1
    ((1, 1), (0.3, 0.007), (-5, 100)),     # one position, large M
])
def test_global_average_pool_matches_reference(rule, hw, scales, zps):
    from bpfree.quant.layers import QGlobalAvgPool2d

    gen = torch.Generator().manual_seed(len(rule) * 100 + hw[0])
    layer = QGlobalAvgPool2d(TensorQuant(scales[0], zps[0]), TensorQuant(scales[1], zps[1]),
                             rule=rule, keepdim=hw == (7, 7))
    for x in (_int8(3, 24, *hw, gen=gen), torch.full((2, 8, *hw), -128, dtype=torch.int8),
              torch.full((2, 8, *hw), 127, dtype=torch.int8)):
        assert torch.equal(_fast(layer).run(0, x), layer(x))


def test_scalar_epilogue_paths_match():
    """Multipliers above one (a left shift) and biases that saturate acc + bias take the
    scalar epilogue; it must agree with the reference too."""
    gen = torch.Generator().manual_seed(2)
    big = _conv(gen, 8, 16, 1, out_scale=1e-6)  # M = s_in s_w / s_out > 1: left shifts
    assert int(big.shift.max()) > 0
    x = _int8(2, 8, 6, 6, gen=gen)
    assert torch.equal(_fast(big).run(0, x), big(x))
    huge = _conv(gen, 8, 16, 1)
    huge.bias.copy_(torch.tensor([2**31 - 1, -(2**31)] * 8, dtype=torch.int32))
    assert torch.equal(_fast(huge).run(0, x), huge(x))


@pytest.mark.parametrize("k_in,c_out", [(64, 10), (65, 3), (784, 33)])
def test_linear_matches_reference(k_in, c_out):
    gen = torch.Generator().manual_seed(k_in)
    w = _int8(c_out, k_in, gen=gen)
    b = torch.randint(-5000, 5000, (c_out,), generator=gen)
    layer = QLinear(w, b, weight_scale=0.01, input_quant=TensorQuant(0.03, 7),
                    output_quant=TensorQuant(0.1, -2))
    for shape in ((5, k_in), (2, 3, k_in)):
        x = _int8(*shape, gen=gen)
        assert torch.equal(_fast(layer).run(0, x), layer(x))


@pytest.mark.parametrize("spec", [
    dict(c_in=8, c_out=12, k=3, padding=1),               # the generic convolution
    dict(c_in=8, c_out=16, k=1),                          # rows kernel, rows in pairs
    dict(c_in=1, c_out=8, k=3, padding=1),                # conv tiles on a framed input
    dict(c_in=16, c_out=16, k=3, padding=1, groups=16),   # depthwise, taps in pairs
    dict(c_in=24, c_out=24, k=3, padding=1, groups=24),   # depthwise, eight channels
], ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
@pytest.mark.parametrize("broadcast", [False, True])
def test_node_offset_matches_reference(broadcast, spec):
    """PMT Eq. 9: the offset is added after int8 saturation, before the activation clamp."""
    gen = torch.Generator().manual_seed(3)
    conv = _conv(gen, **spec)
    x = _int8(4, spec["c_in"], 7, 7, gen=gen)
    c = spec["c_out"]
    shape = (c, 1, 1) if broadcast else (4, c, 7, 7)
    conv.node_offset = torch.randint(-100, 101, shape, generator=gen, dtype=torch.int16)
    try:
        assert torch.equal(_fast(conv).run(0, x), conv(x))
    finally:
        conv.node_offset = None


def _models():
    gen = torch.Generator().manual_seed(0)
    out = []
    for build, shape in ((mnist_mobilenet, (1, 28, 28)), (mnist_cnn, (1, 28, 28)),
                         (digits_mlp, (64,))):
        torch.manual_seed(0)
        x = torch.rand(64, *shape, generator=gen)
        out.append((build.__name__, quantize_model(build().eval(), x, input_range=(0.0, 1.0)),
                    x))
    return out


MODELS = _models()


@pytest.mark.parametrize("shape", [(2, 8, 3, 3), (1, 13)])  # whole vectors and a tail
def test_residual_add_matches_reference(shape):
    """The kernel set's add (bpf_int8.h, which the device programs run too) equals QAdd."""
    gen = torch.Generator().manual_seed(5)
    add = QAdd(TensorQuant(0.02, 3), TensorQuant(0.05, -7), TensorQuant(0.04, 1),
               activation="relu")
    a, b = _int8(*shape, gen=gen), _int8(*shape, gen=gen)
    assert torch.equal(_add_op(lib, add)(a, b), add(a, b))


@pytest.mark.parametrize("name,qmodel,x", MODELS, ids=[m[0] for m in MODELS])
def test_every_stage_matches_reference(name, qmodel, x):
    ref, fast = StagedModel(qmodel, engine="reference"), StagedModel(qmodel, engine="fast")
    assert fast.engine == "fast" and ref.engine == "reference"
    xq = qmodel.input_quant.quantize(x[:7])
    assert torch.equal(ref.clean(xq), fast.clean(xq))
    for a, b in zip(ref.inputs, fast.inputs):
        assert torch.equal(a, b)
    for k in range(len(ref.stages)):
        assert torch.equal(ref.from_stage(k), fast.from_stage(k)), f"stage {k}"


@pytest.mark.parametrize("perturbation", ["adaptive", "wp", "np"])
def test_pmt_steps_bit_identical(perturbation):
    """Whole PMT steps (WP saturating perturbations, NP offsets, the Eq. 8 update): every
    per-step loss and every integer parameter equal on both engines."""
    _, qmodel, x = MODELS[0]
    y = torch.arange(64) % 10
    # GNS shrinks WP steps by Q / (Q + d - 1): a larger rate makes every mode move weights.
    lr = {"adaptive": 20.0, "wp": 3000.0, "np": 20.0}[perturbation]
    states = []
    for engine in ("reference", "fast"):
        model = copy.deepcopy(qmodel)
        trainer = PMTTrainer(model, PMTConfig(queries=3, perturbation=perturbation, seed=5),
                             example=x[:2], trainable=None, engine=engine)
        losses = [trainer.step(x[i:i + 16], y[i:i + 16], lr=lr)["loss"] for i in (0, 16)]
        states.append((losses, {k: v.clone() for k, v in model.state_dict().items()}))
    (l_ref, s_ref), (l_fast, s_fast) = states
    assert l_ref == l_fast
    assert s_ref.keys() == s_fast.keys()
    changed = sum(int((s_ref[k] != qmodel.state_dict()[k]).sum()) for k in s_ref)
    assert changed > 0  # the steps did train, so the comparison means something
    for k in s_ref:
        assert torch.equal(s_ref[k], s_fast[k]), k


def test_engine_choice_and_errors(monkeypatch):
    _, qmodel, _ = MODELS[2]
    with pytest.raises(ValueError, match="engine must be one of"):
        StagedModel(qmodel, engine="turbo")
    monkeypatch.setenv("BPFREE_ENGINE", "reference")
    assert StagedModel(qmodel).engine == "reference"
    assert fast_stages(list(qmodel.body)) is None
    monkeypatch.setenv("BPFREE_ENGINE", "bogus")
    with pytest.raises(ValueError, match="BPFREE_ENGINE must be one of"):
        StagedModel(qmodel)


def test_fast_path_rejects_float_input():
    _, qmodel, x = MODELS[0]
    staged = StagedModel(qmodel, engine="fast")
    with pytest.raises(ValueError, match="int8"):
        staged.from_stage(0, x[:2])


def test_non_contiguous_inputs_are_read_correctly():
    """The kernels index raw memory: a strided view must give the reference's result."""
    gen = torch.Generator().manual_seed(4)
    conv = _conv(gen, 8, 16, 1)
    x = _int8(2, 8, 6, 12, gen=gen)[..., ::2]  # (2, 8, 6, 6), not contiguous
    assert torch.equal(_fast(conv).run(0, x), conv(x))
    lin = QLinear(_int8(5, 6, gen=gen), None, weight_scale=0.01,
                  input_quant=TensorQuant(0.03, 1), output_quant=TensorQuant(0.1, 0))
    xl = _int8(6, 4, gen=gen).T  # (4, 6), transposed
    assert torch.equal(_fast(lin).run(0, xl), lin(xl))


def _fitted_mobilenet():
    """The MNIST MobileNet after a few Adam steps on its own batch: at initialisation its
    logits barely depend on block 1, so no query there would change the loss."""
    gen = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    x = torch.rand(64, 1, 28, 28, generator=gen)
    y = torch.arange(64) % 10
    model = mnist_mobilenet()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(30):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return quantize_model(model.eval(), x, input_range=(0.0, 1.0)), x, y


@pytest.mark.parametrize("engine", ["reference", "fast"])
@pytest.mark.parametrize("perturbation", ["wp", "np"])
def test_queries_entering_inside_a_block_match_whole_block_queries(engine, perturbation,
                                                                   monkeypatch):
    """A layer's queries start at its own input inside its MobileNetV2 block (issue 30): the
    same bits as recomputing the block from its input (the old path, entry without a module),
    while the block's earlier layers run once per layer instead of once per query."""
    qmodel, x, y = _fitted_mobilenet()
    trainable = ["body.1.body.0", "body.1.body.1", "body.1.body.2"]
    expand = qmodel.body[1].body[0]
    real = StagedModel.entry
    results = []
    for whole_block in (True, False):
        if whole_block:
            monkeypatch.setattr(StagedModel, "entry", lambda self, k, module=None: real(self, k))
        else:
            monkeypatch.setattr(StagedModel, "entry", real)
        model = copy.deepcopy(qmodel)
        calls = [0]
        model.body[1].body[0].register_forward_hook(  # samples through the expand layer
            lambda mod, args, out: calls.__setitem__(0, calls[0] + args[0].shape[0]))
        trainer = PMTTrainer(model, PMTConfig(queries=4, perturbation=perturbation, seed=3),
                             example=x[:2], trainable=trainable, engine=engine)
        loss = trainer.step(x[:16], y[:16], lr=3000.0 if perturbation == "wp" else 20.0)["loss"]
        results.append((loss, {k: v.clone() for k, v in model.state_dict().items()}, calls[0]))
    (l_old, s_old, c_old), (l_new, s_new, c_new) = results
    assert l_old == l_new
    assert any(not torch.equal(s_old[k], qmodel.state_dict()[k]) for k in s_old)
    for k in s_old:
        assert torch.equal(s_old[k], s_new[k]), k
    if engine == "reference":  # the hook sees the reference layers' calls
        # The expand layer ran on every query of the two later layers before (WP one query
        # at a time, NP a chunk of queries at once); now once per layer on the batch.
        assert c_new < c_old
    assert expand is qmodel.body[1].body[0]
