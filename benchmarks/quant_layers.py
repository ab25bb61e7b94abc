"""Speed of bpfree's integer (TFLite int8) layers against float32 layers of the same shapes.

Medians of interleaved repeats on one CPU thread, batch 64: each repeat times the float32
``nn.Module`` and then the ``bpfree.quant`` int8 layer (int8 in, int8 out, bit-exact with the
TFLite reference kernels), so that load drifting on a shared machine hits both alike. Layers:
fully connected, 3x3 convolution, depthwise 3x3, pointwise 1x1 (all with a fused ReLU6), and a
small MobileNet-style CNN (3x3 stride-2 stem, two depthwise-separable blocks, an inverted
residual block with a requantized add, global average pooling, linear) on 1x28x28 inputs —
the PMT setting of a BN-folded depthwise-separable model (PMT §2.1, §4). The issue's target is a
whole-CNN ratio int8/float <= 2. Not a paper table: the "paper" column is empty.
"""

from __future__ import annotations

import statistics
import time

NAME = "quant_layers"
DESCRIPTION = __doc__.split("\n\n")[0].replace("\n", " ")
SEED = 0
BATCH = 64
TABLE = "int8 engine vs float32 (CPU, 1 thread, batch 64)"


def _interleaved_medians(float_fn, int_fn, repeats: int) -> tuple[float, float]:
    """Median seconds of each function, alternating calls after one warm-up each."""
    float_fn()
    int_fn()
    tf, ti = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        float_fn()
        t1 = time.perf_counter()
        int_fn()
        t2 = time.perf_counter()
        tf.append(t1 - t0)
        ti.append(t2 - t1)
    return statistics.median(tf), statistics.median(ti)


def _calibrated(lo: float, hi: float):
    """Asymmetric int8 quantization covering [lo, hi] (with 0 inside, as TFLite requires)."""
    from bpfree.quant import TensorQuant

    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = max(hi - lo, 1e-8) / 255.0
    zero_point = int(round(-128 - lo / scale))
    return TensorQuant(scale, max(-128, min(127, zero_point)))


def _quantize_affine(layer, input_quant, output_quant, activation):
    """Per-channel symmetric int8 weights and int32 bias of a float Conv2d / Linear."""
    import torch

    from bpfree.quant import QConv2d, QLinear

    w = layer.weight.detach()
    w_max = w.abs().reshape(w.shape[0], -1).amax(1).clamp_min(1e-8)
    w_scale = w_max / 127.0
    shape = (-1,) + (1,) * (w.dim() - 1)
    qw = torch.round(w / w_scale.reshape(shape)).clamp(-127, 127).to(torch.int8)
    qb = torch.round(layer.bias.detach() / (input_quant.scale * w_scale)).to(torch.int32)
    common = dict(weight_scale=w_scale, input_quant=input_quant, output_quant=output_quant,
                  activation=activation)
    if isinstance(layer, torch.nn.Linear):
        return QLinear(qw, qb, **common)
    return QConv2d(qw, qb, stride=layer.stride, padding=layer.padding, groups=layer.groups,
                   **common)


