"""Integer (real-quantized) inference layers: int8 in, int8 out, integer buffers only.

Each layer follows the matching TFLite int8 reference kernel bit for bit
(``tensorflow/lite/kernels/internal/reference/integer_ops/``): :class:`QLinear`
(``FullyConnectedPerChannel``), :class:`QConv2d` (``ConvPerChannel`` /
``DepthwiseConvPerChannel``; stride, padding, dilation, groups), :class:`QAdd` (``Add``),
:class:`QAvgPool2d` (``AveragePool``), :class:`QGlobalAvgPool2d` (``Mean`` over H and W),
:class:`QReLU` (a clamp) and :class:`QFlatten`. ReLU / ReLU6 fused into a layer are clamps of its
output range (:class:`~bpfree.quant.params.ActivationRange`). Layout is PyTorch's NCHW.

The state is integer, as on an MCU (PMT §2.1, §3.1: there is no float copy of the model):
``weight`` (int8), ``bias`` (int32), ``multiplier`` / ``shift`` (int32, per output channel)
are buffers, so a trainer may perturb and update ``weight`` / ``bias`` in place between forward
passes; nothing derived from them is cached. Scales and zero points are frozen attributes.

Exact float accumulation
------------------------
CPUs have no fast int8 GEMM/conv in PyTorch, so the int32 accumulator ``sum_k w_k (x_k - z_x)``
is computed by float matmul / conv and the result is *proved* exact, never rounded: every
product is an integer with ``|w (x - z_x)| <= 128 * d`` where ``d = max(127 - z_x, 128 + z_x)``
(at most 255), and every partial sum that any summation order can form over ``K`` terms is an
integer bounded by ``K * 128 * d``. Integers up to ``2**24`` are exact in float32 and up to
``2**53`` in float64, and so is every sum of them that stays in range. Hence:

* float32 when ``K * 128 * d <= 2**24`` (``K <= 514`` for any zero point, ``K <= 1024`` for
  ``z_x = 0``): one matmul / conv;
* larger ``K``: the reduction is split into chunks that each satisfy the bound (input features,
  or input channels per group times the kernel area), each chunk is computed in float32
  (exact), and the chunk results are added in float64 (exact: the total is < 2**53);
* ``accumulate="float64"`` (or a kernel area alone above the bound) runs one float64 op instead.
  Both routes are tested bit-identical against the int64 reference.

This holds for any algorithm that only multiplies and adds the operands (direct convolution,
im2col + GEMM, blocked or split-K GEMM, FMA, and TF32/bf16 input rounding, which represents
integers up to 256 exactly). Transform-based convolutions (FFT, large-tile Winograd) would not
be exact: PyTorch's CPU convolution is direct (oneDNN) or im2col + GEMM, and on CUDA we disable
cuDNN around the convolution so that PyTorch's native direct / GEMM kernels run instead of an
autotuned FFT or Winograd algorithm. The requantization epilogue is integer
(:func:`~bpfree.quant.fixed_point.requantize`). Results are therefore independent of the batch
size and identical on CPU and GPU.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from .fixed_point import (
    INT8_MAX,
    INT8_MIN,
    INT32_MAX,
    INT32_MIN,
    _mbqm_int64,
    quantize_multiplier,
    requantize,
    requantized_add,
    rounding_integer_divide,
)
from .params import (
    ActivationRange,
    AddRequantization,
    Requantization,
    TensorQuant,
    WeightQuant,
)

FLOAT32_EXACT = 2**24
FLOAT64_EXACT = 2**53
_ACCUMULATE = ("auto", "float64")
_BACKENDS = ("auto", "torch", "numba")


# ---------------------------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------------------------


def _integer_tensor(value, name: str, lo: int, hi: int, dtype: torch.dtype) -> torch.Tensor:
    """An integer-valued tensor checked to lie in [lo, hi], converted to ``dtype``."""
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of integers in [{lo}, {hi}], "
                         f"got {type(value).__name__}")
    t = value.detach()
    if t.dtype == torch.bool or t.dtype.is_complex:
        raise ValueError(f"{name} must hold integers in [{lo}, {hi}], got dtype {t.dtype}")
    if t.dtype.is_floating_point:
        if not bool(torch.isfinite(t).all()) or not torch.equal(t, torch.round(t)):
            raise ValueError(f"{name} must hold integers in [{lo}, {hi}]; got a {t.dtype} tensor "
                             "with non-integer or non-finite values")
    if t.numel():
        t_min, t_max = t.min().item(), t.max().item()
        if t_min < lo or t_max > hi:
            raise ValueError(f"{name} values must lie in [{lo}, {hi}], got values in "
                             f"[{t_min:g}, {t_max:g}]")
    return t.to(dtype).clone().contiguous()


def _check_quant(value, name: str) -> TensorQuant:
    if not isinstance(value, TensorQuant):
        raise ValueError(f"{name} must be a bpfree.quant.TensorQuant(scale, zero_point), "
                         f"got {value!r}")
    return value


def _check_int8_input(x, name: str = "input") -> None:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.int8:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be an int8 tensor (quantize floats with "
                         f"TensorQuant.quantize), got {got}")


def _pair(value, name: str, minimum: int) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        pair = (value, value)
    elif (isinstance(value, (tuple, list)) and len(value) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        pair = (int(value[0]), int(value[1]))
    else:
        raise ValueError(f"{name} must be an int or a pair of ints >= {minimum}, got {value!r}")
    if min(pair) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return pair


def _check_choice(value, name: str, choices) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def accumulator_bound(k: int, input_zero_point: int) -> int:
    """Largest |partial sum| of ``sum_k w_k (x_k - z_x)`` over int8 weights and inputs."""
    deviation = max(INT8_MAX - input_zero_point, input_zero_point - INT8_MIN)
    return k * 128 * deviation


def float32_chunk(input_zero_point: int, unit: int = 1) -> int:
    """Most reduction units (of ``unit`` terms each) a float32 accumulator sums exactly; 0 if
    even one unit may exceed ``2**24``."""
    return FLOAT32_EXACT // accumulator_bound(unit, input_zero_point)


def _no_transform_algorithms(device: torch.device):
    """Disable cuDNN (which may pick FFT / Winograd, inexact on integers) on CUDA."""
    if device.type == "cuda":
        return torch.backends.cudnn.flags(enabled=False)
    return contextlib.nullcontext()


# ---------------------------------------------------------------------------------------------
# Affine layers
# ---------------------------------------------------------------------------------------------


class _QuantizedAffine(nn.Module):
    """Shared state and epilogue of QLinear / QConv2d."""

    weight: torch.Tensor
    bias: torch.Tensor
    multiplier: torch.Tensor
    shift: torch.Tensor

    def _init_affine(self, weight, bias, weight_scale, input_quant, output_quant, activation,
                     accumulate, backend, k: int, unit: int = 1) -> None:
        self.input_quant = _check_quant(input_quant, "input_quant")
        self.output_quant = _check_quant(output_quant, "output_quant")
        channels = weight.shape[0]
        if isinstance(weight_scale, WeightQuant):
            wq = weight_scale
        else:
            wq = WeightQuant(weight_scale)
        self.weight_quant = wq.broadcast(channels)
        self.requant = Requantization.for_affine(self.input_quant, self.weight_quant,
                                                 self.output_quant)
        self.activation = activation
        self.range = ActivationRange.from_activation(activation, self.output_quant)
        self.accumulate = _check_choice(accumulate, "accumulate", _ACCUMULATE)
        # Chunk length of the reduction (in units of `unit` terms) proven exact in float32.
        self._chunk = float32_chunk(self.input_quant.zero_point, unit)
        self.backend = _check_choice(backend, "backend", _BACKENDS)
        if accumulator_bound(k, self.input_quant.zero_point) > FLOAT64_EXACT:
            raise ValueError(f"reduction size {k} is too large for an exact float64 "
                             "accumulator")
        self.register_buffer("weight", _integer_tensor(weight, "weight", INT8_MIN, INT8_MAX,
                                                       torch.int8))
        if bias is None:
            b = torch.zeros(channels, dtype=torch.int32)
        else:
            b = _integer_tensor(bias, "bias", INT32_MIN, INT32_MAX, torch.int32)
            if tuple(b.shape) != (channels,):
                raise ValueError(f"bias must have shape ({channels},) (one int32 per output "
                                 f"channel), got {tuple(b.shape)}")
        self.register_buffer("bias", b)
        m, s = self.requant.tensors()
        self.register_buffer("multiplier", m)
        self.register_buffer("shift", s)

    def _check_state(self) -> None:
        if self.weight.dtype != torch.int8 or self.bias.dtype != torch.int32:
            raise ValueError(f"weight must stay int8 and bias int32, found {self.weight.dtype} "
                             f"and {self.bias.dtype}")

    def _float_operands(self, x: torch.Tensor, dtype: torch.dtype):
        """(x - z_x, weight) as ``dtype`` tensors (exact: int8 values)."""
        xf = x.to(dtype)
        if self.input_quant.zero_point:
            xf = xf.sub_(self.input_quant.zero_point)
        return xf, self.weight.to(dtype)

    #: Node perturbation (PMT §3.2.1, Eq. 9): an integer tensor broadcastable to the output, or
    #: None. When set, it is added to the requantized pre-activation output (int8 units) before
    #: the fused ReLU / ReLU6 clamp, i.e. ``a = h(z + xi)``, with saturation to int8.
    node_offset: torch.Tensor | None = None

    def _epilogue(self, acc: torch.Tensor, axis: int) -> torch.Tensor:
        offset = self.node_offset
        if offset is None:
            return requantize(acc, self.bias, self.multiplier, self.shift,
                              self.output_quant.zero_point, self.range.qmin, self.range.qmax,
                              axis=axis, backend=self.backend)
        z = requantize(acc, self.bias, self.multiplier, self.shift,
                       self.output_quant.zero_point, INT8_MIN, INT8_MAX,
                       axis=axis, backend=self.backend)
        z = z.to(torch.int16).add_(offset.to(device=z.device, dtype=torch.int16))
        return z.clamp_(self.range.qmin, self.range.qmax).to(torch.int8)

    def extra_repr(self) -> str:
        return (f"input={self.input_quant}, output={self.output_quant}, "
                f"activation={self.activation}")


class QLinear(_QuantizedAffine):
    """Int8 fully-connected layer (TFLite ``FullyConnectedPerChannel``).

    ``out[..., n] = clamp(z_out + MBQM(sum_k w[n, k] (x[..., k] - z_in) + bias[n],
    multiplier[n], shift[n]))``.

    Args:
        weight: (out_features, in_features) integers in [-128, 127] (any integer dtype, or
            integral floats); stored as int8.
        bias: (out_features,) int32-range integers at scale ``s_in * s_w[n]``, or None (zeros).
        weight_scale: per-output-channel float scales (or one float for all), zero point 0.
        input_quant, output_quant: :class:`TensorQuant` of the input and output activations.
        activation: None, "relu" or "relu6", fused as a clamp of the output range.
        accumulate: "auto" (float32, in exact chunks when the reduction is long) or "float64".
        backend: epilogue implementation, "auto" (numba on CPU), "torch" or "numba".
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                 weight_scale, input_quant: TensorQuant, output_quant: TensorQuant,
                 activation: str | None = None, accumulate: str = "auto",
                 backend: str = "auto") -> None:
        super().__init__()
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else weight
            raise ValueError(f"weight must be a 2-D tensor (out_features, in_features), "
                             f"got {shape!r}")
        self.in_features = int(weight.shape[1])
        self.out_features = int(weight.shape[0])
        self._init_affine(weight, bias, weight_scale, input_quant, output_quant, activation,
                          accumulate, backend, k=self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_int8_input(x)
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"input must have shape (..., {self.in_features}), "
                             f"got {tuple(x.shape)}")
        self._check_state()
        k, chunk = self.in_features, self._chunk
        if self.accumulate == "float64" or chunk == 0:
            xf, w = self._float_operands(x, torch.float64)
            acc = xf @ w.T
        elif chunk >= k:
            xf, w = self._float_operands(x, torch.float32)
            acc = xf @ w.T  # exact: see the module docstring
        else:
            xf, w = self._float_operands(x, torch.float32)
            acc = None
            for j in range(0, k, chunk):
                part = (xf[..., j:j + chunk] @ w[:, j:j + chunk].T).to(torch.float64)
                acc = part if acc is None else acc.add_(part)
        return self._epilogue(acc, axis=-1)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, " + super().extra_repr()


