"""bench throughput's PMT step rows (benchmarks/_pmt_step_cost.py): the time-per-part split."""

from __future__ import annotations

import pytest
import torch

from bpfree.quant import engine


@pytest.fixture(scope="module")
def step_cost():
    import _pmt_step_cost

    if engine.kernel_library() is None:
        pytest.skip("no C compiler: the fast engine's kernels are not built")
    return _pmt_step_cost


def test_step_parts_splits_a_fast_step_into_kernels_and_the_rest(step_cost):
    from bpfree.models import mnist_mobilenet
    from bpfree.pmt import PMTConfig, PMTTrainer
    from bpfree.pmt.sparse import block, split_blocks
    from bpfree.quant import quantize_model

    gen = torch.Generator().manual_seed(0)
    x = torch.rand(4, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (4,), generator=gen)
    qmodel = quantize_model(mnist_mobilenet().eval(), x, input_range=(0.0, 1.0))
    blocks = split_blocks(PMTTrainer(qmodel, PMTConfig(), example=x[:2]).layers, 4)
    real = engine.kernel_library()
    parts = step_cost.step_parts(qmodel, x[:2], x, y, trainable=block(blocks, 4), queries=2,
                                 repeats=2)
    assert engine.kernel_library() is real  # the timed library is put back
    assert {"bpf_dense", "bpf_depthwise"} <= set(parts["kernels"])
    assert all(v > 0 for v in parts["kernels"].values())
    assert all(parts["calls"][k] >= 1 for k in parts["kernels"])
    assert parts["total"] == pytest.approx(sum(parts["kernels"].values()) + parts["outside"])
    assert 0 < parts["outside"] < parts["total"]