def build_models(in_channels: int = 1):
    """(float model, int8 model, float input, int8 input) of the MobileNet-style CNN."""
    import torch
    from torch import nn

    from bpfree.quant import QAdd, QGlobalAvgPool2d, TensorQuant

    class FloatNet(nn.Module):
        def __init__(self):
            super().__init__()
            c = lambda i, o, s=1, g=1, k=3: nn.Conv2d(i, o, k, s, k // 2, groups=g)  # noqa: E731
            self.stem = c(in_channels, 16, 2)
            self.dw1, self.pw1 = c(16, 16, 1, 16), c(16, 32, k=1)
            self.dw2, self.pw2 = c(32, 32, 2, 32), c(32, 64, k=1)
            self.expand, self.dw3 = c(64, 128, k=1), c(128, 128, 1, 128)
            self.project = c(128, 64, k=1)
            self.fc = nn.Linear(64, 10)
            self.act = nn.ReLU6()

        def trunk(self, x):
            a = self.act
            x = a(self.stem(x))
            x = a(self.pw1(a(self.dw1(x))))
            x = a(self.pw2(a(self.dw2(x))))
            return x, self.project(a(self.dw3(a(self.expand(x)))))

        def forward(self, x):
            x, r = self.trunk(x)
            x = x + r
            return self.fc(x.mean((2, 3)))

    class IntNet(nn.Module):
        def __init__(self, f: FloatNet, x: torch.Tensor):
            super().__init__()
            with torch.no_grad():
                skip, proj = f.trunk(x)
                summed = skip + proj
                logits = f(x)
            relu6 = TensorQuant(6.0 / 255.0, -128)
            self.input_quant = TensorQuant(1.0 / 255.0, -128)
            proj_q = _calibrated(float(proj.min()), float(proj.max()))
            sum_q = _calibrated(float(summed.min()), float(summed.max()))
            logit_q = _calibrated(float(logits.min()), float(logits.max()))
            self.layers = nn.ModuleList([
                _quantize_affine(f.stem, self.input_quant, relu6, "relu6"),
                _quantize_affine(f.dw1, relu6, relu6, "relu6"),
                _quantize_affine(f.pw1, relu6, relu6, "relu6"),
                _quantize_affine(f.dw2, relu6, relu6, "relu6"),
                _quantize_affine(f.pw2, relu6, relu6, "relu6"),
            ])
            self.expand = _quantize_affine(f.expand, relu6, relu6, "relu6")
            self.dw3 = _quantize_affine(f.dw3, relu6, relu6, "relu6")
            self.project = _quantize_affine(f.project, relu6, proj_q, None)
            self.add = QAdd(relu6, proj_q, sum_q)
            self.pool = QGlobalAvgPool2d(sum_q)
            self.fc = _quantize_affine(f.fc, sum_q, logit_q, None)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            r = self.project(self.dw3(self.expand(x)))
            return self.fc(self.pool(self.add(x, r)))

    torch.manual_seed(0)
    f = FloatNet().eval()
    x = torch.rand(BATCH, in_channels, 28, 28)
    q = IntNet(f, x).eval()
    return f, q, x, q.input_quant.quantize(x)


def _layer_cases():
    """(method, setting, float module, int8 module, float input, int8 input) per layer shape."""
    import torch
    from torch import nn

    from bpfree.quant import TensorQuant

    relu6 = TensorQuant(6.0 / 255.0, -128)
    cases = []
    for method, setting, layer, shape in (
        ("linear", "256 -> 128", nn.Linear(256, 128), (BATCH, 256)),
        ("linear", "784 -> 256", nn.Linear(784, 256), (BATCH, 784)),
        ("conv 3x3", "32 -> 32, 14x14", nn.Conv2d(32, 32, 3, 1, 1), (BATCH, 32, 14, 14)),
        ("depthwise conv 3x3", "64 ch, 14x14", nn.Conv2d(64, 64, 3, 1, 1, groups=64),
         (BATCH, 64, 14, 14)),
        ("pointwise conv 1x1", "32 -> 64, 14x14", nn.Conv2d(32, 64, 1), (BATCH, 32, 14, 14)),
    ):
        q = _quantize_affine(layer, relu6, relu6, "relu6")
        xf = torch.rand(shape) * 6.0
        float_mod = nn.Sequential(layer, nn.ReLU6()).eval()
        cases.append((method, setting, float_mod, q, xf, relu6.quantize(xf)))
        if setting == "784 -> 256":
            q64 = _quantize_affine(layer, relu6, relu6, "relu6")
            q64.accumulate = "float64"
            cases.append(("linear (float64 accumulator)", setting, float_mod, q64, xf,
                          relu6.quantize(xf)))
    return cases


def run(quick: bool) -> tuple[list[dict], dict]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(quick)
    finally:
        torch.set_num_threads(threads)


def _run(quick: bool) -> tuple[list[dict], dict]:
    import torch

    from bpfree.bench import describe_device

    repeats = 7 if quick else 31
    rows: list[dict] = []

    def add(method: str, setting: str, float_fn, int_fn) -> float:
        t_float, t_int = _interleaved_medians(float_fn, int_fn, repeats)
        for metric, value in (("float32 median (ms)", t_float * 1e3),
                              ("int8 median (ms)", t_int * 1e3),
                              ("ratio int8/float", t_int / t_float)):
            rows.append({"table": TABLE, "method": method, "setting": setting, "metric": metric,
                         "value": float(value), "paper": None})
        return t_int / t_float

    with torch.no_grad():
        for method, setting, f, q, xf, xq in _layer_cases():
            add(method, setting, lambda f=f, xf=xf: f(xf), lambda q=q, xq=xq: q(xq))
        f, q, xf, xq = build_models()
        ratio = add("MobileNet-style CNN", "1x28x28 -> 10", lambda: f(xf), lambda: q(xq))
        # How close the int8 network is to its float twin (PTQ with per-channel weights and
        # min/max activation ranges calibrated on this very batch): a sanity check.
        logits = q.fc.output_quant.dequantize(q(xq))
        ref = f(xf)
        agree = (logits.argmax(1) == ref.argmax(1)).float().mean().item() * 100
        err = ((logits - ref).abs().max() / ref.abs().max()).item()
    rows.append({"table": TABLE, "method": "MobileNet-style CNN", "setting": "1x28x28 -> 10",
                 "metric": "argmax agreement with float (%)", "value": agree, "paper": None})
    rows.append({"table": TABLE, "method": "MobileNet-style CNN", "setting": "1x28x28 -> 10",
                 "metric": "max |logit error| / max |logit|", "value": err, "paper": None})
    notes = [
        f"Target (issue 3): whole-CNN int8/float ratio <= 2; measured {ratio:.2f}.",
        "Int8 layers accumulate exactly in float32 when the reduction bound K*128*max|x-z| "
        "is <= 2**24; a longer reduction is split into chunks that each meet the bound, "
        "computed in float32 and summed in float64 (the 784 -> 256 linear with z = -128 takes "
        "that route). The float64 row forces one float64 product (accumulate='float64') on "
        "the same layer.",
        "The int8 times include converting the int8 input to float and the fused numba "
        "requantization epilogue (bias, fixed-point multiplier, zero point, clamp, int8).",
        "The CNN has random weights; agreement rows only check the int8 path tracks its float "
        "twin, they are not an accuracy result.",
    ]
    return rows, {"notes": notes, "device": describe_device("cpu")}