class QConv2d(_QuantizedAffine):
    """Int8 2-D convolution, NCHW (TFLite ``ConvPerChannel`` / ``DepthwiseConvPerChannel``).

    Same arguments as :class:`QLinear` plus ``stride``, ``padding`` (symmetric, explicit like
    ``nn.Conv2d``; padded positions are real zeros, i.e. the input zero point, as in TFLite),
    ``dilation`` and ``groups`` (``groups == in_channels`` is depthwise, with
    ``out_channels = in_channels * depth_multiplier``). ``weight`` has shape
    (out_channels, in_channels / groups, kh, kw).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                 weight_scale, input_quant: TensorQuant, output_quant: TensorQuant,
                 stride=1, padding=0, dilation=1, groups: int = 1,
                 activation: str | None = None, accumulate: str = "auto",
                 backend: str = "auto") -> None:
        super().__init__()
        if not isinstance(weight, torch.Tensor) or weight.dim() != 4:
            shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else weight
            raise ValueError("weight must be a 4-D tensor (out_channels, in_channels / groups, "
                             f"kh, kw), got {shape!r}")
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
            raise ValueError(f"groups must be an int >= 1, got {groups!r}")
        if weight.shape[0] % groups:
            raise ValueError(f"out_channels ({weight.shape[0]}) must be divisible by groups "
                             f"({groups})")
        self.stride = _pair(stride, "stride", 1)
        self.padding = _pair(padding, "padding", 0)
        self.dilation = _pair(dilation, "dilation", 1)
        self.groups = groups
        self.out_channels = int(weight.shape[0])
        self.in_channels = int(weight.shape[1]) * groups
        self.kernel_size = (int(weight.shape[2]), int(weight.shape[3]))
        k = int(weight.shape[1]) * self.kernel_size[0] * self.kernel_size[1]
        self._init_affine(weight, bias, weight_scale, input_quant, output_quant, activation,
                          accumulate, backend, k=k,
                          unit=self.kernel_size[0] * self.kernel_size[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_int8_input(x)
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"input must have shape (N, {self.in_channels}, H, W), "
                             f"got {tuple(x.shape)}")
        self._check_state()
        cin_g, chunk, groups = self.in_channels // self.groups, self._chunk, self.groups
        conv = lambda xs, ws: F.conv2d(xs, ws, None, self.stride, self.padding,  # noqa: E731
                                       self.dilation, groups)
        with _no_transform_algorithms(x.device):
            if self.accumulate == "float64" or chunk == 0:
                acc = conv(*self._float_operands(x, torch.float64))
            elif chunk >= cin_g:
                acc = conv(*self._float_operands(x, torch.float32))  # exact: module docstring
            else:
                xf, w = self._float_operands(x, torch.float32)
                n, _, h, wd = xf.shape
                xg = xf.view(n, groups, cin_g, h, wd)
                acc = None
                for j in range(0, cin_g, chunk):
                    # Channels j..j+chunk of every group, keeping the grouped layout.
                    xs = xg[:, :, j:j + chunk].reshape(n, -1, h, wd)
                    part = conv(xs, w[:, j:j + chunk]).to(torch.float64)
                    acc = part if acc is None else acc.add_(part)
        return self._epilogue(acc, axis=1)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"groups={self.groups}, " + super().extra_repr())


# ---------------------------------------------------------------------------------------------
# Element-wise and pooling layers
# ---------------------------------------------------------------------------------------------


class QAdd(nn.Module):
    """Residual add of two int8 tensors with different scales (TFLite int8 ``ADD``).

    See :class:`~bpfree.quant.params.AddRequantization` for the integer parameters; ``forward``
    runs :func:`~bpfree.quant.fixed_point.requantized_add`. Both inputs must have the same
    shape (no broadcasting).
    """

    def __init__(self, input1_quant: TensorQuant, input2_quant: TensorQuant,
                 output_quant: TensorQuant, activation: str | None = None,
                 backend: str = "auto") -> None:
        super().__init__()
        self.input1_quant = _check_quant(input1_quant, "input1_quant")
        self.input2_quant = _check_quant(input2_quant, "input2_quant")
        self.output_quant = _check_quant(output_quant, "output_quant")
        self.params = AddRequantization.from_quant(self.input1_quant, self.input2_quant,
                                                   self.output_quant)
        self.activation = activation
        self.range = ActivationRange.from_activation(activation, self.output_quant)
        self.backend = _check_choice(backend, "backend", _BACKENDS)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        _check_int8_input(a, "input1")
        _check_int8_input(b, "input2")
        if a.shape != b.shape:
            raise ValueError(f"input1 and input2 must have the same shape, got "
                             f"{tuple(a.shape)} and {tuple(b.shape)}")
        if a.device != b.device:
            raise ValueError(f"input1 and input2 must be on one device, got {a.device} and "
                             f"{b.device}")
        p = self.params
        return requantized_add(a, b, p.input1_offset, p.input2_offset, p.left_shift,
                               p.input1_multiplier, p.input1_shift, p.input2_multiplier,
                               p.input2_shift, p.output_multiplier, p.output_shift,
                               p.output_offset, self.range.qmin, self.range.qmax,
                               backend=self.backend)

    def extra_repr(self) -> str:
        return (f"input1={self.input1_quant}, input2={self.input2_quant}, "
                f"output={self.output_quant}, activation={self.activation}")


class QAvgPool2d(nn.Module):
    """Int8 average pooling (TFLite ``AveragePool``): input and output share one quantization.

    Per window, the raw int8 values inside the input are summed (padding is excluded from both
    sum and count, TFLite's behaviour) and divided with
    :func:`~bpfree.quant.fixed_point.rounding_integer_divide`. The sums come from float32
    ``avg_pool2d(divisor_override=1)``: at most ``kh * kw * 128 <= 2**24`` in magnitude, exact.
    ``quant`` is needed only for a fused ``activation``.
    """

    def __init__(self, kernel_size, stride=None, padding=0, *, quant: TensorQuant | None = None,
                 activation: str | None = None) -> None:
        super().__init__()
        self.kernel_size = _pair(kernel_size, "kernel_size", 1)
        self.stride = self.kernel_size if stride is None else _pair(stride, "stride", 1)
        self.padding = _pair(padding, "padding", 0)
        if any(2 * p > k for p, k in zip(self.padding, self.kernel_size)):
            raise ValueError(f"padding must be at most half the kernel size {self.kernel_size}, "
                             f"got {self.padding}")
        if self.kernel_size[0] * self.kernel_size[1] * 128 > 2**24:
            raise ValueError(f"kernel_size {self.kernel_size} is too large (area must be "
                             "<= 131072)")
        if activation is not None and quant is None:
            raise ValueError("quant (the TensorQuant of input and output) is required for a "
                             f"fused activation, got activation={activation!r} and quant=None")
        self.quant = None if quant is None else _check_quant(quant, "quant")
        self.activation = activation
        self.range = (ActivationRange() if activation is None
                      else ActivationRange.from_activation(activation, self.quant))
        self._counts: dict = {}

    def _count(self, height: int, width: int, device: torch.device) -> torch.Tensor:
        key = (height, width, device)
        if key not in self._counts:
            ones = torch.ones(1, 1, height, width, dtype=torch.float32, device=device)
            c = F.avg_pool2d(ones, self.kernel_size, self.stride, self.padding,
                             divisor_override=1)
            self._counts[key] = c.to(torch.int64)[0, 0]
        return self._counts[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_int8_input(x)
        if x.dim() != 4:
            raise ValueError(f"input must have shape (N, C, H, W), got {tuple(x.shape)}")
        sums = F.avg_pool2d(x.to(torch.float32), self.kernel_size, self.stride, self.padding,
                            divisor_override=1)
        avg = rounding_integer_divide(sums.to(torch.int64), self._count(*x.shape[2:], x.device))
        return avg.clamp_(self.range.qmin, self.range.qmax).to(torch.int8)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"activation={self.activation}")


class QGlobalAvgPool2d(nn.Module):
    """Int8 global average pooling (TFLite ``MEAN`` over H and W, ``reference_integer_ops::Mean``).

    Two integer rules (``rule=``), which differ by one unit on about 1% of the outputs:

    * ``"reference"`` (``reference_integer_ops::Mean``, TFLite Micro and TFLite before LiteRT):
      ``out = clamp(z_out + round_div(MBQM(sum(x - z_in), M), H*W))`` with ``M = s_in / s_out``
      as a quantized multiplier;
    * ``"litert"`` (LiteRT's ``reference_ops::QuantizedMeanOrSum``, what its interpreter runs for
      int8 MEAN): ``1 / (H*W)`` folded into the multiplier, ``M' = (M << k) // (H*W)`` with
      ``k = min(floor(log2(H*W)), 32, 31 + shift)`` and shift ``shift - k``, then
      ``out = clamp(z_out + MBQM(sum(x - z_in), M', shift - k))``.

    Returns (N, C), or (N, C, 1, 1) with ``keepdim=True`` (``nn.AdaptiveAvgPool2d(1)``'s shape).
    """

    RULES = ("reference", "litert")

    def __init__(self, input_quant: TensorQuant, output_quant: TensorQuant | None = None, *,
                 keepdim: bool = False, rule: str = "reference") -> None:
        super().__init__()
        self.rule = _check_choice(rule, "rule", self.RULES)
        self.input_quant = _check_quant(input_quant, "input_quant")
        self.output_quant = (self.input_quant if output_quant is None
                             else _check_quant(output_quant, "output_quant"))
        self.keepdim = bool(keepdim)
        real = self.input_quant.scale / self.output_quant.scale
        self.multiplier, self.shift = quantize_multiplier(real)
        if self.shift > 31:
            raise ValueError(f"input_quant.scale / output_quant.scale = {real!r} must be < 2**31")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_int8_input(x)
        if x.dim() != 4:
            raise ValueError(f"input must have shape (N, C, H, W), got {tuple(x.shape)}")
        count = x.shape[2] * x.shape[3]
        if count == 0 or count * 255 > INT32_MAX:
            raise ValueError(f"H*W must be in [1, {INT32_MAX // 255}], got {count}")
        acc = x.sum(dim=(2, 3), dtype=torch.int64) - self.input_quant.zero_point * count
        if self.rule == "litert":
            k = min(count.bit_length() - 1, 32, 31 + self.shift)
            out = _mbqm_int64(acc, (self.multiplier << k) // count, self.shift - k)
            out = out.add_(self.output_quant.zero_point)
        else:
            acc = _mbqm_int64(acc, self.multiplier, self.shift)
            out = rounding_integer_divide(acc, count).add_(self.output_quant.zero_point)
        out = out.clamp_(INT8_MIN, INT8_MAX).to(torch.int8)
        return out[:, :, None, None] if self.keepdim else out

    def extra_repr(self) -> str:
        return (f"input={self.input_quant}, output={self.output_quant}, keepdim={self.keepdim}, "
                f"rule={self.rule!r}")


class QReLU(nn.Module):
    """Standalone ReLU / ReLU6 on an int8 tensor whose quantization it keeps: a clamp to
    ``[max(-128, z), 127]`` or ``[max(-128, z), min(127, z + round(6 / s))]``."""

    def __init__(self, quant: TensorQuant, six: bool = False) -> None:
        super().__init__()
        self.quant = _check_quant(quant, "quant")
        self.six = bool(six)
        self.range = ActivationRange.from_activation("relu6" if six else "relu", self.quant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_int8_input(x)
        return x.clamp(self.range.qmin, self.range.qmax)

    def extra_repr(self) -> str:
        return f"quant={self.quant}, six={self.six}, range=[{self.range.qmin}, {self.range.qmax}]"


class QFlatten(nn.Flatten):
    """``nn.Flatten`` for int8 tensors (NCHW order; TFLite's NHWC flatten orders differently)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_int8_input(x)
        return super().forward(x)
