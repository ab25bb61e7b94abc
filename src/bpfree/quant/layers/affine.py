"""Integer affine layers: :class:`QLinear` (TFLite ``FullyConnectedPerChannel``) and
:class:`QConv2d` (``ConvPerChannel`` / ``DepthwiseConvPerChannel``), int8 in and out.

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

import torch
import torch.nn.functional as F
from torch import nn

from ..fixed_point import INT8_MAX, INT8_MIN, INT32_MAX, INT32_MIN, requantize
from ..params import ActivationRange, Requantization, TensorQuant, WeightQuant

from .arith import (_ACCUMULATE, _BACKENDS, FLOAT64_EXACT, _check_choice, _check_int8_input,
                    _check_quant, _integer_tensor, _no_transform_algorithms, _pair,
                    accumulator_bound, float32_chunk)

__all__ = ["QConv2d", "QLinear"]


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
            hint = ("; this looks like NHWC (as LiteRT takes it): pass x.permute(0, 3, 1, 2)"
                    if x.dim() == 4 and x.shape[3] == self.in_channels else "")
            raise ValueError(f"input must have shape (N, {self.in_channels}, H, W), "
                             f"got {tuple(x.shape)}{hint}")
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
