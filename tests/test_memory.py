"""Tests for bpfree.memory: reports, profiles, analytic rules and measured peaks."""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest
import torch
from torch import nn

from bpfree.memory import (
    CANONICAL_PARTS,
    MemoryReport,
    analytic,
    format_bytes,
    measure_peak,
    peak_extra_bytes,
    profile_model,
    register_rule,
    registered_rules,
)
from bpfree.memory import rules as rules_module
from bpfree.pmt import layer_memory, pmt_modes

SLACK = 256  # bytes of allocator rounding tolerated in measured peaks

# The hand-counted model: Linear(64,32) -> ReLU -> Linear(32,10), batch 8, fp32.
N = 8
PARAMS = 64 * 32 + 32 + 32 * 10 + 10  # 2410
PARAM_BYTES = PARAMS * 4  # 9640
PEAK = max(N * 64 + N * 32, N * 32 + N * 32, N * 32 + N * 10) * 4  # 3072


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


# --------------------------------------------------------------------------- measure_peak


def test_measure_peak_two_live_allocations_then_freed():
    def fn():
        a = torch.empty(1_000_000, dtype=torch.float32)
        b = torch.empty(500_000, dtype=torch.float32)  # while a is alive
        del a, b

    _, m = measure_peak(fn)
    assert abs(m.peak_bytes - 6_000_000) <= SLACK
    assert m.held_bytes <= SLACK
    assert m.torch_peak_bytes == m.peak_bytes


def test_measure_peak_subtracts_frees_between_allocations():
    def fn():
        a = torch.ones(1_000_000)
        del a
        b = torch.ones(1_000_000)  # reuses the freed budget, peak stays 4 MB
        del b

    _, m = measure_peak(fn)
    assert abs(m.peak_bytes - 4_000_000) <= SLACK


def test_in_place_ops_add_nothing():
    x = torch.ones(100_000)

    def fn():
        x.add_(1)
        x.mul_(2)
        x.clamp_(min=0)
        torch.add(x, 1, out=x)
        x.view(-1)[:10].zero_()

    _, m = measure_peak(fn)
    assert m.peak_bytes == 0
    assert m.held_bytes == 0


def test_tensors_alive_before_entry_not_counted():
    big = torch.ones(1_000_000)

    def fn():
        view = big[:500]  # a view shares big's storage: no new memory
        return view * 2  # 500 new floats

    result, m = measure_peak(fn)
    assert m.peak_bytes == 500 * 4
    assert m.held_bytes == 500 * 4  # the result is still alive
    del result


def test_python_lists_count_but_numpy_backed_tensors_do_not():
    arr = np.ones(10_000)
    _, m_list = measure_peak(lambda: torch.tensor([1.0, 2.0, 3.0, 4.0]))
    _, m_np = measure_peak(lambda: torch.from_numpy(arr))
    assert m_list.peak_bytes == 16
    assert m_np.peak_bytes == 0


def test_numpy_allocations_reported_separately():
    _, m = measure_peak(lambda: np.ones(250_000).sum())
    assert m.peak_bytes == 0
    # tracemalloc also sees Python objects (a few KiB of bookkeeping).
    assert 2_000_000 <= m.numpy_peak_bytes <= 2_000_000 + 64 * 1024


def test_resize_of_preexisting_storage_counts_growth():
    out = torch.empty(0)
    _, m = measure_peak(lambda: torch.add(torch.ones(100), 1, out=out))
    assert m.peak_bytes == 800  # the ones(100) temporary + out grown to 100 floats
    assert m.held_bytes == 400


def test_peak_extra_bytes_is_train_minus_inference():
    def train():
        return torch.ones(1000).sum()

    def inference():
        return torch.ones(250).sum()

    assert peak_extra_bytes(train, inference) == (1000 + 1) * 4 - (250 + 1) * 4


def test_measured_training_step_matches_allocator_profiler():
    """Cross-check against the CPU allocator's own alloc/free events (torch.profiler)."""
    kineto_api = pytest.importorskip("torch.profiler")
    model, x = _mlp(), torch.randn(N, 64)

    def step():
        model.zero_grad(set_to_none=True)
        model(x).square().mean().backward()

    step()
    gc.collect()
    with kineto_api.profile(activities=[kineto_api.ProfilerActivity.CPU],
                            profile_memory=True) as prof:
        step()
    try:
        events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
        events.sort(key=lambda e: e.start_ns())
        sizes = [e.nbytes() for e in events]
    except AttributeError:
        pytest.skip("this torch has no kineto memory events API")
    live = peak = 0
    for nbytes in sizes:
        live += nbytes
        peak = max(peak, live)

    _, m = measure_peak(step)
    assert m.peak_bytes == peak
    assert m.held_bytes == live == PARAM_BYTES  # the fresh .grad buffers


# --------------------------------------------------------------------------- profile_model


