"""Tests for bpfree.memory: reports, profiles, analytic rules and measured peaks."""

from __future__ import annotations

import gc

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
    assert [layer.d_w for layer in p.layers] == [64 * 32 + 32, 0, 32 * 10 + 10]
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
