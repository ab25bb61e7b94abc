"""MIT-BIH (bpfree.data.mitdb): format-212 signals, MIT annotations, beats and the split.

The synthetic records are written by hand from the WFDB format description, independently
of the reader; the real-data tests skip with a reason when shared/data/mitdb is absent.
"""

from __future__ import annotations

import numpy as np
import pytest

from bpfree.data import (
    AAMI_CLASSES,
    AAMI_MAP,
    MITDB_RECORDS,
    MitdbError,
    load_mitdb_beats,
    mitbih_split,
    read_212,
    read_annotations,
    read_header,
    read_record,
    require_data_root,
)
from bpfree.data.mitdb import verify_sha256

# --- writers (from the format description) -----------------------------------------------


def encode_212(values) -> bytes:
    """Pack 12-bit signed ints, two per 3 bytes; an odd last sample takes 2 bytes."""
    out = bytearray()
    u = [int(v) & 0xFFF for v in values]
    for i in range(0, len(u) - 1, 2):
        a, b = u[i], u[i + 1]
        out += bytes([a & 0xFF, ((b >> 8) << 4) | (a >> 8), b & 0xFF])
    if len(u) % 2:
        a = u[-1]
        out += bytes([a & 0xFF, a >> 8])
    return bytes(out)


def checksum16(values) -> int:
    return (int(np.sum(np.asarray(values, np.int64))) + 32768) % 65536 - 32768


def write_record(folder, name, signals: np.ndarray, descriptions=("MLII", "V1"), gain=200,
                 zero=1024, checksums=None):
    """``signals`` [n_samples, n_signals] of ADC values -> NNN.hea + NNN.dat (format 212)."""
    n, k = signals.shape
    (folder / f"{name}.dat").write_bytes(encode_212(signals.reshape(-1)))
    lines = [f"{name} {k} 360 {n}"]
    for i in range(k):
        check = checksum16(signals[:, i]) if checksums is None else checksums[i]
        lines.append(f"{name}.dat 212 {gain} 11 {zero} {int(signals[0, i])} {check} 0 "
                     f"{descriptions[i]}")
    lines.append("# synthetic test record")
    (folder / f"{name}.hea").write_text("\r\n".join(lines) + "\r\n")


CODES = {"N": 1, "L": 2, "V": 5, "F": 6, "A": 8, "/": 12, "Q": 13, "+": 28, "~": 14, "f": 38}


def annotation_bytes(events) -> bytes:
    """``events``: (kind, ...) tuples -> MIT-format words, ending with the 0 word.

    ("beat", symbol, increment) -- increment < 1024; ("skip", n) -- a 32-bit increment;
    ("aux", text); ("num", v) / ("sub", v) / ("chn", v).
    """
    words = []
    for ev in events:
        if ev[0] == "beat":
            words.append((CODES[ev[1]] << 10) | ev[2])
        elif ev[0] == "skip":
            n = ev[1] & 0xFFFFFFFF
            words += [59 << 10, n >> 16, n & 0xFFFF]
        elif ev[0] == "aux":
            raw = ev[1].encode()
            words.append((63 << 10) | len(raw))
            raw += b"\0" * (len(raw) % 2)
            words += list(np.frombuffer(raw, "<u2"))
        else:
            words.append(({"num": 60, "sub": 61, "chn": 62}[ev[0]] << 10) | ev[1])
    words.append(0)
    return np.asarray(words, "<u2").tobytes()


# --- format 212 ---------------------------------------------------------------------------


def test_212_decodes_bit_exact_including_negative_12_bit_values(tmp_path):
    rng = np.random.default_rng(0)
    edge = [-2048, -2047, -1, 0, 1, 2047, -1024, 1023, -256, 255]
    values = np.array(edge + rng.integers(-2048, 2048, 90).tolist(), np.int16).reshape(50, 2)
    (tmp_path / "x.dat").write_bytes(encode_212(values.reshape(-1)))
    got = read_212(tmp_path / "x.dat", 2, 50)
    assert got.dtype == np.int16 and got.shape == (50, 2)
    np.testing.assert_array_equal(got, values)
    # a hand-packed triple: -1 (0xFFF) and 0x123 -> bytes FF 1F 23
    (tmp_path / "y.dat").write_bytes(bytes([0xFF, 0x1F, 0x23]))
    np.testing.assert_array_equal(read_212(tmp_path / "y.dat", 1), [[-1], [0x123]])


