"""The README's main job: `bpfree demo` must adapt the corrupted-digits model BP-free."""

import json

import pytest
import torch

from bpfree import demo
from bpfree.cli import main


def test_demo_cli_gains_at_least_ten_points(tmp_path, capsys):
    out = tmp_path / "out.json"
    assert main(["demo", "--json", str(out), "--no-progress"]) == 0
    r = json.loads(out.read_text())
    for key in ("acc_before", "acc_after", "forward_passes", "peak_extra_bytes", "seconds"):
        assert key in r
    assert 0.0 <= r["acc_before"] <= 1.0 and 0.0 <= r["acc_after"] <= 1.0
    assert r["acc_after"] - r["acc_before"] >= 0.10
    # 20 epochs x 20 steps x 2 layers x (Q + 1) forward passes
    assert r["forward_passes"] == 20 * 20 * 2 * 17
    assert r["peak_extra_bytes"] > 0
    printed = capsys.readouterr().out
    assert "after BP-free" in printed and "forward passes used" in printed


def test_demo_is_reproducible_for_a_seed():
    a = demo.run(seed=3, epochs=2, progress=False)
    b = demo.run(seed=3, epochs=2, progress=False)
    assert a["acc_after"] == b["acc_after"] and a["final_loss"] == b["final_loss"]


def test_corruption_is_deterministic_and_validated():
    x = torch.rand(4, 64)
    a = demo.corrupt(x, noise=0.2, contrast=0.5, brightness=0.3, seed=1)
    assert torch.equal(a, demo.corrupt(x, noise=0.2, contrast=0.5, brightness=0.3, seed=1))
    assert a.min() >= 0 and a.max() <= 1
    clean = demo.corrupt(x, noise=0.0, contrast=1.0, brightness=0.0, seed=1)
    assert torch.equal(clean, x.clamp(0, 1))
    with pytest.raises(ValueError, match="contrast"):
        demo.corrupt(x, noise=0.2, contrast=0.0, brightness=0.3, seed=1)
    with pytest.raises(ValueError, match="noise"):
        demo.corrupt(x, noise=-1.0, contrast=0.5, brightness=0.3, seed=1)


def test_demo_rejects_bad_settings():
    with pytest.raises(ValueError, match="epochs"):
        demo.run(epochs=0, progress=False)
    with pytest.raises(ValueError, match="num_queries"):
        demo.run(queries=0, epochs=1, progress=False)
