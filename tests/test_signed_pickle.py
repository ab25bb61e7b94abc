"""The task cache and epoch snapshots never unpickle a file this user's key did not sign."""

from __future__ import annotations

import os
import pickle
import stat

import pytest

from bpfree import signed_pickle
from bpfree.bench.task_cache import TaskCache


class _Plant:
    """Unpickling this creates ``path``: the stand-in for a hostile file's payload."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


@pytest.fixture
def key(tmp_path, monkeypatch):
    path = tmp_path / "keys" / "pickle.key"
    monkeypatch.setenv("BPFREE_PICKLE_KEY", str(path))
    return path


def test_a_signed_pickle_round_trips_and_its_key_is_private(key):
    data = signed_pickle.dumps({"acc": [1.5, 2.0], "n": 3})
    assert data.startswith(signed_pickle.MAGIC)
    assert signed_pickle.loads(data) == {"acc": [1.5, 2.0], "n": 3}
    assert key.stat().st_size == 32 and stat.S_IMODE(key.stat().st_mode) == 0o600


def test_unsigned_altered_or_foreign_pickles_are_refused_before_unpickling(key, tmp_path,
                                                                          monkeypatch):
    marker = tmp_path / "pwned"
    hostile = pickle.dumps(_Plant(marker))
    with pytest.raises(signed_pickle.SignatureError, match="not a signed"):
        signed_pickle.loads(hostile)
    good = signed_pickle.dumps([1, 2, 3])
    altered = good[:-3] + bytes([good[-3] ^ 1]) + good[-2:]
    with pytest.raises(signed_pickle.SignatureError, match="does not match"):
        signed_pickle.loads(altered)
    forged = good[:len(signed_pickle.MAGIC) + 32] + hostile   # a tag copied onto new bytes
    with pytest.raises(signed_pickle.SignatureError):
        signed_pickle.loads(forged)
    monkeypatch.setenv("BPFREE_PICKLE_KEY", str(tmp_path / "other.key"))  # another user
    with pytest.raises(signed_pickle.SignatureError):
        signed_pickle.loads(good)
    assert not marker.exists()


def test_a_planted_cache_file_counts_as_missing_and_runs_no_code(key, tmp_path):
    cache = TaskCache(tmp_path / "cache", salt="rev")
    (tmp_path / "cache").mkdir()
    marker = tmp_path / "pwned"
    cache.path(len, "task").write_bytes(pickle.dumps(_Plant(marker)))
    assert cache.load(len, "task") == (False, None)
    assert not marker.exists()
    cache.store(len, "task", 4)
    assert cache.load(len, "task") == (True, 4)


def test_a_planted_epoch_snapshot_is_ignored(key, tmp_path):
    import torch

    from bpfree.checkpoint.resume import FitSnapshots, active
    from bpfree.harness import fit
    from bpfree.ttzo.methods import make_method
    from bpfree.ttzo.models import make_model

    marker = tmp_path / "pwned"
    folder = tmp_path / "snaps"
    folder.mkdir()
    (folder / "fit-0.pkl").write_bytes(pickle.dumps(_Plant(marker)))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g)

    def run():
        method = make_method("fo", make_model("tt", rank=2, seed=0), seed=0)
        return fit(method, x, y, epochs=2, batch_size=32, lr=1e-2, seed=0).loss

    with active(FitSnapshots(folder)):
        resumed = run()
    assert resumed == run() and not marker.exists()
    assert os.path.getsize(folder / "fit-0.pkl") > 0   # replaced by a signed snapshot
    assert signed_pickle.verified_payload((folder / "fit-0.pkl").read_bytes())


def test_vouching_signs_an_older_runs_plain_pickle_without_unpickling_it(key, tmp_path,
                                                                         capsys):
    """A task cache written before signing existed: `python -m bpfree.signed_pickle vouch`
    signs the files in place (nothing runs), after which the cache reads them."""
    cache = TaskCache(tmp_path / "cache", salt="old-rev")
    (tmp_path / "cache").mkdir()
    old = cache.path(len, "task")
    old.write_bytes(pickle.dumps({"accuracy": 91.5}, protocol=4))   # as the old revision did
    assert cache.load(len, "task") == (False, None)
    marker = tmp_path / "pwned"
    planted = tmp_path / "planted.pkl"
    planted.write_bytes(pickle.dumps(_Plant(marker)))
    assert signed_pickle.main(["vouch", str(old), str(planted)]) == 0
    assert not marker.exists()                       # vouching unpickles nothing
    assert cache.load(len, "task") == (True, {"accuracy": 91.5})
    # already signed, not a pickle, or missing: refused, named, exit 1, file unchanged
    text = tmp_path / "notes.txt"
    text.write_bytes(b"hello")
    signed = old.read_bytes()
    assert signed_pickle.main(["vouch", str(old), str(text), str(tmp_path / "gone")]) == 1
    err = capsys.readouterr().err
    assert "already a signed bpfree pickle" in err and "not a pickle of protocol" in err
    assert "gone" in err
    assert old.read_bytes() == signed and text.read_bytes() == b"hello"
