"""bpfree.distributed: W workers over shards end where one process over the batch ends.

Most tests simulate the workers in threads (a barrier-based all_reduce), so the arithmetic is
checked without starting processes; two tests spawn real gloo workers on the loopback.
"""

from __future__ import annotations

import copy
import re
import threading
import time

import pytest
import torch

from bpfree.distributed import DataParallelPMT, DataParallelZO, SingleProcess, fixed_sum, from_fixed
from bpfree.distributed.fleet import FleetOptions, train, weights_digest
from bpfree.distributed.launch import FleetError, launch
from bpfree.distributed.projection import mcunet_in1_dimensions, projection_table, step_bytes
from bpfree.estimators import rge, sign_spsa
from bpfree.models import digits_mlp
from bpfree.objective import Objective
from bpfree.optim import ZOOptimizer
from bpfree.pmt import PMTConfig, PMTTrainer
from bpfree.quant.ptq import quantize_model


class ThreadComm(SingleProcess):
    """W threads summing through shared slots: an in-process stand-in for all_reduce."""

    def __init__(self, rank, world, shared):
        super().__init__()
        self.rank, self.world_size, self.shared = rank, world, shared

    def all_reduce(self, tensor, what="scalars"):
        super().all_reduce(tensor)
        slots, barrier = self.shared["slots"], self.shared["barrier"]
        slots[self.rank] = tensor.clone()
        barrier.wait()
        total = slots[0].clone()
        for s in slots[1:]:  # rank order, as every rank does: all receive the same bytes
            total += s
        barrier.wait()
        tensor.copy_(total)
        return tensor


