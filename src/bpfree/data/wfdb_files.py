"""Reading one WFDB record of the MIT-BIH Arrhythmia Database; numpy only.

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
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["ANNOTATION_CODES", "MitdbError", "RecordHeader", "SignalSpec", "read_212",
           "read_annotations", "read_header", "read_record", "verify_sha256"]

#: MIT annotation code -> symbol (WFDB ``ecgcodes.h``); codes not listed are not used by mitdb.
ANNOTATION_CODES = {
    1: "N", 2: "L", 3: "R", 4: "a", 5: "V", 6: "F", 7: "J", 8: "A", 9: "S", 10: "E", 11: "j",
    12: "/", 13: "Q", 14: "~", 16: "|", 18: "s", 19: "T", 20: "*", 21: "D", 22: '"', 23: "=",
    24: "p", 25: "B", 26: "^", 27: "t", 28: "+", 29: "u", 30: "?", 31: "!", 32: "[", 33: "]",
    34: "e", 35: "n", 36: "@", 37: "x", 38: "f", 39: "(", 40: ")", 41: "r",
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
