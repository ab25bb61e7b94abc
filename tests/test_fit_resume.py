"""A training run cut off inside a cached benchmark task resumes from its last epoch snapshot
with the same bits as a run never stopped (bpfree.checkpoint.resume, harness.fit)."""

from __future__ import annotations

import pytest
import torch

from bpfree.bench.task_cache import TaskCache, memoized
from bpfree.checkpoint.resume import FitSnapshots, active
from bpfree.harness import fit


class Cut(Exception):
    """The session ended."""


def _cut_at(step_to_die: int | None, seen: list | None = None):
    """A before_step hook that records the steps it sees and dies before ``step_to_die``."""
    def before_step(step, total):
        if seen is not None:
            seen.append(step)
        if step == step_to_die:
            raise Cut(f"killed before step {step}")
    return before_step


def _ttzo_run(method_name: str, folder, before_step=None):
    from bpfree.ttzo.methods import make_method
    from bpfree.ttzo.train import train

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(96, 784, generator=g), torch.randint(0, 10, (96,), generator=g)
    xv, yv = torch.randn(32, 784, generator=g), torch.randint(0, 10, (32,), generator=g)
    from bpfree.ttzo.models import make_model
    model = make_model("tt", rank=2, seed=0)
    method = make_method(method_name, model, seed=0)
    kwargs = dict(epochs=5, batch_size=32, lr=1e-2, decay_every=2, x_val=xv, y_val=yv, seed=3,
                  keep_best=True)
    with active(None if folder is None else FitSnapshots(folder)):
        if before_step is None:
            log = train(method, x, y, **kwargs)
        else:  # train() has no before_step: call fit as train does, with the hook
            from bpfree.transforms import exponential
            end_epoch = getattr(method, "end_epoch", None)

            def close(epoch, history):
                end_epoch(history.epoch_loss[-1])
                if history.switch_epoch is None:
                    history.switch_epoch = getattr(method, "history", {}).get("switch_epoch")

            log = fit(method, x, y, epochs=5, batch_size=32, lr=1e-2,
                      schedule=exponential(0.9, 2), schedule_unit="epoch", seed=3, x_val=xv,
                      y_val=yv, keep_best=True, before_step=before_step,
                      on_epoch_end=None if end_epoch is None else close)
    return model, method, log


@pytest.mark.parametrize("method_name", ["hybrid", "fo", "rge"])
def test_a_cut_off_ttzo_run_resumes_bit_identical(tmp_path, method_name):
    ref_model, ref_method, ref_log = _ttzo_run(method_name, None)
    with pytest.raises(Cut):                       # killed in the middle of epoch 3
        _ttzo_run(method_name, tmp_path, before_step=_cut_at(3 * 3 + 1))
    assert (tmp_path / "fit-0.pkl").is_file()
    seen: list = []
    model, method, log = _ttzo_run(method_name, tmp_path, before_step=_cut_at(None, seen))
    assert seen[0] == 3 * 3                        # resumed after epochs 0-2 (3 steps each)
    for a, b in zip(ref_model.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)
    assert log.loss == ref_log.loss and log.val_acc == ref_log.val_acc
    assert log.epoch_forwards == ref_log.epoch_forwards and log.best_epoch == ref_log.best_epoch
    assert method.forwards == ref_method.forwards
    assert method.model is model                  # the caller's model was restored in place


def test_a_cut_off_pmt_run_on_the_fast_engine_resumes_bit_identical(tmp_path):
    from bpfree.models import mnist_mobilenet
    from bpfree.pmt import PMTConfig, PMTTrainer
    from bpfree.quant import quantize_model

    g = torch.Generator().manual_seed(0)
    x = torch.rand(40, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (40,), generator=g)
    torch.manual_seed(0)
    base = quantize_model(mnist_mobilenet().eval(), x, input_range=(0.0, 1.0))

    def run(folder, before_step=None):
        import copy
        model = copy.deepcopy(base)
        trainer = PMTTrainer(model, PMTConfig(queries=3, seed=0), example=x[:2])
        with active(None if folder is None else FitSnapshots(folder)):
            log = fit(trainer, x, y, epochs=3, batch_size=10, lr=0.5, schedule="constant",
                      seed=1, before_step=before_step)
        return model, trainer, log

    ref_model, ref_trainer, ref_log = run(None)
    assert ref_log.loss[0] != ref_log.loss[-1]
    with pytest.raises(Cut):
        run(tmp_path, before_step=_cut_at(6))
    seen: list = []
    model, trainer, log = run(tmp_path, before_step=_cut_at(None, seen))
    assert seen[0] == 4                            # resumed after epoch 0 (4 steps)
    assert log.loss == ref_log.loss and trainer.forwards == ref_trainer.forwards
    for a, b in zip(ref_model.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)
    assert trainer.staged.engine == ref_trainer.staged.engine