def test_profile_model_hand_counts():
    model = _mlp()
    p = profile_model(model, torch.randn(N, 64))
    assert [layer.name for layer in p.layers] == ["0", "1", "2"]
    assert [layer.type for layer in p.layers] == ["Linear", "ReLU", "Linear"]
    assert p.layers[0].input_shapes == ((N, 64),)
    assert p.layers[2].output_shapes == ((N, 10),)
    # PMT's d_w is the weight alone (§3.2.2, Algorithm 1 line 7), as PMTTrainer counts it.
    assert [layer.d_w for layer in p.layers] == [64 * 32, 0, 32 * 10]
    assert [layer.d_a for layer in p.layers] == [32, 32, 10]
    assert (p.layers[0].weight_numel, p.layers[0].bias_numel) == (64 * 32, 32)
    assert p.batch_size == N
    assert p.num_parameters == PARAMS
    assert p.parameter_bytes == PARAM_BYTES
    assert p.inference_peak_bytes == PEAK
    assert p.inference_peak_numel * 4 == PEAK


def test_profile_model_counts_aliasing_output_once():
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(inplace=True), nn.Flatten())
    p = profile_model(model, torch.randn(2, 4))
    assert p.layers[1].aliases_input and p.layers[2].aliases_input
    assert p.inference_peak_numel == 2 * 4 + 2 * 6


class _Boom(nn.Module):
    def forward(self, x):
        raise RuntimeError("boom")


def test_profile_removes_hooks_and_restores_mode_even_on_error():
    model = _mlp().train()
    profile_model(model, torch.randn(2, 64))
    assert all(len(m._forward_hooks) == 0 for m in model.modules())
    assert all(m.training for m in model.modules())

    bad = nn.Sequential(nn.Linear(64, 32), _Boom()).train()
    with pytest.raises(RuntimeError, match="boom"):
        profile_model(bad, torch.randn(2, 64))
    assert all(len(m._forward_hooks) == 0 for m in bad.modules())
    assert all(m.training for m in bad.modules())


# --------------------------------------------------------------------------- analytic rules


@pytest.fixture(scope="module")
def mlp_profile():
    return profile_model(_mlp(), torch.randn(N, 64))


def test_analytic_inference_and_zo_wp_lean_hand_counts(mlp_profile):
    q = 4
    inf = analytic(mlp_profile, "inference")
    assert inf.total == PARAM_BYTES + PEAK
    wp = analytic(mlp_profile, "zo_wp_lean", num_queries=q)
    assert wp.parts["seeds_losses"] == q * 4 + (q + 1) * 4
    assert wp.total == PARAM_BYTES + PEAK + q * 4 + (q + 1) * 4
    assert wp.parts["trainable_copy"] == wp.parts["gradient_buffers"] == 0


def test_analytic_from_module_matches_profile(mlp_profile):
    by_example = analytic(_mlp(), "zo_wp_lean", example_input=torch.randn(N, 64), num_queries=3)
    by_shape = analytic(_mlp(), "zo_wp_lean", input_shape=(64,), batch_size=N, num_queries=3)
    by_profile = analytic(mlp_profile, "zo_wp_lean", num_queries=3)
    assert by_example.parts == by_shape.parts == by_profile.parts


def test_analytic_bp_hand_counts(mlp_profile):
    kept = (N * 64 + N * 32 + N * 32) * 4  # inputs of Linear, ReLU, Linear
    bp = analytic(mlp_profile, "bp")
    assert bp.parts["activations"] == kept
    assert bp.parts["activation_gradients"] == PEAK
    assert bp.parts["gradient_buffers"] == PARAM_BYTES
    assert bp.parts["optimizer_state"] == 0
    assert analytic(mlp_profile, "bp", momentum=True).parts["optimizer_state"] == PARAM_BYTES
    last_only = analytic(mlp_profile, "bp", trainable=["2"])
    assert last_only.parts["gradient_buffers"] == (32 * 10 + 10) * 4


def test_analytic_batched_and_np_hand_counts(mlp_profile):
    q = 4
    wpb = analytic(mlp_profile, "zo_wp_batched", num_queries=q,
                   trainable=lambda name: name.startswith("2."))
    assert wpb.parts["trainable_copy"] == q * (32 * 10 + 10) * 4
    assert wpb.parts["activations"] == q * PEAK

    np_seeds = N * q * 4 + N * (q + 1) * 4
    npl = analytic(mlp_profile, "zo_np_lean", num_queries=q)
    assert npl.parts["gradient_buffers"] == (64 * 32 + 32) * 4  # largest trainable layer
    assert npl.parts["activations"] == PEAK
    assert npl.parts["seeds_losses"] == np_seeds

    npb = analytic(mlp_profile, "zo_np_batched", num_queries=q)
    assert npb.parts["activations"] == q * PEAK + (N * 64 + N * 32) * 4
    assert npb.parts["gradient_buffers"] == PARAM_BYTES
    assert npb.parts["seeds_losses"] == np_seeds


