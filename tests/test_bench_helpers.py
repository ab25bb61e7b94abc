"""The process pool (bpfree.bench.parallel) and figure saving (bpfree.plotting) the benchmarks share."""

from __future__ import annotations

import math

import pytest

from bpfree.plotting import pyplot, save_figure
from bpfree.bench.parallel import default_workers, run_keyed, spawn_pool


def test_run_keyed_in_process_and_in_a_spawn_pool_agree():
    tasks = {"a": 4.0, "b": 9.0, ("c", 1): 16.0}
    local = run_keyed(math.sqrt, tasks, workers=1)
    pooled = run_keyed(math.sqrt, tasks, workers=2, order=[("c", 1), "a", "b"])
    assert local == pooled == {"a": 2.0, "b": 3.0, ("c", 1): 4.0}


def test_run_keyed_propagates_a_task_error():
    with pytest.raises(ValueError, match="math domain error"):
        run_keyed(math.sqrt, {"ok": 1.0, "bad": -1.0}, workers=1)


def test_bad_arguments():
    with pytest.raises(ValueError, match="every task key"):
        run_keyed(math.sqrt, {"a": 1.0}, workers=1, order=["a", "b"])
    with pytest.raises(ValueError, match="workers must be >= 1"):
        spawn_pool(0)
    with pytest.raises(ValueError, match="limit must be >= 1"):
        default_workers(0)
    assert 1 <= default_workers(2) <= 2


def test_save_figure_writes_a_png_and_returns_the_relative_path(tmp_path):
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    rel = save_figure(fig, tmp_path / "sub" / "f.png", root=tmp_path)
    assert str(rel) == "sub/f.png"
    assert (tmp_path / rel).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.get_fignums()          # closed, so long benchmarks do not leak figures


def test_pool_device_names_the_worker_layout():
    from bpfree.bench.environment import cpu_model
    from bpfree.bench.parallel import pool_device

    assert pool_device(2) == f"cpu: {cpu_model()}, 2 worker processes x 1 thread"


def _total(tensors) -> float:
    return float(sum(t.sum() for t in tensors))


def test_run_keyed_many_tensor_tasks_through_a_pool():
    """Tasks are fed to the pool a few at a time (bounded in flight); every result still
    comes back under its key, tensors and all."""
    import torch

    tasks = {i: [torch.full((8,), float(i)) for _ in range(4)] for i in range(300)}
    out = run_keyed(_total, tasks, workers=2)
    assert out == {i: 32.0 * i for i in range(300)}
