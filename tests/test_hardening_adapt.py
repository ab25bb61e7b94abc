"""Issue 34, ``bpfree adapt``: no output ever replaces an input (by name, symlink or hard
link), and the data file is checked from its headers before it is unpacked."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from bpfree.cli import main
from bpfree.data.npz import load_npz, npz_headers
from test_tflite_adapt import files  # noqa: F401 - the module's fixture

pytestmark = pytest.mark.usefixtures("files")


def _snapshot(*paths):
    return {p: p.read_bytes() for p in paths}


def _adapt(files, out, *extra):
    return main(["adapt", str(files / "model.tflite"), "--data", str(files / "data.npz"),
                 "--out", str(out), "--epochs", "1", "--quiet", *extra])


@pytest.mark.parametrize("out, json_, victim", [
    ("model.tflite", None, "MODEL"),          # --out MODEL
    ("o.tflite", "model.tflite", "MODEL"),    # --json MODEL (replaced the model, exit 0)
    ("data.npz", None, "--data"),             # --out DATA
    ("o.tflite", "data.npz", "--data"),       # --json DATA
    ("o.tflite", "o.tflite", "--out"),        # --json equal to --out
])
def test_no_output_may_name_an_input_or_another_output(files, tmp_path, capsys, out, json_,
                                                        victim):
    before = _snapshot(files / "model.tflite", files / "data.npz")
    extra = ["--json", str(files / json_ if json_ != "o.tflite" else tmp_path / json_)] \
        if json_ else []
    target = files / out if out != "o.tflite" else tmp_path / out
    assert _adapt(files, target, *extra) == 2
    err = capsys.readouterr().err
    assert "would overwrite" in err and victim in err
    assert _snapshot(files / "model.tflite", files / "data.npz") == before
    assert not (tmp_path / "o.tflite").exists()


def test_symlinks_and_hard_links_of_an_input_are_caught(files, tmp_path, capsys):
    before = _snapshot(files / "model.tflite", files / "data.npz")
    (tmp_path / "link.tflite").symlink_to(files / "model.tflite")
    os.link(files / "data.npz", tmp_path / "hard.npz")
    (tmp_path / "dir").symlink_to(files)
    for out, extra in ((tmp_path / "link.tflite", []),
                       (tmp_path / "ok.tflite", ["--json", str(tmp_path / "hard.npz")]),
                       (tmp_path / "dir" / ".." / files.name / "model.tflite", [])):
        assert _adapt(files, out, *extra) == 2
        assert "would overwrite" in capsys.readouterr().err
    assert _snapshot(files / "model.tflite", files / "data.npz") == before


def test_an_output_inside_an_image_folder_is_refused(files, tmp_path, capsys):
    images = tmp_path / "images"
    (images / "a").mkdir(parents=True)
    rc = main(["adapt", str(files / "model.tflite"), "--data", str(images), "--out",
               str(images / "a" / "o.tflite")])
    assert rc == 2 and "would overwrite the input --data" in capsys.readouterr().err


def test_fifo_directory_and_device_inputs_are_refused_not_waited_on(files, tmp_path, capsys):
    fifo = tmp_path / "data.npz"
    os.mkfifo(fifo)
    assert main(["adapt", str(files / "model.tflite"), "--data", str(fifo), "--out",
                 str(tmp_path / "o.tflite")]) == 2
    assert "not a regular file" in capsys.readouterr().err
    for model in (fifo, tmp_path, "/dev/null"):  # a FIFO, a directory, a device
        assert main(["adapt", str(model), "--data", str(files / "data.npz"), "--out",
                     str(tmp_path / "o.tflite")]) == 2
        err = capsys.readouterr().err
        assert "not a regular file" in err or "is a directory" in err
        assert "no such file" not in err


@pytest.mark.parametrize("extra, match", [
    (["--seed", str(2**70)], "--seed must be an integer in [0, 9223372036854775807]"),
    (["--queries", "100000000"], "--queries must be at most"),
    (["--batch-size", "1000000000"], "--batch-size must be at most"),
])
def test_huge_hyper_parameters_are_refused_before_training(files, tmp_path, capsys, extra,
                                                           match):
    assert _adapt(files, tmp_path / "o.tflite", *extra) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "o.tflite").exists()


def _child_growth_mib(setup: str, code: str) -> tuple[str, float]:
    """Run ``setup`` then ``code`` in a fresh interpreter: its stdout, and how much its peak
    RSS grew (MiB) while ``code`` ran."""
    rss = "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss"
    probe = f"import resource\n{setup}\nbase = {rss}\n{code}\nprint('grew', {rss} - base)\n"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, int(proc.stdout.split("grew")[-1]) / 1024


def _bomb(path, rows: int, cols: int) -> None:
    """An .npz of ``rows x cols`` uint8 zeros, deflated (a few MB on disk)."""
    import zipfile

    header = np.lib.format.header_data_from_array_1_0(np.zeros((0, cols), np.uint8))
    header["shape"] = (rows, cols)
    chunk = bytes(1 << 24)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open("x.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(f, header)
            left = rows * cols
            while left:
                f.write(chunk[:min(left, len(chunk))])
                left -= min(left, len(chunk))
        with z.open("y.npy", "w") as f:
            np.lib.format.write_array(f, np.zeros(rows, np.int64))


def test_a_zip_bomb_npz_is_refused_from_its_header(tmp_path):
    bomb = tmp_path / "bomb.npz"
    _bomb(bomb, 250_000, 784)  # 196 MB of zeros (784 MB as float32) in 0.2 MB
    assert bomb.stat().st_size < 2_000_000
    out, grew = _child_growth_mib(
        "from bpfree.data.npz import load_npz\nfrom bpfree.tflite.adapt import load_data",
        f"try:\n    load_npz({str(bomb)!r}, max_bytes=64 << 20)\n"
        f"except ValueError as e:\n    print('REFUSED:', e)\n"
        # a wrong shape: refused from the header, before anything is unpacked
        f"try:\n    load_data({str(bomb)!r}, (20,))\n"
        f"except ValueError as e:\n    print('REFUSED:', e)\n")
    assert out.count("REFUSED:") == 2 and "GiB" in out and "the model takes (20,)" in out
    assert grew < 32, f"peak RSS grew {grew:.0f} MiB"


def test_npz_headers_rows_and_truncation(tmp_path):
    x = np.arange(60, dtype=np.float32).reshape(5, 3, 4)
    np.savez_compressed(tmp_path / "a.npz", x=x, y=np.arange(5))
    np.savez(tmp_path / "f.npz", x=np.asfortranarray(x), y=np.arange(5))
    assert npz_headers(tmp_path / "a.npz", ("x",))["x"][0] == (5, 3, 4)
    for name in ("a.npz", "f.npz"):
        a, b = load_npz(tmp_path / name, rows=2)
        assert np.array_equal(a, x[:2]) and np.array_equal(b, [0, 1]) and a.flags.writeable
    data = (tmp_path / "f.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable .npz"):
        load_npz(tmp_path / "cut.npz")
    np.savez(tmp_path / "o.npz", x=np.array([object()] * 3, dtype=object), y=np.arange(3))
    with pytest.raises(ValueError, match="must hold numbers"):
        load_npz(tmp_path / "o.npz")