def test_analytic_dtype_bytes_and_batch_scale(mlp_profile):
    int8 = analytic(mlp_profile, "inference", dtype_bytes=1, batch_size=2 * N)
    assert int8.parts["parameters"] == PARAMS
    assert int8.parts["activations"] == 2 * PEAK // 4


def test_unknown_method_lists_registered(mlp_profile):
    with pytest.raises(ValueError, match="not registered") as err:
        analytic(mlp_profile, "zo_nonsense")
    for name in ("bp", "inference", "zo_wp_lean", "zo_np_lean"):
        assert name in str(err.value)


def test_bad_options_name_the_parameter(mlp_profile):
    with pytest.raises(ValueError, match="zo_wp_lean"):
        analytic(mlp_profile, "zo_wp_lean", momentum=True)
    with pytest.raises(ValueError, match="num_queries"):
        analytic(mlp_profile, "zo_wp_lean", num_queries=0)
    with pytest.raises(ValueError, match="trainable"):
        analytic(mlp_profile, "bp", trainable=["no_such_layer"])
    with pytest.raises(ValueError, match="input_shape"):
        analytic(_mlp(), "bp")


def test_register_rule(monkeypatch, mlp_profile):
    monkeypatch.setattr(rules_module, "_RULES", dict(rules_module._RULES))

    def constant(profile, **options):
        return MemoryReport("constant", {"parameters": 7, "scratch": 5})

    register_rule("constant", constant)
    assert "constant" in registered_rules()
    assert analytic(mlp_profile, "constant").total == 12
    with pytest.raises(ValueError, match="replace=True"):
        register_rule("constant", constant)
    register_rule("constant", constant, replace=True)


# --------------------------------------------------------------------------- MemoryReport


def test_memory_report_total_add_and_dict():
    a = MemoryReport("a", {"parameters": 100, "activations": 50})
    b = MemoryReport("b", {"activations": 25, "extra_thing": 1})
    c = a + b
    assert c.method == "a+b"
    assert c.parts == {"parameters": 100, "activations": 75, "extra_thing": 1}
    assert c.total == 176
    assert sum([a, b]).parts == c.parts
    assert a.merge(b, method="both").method == "both"
    assert c.as_dict() == {"method": "a+b", "parts": c.parts, "total": 176}


@pytest.mark.parametrize("parts, error", [
    ({"parameters": -1}, ValueError),
    ({"parameters": 1.5}, TypeError),
    ({"parameters": True}, TypeError),
    ({"Bad Name": 1}, ValueError),
])
def test_memory_report_validates_parts(parts, error):
    with pytest.raises(error):
        MemoryReport("m", parts)


def test_memory_report_table_lists_every_part(mlp_profile):
    report = analytic(mlp_profile, "bp", momentum=True)
    text = report.table()
    for name in (*CANONICAL_PARTS, "activation_gradients", "total"):
        assert name in text
    assert "KiB" in text and "%" in text
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 1024 * 1024) == "3.00 MiB"


# --------------------------------------------------------------------------- int8 MCU rules
# (PMT Table 3 / Algorithm 1, MeZO, CGE, BP on the int8 graph) and MACs per iteration.
#
# The hand-counted conv model: Conv2d(1,4,3,pad 1) -> ReLU -> Flatten -> Linear(144,2) on
# 1x6x6. Per sample: conv d_w 36 < d_a 144 -> WP; linear d_w 288 >= d_a 2 -> NP (d_w is the
# weight alone; an NP gradient buffer also holds the bias: 290).
# Live (input + output) per layer: 36+144, 144+144, 144 (Flatten aliases), 144+2.
# MACs per sample: conv 6*6*4*1*3*3 = 1296, linear 144*2 = 288, total 1584.

from bpfree.memory import macs_per_iteration, method_defaults  # noqa: E402

CN, CQ = 2, 3  # batch N and queries Q of the hand counts
CONV_MACS, LIN_MACS = 1296, 288
C_PARAMS_INT8 = (36 + 288) * 1 + (4 + 2) * 4  # int8 weights, int32 biases = 348
C_INFER = 288 * CN  # max live per sample (ReLU: 144 in + 144 out) x N, 1 B = 576


def _conv_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(144, 2))


@pytest.fixture(scope="module")
def conv_profile():
    return profile_model(_conv_model(), torch.zeros(1, 1, 6, 6))


