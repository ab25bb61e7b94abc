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
from pathlib import Path

import numpy as np
import pytest
import torch

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

FUZZ_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {tests!r})
import numpy as np, torch
from bpfree import tflite as bt
from test_tflite import converter_style_file

torch.set_num_threads(1)
data = converter_style_file({file_seed})
rng = np.random.default_rng({seed})
bits = rng.choice(len(data) * 8, size=min({count}, len(data) * 8), replace=False)
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
print(json.dumps({{"counts": counts, "bad": bad, "seconds": time.perf_counter() - start,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""

#: The address-space cap of the fuzzing child (the issue's bound).
FUZZ_MEMORY_CAP = 1 << 30


def fuzz(count: int, seed: int, file_seed: int = 0, timeout: int = 600) -> dict:
    """Flip ``count`` distinct single bits (``seed`` picks them) of ``converter_style_file``
    in a child capped at :data:`FUZZ_MEMORY_CAP`; its summary."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (FUZZ_MEMORY_CAP, FUZZ_MEMORY_CAP))

    code = FUZZ_CHILD.format(tests=str(Path(__file__).parent), file_seed=file_seed, seed=seed,
                             count=count)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          preexec_fn=cap, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_single_bit_flips_give_a_format_error_or_a_model_that_runs():
    result = fuzz(count=150, seed=34)
    assert result["bad"] == [], result["bad"][:10]
    counts = result["counts"]
    assert counts["format_error"] > 30 and counts["runs"] > 30, counts  # both outcomes occur


@pytest.mark.slow
def test_ten_thousand_single_bit_flips_under_a_1_gib_cap():
    bad, counts = [], {"format_error": 0, "runs": 0}
    for file_seed in (0, 1, 2):  # three weight draws; 10,000 distinct flips in all
        result = fuzz(count=3334, seed=file_seed, file_seed=file_seed, timeout=1800)
        bad += result["bad"]
        for k in counts:
            counts[k] += result["counts"][k]
    assert sum(counts.values()) + len(bad) >= 10_000
    assert bad == [], bad[:10]
