"""The README's main job: `bpfree demo` adapts the PTQ INT8 digits model to drift with PMT."""

import json

import pytest
import torch

from bpfree import demo
from bpfree.cli import main
from bpfree.quant import QuantizedModel


@pytest.fixture(scope="module")
def default_run():
    """The demo exactly as `bpfree demo` runs it (default seed and settings, a few seconds)."""
    return demo.run(progress=False)


def test_default_demo_gains_at_least_ten_points(default_run):
    r = default_run
    assert 0.0 <= r["acc_before"] <= 1.0 and 0.0 <= r["acc_after"] <= 1.0
    assert r["acc_float_clean"] > 0.9 and r["acc_clean"] > 0.9  # PTQ keeps the clean accuracy
    assert r["acc_clean"] - r["acc_before"] > 0.2  # the drift hurts
    assert r["acc_after"] - r["acc_before"] >= 0.10
    assert r["analytic_rule"] == "pmt"
    assert 0 < r["analytic_extra_bytes"] < r["analytic_bytes"]
    assert r["peak_extra_bytes"] > 0


def test_forward_count_is_n_times_one_plus_lq_summed(default_run):
    r, c = default_run, default_run["config"]
    assert r["layers"] == 2 and r["forwards_per_sample_epoch"] == 1 + 2 * c["queries"]
    # Every step on N samples costs N (clean) + L*Q*N (perturbed); summed over all steps.
    assert r["forward_passes"] == c["epochs"] * r["n_train"] * (1 + r["layers"] * c["queries"])


def test_short_run_trains_the_int8_model(monkeypatch):
    models = []
    class Spy(demo.PMTTrainer):
        def __init__(self, model, *args, **kwargs):
            models.append(model)
            super().__init__(model, *args, **kwargs)

    monkeypatch.setattr(demo, "PMTTrainer", Spy)
    r = demo.run(seed=1, epochs=1, batch_size=100, queries=2, progress=False)
    assert len(models) == 1 and isinstance(models[0], QuantizedModel)
    assert models[0].body[0].weight.dtype == torch.int8
    assert r["steps"] == -(-r["n_train"] // 100)
    assert r["forward_passes"] == r["n_train"] * (1 + 2 * 2)
    assert r["config"]["queries"] == 2 and r["config"]["layerwise"] is True


def test_forward_count_of_the_variants():
    base = dict(seed=2, epochs=1, batch_size=200, queries=3, progress=False)
    model_wise = demo.run(layerwise=False, **base)
    assert model_wise["forward_passes"] == model_wise["n_train"] * (1 + 3)
    local = demo.run(synchronized=False, **base)
    assert local["forward_passes"] == local["n_train"] * (1 + 2 * 3 + 2)


def test_demo_is_reproducible_for_a_seed():
    a = demo.run(seed=3, epochs=1, queries=2, progress=False)
    b = demo.run(seed=3, epochs=1, queries=2, progress=False)
    assert a["acc_after"] == b["acc_after"] and a["final_loss"] == b["final_loss"]


def test_cli_writes_json_and_prints_the_table(tmp_path, capsys):
    out = tmp_path / "sub" / "out.json"
    argv = ["demo", "--json", str(out), "--no-progress", "--epochs", "1", "--queries", "2",
            "--batch-size", "128", "--perturbation", "wp", "--no-gns", "--schedule", "constant"]
    assert main(argv) == 0
    r = json.loads(out.read_text())
    for key in ("acc_float_clean", "acc_clean", "acc_before", "acc_after", "forward_passes",
                "analytic_bytes", "analytic_extra_bytes", "peak_extra_bytes", "seconds", "config"):
        assert key in r
    assert r["config"]["perturbation"] == "wp" and r["config"]["gns"] is False
    assert r["config"]["schedule"] == "constant" and r["modes"] == {"body.0": "WP", "body.2": "WP"}
    printed = capsys.readouterr().out
    assert "INT8 after BP-free" in printed and "forward passes used" in printed
    assert f"wrote {out}" in printed


def test_corruption_is_deterministic_and_validated():
    x = torch.rand(4, 64)
    a = demo.corrupt(x, noise=0.2, contrast=0.5, brightness=0.3, seed=1)
    assert torch.equal(a, demo.corrupt(x, noise=0.2, contrast=0.5, brightness=0.3, seed=1))
    assert a.min() >= 0 and a.max() <= 1  # always inside the calibrated input range
    clean = demo.corrupt(x, noise=0.0, contrast=1.0, brightness=0.0, seed=1)
    assert torch.equal(clean, x.clamp(0, 1))
    with pytest.raises(ValueError, match="contrast"):
        demo.corrupt(x, noise=0.2, contrast=0.0, brightness=0.3, seed=1)
    with pytest.raises(ValueError, match="noise"):
        demo.corrupt(x, noise=-1.0, contrast=0.5, brightness=0.3, seed=1)


def test_demo_rejects_bad_settings():
    with pytest.raises(ValueError, match="epochs"):
        demo.run(epochs=0, progress=False)
    with pytest.raises(ValueError, match="queries"):
        demo.run(queries=0, epochs=1, progress=False)
    with pytest.raises(ValueError, match="perturbation"):
        demo.run(perturbation="bogus", epochs=1, progress=False)
    with pytest.raises(ValueError, match="micro_batch"):
        demo.run(micro_batch=0, epochs=1, progress=False)
    with pytest.raises(ValueError, match="lr"):
        demo.run(lr=float("nan"), epochs=1, progress=False)
    with pytest.raises(ValueError, match="brightness"):
        demo.run(brightness=2.0, epochs=1, progress=False)


@pytest.mark.parametrize("argv", [
    ["demo", "--queries", "0", "--epochs", "1", "--no-progress"],
    ["demo", "--lr", "-1", "--epochs", "1", "--no-progress"],
    ["demo", "--contrast", "0", "--epochs", "1", "--no-progress"],
])
def test_cli_rejects_bad_values(argv, capsys):
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["demo", "--perturbation", "bogus"],
    ["demo", "--mode", "lean"],           # flags of the float demo, gone with PMT
    ["demo", "--estimator", "rge"],
    ["demo", "--queries", "many"],
])
def test_cli_rejects_unknown_flags(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