def test_pmt_hand_counts(conv_profile):
    assert pmt_modes(conv_profile) == {"0": "WP", "3": "NP"}
    r = analytic(conv_profile, "pmt", batch_size=CN, num_queries=CQ)
    # WP layer 0 keeps a^(0) (N*36) while layers 0.. run again: 72 + max live after (576).
    wp_peak = max(180 * CN, 36 * CN + 288 * CN)  # 648
    # NP layer 3 keeps a^(3) (N*144) and its perturbed output (N*2); nothing runs after it.
    np_peak = 144 * CN + 2 * CN  # 292
    assert r.parts == {
        "parameters": C_PARAMS_INT8,
        "trainable_copy": 0,
        "activations": C_INFER,
        "gradient_buffers": 290 * 4,  # largest trainable layer's d_w, fp32 accumulator
        "optimizer_state": 0,
        # 1 seed; clean losses: N (an NP layer exists) + the NP layer's N*Q sample losses.
        "seeds_losses": 1 * 4 + (CN + CN * CQ) * 4,
        "saved_activations": max(wp_peak, np_peak) - C_INFER,
    }
    assert r.total == 348 + 576 + 1160 + 36 + 72 == 2192


def test_pmt_d_w_excludes_the_bias_as_the_trainer_does():
    """A layer with weights < d_a <= weights + bias: PMT's d_w (the weight, §3.2.2 /
    Algorithm 1 line 7; PMTTrainer's TrainableLayer.d_w = weight.numel()) picks WP, as the
    trainer does, and its WP gradient buffer holds the weights only, as the trainer's does."""
    from bpfree.quant.graph import find_layers
    from bpfree.quant import quantize_model

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 1), nn.ReLU(), nn.Flatten(), nn.Linear(4, 3))
    p = profile_model(model, torch.zeros(1, 1, 1, 2))  # conv: d_w 2, bias 2, d_a 4
    assert (p.layers[0].d_w, p.layers[0].bias_numel, p.layers[0].d_a) == (2, 2, 4)
    assert pmt_modes(p) == {"0": "WP", "3": "NP"}
    q = quantize_model(model, torch.rand(8, 1, 1, 2), input_range=(0.0, 1.0))
    trainer_modes = {layer.name: layer.preferred_mode
                     for layer in find_layers(q, torch.rand(2, 1, 1, 2))}
    assert sorted(trainer_modes.values()) == ["np", "wp"]
    assert list(trainer_modes.values()) == [m.lower() for m in pmt_modes(p).values()]
    assert macs_per_iteration(p, "pmt", 1, 1) == (
        2 * p.macs + p.macs + p.layers[0].macs + p.layers[3].macs)  # WP conv: Q passes from 0
    r = analytic(p, "pmt", batch_size=1, num_queries=1, trainable=["0"])
    assert r.parts["gradient_buffers"] == 2 * 4  # WP: the 2 weights, no bias
    r = analytic(p, "pmt", batch_size=1, num_queries=1, trainable=["3"])
    assert r.parts["gradient_buffers"] == (12 + 3) * 4  # NP: weight + bias (Eq. 10)


def test_pmt_step_overhead_is_the_rules_gradient_buffer():
    """PMT's memory claim (§3.2.2, Table 3 NP (Efficient) "+ d_w"): beyond inference, a step
    holds one gradient buffer, that of the largest trainable layer, not one per layer and not
    BP's saved activations. Measured (:func:`measure_peak`) on an int8 MLP whose two large
    NP layers are of similar size (holding both buffers would double the overhead), against
    the ``pmt`` rule at the simulator's bytes per value: PMTTrainer accumulates estimates in
    float64 (read off an estimate below), the rule's default is the MCU's fp32."""
    from bpfree.pmt import (PMTConfig, PMTTrainer, StagedModel, estimate_group, find_layers,
                            per_sample_loss)
    from bpfree.quant import quantize_model

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(256, 384), nn.ReLU(), nn.Linear(384, 256),
                          nn.ReLU(), nn.Linear(256, 10))
    x, y = torch.rand(2, 256), torch.tensor([3, 7])
    q = quantize_model(model, torch.rand(64, 256), input_range=(0.0, 1.0))
    # The reference layers: the fast engine (bpfree.quant.engine) also keeps a packed int16
    # copy of each layer's weights, a cache of the simulator and not a buffer of PMT's.
    trainer = PMTTrainer(q, PMTConfig(queries=2), example=x, engine="reference")
    assert set(trainer.modes.values()) == {"np"}
    xq = trainer.staged.quantize(x)
    trainer.step(xq, y, lr=0.0)  # lr 0: the weights stay, the buffers are all made
    _, inference = measure_peak(lambda: q.forward_int(xq))
    _, step = measure_peak(lambda: trainer.step(xq, y, lr=0.0))
    overhead = step.peak_bytes - inference.peak_bytes

    staged = StagedModel(q)
    loss = per_sample_loss(staged.clean(xq), y, q.output_quant)
    layer = find_layers(q, x)[0]
    est = estimate_group(staged, [(layer, "np")], [0], y, loss, queries=1, seed=0)
    grad_bytes = est[layer.name].weight.element_size()
    assert grad_bytes == 8
    rule = analytic(model, "pmt", example_input=x, num_queries=2, grad_bytes=grad_bytes)
    buffer = rule.parts["gradient_buffers"]
    assert buffer == (256 * 384 + 384) * grad_bytes  # the largest layer, weight + bias
    assert abs(overhead - buffer) <= 0.1 * buffer, (overhead, buffer)
    # At its default the rule counts the MCU's 4 B per value: half of what is measured here.
    assert analytic(model, "pmt", example_input=x, num_queries=2).parts[
        "gradient_buffers"] * 2 == buffer
    with pytest.raises(ValueError, match="grad_bytes must be an int >= 1"):
        analytic(model, "pmt", example_input=x, grad_bytes=0)