def run_threads(world, body):
    shared = {"slots": [None] * world, "barrier": threading.Barrier(world, timeout=60)}
    out, errors = [None] * world, []

    def target(rank):
        try:
            out[rank] = body(ThreadComm(rank, world, shared))
        except BaseException as exc:  # surfaced below
            errors.append(exc)
            shared["barrier"].abort()

    threads = [threading.Thread(target=target, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


@pytest.fixture(scope="module")
def tiny():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(96, 64, generator=g)
    y = torch.randint(0, 10, (96,), generator=g)
    torch.manual_seed(0)
    model = quantize_model(digits_mlp().eval(), x[:64], input_range=(0.0, 1.0))
    return {"model": model, "x": x, "y": y, "x_test": x[:32], "y_test": y[:32]}


def _pmt_run(model, x, y, comm, perturbation, steps=3, batch=24):
    dp = DataParallelPMT(model, PMTConfig(queries=3, perturbation=perturbation, seed=5),
                         example=x[:1], comm=comm)
    for s in range(steps):
        idx = torch.arange(s * batch, (s + 1) * batch)
        shards = idx.tensor_split(comm.world_size)
        mine = shards[comm.rank]
        offset = sum(len(t) for t in shards[:comm.rank])
        dp.step(x[mine], y[mine], 0.5, offset=offset, total=batch)
    return weights_digest(model)


def test_fixed_point_sum_is_order_free_and_refuses_overflow():
    v = torch.tensor([[0.1, 1e-7, -0.3, 2.5]], dtype=torch.float64)
    whole = fixed_sum(v)
    parts = fixed_sum(v[:, 2:]) + fixed_sum(v[:, :1]) + fixed_sum(v[:, 1:2])
    assert torch.equal(whole, parts)
    assert abs(float(from_fixed(whole, 4)) - float(v.mean())) < 1e-10
    with pytest.raises(OverflowError, match="int64"):
        fixed_sum(torch.tensor([[1e300]], dtype=torch.float64))
    with pytest.raises(OverflowError):
        fixed_sum(torch.tensor([[float("nan")]], dtype=torch.float64))


def test_pmt_wp_two_workers_bit_identical_to_one_process(tiny):
    single = _pmt_run(copy.deepcopy(tiny["model"]), tiny["x"], tiny["y"], SingleProcess(), "wp")
    digests = run_threads(2, lambda c: _pmt_run(copy.deepcopy(tiny["model"]), tiny["x"],
                                                tiny["y"], c, "wp"))
    assert digests == [single, single]
    assert single != weights_digest(tiny["model"])  # the steps did change the weights
    # Uneven shards (3 workers over 24 samples split 8/8/8, then 25 -> 9/8/8) agree too.
    assert run_threads(3, lambda c: _pmt_run(copy.deepcopy(tiny["model"]), tiny["x"],
                                             tiny["y"], c, "wp")) == [single] * 3


def test_pmt_wp_single_process_matches_pmt_trainer(tiny):
    """The fixed-point mean moves the scalars by < 2**-36: the rounded int8 weights of plain
    PMTTrainer over the same batches are the same here."""
    model = copy.deepcopy(tiny["model"])
    trainer = PMTTrainer(model, PMTConfig(queries=3, perturbation="wp", seed=5),
                         example=tiny["x"][:1])
    for s in range(3):
        trainer.step(tiny["x"][s * 24:(s + 1) * 24], tiny["y"][s * 24:(s + 1) * 24], 0.5)
    ours = _pmt_run(copy.deepcopy(tiny["model"]), tiny["x"], tiny["y"], SingleProcess(), "wp")
    assert weights_digest(model) == ours


def test_pmt_np_workers_agree_and_track_one_process(tiny):
    digests = run_threads(2, lambda c: _pmt_run(copy.deepcopy(tiny["model"]), tiny["x"],
                                                tiny["y"], c, "np", steps=2))
    assert digests[0] == digests[1]
    a, b = copy.deepcopy(tiny["model"]), copy.deepcopy(tiny["model"])
    _pmt_run(a, tiny["x"], tiny["y"], SingleProcess(), "np", steps=2)
    run_threads(1, lambda c: _pmt_run(b, tiny["x"], tiny["y"], c, "np", steps=2))
    for (name, ta), tb in zip(sorted(a.state_dict().items()), (v for _, v in sorted(
            b.state_dict().items()))):
        # float sums of NP gradients: equal up to a rounding flip of one LSB
        assert (ta.to(torch.int64) - tb.to(torch.int64)).abs().max() <= 1, name


def test_np_bytes_are_the_dense_layer_sizes(tiny):
    dp = DataParallelPMT(copy.deepcopy(tiny["model"]), PMTConfig(queries=4, perturbation="np"),
                         example=tiny["x"][:1])
    assert dp.bytes_per_step() == {"wp": 8, "np": 8 * (64 * 64 + 64 + 10 * 64 + 10),
                                   "total": 8 + 8 * (64 * 64 + 64 + 10 * 64 + 10)}
    dp.step(tiny["x"][:8], tiny["y"][:8], 0.1)  # what the collectives really carried:
    assert dp.comm.bytes_by_what == {"WP loss-difference sums": 8,
                                     "NP gradient sums": dp.bytes_per_step()["np"]}
    wp = DataParallelPMT(copy.deepcopy(tiny["model"]), PMTConfig(queries=4, perturbation="wp"),
                         example=tiny["x"][:1])
    assert wp.bytes_per_step()["total"] == 8 * (2 * 4 + 1)


def test_data_parallel_pmt_refuses_unsupported_schedules(tiny):
    with pytest.raises(ValueError, match="synchronized=True"):
        DataParallelPMT(copy.deepcopy(tiny["model"]), PMTConfig(synchronized=False),
                        example=tiny["x"][:1])
    dp = DataParallelPMT(copy.deepcopy(tiny["model"]), PMTConfig(perturbation="wp"),
                         example=tiny["x"][:1])
    with pytest.raises(ValueError, match="inside the batch"):
        dp.step(tiny["x"][:8], tiny["y"][:8], 0.1, offset=4, total=8)


def _float_model():
    torch.manual_seed(1)
    return digits_mlp()


def _zo_run(model, x, y, comm, estimator, steps=3, batch=24):
    opt = ZOOptimizer(list(model.named_parameters()), lr=0.05, estimator=estimator, seed=2)
    dp = DataParallelZO(opt, comm)
    for s in range(steps):
        idx = torch.arange(s * batch, (s + 1) * batch).tensor_split(comm.world_size)[comm.rank]
        dp.step(Objective(model, x[idx], y[idx]))
    return weights_digest(model)


def test_zo_one_worker_is_plain_zooptimizer_and_workers_agree(tiny):
    x, y = tiny["x"], tiny["y"]
    plain = _float_model()
    opt = ZOOptimizer(list(plain.named_parameters()), lr=0.05, estimator=rge(4), seed=2)
    for s in range(3):
        opt.step(Objective(plain, x[s * 24:(s + 1) * 24], y[s * 24:(s + 1) * 24]))
    assert _zo_run(_float_model(), x, y, SingleProcess(), rge(4)) == weights_digest(plain)
    for est in (rge(4), sign_spsa(3)):
        # Built before the threads start: _float_model seeds torch's global generator, and two
        # threads drawing from it at once get different initial weights.
        models = [_float_model(), _float_model()]
        a, b = run_threads(2, lambda c, est=est: _zo_run(models[c.rank], x, y, c, est))
        assert a == b


def test_zo_refuses_estimators_that_are_not_scalar_queries():
    opt = ZOOptimizer(list(_float_model().named_parameters()), estimator="cge")
    with pytest.raises(ValueError, match="weight-perturbation"):
        DataParallelZO(opt)


def test_projection_table_from_model_definitions():
    d, layers = mcunet_in1_dimensions()
    assert layers == 42 and 0.45e6 < d < 0.48e6  # the "0.46 M values"
    assert step_bytes(d, layers, 10) == {"zo": 8 * 421, "bp": 4 * d}
    table = projection_table()
    assert "10,000" in table and "MCUNet-in1" in table and "784-1024-10" in table


def test_spawned_gloo_workers_equal_single_process(tiny):
    options = FleetOptions(method="pmt", perturbation="wp", epochs=1, batch_size=48, queries=2)
    results = launch(2, options, tiny, timeout_s=30)
    ref = train({**tiny, "model": copy.deepcopy(tiny["model"])}, options, SingleProcess())
    assert [r["weights_sha256"] for r in results] == [ref["weights_sha256"]] * 2
    assert results[0]["bytes_per_step"] == 8 * (2 * 2 + 1)


def test_a_dead_worker_stops_the_others_with_a_clear_error(tiny):
    options = FleetOptions(method="pmt", perturbation="wp", epochs=1, batch_size=16, queries=1,
                           die_at_step=1)
    start = time.monotonic()
    with pytest.raises(FleetError) as info:
        launch(2, options, tiny, timeout_s=20)
    message = str(info.value)
    assert "worker 0" in message and "WorkerLost" in message and "worker 1" in message
    # The survivor's collective failed within the group's timeout (start-up is not counted:
    # spawning on a loaded 2-core machine can take minutes).
    waited = float(re.search(r"failed after ([0-9.]+) s", message).group(1))
    assert waited <= 20 + 5
    assert time.monotonic() - start < 900


def test_fleet_doc_table_is_the_generated_one():
    from pathlib import Path

    from bpfree.distributed.projection import render_into

    doc = (Path(__file__).parents[1] / "docs" / "FLEET.md").read_text()
    assert render_into(doc) == doc, "regenerate: python -m bpfree.distributed.projection docs/FLEET.md"


@pytest.mark.parametrize("argv, message", [
    (["--workers", "0"], "--workers must be an integer in [1, 64]"),
    (["--timeout", "-1"], "--timeout must be a number of seconds"),
    (["--queries", "0"], "queries must be an integer >= 1"),
])
def test_fleet_cli_refuses_bad_input_before_any_work(argv, message, capsys):
    from bpfree.cli import main

    assert main(["fleet", *argv]) == 2
    assert message in capsys.readouterr().err
