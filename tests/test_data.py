"""Data loaders: IDX reader, MNIST / Fashion-MNIST from local files, the digits split."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from bpfree.data import (
    DATA_ENV_VAR,
    IdxError,
    candidate_roots,
    default_data_root,
    load_digits_split,
    load_mnist,
    mnist_files,
    read_idx,
    require_data_root,
)

ALL_MNIST_FILES = mnist_files("train") + mnist_files("test")


def idx_bytes(array: np.ndarray, code: int) -> bytes:
    """An IDX file written by hand from the format description, independent of read_idx."""
    be = array.astype(array.dtype.newbyteorder(">"))
    return bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + be.tobytes()


def write(path, data: bytes, compress: bool):
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


# --- the real files ----------------------------------------------------------------------------


@pytest.mark.parametrize("split, n, first", [("train", 60000, 5), ("test", 10000, 7)])
def test_real_mnist(split, n, first):
    require_data_root("mnist", ALL_MNIST_FILES)
    images, labels = load_mnist(split=split)
    assert images.shape == (n, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (n,) and labels.dtype == np.int64
    assert labels[0] == first
    assert set(np.unique(labels).tolist()) == set(range(10))
    assert images.max() == 255 and images.min() == 0


def test_real_fashion_mnist_test_split():
    require_data_root("fashion-mnist", ALL_MNIST_FILES)
    images, labels = load_mnist(split="test", kind="fashion-mnist")
    assert images.shape == (10000, 28, 28)
    assert np.bincount(labels).tolist() == [1000] * 10  # 1,000 per class (MANIFEST)


def test_bpfree_data_env_var_is_searched_first(tmp_path, monkeypatch):
    folder = tmp_path / "mnist"
    folder.mkdir()
    images = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28)
    write(folder / "t10k-images-idx3-ubyte.gz", idx_bytes(images, 0x08), True)
    write(folder / "t10k-labels-idx1-ubyte", idx_bytes(np.array([3, 1], np.uint8), 0x08), False)
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path))
    assert candidate_roots("mnist")[0] == folder
    assert default_data_root("mnist") == folder
    got_images, got_labels = load_mnist(split="test")
    assert np.array_equal(got_images, images) and got_labels.tolist() == [3, 1]


# --- IDX reader on tiny files ------------------------------------------------------------------


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "gzip"])
@pytest.mark.parametrize("array, code", [
    (np.arange(24, dtype=np.uint8).reshape(2, 3, 4), 0x08),
    (np.array([-128, -1, 0, 127], dtype=np.int8), 0x09),
    (np.array([[-30000, 2], [3, 30000]], dtype=np.int16), 0x0B),
    (np.array([-(2**31), 0, 2**31 - 1], dtype=np.int32), 0x0C),
    (np.array([1.5, -0.0, np.inf], dtype=np.float32), 0x0D),
    (np.array([[np.pi], [1e-300]], dtype=np.float64), 0x0E),
    (np.zeros((0, 28, 28), dtype=np.uint8), 0x08),
], ids=["u8", "i8", "i16", "i32", "f32", "f64", "empty"])
def test_idx_round_trip(tmp_path, array, code, compress):
    path = write(tmp_path / "x.idx", idx_bytes(array, code), compress)
    got = read_idx(path)
    assert got.dtype == array.dtype.newbyteorder("=") and got.dtype.isnative
    assert got.shape == array.shape and got.tobytes() == array.tobytes()
    got[...] = 0  # writable, not a view of an immutable buffer


def test_idx_bad_magic_names_the_file(tmp_path):
    data = bytearray(idx_bytes(np.zeros(4, np.uint8), 0x08))
    data[0] = 0x12
    path = write(tmp_path / "bad-magic.idx", bytes(data), False)
    with pytest.raises(IdxError, match="bad-magic.idx.*magic"):
        read_idx(path)
    data[0], data[2] = 0, 0x07  # unknown type code
    path = write(tmp_path / "bad-type.idx.gz", bytes(data), True)
    with pytest.raises(IdxError, match="bad-type.idx.gz.*magic"):
        read_idx(path)


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "gzip"])
def test_idx_truncated_and_oversized_name_the_file(tmp_path, compress):
    data = idx_bytes(np.arange(100, dtype=np.uint8).reshape(10, 10), 0x08)
    short = write(tmp_path / "short.idx", data[:-7], compress)
    with pytest.raises(IdxError, match=r"short.idx.*truncated.*100.*93"):
        read_idx(short)
    header_only = write(tmp_path / "header.idx", data[:6], compress)
    with pytest.raises(IdxError, match="header.idx.*truncated"):
        read_idx(header_only)
    long = write(tmp_path / "long.idx", data + b"\x00\x01", compress)
    with pytest.raises(IdxError, match="long.idx.*wrong size.*2 unexpected bytes"):
        read_idx(long)


def test_idx_truncated_gzip_stream_names_the_file(tmp_path):
    blob = gzip.compress(idx_bytes(np.arange(5000, dtype=np.int32), 0x0C))
    path = tmp_path / "cut.idx.gz"
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(IdxError, match="cut.idx.gz"):
        read_idx(path)


def test_idx_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.idx"):
        read_idx(tmp_path / "nothing.idx")


# --- load_mnist errors ------------------------------------------------------------------------


def test_missing_root_says_how_to_point_at_the_data(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError) as info:
        load_mnist(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(info.value) and "root=" in str(info.value)
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path / "empty"))
    monkeypatch.setattr("bpfree.data.idx.candidate_roots",
                        lambda kind: [tmp_path / "empty" / kind, tmp_path / "shared" / kind])
    with pytest.raises(FileNotFoundError) as info:
        load_mnist(kind="fashion-mnist")
    msg = str(info.value)
    assert DATA_ENV_VAR in msg and str(tmp_path / "empty" / "fashion-mnist") in msg
    assert str(tmp_path / "shared" / "fashion-mnist") in msg


def _fake_split(folder, n_images, labels, shape=(28, 28)):
    folder.mkdir(exist_ok=True)
    images = np.zeros((n_images, *shape), np.uint8)
    write(folder / "train-images-idx3-ubyte.gz", idx_bytes(images, 0x08), True)
    write(folder / "train-labels-idx1-ubyte.gz", idx_bytes(np.array(labels, np.uint8), 0x08), True)


def test_count_mismatch_and_bad_contents_raise_value_error(tmp_path):
    _fake_split(tmp_path / "a", 3, [1, 2])
    with pytest.raises(ValueError, match="3 images.*2 labels"):
        load_mnist(tmp_path / "a")
    _fake_split(tmp_path / "b", 2, [1, 12])
    with pytest.raises(ValueError, match="labels must be 0..9"):
        load_mnist(tmp_path / "b")
    _fake_split(tmp_path / "c", 2, [1, 2], shape=(8, 8))
    with pytest.raises(ValueError, match=r"\[N, 28, 28\]"):
        load_mnist(tmp_path / "c")


def test_bad_split_and_kind_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="split must be one of"):
        load_mnist(tmp_path, split="validation")
    with pytest.raises(ValueError, match="kind must be one of"):
        load_mnist(tmp_path, kind="cifar10")


# --- digits ------------------------------------------------------------------------------------


def test_digits_split_shapes_and_ranges():
    x_tr, y_tr, x_te, y_te = load_digits_split(seed=0, test_fraction=0.3)
    assert x_tr.shape == (1258, 64) and x_te.shape == (539, 64)
    assert x_tr.dtype == x_te.dtype == np.float32
    assert y_tr.dtype == y_te.dtype == np.int64
    assert 0.0 <= x_tr.min() and x_tr.max() <= 1.0 and x_tr.max() == 1.0
    assert set(y_tr.tolist()) == set(y_te.tolist()) == set(range(10))


def test_digits_split_is_stratified():
    _, y_tr, _, y_te = load_digits_split(seed=3, test_fraction=0.25)
    total = np.bincount(y_tr, minlength=10) + np.bincount(y_te, minlength=10)
    share = np.bincount(y_te, minlength=10) / total
    assert np.all(np.abs(share - 0.25) < 0.02), share


def test_digits_split_is_deterministic_per_seed():
    a = load_digits_split(seed=7)
    b = load_digits_split(seed=7)
    c = load_digits_split(seed=8)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert not np.array_equal(a[1], c[1])
    # No sample in both parts: the two halves together are the whole set, once each.
    rows = np.concatenate([a[0], a[2]])
    assert len(np.unique(rows, axis=0)) == len(np.unique(np.concatenate([c[0], c[2]]), axis=0))
    assert len(rows) == 1797


@pytest.mark.parametrize("kwargs, match", [
    ({"test_fraction": 0.0}, "test_fraction"), ({"test_fraction": 1.5}, "test_fraction"),
    ({"test_fraction": 0.001}, "test_fraction"), ({"seed": -1}, "seed"), ({"seed": 1.5}, "seed"),
])
def test_digits_split_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_digits_split(**kwargs)


def test_require_data_root_skips_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path))
    monkeypatch.setattr("bpfree.data.paths._REPO_ROOT", tmp_path / "repo")
    assert default_data_root("mnist") is None
    with pytest.raises(pytest.skip.Exception, match=f"'mnist' not found.*{DATA_ENV_VAR}"):
        require_data_root("mnist")