def test_layer_memory_hand_counts(conv_profile):
    """Per-layer bytes of the hand-counted conv model (N=2, int8): live set, BP's saved
    input, PMT's peak and gradient buffer, and that they add up to the rules' totals."""
    rows = layer_memory(conv_profile, batch_size=CN, dtype_bytes=1)
    assert [(r.name, r.type, r.d_w, r.d_a, r.mode) for r in rows] == [
        ("0", "Conv2d", 36, 144, "WP"), ("1", "ReLU", 0, 144, None),
        ("2", "Flatten", 0, 144, None), ("3", "Linear", 288, 2, "NP")]
    # Live: conv 36 in + 144 out, ReLU 144 + 144, Flatten aliases (144), linear 144 + 2.
    assert [r.live_bytes for r in rows] == [180 * CN, 288 * CN, 144 * CN, 146 * CN]
    # BP keeps the inputs of the conv, the ReLU and the linear (not the Flatten view).
    assert [r.bp_saved_bytes for r in rows] == [36 * CN, 144 * CN, 0, 144 * CN]
    # PMT: WP conv keeps a^(0) while the rest runs again; NP linear keeps a^(3) + its output.
    assert [r.pmt_peak_bytes for r in rows] == [36 * CN + 288 * CN, 0, 0, 144 * CN + 2 * CN]
    # WP fills the weights only, NP weight + bias (Eq. 10).
    assert [r.pmt_grad_bytes for r in rows] == [36 * 4, 0, 0, (288 + 2) * 4]
    assert [r.macs for r in rows] == [CN * CONV_MACS, 0, 0, CN * LIN_MACS]
    # The totals are the rules' parts.
    pmt = analytic(conv_profile, "pmt", batch_size=CN, num_queries=CQ)
    bp = analytic(conv_profile, "bp-int8", batch_size=CN)
    assert sum(r.bp_saved_bytes for r in rows) == bp.parts["activations"] == 648
    assert max(r.live_bytes for r in rows) == pmt.parts["activations"] == C_INFER
    assert max(r.pmt_peak_bytes for r in rows) - C_INFER == pmt.parts["saved_activations"]
    assert max(r.pmt_grad_bytes for r in rows) == pmt.parts["gradient_buffers"] == 1160
    # fp32 (4 B/value) scales activations, not the fp32 gradient buffer; a frozen layer
    # has no PMT columns.
    rows4 = layer_memory(conv_profile, batch_size=CN, dtype_bytes=4, trainable=["3"])
    assert [r.bp_saved_bytes for r in rows4] == [4 * r.bp_saved_bytes for r in rows]
    assert [(r.mode, r.pmt_grad_bytes) for r in rows4] == [
        (None, 0), (None, 0), (None, 0), ("NP", 290 * 4)]
    assert sum(r.bp_saved_bytes for r in rows4) == analytic(
        conv_profile, "bp", batch_size=CN).parts["activations"]


