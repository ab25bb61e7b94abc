"""Sine-activated 3-layer MLPs for the HJB PINN (TT-ZO §5.2, Table 6).

The baseline is ``D_in × n → n × n → n × 1`` with ``sin`` activations. With ``D_in = 21``:

==========================  ======  =======  ==========================================
builder                      width   params   note
==========================  ======  =======  ==========================================
``dense_sine_mlp(21, 768)``  768     608257   FC-3, the paper's full MLP
``dense_sine_mlp(21, 78)``   78      7957     FC-3 at ~7.7k (paper: 7800, no biases)
``tt_sine_mlp(21, 768)``     768     7745     TT-3: every layer a rank-8 TTLinear
``pruned_sine_mlp(21, 768)`` 768     7603     SP-3: fixed random sparsity, 7603 trainable
==========================  ======  =======  ==========================================

The TT-3 factorizations are ``21 = 3·7·1·1``, ``768 = 4·4·4·12`` and ``1 = 1·1·1·1`` with
rank 8, which gives exactly the paper's 7745 parameters. The pruned network stores only its
non-zero weights (``values`` of :class:`SparseLinear`), so its trainable parameter count is
the number of kept weights plus biases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..tt import TTLinear

__all__ = ["SineMLP", "SparseLinear", "dense_sine_mlp", "tt_sine_mlp", "pruned_sine_mlp",
           "build_model", "num_parameters"]


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class SineMLP(nn.Module):
    """``y = L3(sin(L2(sin(L1 x))))`` for any three linear-like layers."""

    def __init__(self, layers: Sequence[nn.Module], in_features: int, kind: str = "dense") -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.in_features = in_features
        self.kind = kind
        #: TT layers switch to forming W from the cores at this many rows (large Stein batches).
        self.dense_rows = 2048
        #: rows per chunk of :meth:`forward_shifted` without gradients (whole points)
        self.shifted_rows = 2048

    def forward_shifted(self, x: Tensor, shifts: Tensor) -> Tensor:
        """``f(x_b + s_k)`` for every point ``x_b`` (B, D) and shift ``s_k`` (K, D): (B, K, n).

        The same function as :meth:`forward` on the B·K rows ``x_b + s_k`` (to rounding), in
        the dtype of ``x`` (the weights are cast to it, differentiably). It is what the Stein
        and FD backends evaluate (Eq. 9 / 13: every node of every residual point), and it
        shares the work the rows have in common:

        * the first layer by the angle-addition identity: with ``a_b = W₁x_b + b₁`` and
          ``c_k = W₁s_k``, ``sin(a_b + c_k) = sin a_b cos c_k + cos a_b sin c_k``, so the first
          GEMM and the first sine run on B + K rows, and the B·K rows cost one multiply-add;
        * without gradients, the other layers run on chunks of whole points (about
          ``shifted_rows`` rows) into buffers reused across chunks: no fresh, page-faulting
          allocation per layer, and a chunk's activations stay in cache.

        Needs two layers or more, each with a dense (or densified) weight.
        """
        if x.ndim != 2 or shifts.ndim != 2 or x.shape[1] != self.in_features \
                or shifts.shape[1] != self.in_features:
            raise ValueError(f"points (B, {self.in_features}) and shifts (K, "
                             f"{self.in_features}) expected, got {tuple(x.shape)} and "
                             f"{tuple(shifts.shape)}")
        if len(self.layers) < 2:
            raise ValueError("forward_shifted needs a sine between two layers or more")
        dtype = x.dtype
        weights = [_dense_weight(layer).to(dtype) for layer in self.layers]
        biases = [None if layer.bias is None else layer.bias.to(dtype) for layer in self.layers]
        a = x @ weights[0].t()
        if biases[0] is not None:
            a = a + biases[0]
        c = shifts.to(dtype) @ weights[0].t()
        sin_a, cos_a, sin_c, cos_c = a.sin(), a.cos(), c.sin(), c.cos()
        b, k = x.shape[0], shifts.shape[0]
        per = max(1, self.shifted_rows // k)          # whole points per chunk
        if torch.is_grad_enabled():
            # chunks here too: autograd keeps every chunk's activations, but as pieces small
            # enough for the allocator to reuse across steps (a whole (B·K, H) tensor is a
            # fresh, page-faulting mapping each time)
            outs = []
            for i in range(0, b, per):
                h = sin_a[i:i + per, None] * cos_c[None] + cos_a[i:i + per, None] * sin_c[None]
                h = h.reshape(-1, h.shape[-1])
                for j, (w, bias) in enumerate(zip(weights[1:], biases[1:])):
                    h = nn.functional.linear(h if j == 0 else torch.sin(h), w, bias)
                outs.append(h)
            return torch.cat(outs).reshape(b, k, -1)
        out = x.new_empty(b, k, weights[-1].shape[0])
        rows = min(per, b) * k
        buffers = [x.new_empty(rows, w.shape[0]) for w in weights[:-1]]
        for i in range(0, b, per):
            n = min(per, b - i)
            s1 = buffers[0][:n * k].view(n, k, -1)
            torch.mul(cos_c[None], sin_a[i:i + n, None], out=s1)
            s1.addcmul_(sin_c[None], cos_a[i:i + n, None])
            h = buffers[0][:n * k]
            for j in range(1, len(weights)):
                dest = out[i:i + n].view(n * k, -1) if j == len(weights) - 1 \
                    else buffers[j][:n * k]
                torch.mm(h, weights[j].t(), out=dest)
                if biases[j] is not None:
                    dest.add_(biases[j])
                if j < len(weights) - 1:
                    dest.sin_()
                h = dest
        return out

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input has {x.shape[-1]} coordinates, the network takes "
                             f"{self.in_features}")
        h = x
        dense_form = self.kind == "tt" and x.reshape(-1, x.shape[-1]).shape[0] >= self.dense_rows
        for i, layer in enumerate(self.layers):
            if dense_form:   # same function; one W = TT(cores) beats core contraction here
                h = nn.functional.linear(h, layer.dense_weight(), layer.bias)
            else:
                h = layer(h)
            if i < len(self.layers) - 1:
                h = torch.sin(h)
        return h


def _dense_weight(layer: nn.Module) -> Tensor:
    """The ``(out, in)`` weight matrix of a dense, TT or sparse layer (formed when stored
    otherwise; differentiable in the parameters)."""
    if isinstance(layer, nn.Linear):
        return layer.weight
    if isinstance(layer, TTLinear):
        return layer.dense_weight()
    if isinstance(layer, SparseLinear):
        return layer.weight()
    raise TypeError(f"no dense weight for a {type(layer).__name__} layer")


class SparseLinear(nn.Module):
    """Linear layer with a fixed sparsity pattern; only the kept weights are parameters."""

    def __init__(self, in_features: int, out_features: int, index: Tensor, bias: bool = True,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("index", index.long())               # (nnz,) flat row-major
        fan_in = max(1.0, index.numel() / out_features)
        bound = 1.0 / math.sqrt(fan_in)
        self.values = nn.Parameter(torch.empty(index.numel()).uniform_(-bound, bound,
                                                                      generator=generator))
        self.bias = nn.Parameter(torch.empty(out_features).uniform_(-bound, bound,
                                                                    generator=generator)) \
            if bias else None

    def weight(self) -> Tensor:
        w = self.values.new_zeros(self.out_features * self.in_features)
        return w.index_put((self.index,), self.values).view(self.out_features, self.in_features)

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.linear(x, self.weight(), self.bias)


def dense_sine_mlp(in_features: int = 21, width: int = 78, out_features: int = 1,
                   seed: int = 0) -> SineMLP:
    """FC-3: three dense layers with biases."""
    torch.manual_seed(seed)
    return SineMLP([nn.Linear(in_features, width), nn.Linear(width, width),
                    nn.Linear(width, out_features)], in_features, "dense")


def _factor(n: int, parts: int) -> tuple[int, ...]:
    """Split ``n`` into ``parts`` factors, largest first (padding with 1)."""
    fs = []
    m = n
    for p in range(2, n + 1):
        while m % p == 0:
            fs.append(p)
            m //= p
        if m == 1:
            break
    while len(fs) > parts:                      # merge the two smallest
        fs.sort()
        fs = [fs[0] * fs[1]] + fs[2:]
    fs = sorted(fs) + [1] * (parts - len(fs))
    return tuple(fs)


def tt_sine_mlp(in_features: int = 21, width: int = 768, out_features: int = 1, rank: int = 8,
                in_factors: Sequence[int] | None = None,
                hidden_factors: Sequence[int] | None = None, seed: int = 0) -> SineMLP:
    """TT-3: three TT layers (defaults give the paper's 7745-parameter TT-MLP at 21-768-1)."""
    if hidden_factors is None:
        hidden_factors = (4, 4, 4, 12) if width == 768 else _factor(width, 4)
    if in_features == 21 and in_factors is None:
        in_factors = (3, 7, 1, 1)
    if in_factors is None:
        in_factors = tuple(reversed(_factor(in_features, len(hidden_factors))))
    out_factors = _factor(out_features, len(hidden_factors))
    torch.manual_seed(seed)
    # Var W = 1/(3N), the variance of nn.Linear's default init (so FC and TT start alike).
    layers = [TTLinear(in_factors, hidden_factors, rank, init=1 / (3 * in_features)),
              TTLinear(hidden_factors, hidden_factors, rank, init=1 / (3 * width)),
              TTLinear(hidden_factors, out_factors, rank, init=1 / (3 * width))]
    for layer in layers:   # small random biases, like nn.Linear (phases of the sines)
        with torch.no_grad():
            layer.bias.uniform_(-1 / math.sqrt(layer.in_features), 1 / math.sqrt(layer.in_features))
    return SineMLP(layers, in_features, "tt")


def pruned_sine_mlp(in_features: int = 21, width: int = 768, out_features: int = 1,
                    trainable: int = 7603, seed: int = 0) -> SineMLP:
    """SP-3: a ``width``-wide MLP pruned at random to ``trainable`` parameters (with biases).

    The output layer stays dense, every hidden unit keeps two input weights, and the rest of
    the budget is spread uniformly over the hidden-to-hidden matrix.
    """
    g = torch.Generator().manual_seed(seed)
    biases = 2 * width + out_features
    first_k = min(2, in_features)
    budget_mid = trainable - biases - width * out_features - width * first_k
    if budget_mid < 1 or budget_mid > width * width:
        raise ValueError(f"trainable={trainable} is not achievable for width {width}")
    rows = torch.arange(width).repeat_interleave(first_k)
    cols = torch.stack([torch.randperm(in_features, generator=g)[:first_k] for _ in range(width)]).flatten()
    first = rows * in_features + cols
    mid = torch.randperm(width * width, generator=g)[:budget_mid].sort().values
    last = torch.arange(width * out_features)
    layers = [SparseLinear(in_features, width, first, generator=g),
              SparseLinear(width, width, mid, generator=g),
              SparseLinear(width, out_features, last, generator=g)]
    return SineMLP(layers, in_features, "pruned")


def build_model(kind: str, in_features: int = 21, width: int | None = None, **kw) -> SineMLP:
    """``kind`` in {"dense", "tt", "pruned"}; width defaults to the paper's ~7.7k variants."""
    if kind == "dense":
        return dense_sine_mlp(in_features, 78 if width is None else width, **kw)
    if kind == "tt":
        return tt_sine_mlp(in_features, 768 if width is None else width, **kw)
    if kind == "pruned":
        return pruned_sine_mlp(in_features, 768 if width is None else width, **kw)
    raise ValueError(f"unknown model kind {kind!r}; choose dense, tt or pruned")
