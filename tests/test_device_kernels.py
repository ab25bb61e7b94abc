"""The device runtime's fast int8 kernels (issue 33) against the integer model, bit for bit.

A small model exercises every kernel path of ``bpfree_runtime.c``: the im2col GEMM for a
strided 3x3 convolution (a 3x3 one on the M7's int8 rows), a pointwise and a strided 1x1 one, and the fully connected head
(odd channel counts, odd column blocks); depthwise 5x5/s2, 7x7/s1 (unrolled instances) and
3x1 (the general instance); the direct loops of a dilated depthwise and a grouped
convolution. Its requantization constants are then edited so that every form of the
requantization runs: the one-SMLAL form with the int8 clamp (one SSAT) and with a narrower
clamp, right shifts of 1 and 0, a left shift, a zero multiplier, and a bias too large to
start the accumulator. Host and the emulated Cortex-M7 (SMLAD) must both equal
``forward_int``.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

from bpfree.device import export_c, infer_c
from bpfree.device.lower import kernel_class, lower, macs_by_kernel
from bpfree.device.mcu import kernel_instructions, missing_tools
from bpfree.device.run import _as_int8
from bpfree.pmt import PMTConfig, PMTTrainer
from bpfree.quant import quantize_model
from bpfree.quant.params import ActivationRange

HAS_CC = any(shutil.which(c) for c in ("cc", "gcc", "clang"))
needs_cc = pytest.mark.skipif(not HAS_CC, reason="no C compiler (cc, gcc or clang) on PATH")
MISSING_M7 = missing_tools()
needs_m7 = pytest.mark.skipif(bool(MISSING_M7),
                              reason=f"cortex-m7 toolchain missing: {', '.join(MISSING_M7)}")
SHAPE = (3, 29, 31)


def _zoo_float() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 5, 3, stride=2, padding=1), nn.ReLU6()),  # gemm, conv
        nn.Conv2d(5, 5, 3, padding=1),                                        # conv8 3x3 s1
        nn.Conv2d(5, 5, 5, stride=2, padding=2, groups=5),                    # dw 5x5 s2
        nn.Sequential(nn.Conv2d(5, 7, 1), nn.ReLU()),                         # pointwise
        nn.Conv2d(7, 7, (3, 1), padding=(1, 0), groups=7),                    # dw, general
        nn.Conv2d(7, 7, 3, padding=2, dilation=2, groups=7),                  # dilated: loops
        nn.Conv2d(7, 14, 3, padding=1, groups=7),                             # grouped: loops
        nn.Conv2d(14, 9, 1, stride=2),                                        # strided 1x1
        nn.Conv2d(9, 9, 7, padding=3, groups=9),                              # dw 7x7 s1
        nn.Flatten(), nn.Linear(9 * 4 * 4, 3))                                # linear


def _edit_requantization(model) -> None:
    """Every requantization form of the runtime, on chosen channels and layers."""
    body = model.body
    body[3].range = ActivationRange(-100, 90)  # a narrower clamp: the RQ_FAST instances
    conv = body[0]
    conv.shift[0], conv.shift[1], conv.shift[2] = -1, 0, 1  # r = 1, r = 0, a left shift
    conv.multiplier[3] = 0
    conv.bias[4] = 2**31 - 1000  # too large to start the accumulator
    # the M7's int8-row convolution (four channels at a time, then one): a shift so large
    # that the zero point is added after it, a bias off the fast requantization (inside the
    # group of four), a shift of 0 (the channel left over)
    conv8 = body[1]
    conv8.shift[0], conv8.bias[1], conv8.shift[4] = -30, 2**30, 0
    dw = body[8]
    dw.shift[0], dw.bias[1] = 0, -(2**31) + 5
    head = body[10]
    head.shift[1], head.bias[2] = -1, 2**31 - 7


@pytest.fixture(scope="module")
def zoo():
    torch.manual_seed(1)
    x = torch.randn(24, *SHAPE)
    model = quantize_model(_zoo_float().eval(), x[:16])
    _edit_requantization(model)
    return model, model.input_quant.quantize(x)


def _program(model, xq, tmp_path, target):
    trainer = PMTTrainer(model, PMTConfig(queries=1, seed=3, device_exact=True), example=xq[:2])
    return export_c(trainer, tmp_path / target, target=target, max_batch=8, max_samples=24)


def test_the_zoo_covers_every_kernel_class(zoo):
    model, _ = zoo
    graph = lower(model, SHAPE)
    classes = {kernel_class(graph, op) for op in graph.affine_ops()}
    assert classes == {"conv", "pointwise", "depthwise", "linear"}
    macs = macs_by_kernel(graph)
    # the head sums 144 products for each of 3 outputs; the 1x1 sums 5 for 7 x 8 x 8
    assert macs["linear"] == 3 * 144
    assert macs["pointwise"] == 7 * 8 * 8 * 5


@needs_cc
def test_host_kernels_equal_forward_int(zoo, tmp_path):
    model, xq = zoo
    program = _program(model, xq, tmp_path, "host")
    assert torch.equal(infer_c(program, xq), model.forward_int(xq))


@needs_m7
def test_cortex_m7_kernels_equal_forward_int(zoo, tmp_path):
    model, xq = zoo
    program = _program(model, xq[:8], tmp_path, "cortex-m7")
    assert torch.equal(infer_c(program, xq[:8]), model.forward_int(xq[:8]))


@needs_m7
def test_kernel_instruction_counts_cover_the_inference(zoo, tmp_path):
    from bpfree.device.mcu import infer_emulated

    model, xq = zoo
    program = _program(model, xq[:1], tmp_path, "cortex-m7")
    xs = _as_int8(program, xq[:1])
    per_kernel = kernel_instructions(program, xs)
    _, calls = infer_emulated(program, xs, count_instructions=True)
    assert set(per_kernel) >= {"conv", "pointwise", "depthwise", "linear"}
    assert all(per_kernel[k] > 0 for k in ("conv", "pointwise", "depthwise", "linear"))
    # a separate build (the counter is read around every operator, a tick is 40
    # instructions): the kernels' sum is the whole call's count to within 2 %
    assert abs(sum(per_kernel.values()) - calls[0]) <= 0.02 * calls[0]