def test_memory_cli_layers_prints_per_layer_bytes(capsys):
    from bpfree import cli

    assert cli.main(["memory", "--model", "mnist-mobilenet", "--method", "pmt", "--method",
                     "bp-int8", "--layers", "--batch-size", "100", "--queries", "5"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("layer "))
    for col in ("live_B", "bp_saved_B", "pmt_peak_B", "pmt_grad_B"):
        assert col in header
    total = next(line for line in out.splitlines() if line.startswith("total "))
    from bpfree.models import get_model

    rows = layer_memory(get_model("mnist-mobilenet").build(), input_shape=(1, 28, 28),
                        batch_size=100)
    bp = analytic(get_model("mnist-mobilenet").build(), "bp-int8", input_shape=(1, 28, 28),
                  batch_size=100)
    assert f"{sum(r.bp_saved_bytes for r in rows):,}" in total
    assert sum(r.bp_saved_bytes for r in rows) == bp.parts["activations"]


def test_mezo_cge_hand_counts(conv_profile):
    mezo = analytic(conv_profile, "mezo", batch_size=CN, num_queries=CQ)
    assert mezo.total == C_PARAMS_INT8 + C_INFER + CQ * 4 + (CQ + 1) * 4 == 952
    assert mezo.parts["gradient_buffers"] == 0
    cge = analytic(conv_profile, "cge", batch_size=CN, num_queries=CQ, coordinates=5)
    assert cge.parts["seeds_losses"] == 4 + (5 + 1) * 4
    assert analytic(conv_profile, "cge", batch_size=CN, num_queries=CQ).parts[
        "seeds_losses"] == 4 + (CQ + 1) * 4


def test_bp_int8_and_sparse_bp_hand_counts(conv_profile):
    bp = analytic(conv_profile, "bp-int8", batch_size=CN)
    assert bp.parts["parameters"] == C_PARAMS_INT8
    assert bp.parts["activations"] == (36 + 144 + 144) * CN  # inputs of conv, ReLU, linear, int8
    assert bp.parts["activation_gradients"] == C_INFER * 4  # fp32
    assert bp.parts["gradient_buffers"] == (40 + 290) * 4
    assert bp.total == 4620

    sparse = analytic(conv_profile, "sparse-bp", batch_size=CN, trainable=["3"])
    assert sparse.parts["activations"] == 144 * CN  # only the trained linear's input
    assert sparse.parts["activation_gradients"] == (144 + 2) * CN * 4
    assert sparse.parts["gradient_buffers"] == 290 * 4
    assert sparse.total == 348 + 288 + 1168 + 1160 == 2964
    # Bias-only training keeps no input at all (grad b = grad z).
    bias_only = analytic(conv_profile, "sparse-bp", batch_size=CN, trainable=["3.bias"])
    assert bias_only.parts["activations"] == 0
    assert bias_only.parts["gradient_buffers"] == 2 * 4


def test_macs_per_iteration_hand_counts(conv_profile):
    m = CONV_MACS + LIN_MACS
    assert [layer.macs for layer in conv_profile.layers] == [CONV_MACS, 0, 0, LIN_MACS]
    assert conv_profile.macs == m
    macs = lambda method, **kw: macs_per_iteration(conv_profile, method, CN, CQ, **kw)  # noqa: E731
    assert macs("inference") == CN * m
    # Clean forward + layer-wise forward + WP layer 0: Q*N*(all layers) + recompute conv;
    # NP layer 3: Q*N*(nothing after it) + recompute linear.
    assert macs("pmt") == CN * m + CN * m + CQ * CN * m + CN * CONV_MACS + 0 + CN * LIN_MACS
    assert macs("pmt") == 19008
    assert macs("mezo") == (CQ + 1) * CN * m
    assert macs("cge", coordinates=5) == 6 * CN * m
    assert macs("bp-int8") == CN * (m + LIN_MACS + m) == 3 * CN * m - CN * CONV_MACS
    assert macs("sparse-bp", trainable=["3"]) == CN * (m + LIN_MACS)
    # Sparse PMT: only the linear trains; no WP suffix, its recompute only.
    assert macs("pmt-sparse", trainable=["3"]) == CN * m + CN * m + CN * LIN_MACS


def test_layer_macs_match_formula():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1),  # 9x9 -> 5x5
                          nn.Conv2d(8, 8, 3, padding=1, groups=8),   # depthwise
                          nn.Flatten(), nn.Linear(200, 7))
    p = profile_model(model, torch.zeros(2, 3, 9, 9))
    conv, dw, _, lin = p.layers
    assert conv.macs == 5 * 5 * 8 * 3 * 3 * 3
    assert dw.macs == 5 * 5 * 8 * (8 // 8) * 3 * 3
    assert lin.macs == 200 * 7
    seq = profile_model(nn.Linear(6, 4), torch.zeros(2, 5, 6))  # 5 positions per sample
    assert seq.layers[0].macs == 5 * 6 * 4


def test_fold_batchnorm_moves_shift_into_conv_bias():
    model = nn.Sequential(nn.Conv2d(2, 4, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU6())
    p = profile_model(model, torch.zeros(1, 2, 5, 5))
    f = p.fold_batchnorm()
    assert [layer.type for layer in f.layers] == ["Conv2d", "ReLU6"]
    assert f.parameter_numel == {"0.weight": 72, "0.bias": 4}
    assert f.layers[0].d_w == 72 and f.layers[0].bias_numel == 4
    assert f.folded_batchnorm == ("1",)
    assert f.parameter_bytes == 76 * 4
    assert f.fold_batchnorm() is f  # idempotent
    assert profile_model(model, torch.zeros(1, 2, 5, 5), fold_bn=True).parameter_numel == \
        f.parameter_numel
    assert p.num_parameters == 72 + 8  # the unfolded profile is unchanged


class _ConvBnTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(2, 4, 3, bias=False), nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y  # the conv output is read twice: folding would change it


def test_fold_batchnorm_leaves_shared_conv_output_alone():
    p = profile_model(_ConvBnTwice(), torch.zeros(1, 2, 5, 5))
    assert p.fold_batchnorm() is p


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x):
        return x + self.body(x)


def test_residual_skip_is_held_across_the_block():
    p = profile_model(nn.Sequential(_Residual()), torch.zeros(3, 4))
    assert [layer.name for layer in p.layers] == ["0.body.0", "0.body.1", "0.body.2", "0:add"]
    assert p.layers[-1].type == "add" and p.layers[-1].input_shapes == ((3, 4), (3, 4))
    # x (3x4) is read by the first linear and again by the add: held across ReLU and Linear.
    assert [layer.held_numel for layer in p.layers] == [0, 12, 12, 0]
    assert p.inference_peak_numel == 3 * 16 + 3 * 16 + 12
    # Without functional tracing the add is invisible (the old behaviour).
    assert profile_model(nn.Sequential(_Residual()), torch.zeros(3, 4),
                         functional=False).inference_peak_numel == 3 * 16 + 3 * 16


@pytest.fixture(scope="module")
def mobilenet_profile():
    from bpfree.models import get_model

    spec = get_model("mnist-mobilenet")
    return profile_model(spec.build(), torch.zeros(1, *spec.input_shape))


def test_pmt_modes_are_dw_lt_da_on_mobilenet(mobilenet_profile):
    folded = mobilenet_profile.fold_batchnorm()
    assert not any(layer.type == "BatchNorm2d" for layer in folded.layers)
    modes = pmt_modes(mobilenet_profile)
    assert modes and set(modes.values()) == {"WP", "NP"}
    for layer in folded.layers:
        if layer.parameter_numel:
            assert modes[layer.name] == ("WP" if layer.d_w < layer.d_a else "NP")
    # Residual blocks (1 and 3) show up as add layers.
    assert [layer.name for layer in folded.layers if layer.type == "add"] == ["1:add", "3:add"]


def test_pmt_is_leaner_than_bp_int8_on_mobilenet(mobilenet_profile):
    kw = dict(batch_size=16, num_queries=8)
    pmt = analytic(mobilenet_profile, "pmt", **kw)
    bp8 = analytic(mobilenet_profile, "bp-int8", **kw)
    inference8 = analytic(mobilenet_profile, "inference", dtype_bytes=1, fold_bn=True, **kw)
    assert inference8.total < pmt.total < bp8.total
    assert pmt.parts["activations"] == inference8.parts["activations"]
    sparse = analytic(mobilenet_profile, "pmt-sparse", trainable=["4.*", "5.*"], **kw)
    assert sparse.total <= pmt.total
    assert macs_per_iteration(mobilenet_profile, "pmt-sparse", 16, 8, trainable=["4.*"]) < \
        macs_per_iteration(mobilenet_profile, "pmt", 16, 8)
    assert analytic(mobilenet_profile, "sparse-bp", trainable="8", **kw).total < bp8.total


def test_method_defaults_and_trainable_globs(mobilenet_profile):
    assert method_defaults("pmt") == {"dtype_bytes": 1, "fold_bn": True, "has_macs": True}
    assert method_defaults("bp")["dtype_bytes"] == 4 and not method_defaults("bp")["fold_bn"]
    folded = mobilenet_profile.fold_batchnorm()
    weights = sum(n for k, n in folded.parameter_numel.items() if not k.endswith("bias"))
    biases = folded.num_parameters - weights
    assert analytic(mobilenet_profile, "mezo").parts["parameters"] == weights + 4 * biases
    one_block = analytic(mobilenet_profile, "sparse-bp", trainable=["4.*"])
    assert one_block.parts["gradient_buffers"] == 4 * sum(
        n for k, n in folded.parameter_numel.items() if k.startswith("4."))
    with pytest.raises(ValueError, match="matches no parameter"):
        analytic(mobilenet_profile, "pmt", trainable=["nothing*"])
    with pytest.raises(ValueError, match="not registered"):
        macs_per_iteration(mobilenet_profile, "nope", 1, 1)
    with pytest.raises(ValueError, match="num_queries"):
        macs_per_iteration(mobilenet_profile, "pmt", 4, 0)
    with pytest.raises(ValueError, match="coordinates"):
        analytic(mobilenet_profile, "cge", coordinates=0)


def test_macs_per_iteration_needs_a_macs_rule(monkeypatch, mlp_profile):
    monkeypatch.setattr(rules_module, "_RULES", dict(rules_module._RULES))
    register_rule("no_macs", lambda profile, **kw: MemoryReport("no_macs", {"parameters": 1}))
    with pytest.raises(ValueError, match="no MACs rule"):
        macs_per_iteration(mlp_profile, "no_macs", 1, 1)


def test_memory_cli_pmt_on_mobilenet(tmp_path, capsys):
    from bpfree import cli

    assert cli.main(["memory", "--model", "mnist-mobilenet", "--method", "pmt"]) == 0
    out = capsys.readouterr().out
    assert "method pmt" in out and "MACs per iteration" in out and "1 B/value" in out
    path = tmp_path / "mem.json"
    assert cli.main(["memory", "--model", "mnist-mobilenet", "--method", "pmt", "--method",
                     "bp-int8", "--layers", "--trainable", "4.*", "5.*", "--batch-size", "4",
                     "--queries", "2", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert " WP " in out and " NP " in out and "BatchNorm folded" in out
    rows = json.loads(path.read_text())
    assert [r["method"] for r in rows] == ["pmt", "bp-int8"]
    from bpfree.models import get_model

    mobilenet = profile_model(get_model("mnist-mobilenet").build(), torch.zeros(1, 1, 28, 28))
    assert rows[0]["macs_per_iteration"] == macs_per_iteration(
        mobilenet, "pmt", 4, 2, trainable=["4.*", "5.*"])
    assert rows[0]["total"] < rows[1]["total"]
    # Bad input: a pattern matching nothing is a clean error (status 2), as are bad N / method.
    assert cli.main(["memory", "--model", "mnist-mobilenet", "--method", "pmt",
                     "--trainable", "nothing*"]) == 2
    assert "matches no parameter" in capsys.readouterr().err
    for argv in (["memory", "--batch-size", "0"], ["memory", "--queries", "-1"],
                 ["memory", "--method", "nope"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2


GENERIC_RULES = ["bp", "inference", "zo_np_batched", "zo_np_lean", "zo_wp_batched",
                 "zo_wp_lean"]


def _fresh_python(code: str) -> list[str]:
    """stdout lines of ``code`` run in a fresh interpreter (nothing of bpfree imported yet)
    that sees the same bpfree as this process."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_bare_import_of_memory_finds_each_methods_rule():
    """``import bpfree.memory`` alone is enough (issue 15): a method's rule lives next to its
    code and the registry imports that module on the first lookup of its name, so the
    reports equal those of this process, where the packages are imported up front. An
    unknown name lists every available method, loaded or not."""
    code = (
        "import json, sys, torch\n"
        "import bpfree.memory as m\n"
        "print(json.dumps(sorted(m.registered_rules())))\n"
        "print(json.dumps(sorted(k for k in sys.modules if k.startswith(('bpfree.pmt', "
        "'bpfree.qzoff', 'bpfree.tinyfoa')))))\n"
        "try:\n"
        "    m.analytic(torch.nn.Linear(2, 2), 'nope', input_shape=(2,))\n"
        "except ValueError as e:\n"
        "    print(e)\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),\n"
        "                            torch.nn.Linear(32, 10))\n"
        "for method in ('pmt', 'ff', 'tinyfoa'):\n"
        "    r = m.analytic(model, method, input_shape=(64,), batch_size=8, num_queries=4)\n"
        "    print(json.dumps([method, r.as_dict()]))\n"
        "print(json.dumps(m.macs_per_iteration(model, 'cge', 8, 4, input_shape=(64,))))\n"
    )
    out = _fresh_python(code)
    assert json.loads(out[0]) == GENERIC_RULES
    assert json.loads(out[1]) == []  # nothing loaded before a lookup asks for it
    assert "'nope' is not registered" in out[2]
    for name in [*GENERIC_RULES, *rules_module.PROVIDERS]:
        assert name in out[2]
    model = _mlp()
    for line in out[3:6]:
        method, report = json.loads(line)
        assert report == analytic(model, method, input_shape=(64,), batch_size=8,
                                  num_queries=4).as_dict()
    assert json.loads(out[6]) == macs_per_iteration(model, "cge", 8, 4, input_shape=(64,))


def test_providers_table_matches_the_register_rule_calls():
    """The table cannot go stale: every ``register_rule("name", ...)`` in the package outside
    the registry is listed with the module that makes the call, every listed name is
    registered by importing its provider alone (a fresh interpreter per provider), and
    nothing else is."""
    import ast
    from pathlib import Path

    import bpfree

    root = Path(bpfree.__file__).parent
    calls = {}
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        if module == "bpfree.memory.rules":
            continue  # the registry's own generic rules
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "register_rule":
                name = node.args[0]
                assert isinstance(name, ast.Constant), \
                    f"{module}:{node.lineno}: register_rule with a computed name"
                calls[name.value] = module.removesuffix(".__init__")
    assert calls == rules_module.PROVIDERS
    for provider in sorted(set(calls.values())):
        out = _fresh_python(
            "import importlib, json\n"
            "import bpfree.memory as m\n"
            "before = set(m.registered_rules())\n"
            f"importlib.import_module({provider!r})\n"
            "print(json.dumps(sorted(set(m.registered_rules()) - before)))\n"
        )
        mine = sorted(n for n, mod in calls.items() if mod == provider)
        assert json.loads(out[0]) == mine, provider