def test_212_odd_sample_count_and_size_checks(tmp_path):
    values = np.array([5, -5, -2048, 2047, -3], np.int16)
    (tmp_path / "odd.dat").write_bytes(encode_212(values))
    np.testing.assert_array_equal(read_212(tmp_path / "odd.dat", 1, 5)[:, 0], values)
    with pytest.raises(MitdbError, match="odd.dat: wrong size"):
        read_212(tmp_path / "odd.dat", 1, 6)
    with pytest.raises(FileNotFoundError, match="nothere.dat"):
        read_212(tmp_path / "nothere.dat", 1)


def test_read_record_checks_initial_value_and_checksum(tmp_path):
    rng = np.random.default_rng(1)
    sig = rng.integers(-600, 1500, (400, 2)).astype(np.int16)
    write_record(tmp_path, "200", sig)
    adc, header = read_record(tmp_path / "200")
    np.testing.assert_array_equal(adc, sig)
    assert header.n_signals == 2 and header.fs == 360 and header.n_samples == 400
    s = header.signals[0]
    assert (s.fmt, s.gain, s.baseline, s.adc_resolution, s.description) == (212, 200, 1024, 11,
                                                                          "MLII")
    assert read_record(tmp_path / "200.hea")[0].shape == (400, 2)
    write_record(tmp_path, "201", sig, checksums=(checksum16(sig[:, 0]) + 1, 0))
    with pytest.raises(MitdbError, match="201.hea.*checksum.*corrupt"):
        read_record(tmp_path / "201")
    assert read_record(tmp_path / "201", verify=False)[0].shape == (400, 2)
    # a .dat that does not match its header: wrong first sample
    write_record(tmp_path, "202", sig)
    bad = sig.copy()
    bad[0, 0] += 1
    (tmp_path / "202.dat").write_bytes(encode_212(bad.reshape(-1)))
    with pytest.raises(MitdbError, match="initial value"):
        read_record(tmp_path / "202")
    (tmp_path / "202.dat").write_bytes(encode_212(sig.reshape(-1))[:-3])
    with pytest.raises(MitdbError, match="wrong size"):
        read_record(tmp_path / "202")


def test_header_errors_name_the_file(tmp_path):
    (tmp_path / "a.hea").write_text("a 2 360\n")
    with pytest.raises(MitdbError, match="a.hea.*n_samples"):
        read_header(tmp_path / "a.hea")
    (tmp_path / "b.hea").write_text("b 2 360 100\nb.dat 212 200 11 1024 0 0 0 MLII\n")
    with pytest.raises(MitdbError, match="b.hea.*2 signals.*1 signal lines"):
        read_header(tmp_path / "b.hea")
    (tmp_path / "c.hea").write_text("c 1 360 100\nc.dat 212 200 11 zero 0 0 0 MLII\n")
    with pytest.raises(MitdbError, match="c.hea.*adc_zero"):
        read_header(tmp_path / "c.hea")
    with pytest.raises(FileNotFoundError, match="d.hea"):
        read_header(tmp_path / "d.hea")


def test_header_baseline_in_parentheses(tmp_path):
    (tmp_path / "e.hea").write_text("e 1 250 10\ne.dat 212 100(-5)/mV 12 0 3 7 0 ECG\n")
    s = read_header(tmp_path / "e.hea").signals[0]
    assert (s.gain, s.baseline, s.adc_zero, s.initial_value, s.checksum) == (100, -5, 0, 3, 7)


# --- annotations --------------------------------------------------------------------------