def test_a_cached_task_keeps_snapshots_only_until_its_result_is_stored(tmp_path):
    from bpfree.ttzo.methods import make_method
    from bpfree.ttzo.models import make_model

    cache = TaskCache(tmp_path, salt="rev")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g)

    def train(task, die=False, seen=None):
        model = make_model("tt", rank=2, seed=0)
        method = make_method("fo", model, seed=0)
        return fit(method, x, y, epochs=3, batch_size=32, lr=1e-2, seed=0,
                   before_step=_cut_at(3 if die else None, seen)).loss

    with pytest.raises(Cut):
        memoized(cache, train, "task", lambda: train("task", die=True))
    folder = cache.snapshot_dir(train, "task")
    assert (folder / "fit-0.pkl").is_file()
    seen: list = []
    losses = memoized(cache, train, "task", lambda: train("task", seen=seen))
    assert seen[0] == 2                            # epoch 0 came from the snapshot
    assert losses == train("task")                 # resumed = uninterrupted
    assert not folder.exists()                     # stored: the snapshots are gone


def test_a_snapshot_of_another_fit_call_is_refused_and_a_corrupt_one_ignored(tmp_path):
    from bpfree.ttzo.methods import make_method
    from bpfree.ttzo.models import make_model

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g)

    def run(epochs, die=None):
        method = make_method("fo", make_model("tt", rank=2, seed=0), seed=0)
        with active(FitSnapshots(tmp_path)):
            return fit(method, x, y, epochs=epochs, batch_size=32, lr=1e-2, seed=0,
                       before_step=None if die is None else _cut_at(die)).loss

    with pytest.raises(Cut):
        run(3, die=3)
    with pytest.raises(RuntimeError, match="another fit call"):
        run(4)
    (tmp_path / "fit-0.pkl").write_bytes(b"\x80\x04truncated")
    fresh = run(3)                                 # unreadable: trains from epoch 0
    method = make_method("fo", make_model("tt", rank=2, seed=0), seed=0)
    assert fresh == fit(method, x, y, epochs=3, batch_size=32, lr=1e-2, seed=0).loss
    assert run(3) == fresh                         # every epoch in the snapshot: nothing to do


def test_a_cut_off_mcutrain_run_keeps_its_unrounded_weights_across_the_cut(tmp_path):
    """SparseBP(latent_weights=True) accumulates sub-LSB steps in a float copy keyed by its
    layers; a resumed run must carry that copy over, not restart it from the int8 weights."""
    import copy

    from bpfree.baselines.integer_bp import SparseBP
    from bpfree.models import mnist_cnn
    from bpfree.quant import quantize_model

    g = torch.Generator().manual_seed(0)
    x = torch.rand(40, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (40,), generator=g)
    torch.manual_seed(0)
    base = quantize_model(mnist_cnn().eval(), x, input_range=(0.0, 1.0))
    names = [n for n, m in base.named_modules() if type(m).__name__ in ("QConv2d", "QLinear")]

    def run(folder, before_step=None):
        model = copy.deepcopy(base)
        trainer = SparseBP(model, trainable=names[-1:], qas=True, latent_weights=True)
        with active(None if folder is None else FitSnapshots(folder)):
            log = fit(trainer, x, y, epochs=3, batch_size=10, lr=1e-4, schedule="constant",
                      seed=1, before_step=before_step)
        return model, log

    ref_model, ref_log = run(None)
    with pytest.raises(Cut):
        run(tmp_path, before_step=_cut_at(6))
    model, log = run(tmp_path)
    assert log.loss == ref_log.loss
    for a, b in zip(ref_model.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)


def test_an_unpicklable_method_is_warned_about_once_per_process(tmp_path, caplog):
    """A method that cannot be snapshotted (QZO-FF's quantizer hooks) trains on without
    snapshots; the warning says so once, not at every fit of a long benchmark."""
    import logging

    from bpfree.checkpoint import resume

    class Hooked:
        def __init__(self):
            self.hook = lambda: None  # a lambda does not pickle

    resume._UNPICKLABLE_WARNED.discard("Hooked")
    model = torch.nn.Linear(2, 1)
    with caplog.at_level(logging.WARNING, logger=resume.log.name):
        for i in range(3):
            snap = resume.FitSnapshot(tmp_path / f"s{i}.pkl")
            snap.save({"epoch": 1}, Hooked(), model)
            assert snap.broken and not (tmp_path / f"s{i}.pkl").exists()
    assert sum("does not pickle" in r.getMessage() for r in caplog.records) == 1
