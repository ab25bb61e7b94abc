"""Issue 34, the ``.tflite`` reader against hostile files: each structural finding reproduced
with a hand-made file, then fixed-seed single-bit-flip fuzzing of a converter-style CNN whose
every outcome must be a :class:`TFLiteFormatError` or a model that runs, in a child process
under a 1 GiB address-space cap."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bpfree.bench.environment import git_state
from bpfree import tflite as bt
from bpfree.quant.params import TensorQuant
from bpfree.tflite import writer
from bpfree.tflite.reader import MAX_FILE_BYTES
from bpfree.tflite.schema import tflite
from bpfree.tflite.writer import _Graph, _Op, _options, _serialize

T, O, B = tflite.TensorType, tflite.BuiltinOperator, tflite.BuiltinOptions
Q_IN, Q_OUT = TensorQuant(0.02, 3), TensorQuant(0.05, -7)


def conv_file(*, x_shape=(1, 8, 8, 4), w_shape=(4, 3, 3, 4), y_shape=(1, 8, 8, 4),
              padding=tflite.Padding.SAME, stride=(1, 1), dilation=(1, 1), depthwise=False,
              bias_scale=None, inputs=None, pads=None, softmax_beta=None,
              activation_data=False, version=None) -> bytes:
    """A one-convolution graph (optionally a PAD before it, a RESHAPE + SOFTMAX after it) whose
    every field can be set to a value a bit flip or an editor could produce."""
    rng = np.random.default_rng(0)
    g = _Graph()
    x = g.activation(x_shape if pads is None else
                     (1, x_shape[1] - sum(pads[1]), x_shape[2] - sum(pads[2]), x_shape[3]),
                     Q_IN, "x")
    conv_in = x
    if pads is not None:
        conv_in = g.activation(x_shape, Q_IN, "padded")
        g.ops.append(_Op(O.PAD, [x, g.int32(np.array(pads), "paddings")], [conv_in],
                         B.PadOptions, _options("PadOptions")))
    out_c = w_shape[3] if depthwise else w_shape[0]
    w_count = int(np.prod([max(d, 0) for d in w_shape]))
    w = g.const(rng.integers(-127, 128, min(w_count, 1 << 16)).astype(np.int8), T.INT8, "w",
                (0.01,), (0,))
    g.tensors[w].shape = tuple(w_shape)
    scale = Q_IN.scale * 0.01 if bias_scale is None else bias_scale
    b = g.const(rng.integers(-100, 100, out_c).astype("<i4"), T.INT32, "b", (scale,), (0,))
    y = g.activation(y_shape, Q_OUT, "y")
    if activation_data:
        g.tensors[y].data = bytes(int(np.prod(y_shape)))
    kind = "DepthwiseConv2DOptions" if depthwise else "Conv2DOptions"
    extra = {"depth_multiplier": out_c // x_shape[3]} if depthwise else {}
    g.ops.append(_Op(O.DEPTHWISE_CONV_2D if depthwise else O.CONV_2D,
                     inputs if inputs is not None else [conv_in, w, b], [y],
                     getattr(B, kind),
                     _options(kind, padding=padding, stride_h=stride[0], stride_w=stride[1],
                              dilation_h_factor=dilation[0], dilation_w_factor=dilation[1],
                              **extra)))
    out = y
    if softmax_beta is not None:
        flat = g.activation((1, int(np.prod(y_shape[1:]))), Q_OUT, "flat")
        g.ops.append(_Op(O.RESHAPE, [y], [flat], B.ReshapeOptions,
                         _options("ReshapeOptions", new_shape=[1, -1])))
        out = g.activation((1, int(np.prod(y_shape[1:]))), TensorQuant(1 / 256, -128), "p")
        g.ops.append(_Op(O.SOFTMAX, [flat], [out], B.SoftmaxOptions,
                         _options("SoftmaxOptions", beta=softmax_beta)))
    if version is None:
        return _serialize(g, x, out)
    saved, writer.SCHEMA_VERSION = writer.SCHEMA_VERSION, version
    try:
        return _serialize(g, x, out)
    finally:
        writer.SCHEMA_VERSION = saved


def test_the_reference_file_loads_and_runs():
    for kw in ({}, {"softmax_beta": 1.0}, {"depthwise": True, "w_shape": (1, 3, 3, 8),
                                           "y_shape": (1, 8, 8, 8)},
               {"pads": [[0, 0], [1, 1], [1, 1], [0, 0]], "padding": tflite.Padding.VALID,
                "x_shape": (1, 10, 10, 4)}):
        model = bt.from_bytes(conv_file(**kw))
        model(torch.zeros(2, *model.input_shape, dtype=torch.int8))


@pytest.mark.parametrize("kw, match", [
    # memory blow-ups: a dilation of 131072 (byte 1570 bit 0 of the file), PAD 20000
    ({"dilation": (131072, 1)}, r"operator 0 \(CONV_2D\).*dilation H 131072 must lie in"),
    ({"depthwise": True, "w_shape": (1, 3, 3, 4), "dilation": (1, 131072)},
     r"DEPTHWISE_CONV_2D.*dilation W 131072"),
    ({"dilation": (2048, 2048)}, r"3x3 kernel dilated by \(2048, 2048\) pads the 8x8 input to "
                                 r"4104x4104, more than"),
    ({"pads": [[0, 0], [20000, 20000], [20000, 20000], [0, 0]], "x_shape": (1, 40008, 40008, 4),
      "padding": tflite.Padding.VALID},
     r"operator 0 \(PAD\).*(more than the|must lie in)"),
    # ZeroDivisionError before: stride 0 with SAME padding, 0 input channels
    ({"stride": (0, 1)}, r"operator 0 \(CONV_2D\).*stride H 0 must lie in \[1"),
    ({"x_shape": (1, 8, 8, 0)}, r"operator 0 \(CONV_2D\) on tensor 0 'x'.*dimension below 1"),
    # negative tensor indices wrapped around (-5 aliased tensor 2)
    ({"inputs": [0, -5, 2]}, r"operator 0 \(CONV_2D\): input 1: tensor index -5 is out of"),
    ({"inputs": [-1, 1, 2]}, r"input 0: tensor index -1 is out of range"),
    # declared shapes never checked
    ({"y_shape": (1, -8, 8, 4)}, r"on tensor 3 'y': declared shape .* dimension below 1"),
    ({"y_shape": (1, 8, 8, 2**31 - 1)}, r"'y': declared shape .* elements, more than"),
    ({"w_shape": (4, 3, 3, 3)}, r"weights \(4, 3, 3, 3\) take 3 input channels"),
    ({"y_shape": (1, 8, 8, 5)}, r"'y'.*declared output shape \(1, 8, 8, 5\), but the operator "
                                r"computes \(1, 8, 8, 4\)"),
    ({"y_shape": (1, 4, 4, 4)}, r"declared output shape \(1, 4, 4, 4\)"),
    # enums and values accepted before
    ({"padding": 7}, r"operator 0 \(CONV_2D\).*padding code 7 is not SAME"),
    ({"version": 99}, r"schema version 99"),
    ({"softmax_beta": float("inf")}, r"\(SOFTMAX\).*beta inf must be a finite"),
    ({"softmax_beta": float("nan")}, r"\(SOFTMAX\).*beta nan must be a finite"),
    ({"bias_scale": float("nan")}, r"on tensor 2 'b': quantization scales must be finite"),
    ({"activation_data": True}, r"on tensor 3 'y': an activation .* must not hold constant"),
])
def test_each_structural_finding_is_a_format_error_naming_the_operator(kw, match):
    with pytest.raises(bt.TFLiteFormatError, match=match):
        bt.from_bytes(conv_file(**kw))


@pytest.mark.parametrize("kw, names", [
    ({"depthwise": True, "w_shape": (1, 3, 3, 4), "dilation": (131072, 1)},
     ["operator 0 (DEPTHWISE_CONV_2D)", "131072"]),
    ({"pads": [[0, 0], [20000, 20000], [20000, 20000], [0, 0]], "x_shape": (1, 40008, 40008, 4),
      "padding": tflite.Padding.VALID}, ["operator 0 (PAD)"]),
    ({"stride": (0, 1)}, ["operator 0 (CONV_2D)", "stride H 0"]),
])
def test_adapt_exits_1_with_one_line_naming_the_operator(tmp_path, capsys, kw, names):
    """The issue's blow-ups and ZeroDivisionError through the CLI: exit 1, one line, no file."""
    from bpfree.cli import main

    (tmp_path / "m.tflite").write_bytes(conv_file(**kw))
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 8, 8, 4), np.float32), y=np.zeros(4, np.int64))
    rc = main(["adapt", str(tmp_path / "m.tflite"), "--data", str(tmp_path / "d.npz"), "--out",
               str(tmp_path / "o.tflite"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1, err
    assert all(n in err for n in names) and "Traceback" not in err, err
    assert not (tmp_path / "o.tflite").exists()


def test_huge_fifo_and_directory_files_are_refused_before_reading(tmp_path):
    huge = tmp_path / "huge.tflite"
    with open(huge, "wb") as f:  # sparse: 3 GiB declared, nothing written
        f.truncate(3 << 30)
    assert huge.stat().st_size > MAX_FILE_BYTES
    with pytest.raises(bt.TFLiteFormatError, match="MiB; bpfree loads .tflite files of at most"):
        bt.load(huge)
    fifo = tmp_path / "fifo.tflite"
    os.mkfifo(fifo)
    with pytest.raises(bt.TFLiteFormatError, match="not a regular file"):
        bt.load(fifo)
    with pytest.raises(bt.TFLiteFormatError, match="is a directory"):
        bt.load(tmp_path)
    with pytest.raises(FileNotFoundError):
        bt.load(tmp_path / "missing.tflite")


# ------------------------------------------------------------------------------- fuzzing

#: A small int8 CNN made by TensorFlow's TFLite converter (tests/data/make_converter_cnn.py):
#: a stride-2 conv, an inverted-residual block with its ADD, MEAN, a dense classifier.
CONVERTER_CNN = Path(__file__).parent / "data" / "converter_cnn.tflite"

#: Files the fuzz mutates: an expression the child evaluates to the file's bytes.
SOURCES = {
    "converter-made CNN": f"Path({str(CONVERTER_CNN)!r}).read_bytes()",
    "converter-style CNN": "converter_style_file(0)",
    # bpfree's own writer; its flatbuffer holds 0.7 MB of weights, so its mutants are drawn
    # from the structure (everything but the buffers' data): flips in weights only load
    "MCUNet-in1": "mcunet_in1_file()",
}

FUZZ_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import numpy as np, torch
from bpfree import tflite as bt
from test_tflite import converter_style_file
from test_tflite_fuzz import mcunet_in1_file, structure_bits

torch.set_num_threads(1)
data = {source}
rng = np.random.default_rng({seed})
pool = structure_bits(data) if {structure} else np.arange(len(data) * 8)
bits = rng.choice(pool, size=min({count}, len(pool)), replace=False)[{part}::{parts}]
counts = {{"format_error": 0, "runs": 0}}
bad = []
start = time.perf_counter()
for bit in bits.tolist():
    mutant = bytearray(data)
    mutant[bit // 8] ^= 1 << (bit % 8)
    try:
        model = bt.from_bytes(bytes(mutant))
    except bt.TFLiteFormatError:
        counts["format_error"] += 1
        continue
    except BaseException as err:
        bad.append([bit, "load", f"{{type(err).__name__}}: {{err}}"[:300]])
        continue
    try:
        with torch.no_grad():
            model(torch.zeros(2, *model.input_shape, dtype=torch.int8))
        counts["runs"] += 1
    except BaseException as err:
        bad.append([bit, "run", f"{{type(err).__name__}}: {{err}}"[:300]])
print(json.dumps({{"bytes": len(data), "counts": counts, "bad": bad,
                  "seconds": time.perf_counter() - start,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""

#: The address-space cap of the fuzzing child (the issue's bound).
FUZZ_MEMORY_CAP = 1 << 30


def mcunet_in1_file() -> bytes:
    """The bundled MCUNet-in1 as bpfree saves it (LiteRT's kernel rules, 128x128 input)."""
    from bpfree.models.mcunet import mcunet_in1

    model = mcunet_in1()
    bt.use_litert_kernels(model)
    return bt.to_bytes(model, (3, 128, 128))


def structure_bits(data: bytes) -> np.ndarray:
    """Bit positions of ``data`` outside its buffers' data (weights, biases, constants)."""
    model = tflite.Model.GetRootAsModel(data, 0)
    keep = np.ones(len(data), dtype=bool)
    for i in range(model.BuffersLength()):
        buf = model.Buffers(i)
        field = buf._tab.Offset(4)  # Buffer.data, a [ubyte] vector
        if field:
            start = buf._tab.Vector(field)
            keep[start:start + buf.DataLength()] = False
    byte = np.flatnonzero(keep)
    return (byte[:, None] * 8 + np.arange(8)).reshape(-1)


def fuzz(count: int, seed: int, source: str = "converter-made CNN", *,
         structure: bool = False, workers: int = 1, timeout: int = 600) -> dict:
    """Flip ``count`` distinct single bits (``seed`` picks them; ``structure``: outside the
    buffers' data only) of the file ``SOURCES[source]``, split over ``workers`` children run
    side by side, each capped at :data:`FUZZ_MEMORY_CAP`; their summed summary."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (FUZZ_MEMORY_CAP, FUZZ_MEMORY_CAP))

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    children = [subprocess.Popen(
        [sys.executable, "-c", FUZZ_CHILD.format(
            tests=str(Path(__file__).parent), source=SOURCES[source], seed=seed, count=count,
            structure=structure, part=part, parts=workers)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=cap, env=env)
        for part in range(workers)]
    try:
        outputs = [child.communicate(timeout=timeout) + (child.returncode,)
                   for child in children]
    finally:
        for child in children:
            child.kill()  # a no-op for a child that has ended
    for _, err, rc in outputs:
        assert rc == 0, err[-3000:]
    parts = [json.loads(out.strip().splitlines()[-1]) for out, _, _ in outputs]
    return {"bytes": parts[0]["bytes"], "bad": [b for r in parts for b in r["bad"]],
            "counts": {k: sum(r["counts"][k] for r in parts) for k in parts[0]["counts"]},
            "seconds": max(r["seconds"] for r in parts),
            "peak_mib": max(r["peak_mib"] for r in parts)}


def test_the_converter_made_file_loads_and_matches_litert():
    from bpfree.tflite.oracle import litert_available, run_litert

    model = bt.load(CONVERTER_CNN)
    kinds = [type(m).__name__ for m in model.modules()]
    assert {"QConv2d", "QInvertedResidual", "QAdd", "QGlobalAvgPool2d"} <= set(kinds), kinds
    assert any(m.groups > 1 for m in model.modules() if type(m).__name__ == "QConv2d")
    if litert_available():
        x = torch.randint(-128, 128, (1, *model.input_shape), dtype=torch.int8,
                          generator=torch.Generator().manual_seed(0))
        np.testing.assert_array_equal(run_litert(CONVERTER_CNN.read_bytes(), x).reshape(1, -1),
                                      model.forward_int(x).numpy())


def test_structure_bits_skip_exactly_the_buffers():
    data = CONVERTER_CNN.read_bytes()
    bits = structure_bits(data)
    assert len(bits) % 8 == 0 and len(np.unique(bits)) == len(bits)
    model = tflite.Model.GetRootAsModel(data, 0)
    buffers = sum(model.Buffers(i).DataLength() for i in range(model.BuffersLength()))
    assert len(data) * 8 - len(bits) == 8 * buffers
    loaded = bt.load(CONVERTER_CNN)  # the buffers hold at least every int8 weight
    assert buffers >= sum(m.weight.numel() for m in loaded.modules() if hasattr(m, "weight"))


@pytest.mark.parametrize("source", ["converter-made CNN", "converter-style CNN"])
def test_single_bit_flips_give_a_format_error_or_a_model_that_runs(source):
    result = fuzz(count=150, seed=34, source=source)
    assert result["bad"] == [], result["bad"][:10]
    counts = result["counts"]
    assert counts["format_error"] > 15 and counts["runs"] > 30, counts  # both outcomes occur


def _record(name: str, results: list[dict], **extra) -> dict:
    """Summed outcomes of ``results``; written to ``$BPFREE_FUZZ_RESULTS`` (a JSON file that
    collects one entry per run) when that is set, so a run's counts can be kept."""
    summary = {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               # results/ does not count as dirty (bench's rule): a first run's counts
               # written there must not mark the next run's revision dirty.
               "git_revision": git_state(Path(__file__).parent)[0],
               "dirty": git_state(Path(__file__).parent)[1],
               "mutants": sum(sum(r["counts"].values()) + len(r["bad"]) for r in results),
               "loads_and_runs": sum(r["counts"]["runs"] for r in results),
               "format_errors": sum(r["counts"]["format_error"] for r in results),
               "other": sum(len(r["bad"]) for r in results),
               "bad": [b for r in results for b in r["bad"]][:20],
               "file_bytes": results[0]["bytes"],
               "seconds": round(sum(r["seconds"] for r in results), 1),  # wall
               "peak_rss_mib": round(max(r["peak_mib"] for r in results), 1),
               "address_space_cap_mib": FUZZ_MEMORY_CAP >> 20, **extra}
    print(f"\n{name}: {json.dumps(summary)}")
    target = os.environ.get("BPFREE_FUZZ_RESULTS")
    if target:
        path = Path(target)
        runs = json.loads(path.read_text()) if path.exists() else {}
        runs[name] = summary
        path.write_text(json.dumps(runs, indent=2) + "\n")
    return summary


@pytest.mark.slow
def test_ten_thousand_single_bit_flips_of_a_converter_made_cnn_under_a_1_gib_cap():
    """The issue's 'Done when': 10,000 distinct single-bit mutants of a converter-made CNN,
    each a clean load that runs or a TFLiteFormatError, in a child capped at 1 GiB."""
    result = fuzz(count=10_000, seed=34, workers=4, timeout=3600)
    summary = _record("converter-made CNN, 10,000 single-bit flips", [result])
    assert summary["mutants"] == 10_000
    assert summary["other"] == 0, summary["bad"][:10]


@pytest.mark.slow
def test_single_bit_flips_of_mcunet_in1_structure_under_a_1_gib_cap():
    """MCUNet-in1 (0.8 MB; about 3 s a mutant): 100 flips of its structure bytes."""
    result = fuzz(count=100, seed=34, source="MCUNet-in1", structure=True, workers=2,
                  timeout=1800)
    summary = _record("MCUNet-in1, 100 single-bit flips of the structure", [result])
    assert summary["mutants"] == 100 and summary["other"] == 0, summary["bad"][:10]
