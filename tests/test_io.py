"""bpfree.io: output paths refused before the work, atomic writes that keep the old file."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bpfree import io


@pytest.mark.parametrize("bad", ["", "  ", ".", "/dev/null", "/proc/bpfree-x.json"])
def test_bad_destinations_are_refused_naming_the_option(bad):
    with pytest.raises(ValueError, match="^--json: "):
        io.check_output_path(bad, what="--json")


def test_path_below_a_file_and_a_directory_are_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        io.check_output_path(tmp_path / "file" / "sub" / "x.json", what="--out")
    with pytest.raises(ValueError, match="is a directory"):
        io.check_output_path(tmp_path, what="--out")
    # A folder that does not exist yet is fine: it is created when the file is written.
    target = tmp_path / "new" / "deeper" / "x.json"
    assert io.check_output_path(target) == target and not target.parent.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # the probe is gone


def test_write_json_is_strict_and_follows_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        path = io.write_json({"a": [1, 2.5]}, tmp_path / "d" / "r.json")
    finally:
        os.umask(old)
    assert json.loads(path.read_text()) == {"a": [1, 2.5]}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    with pytest.raises(ValueError, match="not valid JSON"):
        io.write_json({"a": float("nan")}, path)
    assert json.loads(path.read_text()) == {"a": [1, 2.5]}  # untouched


def test_a_symlink_keeps_pointing_at_the_new_file(tmp_path):
    target = tmp_path / "target.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target.name)
    io.atomic_write_text("new", link)
    assert link.is_symlink() and os.readlink(link) == target.name
    assert target.read_text() == "new"


def test_device_nodes_are_never_replaced():
    with pytest.raises(ValueError, match="not a regular file"):
        io.atomic_write_text("x", "/dev/null")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_write_cut_by_the_file_size_limit_leaves_the_old_file(tmp_path):
    """`ulimit -f 1`: the write fails, the previous file stays whole, no temporary remains."""
    path = tmp_path / "good.json"
    io.write_json({"kept": True}, path)
    script = textwrap.dedent(f"""
        import resource, signal, sys
        from bpfree import io
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
        try:
            io.write_json({{"big": "x" * 10000}}, {str(path)!r})
        except OSError as err:
            print(err, file=sys.stderr)
            sys.exit(3)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 3, done.stderr
    # the error names the option and the file, and says the old one is intact
    assert f"--json: could not write {path}" in done.stderr
    assert "previous file, if any, is unchanged" in done.stderr
    assert json.loads(path.read_text()) == {"kept": True}
    assert [p.name for p in tmp_path.iterdir()] == ["good.json"]


def test_stale_temporaries_of_one_file_are_removed(tmp_path):
    target = tmp_path / "ck.safetensors"
    stale = tmp_path / f".{target.name}.0123456789ab.tmp"
    other = tmp_path / ".other.safetensors.0123456789ab.tmp"
    mine_not = tmp_path / f".{target.name}.notatoken.tmp"
    probe = tmp_path / f".{target.name}.a0b1c2d3e4f5.probe"  # a kill inside the path check
    for p in (stale, other, mine_not, probe):
        p.write_bytes(b"partial")
    assert io.remove_stale_temporaries(target) == [stale, probe]
    assert not stale.exists() and not probe.exists() and other.exists() and mine_not.exists()
    assert io.remove_stale_temporaries(Path("/nonexistent-dir/x")) == []


def test_first_missing_folder_names_the_outermost_folder_a_write_creates(tmp_path):
    root = Path(os.path.realpath(tmp_path))
    assert io.first_missing_folder(root / "x.json") is None
    assert io.first_missing_folder(root / "a" / "b" / "x.json") == root / "a"
    (root / "a").mkdir()
    assert io.first_missing_folder(root / "a" / "b" / "x.json") == root / "a" / "b"
    # check_output_path accepts the same path (the folders are created at write time)
    io.check_output_path(root / "a" / "b" / "x.json", what="--json")
    assert not (root / "a" / "b").exists()
