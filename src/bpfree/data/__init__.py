"""Datasets from local files only; bpfree never downloads.

* :func:`load_mnist` -- MNIST / Fashion-MNIST from the four standard IDX files, found in a
  given folder, ``$BPFREE_DATA/<kind>`` or the project's staged ``shared/data/<kind>``.
* :func:`read_idx` -- any IDX file, gzip-compressed or raw.
* :func:`load_digits_split` -- scikit-learn's bundled 8x8 digits, split for quick runs.
* :func:`load_mitdb_beats`, :func:`mitbih_split` -- MIT-BIH Arrhythmia beats (WFDB
  format-212 signals, ``.atr`` annotations, five AAMI classes) and a seeded, class-balanced
  split; :func:`read_record` / :func:`read_annotations` read one record.
* :func:`corrupt`, :func:`list_corruptions` -- MNIST-C / CIFAR-10-C style corruptions,
  severities 1–5, deterministic per image and seed.
* :func:`split_indices`, :func:`flat_image_splits` -- a validation split carved from the
  training split (the test split stays untouched), and MNIST-style images split and flattened.
* :func:`default_data_root` / :func:`require_data_root` -- where a dataset lives; the latter
  skips a pytest test with a reason when it is absent.
"""

from .corruptions import CORRUPTIONS, corrupt, list_corruptions, preview_grid, severity_params
from .digits import load_digits_split
from .idx import IDX_KINDS, IdxError, load_mnist, mnist_files, read_idx
from .mitdb import (
    AAMI_CLASSES,
    AAMI_MAP,
    MITDB_RECORDS,
    MitdbBeats,
    MitdbError,
    load_mitdb_beats,
    mitbih_split,
    read_212,
    read_annotations,
    read_header,
    read_record,
)
from .paths import DATA_ENV_VAR, candidate_roots, default_data_root, require_data_root
from .splits import flat_image_splits, split_indices

__all__ = [
    "AAMI_CLASSES",
    "AAMI_MAP",
    "MITDB_RECORDS",
    "MitdbBeats",
    "MitdbError",
    "load_mitdb_beats",
    "mitbih_split",
    "read_212",
    "read_annotations",
    "read_header",
    "read_record",
    "CORRUPTIONS",
    "corrupt",
    "list_corruptions",
    "preview_grid",
    "severity_params",
    "DATA_ENV_VAR",
    "IDX_KINDS",
    "IdxError",
    "candidate_roots",
    "default_data_root",
    "flat_image_splits",
    "load_digits_split",
    "load_mnist",
    "mnist_files",
    "read_idx",
    "require_data_root",
    "split_indices",
]
