"""The MIT-BIH Arrhythmia Database (PhysioNet ``mitdb``) from its WFDB files; numpy only.

A record ``NNN`` is three files (WFDB format, PhysioNet's "WFDB file formats" pages):

* ``NNN.hea`` -- text header. The record line is ``name n_signals fs n_samples ...``; one
  line per signal: ``file format gain[(baseline)][/units] adc_resolution adc_zero
  initial_value checksum block_size description`` (``#`` lines are comments).
* ``NNN.dat`` -- the samples, interleaved by frame (``s0[ch0] s0[ch1] s1[ch0] ...``), in
  format 212: each pair of 12-bit two's-complement samples takes 3 bytes -- byte 0 is the
  low 8 bits of the first sample, the low nibble of byte 1 its high 4 bits, the high nibble
  of byte 1 the high 4 bits of the second sample, byte 2 the second sample's low 8 bits.
* ``NNN.atr`` -- reference annotations in MIT format: little-endian 16-bit words, code
  ``A = word >> 10`` and time increment ``I = word & 0x3FF``; ``A = 59`` (SKIP) is followed by
  a 32-bit increment (high 16-bit word first), ``60/61/62`` (NUM/SUB/CHN) set a field in
  ``I``, ``63`` (AUX) is followed by ``I`` bytes of text padded to an even length, and the
  word 0 ends the file. Codes 1..49 are annotation types (``N``, ``V``, ``/``, ``+``, ...).

:func:`read_record` / :func:`read_annotations` read one record; the header's per-signal
initial value and checksum are verified, so a corrupt ``.dat`` is reported, not used. The
WFDB checksum is a sum, blind to samples moved around (two swapped frames keep it), so where
the record's folder holds PhysioNet's ``SHA256SUMS.txt`` (every PhysioNet release ships one)
each file it lists is also checked against its SHA-256. An annotation file must end with the
end-of-file word: an empty or cut-off ``.atr`` is an error, not a shorter list of beats.

Why not ``wfdb`` (the field's reader, PhysioNet's own package): measured with wfdb 4.3.1,
``wfdb.rdann`` returns 0 annotations for an empty ``.atr`` and 1,491 of record 208's 3,040
(F beats 249 of 373) for one cut in half, without a warning, and ``wfdb.rdrecord`` reads a
``.dat`` whose checksum no longer matches its header without complaint -- the faults this
reader exists to refuse -- and it pulls pandas, aiohttp, requests, soundfile and fsspec into a
library that needs three small binary formats. Our reader is tested against ``wfdb`` record
for record on all 48 records (``tests/test_mitdb.py``; wfdb is a dev dependency).
:func:`load_mitdb_beats` cuts a fixed window around every beat annotation and maps its
symbol to the five AAMI EC57 classes; :func:`mitbih_split` gives a seeded, class-balanced
train/test split of those beats (intra-patient by default, the setting of the TinyFoA
authors' code; inter-patient when ``test_records`` is given). bpfree never downloads data.
"""

from __future__ import annotations

import functools
import hashlib
import numbers
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .paths import DATA_ENV_VAR, candidate_roots, default_data_root

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

#: MIT annotation code -> symbol (WFDB ``ecgcodes.h``); codes not listed are not used by mitdb.
ANNOTATION_CODES = {
    1: "N", 2: "L", 3: "R", 4: "a", 5: "V", 6: "F", 7: "J", 8: "A", 9: "S", 10: "E", 11: "j",
    12: "/", 13: "Q", 14: "~", 16: "|", 18: "s", 19: "T", 20: "*", 21: "D", 22: '"', 23: "=",
    24: "p", 25: "B", 26: "^", 27: "t", 28: "+", 29: "u", 30: "?", 31: "!", 32: "[", 33: "]",
    34: "e", 35: "n", 36: "@", 37: "x", 38: "f", 39: "(", 40: ")", 41: "r",
}

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

_SKIP, _NUM, _SUB, _CHN, _AUX = 59, 60, 61, 62, 63


class MitdbError(ValueError):
    """A WFDB header, signal or annotation file is malformed or fails its checks."""


@dataclass(frozen=True)
class SignalSpec:
    """One signal line of a header."""

    file: str
    fmt: int
    gain: float        # ADC units per physical unit (mV)
    baseline: int      # ADC value of 0 mV
    adc_resolution: int
    adc_zero: int
    initial_value: int
    checksum: int      # 16-bit signed sum of all the signal's samples
    description: str


@dataclass(frozen=True)
class RecordHeader:
    record: str
    n_signals: int
    fs: float
    n_samples: int
    signals: tuple[SignalSpec, ...]


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
# Files of one record
# ---------------------------------------------------------------------------------------


def _int(text: str, what: str, path: Path) -> int:
    try:
        return int(text)
    except ValueError:
        raise MitdbError(f"{path}: {what} must be an integer, got {text!r}") from None


