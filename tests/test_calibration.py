"""Corruption-strength calibration (bpfree.data.calibration): bisection to a target accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from bpfree.data.calibration import KNOBS, calibrate, corruption_param
from bpfree.data.corruptions import apply_corruption, corrupt, list_corruptions


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    x = np.zeros((40, 16, 16), np.uint8)
    x[:, 4:12, 6:10] = rng.integers(150, 256, size=(40, 8, 4), dtype=np.uint8)
    return x, np.zeros(40, np.int64)


def test_every_pmt_corruption_has_a_knob_whose_parameter_corrupt_accepts(images):
    x, _ = images
    assert set(KNOBS) == set(list_corruptions("pmt-mnist"))
    for name, (_, lo, hi) in KNOBS.items():
        for t in (lo, 0.5 * (lo + hi), hi):
            out = apply_corruption(x[:2], name, corruption_param(name, t), seed=1)
            assert out.shape == x[:2].shape and out.dtype == np.uint8
    with pytest.raises(ValueError, match="must lie in"):
        corruption_param("contrast", 1.5)
    with pytest.raises(ValueError, match="calibratable"):
        corruption_param("rotate", 0.1)


def test_bisection_hits_an_analytic_target(images):
    """Score = 100 * (1 - contrast strength) exactly: the search must land within tolerance
    of the target, and every probe of its trace must lie inside the knob's range."""
    x, y = images
    flat = x.astype(np.float64) / 255

    def score(corrupted, labels):
        # Recover the contrast factor from the corrupted images: std shrinks by the factor.
        c = (corrupted.astype(np.float64) / 255).std() / flat.std()
        return 100.0 * c

    cal = calibrate(x, y, "contrast", 36.0, score, tolerance=0.5)
    assert abs(cal.accuracy - 36.0) <= 0.5
    assert cal.param == pytest.approx(1 - cal.strength)
    assert cal.strength == pytest.approx(0.64, abs=0.01)
    assert all(0.0 <= t <= 1.0 for t, _ in cal.trace)
    d = cal.as_dict()
    assert d["error"] == pytest.approx(cal.accuracy - 36.0)


def test_calibrated_images_equal_the_experiments_corruption(images):
    x, y = images
    cal = calibrate(x, y, "gaussian_noise", 50.0,
                    lambda c, _: 100.0 - float(np.abs(c.astype(float) - x).mean()),
                    seed=3, start_index=7, iterations=4)
    # The returned point is the trace's closest to the target, not merely its last probe.
    assert abs(cal.accuracy - 50.0) == min(abs(a - 50.0) for _, a in cal.trace)
    # Re-corrupting with the same seed and start index reproduces what was scored.
    again = apply_corruption(x, "gaussian_noise", cal.param, seed=3, start_index=7)
    assert 100.0 - float(np.abs(again.astype(float) - x).mean()) == cal.accuracy
    # Same seed stream as corrupt(): at a table's parameter they agree bit for bit.
    np.testing.assert_array_equal(
        apply_corruption(x, "gaussian_noise", 0.38, seed=3), corrupt(x, "gaussian_noise", 5,
                                                                      seed=3))


def test_bad_calibration_requests_are_refused(images):
    x, y = images
    with pytest.raises(ValueError, match="target accuracy"):
        calibrate(x, y, "fog", 120.0, lambda c, _: 50.0)
    with pytest.raises(ValueError, match="calibratable"):
        calibrate(x, y, "rotate", 50.0, lambda c, _: 50.0)
    with pytest.raises(ValueError, match="tolerance"):
        calibrate(x, y, "fog", 50.0, lambda c, _: 50.0, tolerance=0)


def test_pmt_mnist_table_is_the_committed_full_runs_calibration():
    """The named table holds exactly what `bpfree bench pmt` (full run) calibrated."""
    import json
    from pathlib import Path

    from bpfree.data.corruptions import PMT_MNIST

    path = Path(__file__).resolve().parent.parent / "results" / "pmt.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    calibration = doc.get("extra", {}).get("calibration")
    if doc.get("quick", True) or not calibration:
        pytest.skip(f"{path} holds no full-run calibration")
    assert set(PMT_MNIST) == set(calibration)
    for name, entry in calibration.items():
        param = entry["param"]
        expected = tuple(param) if isinstance(param, list) else param
        assert PMT_MNIST[name] == pytest.approx(expected), name


def test_defocus_knob_walks_pixel_shells_with_growing_blur():
    """The defocus knob's integer part is a pixel shell of the aliased disk, its fraction the
    anti-aliasing sigma: the kernel's spread (second moment) never shrinks along the knob
    within a shell, and shell k's disk holds exactly the pixels at distance <= the k-th
    distinct distance sqrt(i^2 + j^2)."""
    from bpfree.data.corruptions.blur import disk_kernel

    def spread(t):
        k = disk_kernel(*corruption_param("defocus_blur", t))
        c = np.arange(k.shape[0]) - k.shape[0] // 2
        return float((k * (c[:, None] ** 2 + c[None, :] ** 2)).sum())

    distances = sorted({i * i + j * j for i in range(-4, 5) for j in range(-4, 5)})
    for shell in range(6):
        radius, sigma = corruption_param("defocus_blur", float(shell))
        assert sigma == pytest.approx(0.1)
        inside = sum(1 for i in range(-4, 5) for j in range(-4, 5)
                     if i * i + j * j <= radius ** 2)
        assert inside == sum(1 for i in range(-4, 5) for j in range(-4, 5)
                             if i * i + j * j <= distances[shell])
        spreads = [spread(shell + f) for f in (0.0, 0.3, 0.6, 0.99)]
        assert spreads == sorted(spreads) and spreads[-1] > spreads[0]
    # The next shell's sharp disk spreads more than this shell's sharpest.
    assert spread(4.0) > spread(3.0)