def test_annotations_parse_skip_aux_num_and_non_beats(tmp_path):
    events = [("beat", "N", 100), ("aux", "(AFL"), ("beat", "+", 0), ("num", 3),
              ("beat", "V", 1023), ("skip", 70000), ("beat", "A", 5), ("sub", 1),
              ("chn", 0), ("aux", "odd"), ("beat", "/", 12), ("beat", "~", 1)]
    (tmp_path / "r.atr").write_bytes(annotation_bytes(events))
    sample, symbol = read_annotations(tmp_path / "r.atr")
    assert symbol.tolist() == ["N", "+", "V", "A", "/", "~"]
    assert sample.tolist() == [100, 100, 1123, 1123 + 70000 + 5, 71140, 71141]


def test_annotation_errors(tmp_path):
    (tmp_path / "odd.atr").write_bytes(b"\x01")
    with pytest.raises(MitdbError, match="odd.atr.*odd length"):
        read_annotations(tmp_path / "odd.atr")
    (tmp_path / "code.atr").write_bytes(np.asarray([(50 << 10) | 3, 0], "<u2").tobytes())
    with pytest.raises(MitdbError, match="unknown annotation code 50"):
        read_annotations(tmp_path / "code.atr")
    (tmp_path / "aux.atr").write_bytes(np.asarray([(63 << 10) | 40, 0x4141], "<u2").tobytes())
    with pytest.raises(MitdbError, match="truncated.*AUX"):
        read_annotations(tmp_path / "aux.atr")
    with pytest.raises(FileNotFoundError, match="none.atr"):
        read_annotations(tmp_path / "none.atr")


def test_empty_or_cut_annotation_file_is_an_error_not_fewer_beats(tmp_path):
    """Issue 20 probe 6: an empty or half-truncated .atr used to give fewer beats silently."""
    full = annotation_bytes([("beat", "N", 100), ("beat", "F", 50), ("aux", "(N"),
                             ("beat", "V", 70), ("beat", "F", 30)])
    (tmp_path / "ok.atr").write_bytes(full)
    assert read_annotations(tmp_path / "ok.atr")[1].tolist() == ["N", "F", "V", "F"]
    (tmp_path / "empty.atr").write_bytes(b"")
    with pytest.raises(MitdbError, match="empty.atr: empty annotation file"):
        read_annotations(tmp_path / "empty.atr")
    (tmp_path / "cut.atr").write_bytes(full[:8])  # N, F, the AUX word and its text
    with pytest.raises(MitdbError, match="cut.atr: truncated: no end-of-file word after 2 "):
        read_annotations(tmp_path / "cut.atr")
    # only the end-of-file word: a valid file with no annotations
    (tmp_path / "none.atr").write_bytes(b"\0\0")
    assert read_annotations(tmp_path / "none.atr")[0].size == 0


