"""The MIT-BIH Arrhythmia Database (PhysioNet ``mitdb``) from its WFDB files; numpy only.

Its WFDB files are read by :mod:`.wfdb_files` (re-exported here: ``read_record``,
``read_annotations``, ...).
:func:`load_mitdb_beats` cuts a fixed window around every beat annotation and maps its
symbol to the five AAMI EC57 classes; :func:`mitbih_split` gives a seeded, class-balanced
train/test split of those beats (intra-patient by default, the setting of the TinyFoA
authors' code; inter-patient when ``test_records`` is given). bpfree never downloads data.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .paths import DATA_ENV_VAR, candidate_roots, default_data_root
from .wfdb_files import (ANNOTATION_CODES, MitdbError, RecordHeader, SignalSpec, read_212,
                         read_annotations, read_header, read_record, verify_sha256)

__all__ = [
    "AAMI_CLASSES", "AAMI_MAP", "ANNOTATION_CODES", "MITDB_RECORDS", "MitdbBeats", "MitdbError",
    "RecordHeader", "SignalSpec", "load_mitdb_beats", "mitbih_split", "read_212",
    "read_annotations", "read_header", "read_record", "verify_sha256",
]

#: The 48 records of the database (its ``RECORDS`` file).
MITDB_RECORDS = (
    "100", "101", "102", "103", "104", "105", "106", "107", "108", "109", "111", "112", "113",
    "114", "115", "116", "117", "118", "119", "121", "122", "123", "124", "200", "201", "202",
    "203", "205", "207", "208", "209", "210", "212", "213", "214", "215", "217", "219", "220",
    "221", "222", "223", "228", "230", "231", "232", "233", "234",
)

#: The AAMI EC57 heartbeat classes, in label order 0..4.
AAMI_CLASSES = ("N", "S", "V", "F", "Q")
#: Beat symbol -> AAMI class index. N: normal, bundle branch block, atrial / nodal escape;
#: S: supraventricular ectopic (atrial, aberrated atrial, nodal and supraventricular
#: premature); V: ventricular ectopic (premature ventricular contraction, ventricular
#: escape); F: fusion of ventricular and normal; Q: paced, fusion of paced and normal,
#: unclassifiable. Non-beat annotations (rhythm, noise, ``|`` artefacts, ``!`` flutter
#: waves, ``x`` non-conducted P waves, ...) are not beats and are dropped.
AAMI_MAP = {
    "N": 0, "L": 0, "R": 0, "e": 0, "j": 0,
    "A": 1, "a": 1, "J": 1, "S": 1,
    "V": 2, "E": 2,
    "F": 3,
    "/": 4, "f": 4, "Q": 4,
}


@dataclass(frozen=True)
class MitdbBeats:
    """Beat windows of :func:`load_mitdb_beats`: ``x`` float32 ``[N, window]``, ``y`` int64
    AAMI class (index into :data:`AAMI_CLASSES`), and per beat its ``record`` name, beat
    ``symbol`` and R-peak ``sample`` index."""

    x: np.ndarray
    y: np.ndarray
    record: np.ndarray
    symbol: np.ndarray
    sample: np.ndarray



# ---------------------------------------------------------------------------------------
# Beats and the benchmark split
# ---------------------------------------------------------------------------------------

_NORMALIZE = ("beat", "mv")


def _find_root(root, records) -> Path:
    needed = tuple(f"{r}.{ext}" for r in records for ext in ("hea", "dat", "atr"))
    if root is None:
        folder = default_data_root("mitdb", needed)
        if folder is None:
            tried = ", ".join(str(r) for r in candidate_roots("mitdb"))
            raise FileNotFoundError(f"MIT-BIH records not found (tried {tried}; each must hold "
                                    f"NNN.hea/.dat/.atr for {len(records)} records); bpfree "
                                    f"never downloads data: pass root= or set {DATA_ENV_VAR} "
                                    "to a folder with a mitdb/ subfolder")
        return folder
    folder = Path(root).expanduser()
    missing = [n for n in needed if not (folder / n).is_file()]
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6
                                          else "")
        raise FileNotFoundError(f"MIT-BIH files missing in {folder}: {shown}; bpfree never "
                                "downloads data: pass root= a folder holding the mitdb "
                                "records (NNN.hea, NNN.dat, NNN.atr)")
    return folder


def load_mitdb_beats(root: str | os.PathLike | None = None, *,
                     records: tuple[str, ...] | list[str] | None = None, window: int = 168,
                     before: int = 72, lead: str = "MLII", normalize: str = "beat",
                     verify: bool = True) -> MitdbBeats:
    """Every beat of ``records`` (default all 48) as a ``window``-sample window starting
    ``before`` samples ahead of its annotation (the R peak), labelled by :data:`AAMI_MAP`.

    ``root`` is a folder with ``NNN.hea``, ``NNN.dat`` and ``NNN.atr``; ``None`` searches
    :func:`bpfree.data.paths.candidate_roots` (``$BPFREE_DATA/mitdb``, then the staged
    ``shared/data/mitdb``). The signal is the channel named ``lead`` where the record has
    it, else channel 0 (mitdb: MLII in 46 records; 102 and 104 have V5 instead -- their
    channel 0 -- and 114 stores MLII as channel 1). Beats whose window would leave the
    record are dropped. ``normalize``: ``"beat"`` standardises each window (zero mean, unit
    variance; removes baseline wander and the gain differences between records), ``"mv"``
    gives millivolts ``(adc - baseline) / gain``.
    """
    for name, v, lo in (("window", window, 1), ("before", before, 0)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    if before >= window:
        raise ValueError(f"before ({before}) must be < window ({window}) so the R peak lies "
                         "inside the window")
    if normalize not in _NORMALIZE:
        raise ValueError(f"normalize must be one of {list(_NORMALIZE)}, got {normalize!r}")
    records = tuple(str(r) for r in (MITDB_RECORDS if records is None else records))
    if not records:
        raise ValueError("records must name at least one record")
    folder = _find_root(root, records)
    xs, ys, recs, syms, samps = [], [], [], [], []
    offsets = np.arange(window) - before
    for rec in records:
        adc, header = read_record(folder / rec, verify=verify)
        names = [s.description for s in header.signals]
        ch = names.index(lead) if lead in names else 0
        spec = header.signals[ch]
        sig = adc[:, ch]
        sample, symbol = read_annotations(folder / f"{rec}.atr", verify=verify)
        labels = np.array([AAMI_MAP.get(s, -1) for s in symbol], np.int64)
        keep = ((labels >= 0) & (sample - before >= 0)
                & (sample - before + window <= sig.size))
        sample, symbol, labels = sample[keep], symbol[keep], labels[keep]
        w = sig[sample[:, None] + offsets[None, :]].astype(np.float32)
        if normalize == "beat":
            w -= w.mean(axis=1, keepdims=True)
            w /= w.std(axis=1, keepdims=True) + 1e-6
        else:
            w = (w - spec.baseline) / spec.gain
        xs.append(w)
        ys.append(labels)
        recs.append(np.full(len(labels), rec))
        syms.append(symbol)
        samps.append(sample)
    return MitdbBeats(np.concatenate(xs), np.concatenate(ys), np.concatenate(recs),
                      np.concatenate(syms), np.concatenate(samps))


def _balanced_pick(y: np.ndarray, n: int | None, rng: np.random.Generator, where: str,
                   balance: bool) -> list[np.ndarray]:
    """Per class, the indices of the beats kept (``n`` per class, or the rarest count)."""
    counts = np.bincount(y, minlength=len(AAMI_CLASSES))
    if balance:
        absent = [AAMI_CLASSES[c] for c in range(len(AAMI_CLASSES)) if counts[c] == 0]
        if absent:
            raise ValueError(f"class(es) {absent} have no beats in the {where} records; a "
                             "balanced split needs every AAMI class")
        k = int(counts.min()) if n is None else int(n)
        if k > counts.min():
            raise ValueError(f"per_class={k} but the {where} records hold only "
                             f"{dict(zip(AAMI_CLASSES, counts.tolist()))} beats per class")
    out = []
    for c in range(len(AAMI_CLASSES)):
        idx = np.flatnonzero(y == c)
        take = k if balance else (idx.size if n is None else min(int(n), idx.size))
        out.append(np.sort(rng.choice(idx, size=take, replace=False)) if take else idx)
    return out


def mitbih_split(root: str | os.PathLike | None = None, *, seed: int = 0,
                 test_fraction: float = 0.2, per_class: int | None = None,
                 balance: bool = True, test_records: tuple[str, ...] | list[str] | None = None,
                 records: tuple[str, ...] | list[str] | None = None, window: int = 168,
                 before: int = 72, lead: str = "MLII", normalize: str = "beat",
                 beats: MitdbBeats | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A seeded, class-balanced train/test split of the MIT-BIH beats (5 AAMI classes).

    Intra-patient (default, as the TinyFoA authors' code): the beats of all ``records`` are
    pooled; ``balance`` keeps ``per_class`` beats of each class (default the rarest class's
    count: F, 802 with the defaults), drawn with ``seed``, and ``test_fraction`` of each
    class goes to the test set -- beats of one patient can be on both sides. With
    ``balance=False`` every beat is kept (``per_class`` then only caps each class).
    Inter-patient: with ``test_records`` the test set is those records' beats and the
    training set the other records' (balanced separately; every class must occur on both
    sides, so the paced records that hold the Q class must be split between them).

    Returns ``(x_train float32 [N, window], y_train int64, x_test, y_test)``, classes
    0..4 = :data:`AAMI_CLASSES`. ``beats`` reuses a :func:`load_mitdb_beats` result.
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an int in [0, 2**32 - 1], got {seed!r}")
    if (isinstance(test_fraction, bool) or not isinstance(test_fraction, numbers.Real)
            or not 0.0 < float(test_fraction) < 1.0):
        raise ValueError(f"test_fraction must be a float in (0, 1), got {test_fraction!r}")
    if per_class is not None and (isinstance(per_class, bool)
                                  or not isinstance(per_class, numbers.Integral)
                                  or per_class < 2):
        raise ValueError(f"per_class must be None or an int >= 2, got {per_class!r}")
    if beats is None:
        beats = load_mitdb_beats(root, records=records, window=window, before=before,
                                 lead=lead, normalize=normalize)
    rng = np.random.default_rng(int(seed))
    if test_records is None:
        tr, te = [], []
        for idx in _balanced_pick(beats.y, per_class, rng, "selected", balance):
            idx = rng.permutation(idx)
            n_test = int(round(idx.size * float(test_fraction)))
            if idx.size and not 0 < n_test < idx.size:
                raise ValueError(f"test_fraction={test_fraction} leaves no training or no "
                                 f"test beats for a class of {idx.size}")
            te.append(idx[:n_test])
            tr.append(idx[n_test:])
        tr, te = np.sort(np.concatenate(tr)), np.sort(np.concatenate(te))
    else:
        test_records = {str(r) for r in test_records}
        unknown = test_records - set(beats.record.tolist())
        if unknown:
            raise ValueError(f"test_records {sorted(unknown)} are not among the loaded records")
        on_test = np.isin(beats.record, list(test_records))
        pools = []
        for mask, where in ((~on_test, "training"), (on_test, "test")):
            base = np.flatnonzero(mask)
            picked = _balanced_pick(beats.y[base], per_class, rng, where, balance)
            pools.append(np.sort(np.concatenate([base[p] for p in picked])))
        tr, te = pools
    return (np.ascontiguousarray(beats.x[tr]), beats.y[tr].copy(),
            np.ascontiguousarray(beats.x[te]), beats.y[te].copy())
