"""TinyFoA (§2.1–2.2): local losses through fixed random projections + vertical slicing.

Every hidden layer ``l`` has a fixed random ``B_l ∈ R^{N_c × D_l}`` projecting its activation
to class logits ``a_l = B_l h_l``; its local cross-entropy gives ``δa_l = p_l − y`` (Eq. 1–3).
With vertical training the weight is cut into ``M × M`` slices (FC) or ``M`` groups of
kernels (LC) and one step computes **only** the active slice's gradient (Eq. 2 / Eq. 5):

    δh^(j) = (B^(j))ᵀ δa  ⊙ dh/dz^(j)            (only the j-th output block)
    δW^(i,j) = δz^(j)ᵀ h_{l-1}^(i) [⊙ 1_{|W^(i,j)|<=1}]

so no full-layer gradient is ever allocated. With binary weights the forward pass uses
``alpha · sign(W)`` (stored as a ±1 tensor and a running ``Σ|W|``) and the full-precision
latent weights live in a :class:`FlashStore` (off the training RAM); only the active
slice is held as a torch tensor, written back on each data exchange.

Slice schedule (§4.2): the active slice changes ``F`` times over training (``F = E``, once
an epoch, by default; Fig. 5 uses ``F = 2``); :meth:`TinyFoA.set_progress` moves it.
There is no trained classifier on top: the prediction is the last hidden layer's
auxiliary logits ``a_L = B_L h_L`` (the paper's memory count has no classifier either).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..baselines.variants import Variant, check_batch, check_slices, parse_variant
from ..quant.binary import activate, activation_grad_mask, sign

__all__ = ["FlashStore", "SlicedFC", "SlicedLC", "TinyFoA", "check_slices"]


class FlashStore:
    """Full-precision latent weights kept outside torch (the device's Flash); counts exchanges."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.data = weight.detach().cpu().numpy().astype(np.float32).copy()
        self.reads = 0
        self.writes = 0

    def read(self, idx) -> torch.Tensor:
        self.reads += 1
        return torch.from_numpy(self.data[idx].copy())

    def write(self, idx, value: torch.Tensor) -> None:
        self.writes += 1
        self.data[idx] = value.detach().numpy()

    def full(self) -> torch.Tensor:
        return torch.from_numpy(self.data.copy())


class _SlicedLayer:
    """Shared storage logic: full-precision weight or (signs, Σ|W|, flash, active latent)."""

    weight_shape: tuple[int, ...]

    def _init_storage(self, w: torch.Tensor, binary_weights: bool) -> None:
        self.binary_weights = binary_weights
        self.adam = None                 # (betas, eps) once use_adam() is called
        self.numel = w.numel()
        self.slice_index = 0
        if binary_weights:
            self.flash = FlashStore(w)
            self.signs = sign(w)
            self.abs_sum = float(w.abs().sum())
            self.weight = None
            self.latent = self.flash.read(self.slice_idx(0))
        else:
            self.flash = None
            self.weight = w.clone()

    @property
    def alpha(self) -> float:
        return self.abs_sum / self.numel

    def slice_idx(self, k: int):
        raise NotImplementedError

    @property
    def num_slices(self) -> int:
        raise NotImplementedError

    def set_slice(self, k: int) -> None:
        """Make slice ``k % num_slices`` active (a data exchange with binary weights)."""
        k %= self.num_slices
        if k == self.slice_index:
            return
        if self.binary_weights:
            self.flash.write(self.slice_idx(self.slice_index), self.latent)
            self.latent = self.flash.read(self.slice_idx(k))
        self.slice_index = k
        if self.adam is not None:
            self.adam_state = {}

    def active_weight(self) -> torch.Tensor:
        """The active slice's full-precision weight (a view into ``weight`` without BW)."""
        if self.binary_weights:
            return self.latent
        return self.weight[self.slice_idx(self.slice_index)]

    def forward_weight(self) -> torch.Tensor:
        """The weight the forward pass uses (``alpha·sign(W)`` materialised; for inspection)."""
        return self.alpha * self.signs if self.binary_weights else self.weight

    def latent_weight(self) -> torch.Tensor:
        """Full latent weight (reassembled from flash + the active slice; for inspection)."""
        if not self.binary_weights:
            return self.weight.clone()
        w = self.flash.full()
        w[self.slice_idx(self.slice_index)] = self.latent
        return w

    def _apply(self, dw: torch.Tensor, lr: float, keep: tuple | None = None) -> None:
        """``W^(i,j) −= η δW^(i,j)`` in place (Eq. 3), or an Adam step on the active slice
        (:meth:`use_adam`); with binary weights the STE mask of Eq. 5, the running ``Σ|W|``
        and the slice's signs are updated without any temporary larger than the slice.
        ``keep`` names a block of the active weight that the step must leave unchanged (the
        authors' code schedule, :class:`TinyFoA` ``schedule="diagonal-freeze"``)."""
        w = self.active_weight()
        kept = None if keep is None else w[keep].clone()
        if self.binary_weights:
            dw.masked_fill_((w > 1) | (w < -1), 0.0)
            old = float(torch.linalg.vector_norm(w, 1))
            self._descend(w, "weight", dw, lr)
            if kept is not None:
                w[keep] = kept
            self.abs_sum += float(torch.linalg.vector_norm(w, 1)) - old
            signs = self.signs[self.slice_idx(self.slice_index)]
            signs.copy_(w >= 0).mul_(2).sub_(1)
        else:
            self._descend(w, "weight", dw, lr)
            if kept is not None:
                w[keep] = kept

    def use_adam(self, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        """Replace Eq. 3's SGD step by Adam (the optimizer of the authors' code). Its moments
        cover only the active slice and are dropped at a data exchange: a device holds one
        slice's state, not the layer's."""
        self.adam = (betas, eps)
        self.adam_state: dict = {}

    def _descend(self, w: torch.Tensor, key: str, grad: torch.Tensor, lr: float) -> None:
        """``w −= η·g`` (Eq. 3; ``sub_`` with ``alpha``, whose rounding the golden digests
        pin) or ``w −=`` Adam's step."""
        if self.adam is None:
            w.sub_(grad, alpha=lr)
        else:
            w.sub_(self._direction(key, grad, lr))

    def _direction(self, key: str, grad: torch.Tensor, lr: float) -> torch.Tensor:
        """The step ``η·g`` (SGD) or Adam's bias-corrected ``η·m̂/(√v̂ + ε)``."""
        if self.adam is None:
            return lr * grad
        (b1, b2), eps = self.adam
        m, v, t = self.adam_state.get(key, (torch.zeros_like(grad), torch.zeros_like(grad), 0))
        t += 1
        m.mul_(b1).add_(grad, alpha=1 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        self.adam_state[key] = (m, v, t)
        return (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt_().add_(eps)) * lr


class SlicedFC(_SlicedLayer):
    """Fully connected layer trained slice by slice (``M × M`` slices; ``M`` over the input
    only when ``slice_out`` is False, as for the output layer)."""

    def __init__(self, in_features: int, out_features: int, *, m: int = 1,
                 binary_weights: bool = False, slice_out: bool = True,
                 generator: torch.Generator | None = None, name: str = "layer") -> None:
        sizes = {f"{name}'s input size": in_features}
        if slice_out:
            sizes[f"{name}'s output size"] = out_features
        self.m = check_slices(m, sizes)
        self.in_features, self.out_features, self.slice_out = in_features, out_features, slice_out
        self.weight_shape = (out_features, in_features)
        bound = math.sqrt(6.0 / in_features)  # Kaiming uniform (ReLU)
        w = (torch.rand(out_features, in_features, generator=generator) * 2 - 1) * bound
        self.bias = torch.zeros(out_features)
        self._init_storage(w, binary_weights)

    @property
    def num_slices(self) -> int:
        return self.m * self.m if self.slice_out else self.m

    def blocks(self, k: int) -> tuple[slice, slice]:
        """``(rows j, columns i)`` of slice ``k`` (``k = j·M + i``)."""
        k %= self.num_slices
        ci = self.in_features // self.m
        i, j = (k % self.m, k // self.m) if self.slice_out else (k, 0)
        ro = self.out_features // self.m if self.slice_out else self.out_features
        return slice(j * ro, (j + 1) * ro), slice(i * ci, (i + 1) * ci)

    slice_idx = blocks

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.binary_weights:
            return self.alpha * (h @ self.signs.T) + self.bias
        return h @ self.weight.T + self.bias

    def local_update(self, h_in: torch.Tensor, dz_rows: torch.Tensor, lr: float,
                     keep: tuple | None = None) -> None:
        """Apply Eq. 3/5 for the active slice given ``δz^(j)`` ``[B, D_l/M]``; ``keep``: a
        ``(rows, columns)`` block of the slice's weight left unchanged (the biases train, as
        in the authors' code)."""
        rows, cols = self.blocks(self.slice_index)
        dw = dz_rows.T @ h_in[:, cols]
        self._apply(dw, lr, keep)
        self.bias[rows] -= self._direction("bias", dz_rows.sum(0), lr)

    def out_block(self) -> slice:
        return self.blocks(self.slice_index)[0]


class SlicedLC(_SlicedLayer):
    """Locally connected layer (``weight [P, O, C·k·k]``) trained over ``M`` groups of kernels."""

    def __init__(self, in_channels: int, out_channels: int, in_size: int, kernel_size: int,
                 stride: int = 1, *, m: int = 1, binary_weights: bool = False,
                 generator: torch.Generator | None = None, name: str = "layer") -> None:
        self.m = check_slices(m, {f"{name}'s kernel count": out_channels})
        if kernel_size > in_size:
            raise ValueError(f"kernel_size {kernel_size} exceeds the input size {in_size}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.in_size = kernel_size, stride, in_size
        self.out_size = (in_size - kernel_size) // stride + 1
        self.positions = self.out_size ** 2
        fan_in = in_channels * kernel_size ** 2
        self.weight_shape = (self.positions, out_channels, fan_in)
        bound = math.sqrt(6.0 / fan_in)
        w = (torch.rand(*self.weight_shape, generator=generator) * 2 - 1) * bound
        self.bias = torch.zeros(self.positions, out_channels)
        self._init_storage(w, binary_weights)

    @property
    def out_features(self) -> int:
        return self.out_channels * self.positions

    @property
    def num_slices(self) -> int:
        return self.m

    def slice_idx(self, k: int):
        o = self.out_channels // self.m
        k %= self.m
        return (slice(None), slice(k * o, (k + 1) * o), slice(None))

    def patches(self, h: torch.Tensor) -> torch.Tensor:
        x = h.reshape(h.shape[0], self.in_channels, self.in_size, self.in_size)
        return F.unfold(x, self.kernel_size, stride=self.stride)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``[B, C·H·W]`` → ``z [B, O·P]`` (channel-major: a flattened ``[B, O, H', W']``)."""
        p = self.patches(h)
        if self.binary_weights:
            z = self.alpha * torch.einsum("bcp,poc->bpo", p, self.signs)
        else:
            z = torch.einsum("bcp,poc->bpo", p, self.weight)
        return (z + self.bias).permute(0, 2, 1).reshape(h.shape[0], -1)

    def out_block(self) -> torch.Tensor:
        """Flat indices of the active kernels' outputs in ``z``."""
        o = self.out_channels // self.m
        k = self.slice_index
        return torch.arange(k * o * self.positions, (k + 1) * o * self.positions)

    def local_update(self, h_in: torch.Tensor, dz_rows: torch.Tensor, lr: float) -> None:
        o = self.out_channels // self.m
        dz = dz_rows.reshape(h_in.shape[0], o, self.positions)
        dw = torch.einsum("bop,bcp->poc", dz, self.patches(h_in))
        self._apply(dw, lr)
        k = self.slice_index
        self.bias[:, k * o:(k + 1) * o] -= self._direction("bias", dz.sum(0).T, lr)


class TinyFoA:
    """TinyFoA and its ablations (``TinyFoA-V-BA-BW`` … ``TinyFoA``) as a harness Method.

    ``sizes = [D_x, D_1, …, D_L]`` builds an FC network with ``L`` hidden layers (the
    prediction is ``B_L h_L``); ``lc=[(C_out, k, stride), …]`` with ``in_shape=(C,H)``
    builds LC hidden layers instead. ``m`` is the slice count (used only when the variant
    has vertical training; ``M = 2`` by default as in §4.1). ``feedback_scale``: ``B_l``'s
    entries are uniform in ``±feedback_scale / sqrt(D_l)``.

    The paper's text trains every layer at once with Eq. 3's SGD, one of the ``M × M``
    slices at a time. The authors' public code differs in three ways, each available here
    so that a benchmark can measure what it changes (defaults: the paper's text):

    - ``optimizer="adam"``: Adam instead of SGD (:meth:`_SlicedLayer.use_adam`);
    - ``layerwise=True``: greedy layer-wise training, one layer after another, each for an
      equal share of the steps (the earlier layers frozen, the later ones not yet run);
    - ``schedule="diagonal-freeze"`` (FC only): each phase holds *one diagonal block* of the
      ``M × M`` grid fixed and trains the rest of the layer, so ``(M² − 1)/M²`` of the
      weights train at once and the gradient is the whole layer's, not the ``1/M²`` that
      Table 1's gradient and update columns count.
    """

    OPTIMIZERS = ("sgd", "adam")
    SCHEDULES = ("slice", "diagonal-freeze")

    def __init__(self, sizes: list[int] | None = None, n_classes: int = 10, *,
                 variant: str | Variant = "TinyFoA", m: int = 2, seed: int = 0,
                 lc: list[tuple[int, int, int]] | None = None,
                 in_shape: tuple[int, int] | None = None, feedback_scale: float = 4.0,
                 optimizer: str = "sgd", layerwise: bool = False,
                 schedule: str = "slice") -> None:
        v = parse_variant(variant) if isinstance(variant, str) else variant
        if v.base != "TinyFoA":
            raise ValueError(f"TinyFoA runs the TinyFoA variants, got {v.name!r}")
        if n_classes < 2:
            raise ValueError(f"n_classes must be >= 2, got {n_classes}")
        if optimizer not in self.OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {self.OPTIMIZERS}, got {optimizer!r}")
        if schedule not in self.SCHEDULES:
            raise ValueError(f"schedule must be one of {self.SCHEDULES}, got {schedule!r}")
        if schedule == "diagonal-freeze" and (lc is not None or not v.vertical):
            raise ValueError("schedule='diagonal-freeze' needs an FC network and a variant "
                             f"with vertical training, got {v.name!r}"
                             + (" with LC layers" if lc is not None else ""))
        self.variant, self.n_classes = v, n_classes
        self.optimizer, self.layerwise, self.schedule = optimizer, bool(layerwise), schedule
        check_slices(m, {})          # M >= 1 even when the variant has no vertical training
        self.m = m if v.vertical else 1
        # the authors' schedule trains the whole layer but one diagonal block: one "slice"
        self.frozen_grid = self.m if schedule == "diagonal-freeze" else 1
        if self.frozen_grid > 1:
            self.m = 1
        self.phase = 0
        self.active_layer = 0
        self.forwards = 0
        g = torch.Generator().manual_seed(seed)
        self.layers: list = []
        if lc is not None:
            if in_shape is None:
                raise ValueError("lc layers need in_shape=(channels, size)")
            c, s = in_shape
            for n, (o, k, st) in enumerate(lc, 1):
                layer = SlicedLC(c, o, s, k, st, m=self.m, binary_weights=v.binary_weights,
                                 generator=g, name=f"LC layer {n}")
                self.layers.append(layer)
                c, s = o, layer.out_size
        else:
            if sizes is None or len(sizes) < 2:
                raise ValueError("sizes must list the input size and at least one hidden size")
            for n, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]), 1):
                self.layers.append(SlicedFC(a, b, m=self.m, binary_weights=v.binary_weights,
                                            generator=g, name=f"hidden layer {n}"))
        if self.frozen_grid > 1:
            for layer in self.layers:
                check_slices(self.frozen_grid, {f"{layer.in_features} inputs": layer.in_features,
                                                f"{layer.out_features} outputs":
                                                layer.out_features})
        if optimizer == "adam":
            for layer in self.layers:
                layer.use_adam()
        # fixed random projections B_l (N_c × D_l), uniform ±feedback_scale/sqrt(D_l)
        self.projections = [(torch.rand(n_classes, layer.out_features, generator=g) * 2 - 1)
                            * feedback_scale / math.sqrt(layer.out_features)
                            for layer in self.layers]
        self.exchanges = 0

    # -- slice schedule -------------------------------------------------------------------
    def set_slice(self, k: int) -> None:
        """Make slice ``k`` active in every layer (one data exchange)."""
        if all(layer.slice_index == k % layer.num_slices
               for layer in self.layers):
            return
        for layer in self.layers:
            layer.set_slice(k)
        self.exchanges += 1

    def set_progress(self, step: int, total_steps: int, exchanges: int) -> None:
        """Slice schedule: ``exchanges`` (``F``) equal phases over ``total_steps``; phase ``f``
        trains slice ``f`` (mod the slice count), or with ``schedule="diagonal-freeze"``
        holds diagonal block ``f`` (mod ``M``) fixed. With ``layerwise`` the steps are also
        cut into one equal share per layer, in order."""
        if exchanges < 1:
            raise ValueError(f"the number of data exchanges F must be >= 1, got {exchanges}")
        total = max(total_steps, 1)
        self.phase = min(step * exchanges // total, exchanges - 1)
        if self.layerwise:
            self.active_layer = min(step * len(self.layers) // total, len(self.layers) - 1)
        self.set_slice(self.phase)

    # -- training -------------------------------------------------------------------------
    @property
    def in_features(self) -> int:
        first = self.layers[0]
        if isinstance(first, SlicedLC):
            return first.in_channels * first.in_size ** 2
        return first.in_features

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        check_batch(x, y, self.in_features, self.n_classes,
                    f"to match the {self.n_classes}-class auxiliary classifiers")
        ba = self.variant.binary_activations
        h = x.reshape(x.shape[0], -1)
        onehot = F.one_hot(y, self.n_classes).to(h.dtype)
        n = h.shape[0]
        losses = []
        for index, (layer, b) in enumerate(zip(self.layers, self.projections)):
            z = layer.forward(h)
            out = activate(z, ba)
            if self.layerwise and index < self.active_layer:
                h = out                   # a frozen earlier layer: forward only
                continue
            a = out @ b.T
            losses.append(float(F.cross_entropy(a, y)))
            da = (torch.softmax(a, -1) - onehot) / n
            rows = layer.out_block()
            dz = (da @ b[:, rows]) * activation_grad_mask(z[:, rows], ba)
            layer.local_update(h, dz, lr, **self._keep(layer))
            h = out
            if self.layerwise:
                break                     # later layers are not trained yet
        self.forwards += n
        return {"loss": losses[-1], "local_losses": losses}

    def _keep(self, layer) -> dict:
        """``{"keep": block}``: the diagonal block that the authors' schedule holds fixed."""
        if self.frozen_grid == 1:
            return {}
        p, g = self.phase % self.frozen_grid, self.frozen_grid
        ro, ci = layer.out_features // g, layer.in_features // g
        return {"keep": (slice(p * ro, (p + 1) * ro), slice(p * ci, (p + 1) * ci))}

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(x.shape[0], -1)
        for layer in self.layers:
            h = activate(layer.forward(h), self.variant.binary_activations)
        return h @ self.projections[-1].T