def test_split_refuses_a_cut_annotation_file(tmp_path):
    names = _synthetic_db(tmp_path)
    atr = tmp_path / f"{names[1]}.atr"
    atr.write_bytes(atr.read_bytes()[:atr.stat().st_size // 4 * 2])
    with pytest.raises(MitdbError, match=f"{names[1]}.atr: truncated"):
        mitbih_split(tmp_path, records=names, balance=False, window=40, before=15)
    atr.write_bytes(b"")
    with pytest.raises(MitdbError, match=f"{names[1]}.atr: empty"):
        mitbih_split(tmp_path, records=names, balance=False, window=40, before=15)


def _sha256sums(folder, names):
    import hashlib

    lines = [f"{hashlib.sha256((folder / n).read_bytes()).hexdigest()} {n}" for n in names]
    (folder / "SHA256SUMS.txt").write_text("\n".join(lines) + "\n")


def test_swapped_frames_pass_the_checksum_but_not_the_sha256_list(tmp_path):
    """Issue 20 probe 6: two swapped 3-byte frames keep WFDB's 16-bit sum; PhysioNet's
    SHA256SUMS.txt beside the record catches them."""
    rng = np.random.default_rng(2)
    sig = rng.integers(-600, 1500, (400, 2)).astype(np.int16)
    write_record(tmp_path, "300", sig)
    (tmp_path / "300.atr").write_bytes(annotation_bytes([("beat", "N", 100)]))
    _sha256sums(tmp_path, ["300.hea", "300.dat", "300.atr"])
    assert verify_sha256(tmp_path / "300.dat") and not verify_sha256(tmp_path / "other.dat")
    np.testing.assert_array_equal(read_record(tmp_path / "300")[0], sig)
    raw = bytearray((tmp_path / "300.dat").read_bytes())
    raw[30:33], raw[60:63] = raw[60:63], raw[30:33]  # frames 10 and 20 (one frame = 3 bytes)
    (tmp_path / "300.dat").write_bytes(bytes(raw))
    with pytest.raises(MitdbError, match="300.dat: SHA-256 .* does not match"):
        read_record(tmp_path / "300")
    adc, _ = read_record(tmp_path / "300", verify=False)
    assert not np.array_equal(adc, sig)
    np.testing.assert_array_equal(adc[[10, 20]], sig[[20, 10]])
    (tmp_path / "SHA256SUMS.txt").unlink()  # without the list the swap is invisible:
    np.testing.assert_array_equal(read_record(tmp_path / "300")[0], adc)  # the sum still holds
    _sha256sums(tmp_path, ["300.atr"])
    (tmp_path / "300.atr").write_bytes(annotation_bytes([("beat", "V", 100)]))
    with pytest.raises(MitdbError, match="300.atr: SHA-256"):
        read_annotations(tmp_path / "300.atr")
    assert read_annotations(tmp_path / "300.atr", verify=False)[1].tolist() == ["V"]


# --- beats and the split ------------------------------------------------------------------


def _synthetic_db(folder, n_records=3, n=6000, seed=0):
    """Records r0.. with beats of every AAMI class every 100 samples (+ non-beats)."""
    rng = np.random.default_rng(seed)
    symbols = ["N", "A", "V", "F", "/", "L", "f", "Q"]
    names = []
    for r in range(n_records):
        name = f"90{r}"
        names.append(name)
        sig = rng.integers(-500, 500, (n, 2)).astype(np.int16)
        write_record(folder, name, sig, descriptions=("V5", "MLII") if r == 0 else ("MLII", "V1"))
        events = [("beat", "N", 10)]                      # too close to the start: dropped
        for i in range(1, n // 100 - 1):
            events.append(("beat", symbols[(i + r) % len(symbols)], 100 if i > 1 else 90))
            if i % 7 == 0:
                events.append(("beat", "+", 0))           # rhythm change: not a beat
        events.append(("beat", "V", n - 30 - (n // 100 - 2) * 100))  # too close to the end
        (folder / f"{name}.atr").write_bytes(annotation_bytes(events))
    return names


def test_beats_are_windows_of_the_lead_with_aami_labels(tmp_path):
    names = _synthetic_db(tmp_path)
    beats = load_mitdb_beats(tmp_path, records=names, window=40, before=15, normalize="mv")
    for rec in names:
        adc, _ = read_record(tmp_path / rec)
        lead = 1 if rec == names[0] else 0                # r0 stores MLII as channel 1
        sample, symbol = read_annotations(tmp_path / f"{rec}.atr")
        keep = np.array([s in AAMI_MAP for s in symbol]) & (sample >= 15) & (sample + 25 <= 6000)
        on = beats.record == rec
        np.testing.assert_array_equal(beats.sample[on], sample[keep])
        assert beats.symbol[on].tolist() == symbol[keep].tolist()
        assert beats.y[on].tolist() == [AAMI_MAP[s] for s in symbol[keep]]
        for x, s in zip(beats.x[on][:5], beats.sample[on][:5]):
            np.testing.assert_allclose(x, (adc[s - 15:s + 25, lead] - 1024) / 200, rtol=1e-6)
    assert beats.x.dtype == np.float32 and beats.x.shape[1] == 40
    assert "+" not in beats.symbol.tolist()
    z = load_mitdb_beats(tmp_path, records=names, window=40, before=15).x
    np.testing.assert_allclose(z.mean(1), 0, atol=1e-5)
    np.testing.assert_allclose(z.std(1), 1, atol=1e-3)


def test_aami_map_covers_the_five_classes():
    assert AAMI_CLASSES == ("N", "S", "V", "F", "Q")
    assert {AAMI_CLASSES[c] for c in AAMI_MAP.values()} == set(AAMI_CLASSES)
    assert [AAMI_MAP[s] for s in "NLReSAaJVEF/fQ"] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 4, 4, 4]
    assert not {"+", "~", "|", "!", "x", '"'} & set(AAMI_MAP)


def test_split_is_balanced_stratified_and_seeded(tmp_path):
    names = _synthetic_db(tmp_path)
    beats = load_mitdb_beats(tmp_path, records=names, window=40, before=15)
    counts = np.bincount(beats.y, minlength=5)
    xtr, ytr, xte, yte = mitbih_split(beats=beats, seed=3, test_fraction=0.25)
    k = counts.min()
    assert np.bincount(ytr, minlength=5).tolist() == [k - round(k * 0.25)] * 5
    assert np.bincount(yte, minlength=5).tolist() == [round(k * 0.25)] * 5
    again = mitbih_split(beats=beats, seed=3, test_fraction=0.25)
    for a, b in zip((xtr, ytr, xte, yte), again):
        np.testing.assert_array_equal(a, b)
    other = mitbih_split(beats=beats, seed=4, test_fraction=0.25)
    assert not np.array_equal(other[0], xtr)
    # train and test are disjoint beats
    rows = {r.tobytes() for r in xtr}
    assert not any(r.tobytes() in rows for r in xte)
    _, y5, _, _ = mitbih_split(beats=beats, per_class=5, test_fraction=0.2)
    assert np.bincount(y5).tolist() == [4] * 5
    _, yall, _, yteall = mitbih_split(beats=beats, balance=False)
    assert (np.bincount(yall, minlength=5) + np.bincount(yteall, minlength=5)).tolist() == \
        counts.tolist()


def test_inter_patient_split_keeps_records_apart(tmp_path):
    names = _synthetic_db(tmp_path, n_records=4)
    beats = load_mitdb_beats(tmp_path, records=names, window=40, before=15)
    xtr, ytr, xte, yte = mitbih_split(beats=beats, test_records=[names[3]])
    test_rows = {r.tobytes() for r in beats.x[beats.record == names[3]]}
    assert all(r.tobytes() in test_rows for r in xte)
    assert not any(r.tobytes() in test_rows for r in xtr)
    assert len(set(np.bincount(ytr).tolist())) == 1 and len(set(np.bincount(yte).tolist())) == 1
    with pytest.raises(ValueError, match="not among the loaded records"):
        mitbih_split(beats=beats, test_records=["999"])


def test_split_and_loader_bad_arguments(tmp_path):
    names = _synthetic_db(tmp_path, n_records=1)
    beats = load_mitdb_beats(tmp_path, records=names, window=40, before=15)
    keep = beats.y != 3                                    # drop every F beat
    no_f = type(beats)(beats.x[keep], beats.y[keep], beats.record[keep], beats.symbol[keep],
                       beats.sample[keep])
    with pytest.raises(ValueError, match=r"\['F'\] have no beats"):
        mitbih_split(beats=no_f)
    with pytest.raises(ValueError, match="per_class=1000"):
        mitbih_split(beats=beats, per_class=1000)
    for kw, match in [(dict(seed=-1), "seed"), (dict(test_fraction=1.0), "test_fraction"),
                      (dict(per_class=1), "per_class")]:
        with pytest.raises(ValueError, match=match):
            mitbih_split(beats=beats, **kw)
    for kw, match in [(dict(window=0), "window"), (dict(before=40), "before"),
                      (dict(normalize="minmax"), "normalize"), (dict(records=[]), "records")]:
        with pytest.raises(ValueError, match=match):
            load_mitdb_beats(tmp_path, **{"records": names, "window": 40, "before": 15, **kw})


def test_missing_files_are_named_and_nothing_is_downloaded(tmp_path, monkeypatch):
    names = _synthetic_db(tmp_path, n_records=1)
    (tmp_path / f"{names[0]}.atr").unlink()
    with pytest.raises(FileNotFoundError) as info:
        load_mitdb_beats(tmp_path, records=names)
    msg = str(info.value)
    assert f"{names[0]}.atr" in msg and "root=" in msg and "never downloads" in msg
    monkeypatch.setattr("bpfree.data.paths.candidate_roots", lambda kind: [tmp_path / "none"])
    with pytest.raises(FileNotFoundError, match="BPFREE_DATA"):
        load_mitdb_beats()


# --- the real database --------------------------------------------------------------------

RECORD_FILES = tuple(f"{r}.{e}" for r in MITDB_RECORDS for e in ("hea", "dat", "atr"))


def test_real_record_100():
    root = require_data_root("mitdb", ("100.hea", "100.dat", "100.atr"))
    adc, header = read_record(root / "100")          # verifies initial values and checksums
    assert adc.shape == (650000, 2) and header.fs == 360
    assert [s.description for s in header.signals] == ["MLII", "V5"]
    assert adc[0].tolist() == [995, 1011]            # the header's initial values
    sample, symbol = read_annotations(root / "100.atr")
    assert len(symbol) == 2274                       # 2273 beats + one rhythm annotation
    beats = [s for s in symbol if s in AAMI_MAP]
    assert len(beats) == 2273
    assert {s: beats.count(s) for s in set(beats)} == {"N": 2239, "A": 33, "V": 1}
    assert np.all(np.diff(sample) >= 0) and sample[-1] < 650000


def test_real_record_with_swapped_frames_is_refused(tmp_path):
    root = require_data_root("mitdb", ("208.hea", "208.dat", "208.atr", "SHA256SUMS.txt"))
    for ext in ("hea", "dat", "atr"):
        (tmp_path / f"208.{ext}").write_bytes((root / f"208.{ext}").read_bytes())
    (tmp_path / "SHA256SUMS.txt").write_bytes((root / "SHA256SUMS.txt").read_bytes())
    raw = bytearray((tmp_path / "208.dat").read_bytes())
    a, b = slice(3 * 1000, 3 * 1001), slice(3 * 100_000, 3 * 100_001)  # frames 1000, 100000
    assert raw[a] != raw[b]
    raw[a], raw[b] = raw[b], raw[a]
    (tmp_path / "208.dat").write_bytes(bytes(raw))
    with pytest.raises(MitdbError, match="208.dat: SHA-256"):
        read_record(tmp_path / "208")


def test_reader_agrees_with_wfdb_record_for_record():
    """Every record's samples (ADC units) and every annotation's sample and symbol equal
    PhysioNet's own reader's (wfdb, a dev dependency; see bpfree.data.mitdb on why it is not
    the library's reader)."""
    wfdb = pytest.importorskip("wfdb", reason="wfdb (dev extra) is not installed")
    root = require_data_root("mitdb", RECORD_FILES)
    for rec in MITDB_RECORDS:
        adc, header = read_record(root / rec)
        theirs = wfdb.rdrecord(str(root / rec), physical=False)
        np.testing.assert_array_equal(adc, theirs.d_signal, err_msg=rec)
        assert [s.description for s in header.signals] == theirs.sig_name, rec
        assert [s.gain for s in header.signals] == list(theirs.adc_gain), rec
        assert [s.checksum for s in header.signals] == list(theirs.checksum), rec
        sample, symbol = read_annotations(root / f"{rec}.atr")
        ann = wfdb.rdann(str(root / rec), "atr")
        np.testing.assert_array_equal(sample, ann.sample, err_msg=rec)
        assert symbol.tolist() == list(ann.symbol), rec


def test_real_database_beats_and_benchmark_split():
    root = require_data_root("mitdb", RECORD_FILES)
    beats = load_mitdb_beats(root)
    # the database's beat counts (N 90,631, S 2,781, V 7,236, F 803, Q 8,043) less the beats
    # too close to a record's ends for a 168-sample window
    assert np.bincount(beats.y).tolist() == [90612, 2781, 7235, 802, 8043]
    x, y, xt, yt = mitbih_split(beats=beats)
    assert x.shape == (3210, 168) and xt.shape == (800, 168)
    assert np.bincount(y).tolist() == [642] * 5 and np.bincount(yt).tolist() == [160] * 5