def read_header(path: str | os.PathLike) -> RecordHeader:
    """Parse a WFDB ``.hea`` header (single-segment records).

    Raises ``FileNotFoundError`` and :class:`MitdbError` naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"WFDB header not found: {path}")
    lines = [ln.strip() for ln in path.read_text(encoding="ascii", errors="replace").splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    if not lines:
        raise MitdbError(f"{path}: empty header, no record line")
    rec = lines[0].split()
    if len(rec) < 4:
        raise MitdbError(f"{path}: record line {lines[0]!r} needs 'name n_signals fs "
                         "n_samples'")
    if "/" in rec[0]:
        raise MitdbError(f"{path}: multi-segment records ({rec[0]!r}) are not supported")
    n_signals = _int(rec[1], "the number of signals", path)
    try:
        fs = float(rec[2].split("/")[0].split("(")[0])
    except ValueError:
        raise MitdbError(f"{path}: bad sampling frequency {rec[2]!r}") from None
    n_samples = _int(rec[3], "the number of samples", path)
    if n_signals < 1 or n_samples < 1 or fs <= 0:
        raise MitdbError(f"{path}: record line {lines[0]!r}: need >= 1 signal, >= 1 sample "
                         "and fs > 0")
    if len(lines) - 1 < n_signals:
        raise MitdbError(f"{path}: header declares {n_signals} signals but has "
                         f"{len(lines) - 1} signal lines")
    signals = []
    for line in lines[1:1 + n_signals]:
        f = line.split(maxsplit=8)
        if len(f) < 7:
            raise MitdbError(f"{path}: signal line {line!r} needs at least 'file format gain "
                             "adc_resolution adc_zero initial_value checksum'")
        fmt = _int(f[1].split("x")[0].split(":")[0].split("+")[0], "the signal format", path)
        gain_text = f[2].split("/")[0]
        baseline = None
        if "(" in gain_text:
            gain_text, base_text = gain_text.rstrip(")").split("(")
            baseline = _int(base_text, "the baseline", path)
        try:
            gain = float(gain_text) or 200.0  # WFDB: gain 0 means the default 200
        except ValueError:
            raise MitdbError(f"{path}: bad ADC gain {f[2]!r}") from None
        adc_zero = _int(f[4], "adc_zero", path)
        signals.append(SignalSpec(
            file=f[0], fmt=fmt, gain=gain,
            baseline=adc_zero if baseline is None else baseline,
            adc_resolution=_int(f[3], "adc_resolution", path), adc_zero=adc_zero,
            initial_value=_int(f[5], "the initial value", path),
            checksum=_int(f[6], "the checksum", path),
            description=f[8] if len(f) > 8 else ""))
    return RecordHeader(rec[0], n_signals, fs, n_samples, tuple(signals))


def read_212(path: str | os.PathLike, n_signals: int, n_samples: int | None = None
             ) -> np.ndarray:
    """Decode a format-212 ``.dat`` file into int16 ADC values ``[n_samples, n_signals]``.

    With ``n_samples`` the file must hold exactly that many frames (trailing bytes or a
    short file raise :class:`MitdbError`); without, every whole frame is returned.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"WFDB signal file not found: {path}")
    if n_signals < 1:
        raise ValueError(f"n_signals must be >= 1, got {n_signals}")
    raw = np.fromfile(path, dtype=np.uint8)
    total = raw.size // 3 * 2 + (1 if raw.size % 3 == 2 else 0)
    if n_samples is not None:
        need = n_samples * n_signals
        need_bytes = need // 2 * 3 + (2 if need % 2 else 0)
        if raw.size != need_bytes:
            raise MitdbError(f"{path}: wrong size: {n_samples} samples x {n_signals} signals "
                             f"in format 212 take {need_bytes} bytes, the file has {raw.size}")
        total = need
    padded = np.zeros(-(-raw.size // 3) * 3, np.uint8)
    padded[:raw.size] = raw
    b = padded.reshape(-1, 3).astype(np.int16)
    out = np.empty(b.shape[0] * 2, np.int16)
    out[0::2] = b[:, 0] | ((b[:, 1] & 0x0F) << 8)
    out[1::2] = b[:, 2] | ((b[:, 1] & 0xF0) << 4)
    out = out[:total]
    out[out >= 2048] -= 4096  # 12-bit two's complement
    frames = total // n_signals
    return out[:frames * n_signals].reshape(frames, n_signals)


SHA256SUMS = "SHA256SUMS.txt"


@functools.lru_cache(maxsize=8)
def _listed_digests(sums: Path, mtime_ns: int) -> dict[str, str]:
    """``file name -> sha256 hex`` of a PhysioNet ``SHA256SUMS.txt`` (``digest name`` lines;
    ``mtime_ns`` is part of the cache key so an edited list is read again)."""
    digests = {}
    for line in sums.read_text(encoding="utf-8", errors="replace").splitlines():
        fields = line.split()
        if len(fields) == 2 and len(fields[0]) == 64:
            digests[fields[1].lstrip("*")] = fields[0].lower()
    return digests


def verify_sha256(path: str | os.PathLike) -> bool:
    """Check ``path`` against the ``SHA256SUMS.txt`` beside it, if there is one and it lists
    the file; returns whether a digest was checked. Raises :class:`MitdbError` on a mismatch.

    The WFDB header checksum is a 16-bit sum, so reordered samples (two swapped 3-byte frames
    of a format-212 file, say) keep it; the release's SHA-256 list catches every change."""
    path = Path(path)
    sums = path.parent / SHA256SUMS
    if not sums.is_file():
        return False
    expected = _listed_digests(sums, sums.stat().st_mtime_ns).get(path.name)
    if expected is None:
        return False
    with open(path, "rb") as f:
        actual = hashlib.file_digest(f, "sha256").hexdigest()
    if actual != expected:
        raise MitdbError(f"{path}: SHA-256 {actual[:16]}... does not match {sums} "
                         f"({expected[:16]}...); the file is corrupt or was modified: restore it "
                         "from the PhysioNet release")
    return True


def read_record(path: str | os.PathLike, *, verify: bool = True
                ) -> tuple[np.ndarray, RecordHeader]:
    """Read record ``path`` (``.../100`` or ``.../100.hea``): ``(adc int16 [n_samples,
    n_signals], header)``. Physical values are ``(adc - baseline) / gain`` mV.

    With ``verify`` every signal's first sample must equal the header's initial value and
    the 16-bit sum of its samples the header's checksum, and the header and signal files must
    match their SHA-256 in a ``SHA256SUMS.txt`` beside them (:func:`verify_sha256`, where one
    lists them); :class:`MitdbError` otherwise.
    """
    path = Path(path)
    hea = path if path.suffix == ".hea" else path.with_name(path.name + ".hea")
    header = read_header(hea)
    files = {s.file for s in header.signals}
    if len(files) != 1 or any(s.fmt != 212 for s in header.signals):
        raise MitdbError(f"{hea}: only records whose signals share one format-212 file are "
                         f"supported, got files {sorted(files)} formats "
                         f"{sorted({s.fmt for s in header.signals})}")
    dat = hea.with_name(files.pop())
    adc = read_212(dat, header.n_signals, header.n_samples)
    if verify:
        verify_sha256(hea)
        verify_sha256(dat)
        for i, s in enumerate(header.signals):
            col = adc[:, i]
            if int(col[0]) != s.initial_value:
                raise MitdbError(f"{hea}: signal {i} ({s.description}) starts at {int(col[0])}"
                                 f", the header's initial value is {s.initial_value}; the "
                                 ".dat file is corrupt or belongs to another record")
            total = int(col.astype(np.int64).sum())
            check = (total + 32768) % 65536 - 32768
            if check != s.checksum:
                raise MitdbError(f"{hea}: signal {i} ({s.description}) checksum {check} != "
                                 f"header {s.checksum}; the .dat file is corrupt")
    return adc, header


def read_annotations(path: str | os.PathLike, *, verify: bool = True
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Read an MIT-format annotation file (``.atr``): ``(sample int64 [K], symbol str [K])``,
    every annotation in file order (beats and non-beats; see :data:`AAMI_MAP`).

    The file must end with the end-of-file word 0: an empty or cut-off file raises
    :class:`MitdbError` instead of returning the annotations before the cut. With ``verify``
    the file must also match its SHA-256 in a ``SHA256SUMS.txt`` beside it, where one lists it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"WFDB annotation file not found: {path}")
    if verify:
        verify_sha256(path)
    data = path.read_bytes()
    if not data:
        raise MitdbError(f"{path}: empty annotation file; an MIT annotation file holds at "
                         "least its end-of-file word")
    if len(data) % 2:
        raise MitdbError(f"{path}: odd length {len(data)}; MIT annotation files are 16-bit "
                         "words")
    words = np.frombuffer(data, dtype="<u2")
    samples, symbols = [], []
    t, i, n = 0, 0, len(words)
    ended = False
    while i < n:
        w = int(words[i])
        i += 1
        code, inc = w >> 10, w & 0x3FF
        if code == 0 and inc == 0:
            ended = True
            break
        if code == _SKIP:
            if i + 2 > n:
                raise MitdbError(f"{path}: truncated SKIP annotation at byte {2 * i - 2}")
            skip = (int(words[i]) << 16) | int(words[i + 1])
            if skip >= 1 << 31:
                skip -= 1 << 32
            t += skip
            i += 2
        elif code == _AUX:
            i += (inc + 1) // 2
            if i > n:
                raise MitdbError(f"{path}: truncated: an AUX field of {inc} bytes runs past "
                                 "the end of the file")
        elif code in (_NUM, _SUB, _CHN):
            pass
        else:
            t += inc
            if code not in ANNOTATION_CODES:
                raise MitdbError(f"{path}: unknown annotation code {code} at byte {2 * i - 2}")
            samples.append(t)
            symbols.append(ANNOTATION_CODES[code])
    if not ended:
        raise MitdbError(f"{path}: truncated: no end-of-file word after {len(samples)} "
                         f"annotations ({len(data)} bytes); the file was cut off")
    return np.asarray(samples, np.int64), np.asarray(symbols, dtype="<U1")


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
