"""Local learning rules and BP on binary / sliced networks: the baselines of TinyFoA Tables 1–3.

Each takes a variant name (``"BP"``, ``"DRTP+BW"``, ``"FF+BW+BA"``, ``"BP+BW+BA+V"``…):
``+BW`` binary weights (XNOR scaling, STE mask ``|W| <= 1``), ``+BA`` binary activations
(sign, STE mask ``|z| <= 1``), ``+V`` vertical training (only the active ``M × M`` slice of
each hidden weight, and the active input block of the output weight, is updated).

Update rules (``n`` the batch size, ``f'`` the activation derivative, ``y`` one-hot):

- **BP**: autograd of the mean cross-entropy, SGD.
- **DRTP** (Frenkel et al. 2021): hidden ``δz_l = −(y B_l) ⊙ f'(z_l)`` (tanh units), fixed
  random ``B_l ∈ R^{N_c × D_l}`` — the target, not the error, is the learning signal —;
  output ``δz_L = p − y``; ``ΔW_l = −η δz_lᵀ h_{l−1} / n``.
- **PEPITA** (Dellaferrera et al. 2022), 3 hidden layers: pass 1 gives ``e = p − y``;
  pass 2 runs on ``x + e Fᵀ`` (fixed ``F ∈ R^{D_x × N_c}``);
  ``ΔW_1 = (h_1 − h_1^mod)ᵀ x^mod``,
  ``ΔW_l = (h_l − h_l^mod)ᵀ h_{l−1}^mod``, ``ΔW_L = eᵀ h_{L−1}^mod`` (all ``/ n``).
- **FF** (Hinton 2022): the label is written into the first ``N_c`` inputs; each layer sees
  its input normalised to unit RMS, goodness ``g = Σ h²``, loss
  ``softplus(θ − g_pos) + softplus(g_neg − θ)`` with ``θ`` = the layer width; negative
  data carry a random label that is never the true one; inference tries every label and
  picks the largest summed goodness.

With ``+V`` these baselines compute their gradient as usual and keep only the active slice
(the paper's rows for BP+V are an accounting of what a sliced implementation would need;
TinyFoA's own sliced step in :mod:`bpfree.tinyfoa.local` never forms the full gradient).

The layers are :mod:`bpfree.quant.binary`'s, the variant names :mod:`.variants`'. These classes
moved here from ``bpfree.tinyfoa.baselines``, which re-exports them beside TinyFoA's
``make_method``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..quant.binary import (BinaryLinear, LocallyConnected2d, act, act_ste_mask, sign,
                            weight_ste_mask)
from .variants import Variant, check_batch, check_slices, parse_variant

__all__ = ["BP", "DRTP", "FF", "PEPITA"]


class _Baseline:
    base = ""

    def __init__(self, sizes: list[int], n_classes: int = 10, *, variant: str | Variant = "",
                 m: int = 2, seed: int = 0) -> None:
        v = parse_variant(variant or self.base) if not isinstance(variant, Variant) else variant
        if v.base != self.base:
            raise ValueError(f"{type(self).__name__} runs {self.base} variants, got {v.name!r}")
        if n_classes < 2:
            raise ValueError(f"n_classes must be >= 2, got {n_classes}")
        if len(sizes) < 2:
            raise ValueError("sizes must list the input size and at least one hidden size")
        self.variant, self.n_classes, self.sizes = v, n_classes, list(sizes)
        check_slices(m, {})          # M >= 1 even when the variant has no vertical training
        self.m = 1
        if v.vertical:
            named = {f"hidden layer {i}'s input size": a for i, a in enumerate(sizes[:-1], 1)}
            named.update({f"hidden layer {i}'s output size": b
                          for i, b in enumerate(sizes[1:], 1)})
            self.m = check_slices(m, named)
        self.generator = torch.Generator().manual_seed(seed)
        self.layers = [BinaryLinear(a, b, binary_weights=v.binary_weights,
                                    generator=self.generator)
                       for a, b in zip(sizes[:-1], sizes[1:])]
        self.output = BinaryLinear(sizes[-1], n_classes, binary_weights=v.binary_weights,
                                   generator=self.generator)
        self.forwards = 0
        self.slice_k = 0

    # -- vertical training ----------------------------------------------------------------
    def set_progress(self, step: int, total_steps: int, exchanges: int) -> None:
        if exchanges < 1:
            raise ValueError(f"the number of data exchanges F must be >= 1, got {exchanges}")
        self.slice_k = min(step * exchanges // max(total_steps, 1), exchanges - 1)

    def _slice(self, layer, is_output: bool) -> tuple[tuple, tuple]:
        """``(weight index, bias index)`` of the active slice: ``M × M`` blocks of an FC
        weight, the active input block of the output layer, ``M`` groups of LC kernels."""
        full = (slice(None),) * layer.weight.dim()
        if self.m == 1:
            return full, (slice(None),) * layer.bias.dim()
        if layer.weight.dim() == 3:                       # LC: [P, O, C·k·k]
            o = layer.weight.shape[1] // self.m
            k = self.slice_k % self.m
            blk = slice(k * o, (k + 1) * o)
            return (slice(None), blk, slice(None)), (slice(None), blk)
        out_f, in_f = layer.weight.shape
        if is_output:
            i = self.slice_k % self.m
            c = in_f // self.m
            return (slice(None), slice(i * c, (i + 1) * c)), (slice(None),)
        k = self.slice_k % (self.m * self.m)
        i, j = k % self.m, k // self.m
        r, c = out_f // self.m, in_f // self.m
        rows = slice(j * r, (j + 1) * r)
        return (rows, slice(i * c, (i + 1) * c)), (rows,)

    def _sgd(self, layer, dw: torch.Tensor, db: torch.Tensor, lr: float,
             is_output: bool = False, ste: bool = True) -> None:
        """``W −= η dW`` (STE-masked with binary weights when ``ste``), on the slice only."""
        with torch.no_grad():
            if ste and layer.binary_weights:
                dw = dw * weight_ste_mask(layer.weight)
            widx, bidx = self._slice(layer, is_output)
            layer.weight[widx] -= lr * dw[widx]
            layer.bias[bidx] -= lr * db[bidx]

    def _check_labels(self, x: torch.Tensor, y: torch.Tensor) -> None:
        check_batch(x, y, self.sizes[0], self.n_classes,
                    f"for a {self.n_classes}-class network")

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(x.shape[0], -1)
        for layer in self.layers:
            h = self._act(layer(h))
        return self.output(h)

    def _act(self, z: torch.Tensor) -> torch.Tensor:
        return act(z, self.variant.binary_activations)


class BP(_Baseline):
    """End-to-end backpropagation (and +BW/+BA/+V); ``lc=[(C_out, k, stride), …]`` with
    ``in_shape=(C, H)`` builds locally connected hidden layers (Table 3) instead of FC."""

    base = "BP"

    def __init__(self, sizes=None, n_classes=10, *, lc=None, in_shape=None, m: int = 2,
                 **kw) -> None:
        if lc is None:
            super().__init__(sizes, n_classes, m=m, **kw)
            return
        if in_shape is None:
            raise ValueError("lc layers need in_shape=(channels, size)")
        c, size = in_shape
        check_slices(m, {})
        super().__init__([c * size * size, 1], n_classes, m=1, **kw)
        if self.variant.vertical:
            self.m = check_slices(m, {f"LC layer {i}'s kernel count": o
                                      for i, (o, _, _) in enumerate(lc, 1)})
        self.layers, self.shapes = [], []
        for o, k, st in lc:
            layer = LocallyConnected2d(c, o, size, k, st,
                                       binary_weights=self.variant.binary_weights,
                                       generator=self.generator)
            self.layers.append(layer)
            self.shapes.append((c, size))
            c, size = o, layer.out_size
        self.output = BinaryLinear(c * size * size, n_classes,
                                   binary_weights=self.variant.binary_weights,
                                   generator=self.generator)

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        self._check_labels(x, y)
        params = [p for layer in [*self.layers, self.output] for p in (layer.weight, layer.bias)]
        for p in params:
            p.grad = None
        logits = self.forward_train(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        # the STE mask is already inside BinarizeWeight's backward
        for i, layer in enumerate([*self.layers, self.output]):
            self._sgd(layer, layer.weight.grad, layer.bias.grad, lr,
                      is_output=i == len(self.layers), ste=False)
        self.forwards += x.shape[0]
        return {"loss": float(loss.detach())}

    def forward_train(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(x.shape[0], -1)
        for i, layer in enumerate(self.layers):
            if isinstance(layer, LocallyConnected2d):
                c, size = self.shapes[i]
                z = layer(h.reshape(h.shape[0], c, size, size)).reshape(h.shape[0], -1)
            else:
                z = layer(h)
            h = act(z, self.variant.binary_activations)
        return self.output(h)

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_train(x)


class DRTP(_Baseline):
    """Direct Random Target Projection: hidden layers learn from ``y B_l``, not the error."""

    base = "DRTP"

    # full-precision DRTP uses tanh hidden units (Frenkel et al.): a target-driven update
    # on ReLU units has nothing that bounds it
    def _act(self, z: torch.Tensor) -> torch.Tensor:
        return sign(z) if self.variant.binary_activations else torch.tanh(z)

    def _act_grad(self, z: torch.Tensor) -> torch.Tensor:
        if self.variant.binary_activations:
            return act_ste_mask(z)
        return 1 - torch.tanh(z) ** 2

    def __init__(self, sizes, n_classes=10, *, feedback_scale: float = 2.0, **kw) -> None:
        super().__init__(sizes, n_classes, **kw)
        # B_l entries uniform in ±feedback_scale (the target's projection sets each unit's
        # learning signal directly, so it is not normalised by the width)
        self.projections = [(torch.rand(n_classes, b, generator=self.generator) * 2 - 1)
                            * feedback_scale for b in self.sizes[1:]]

    @torch.no_grad()
    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        self._check_labels(x, y)
        h = x.reshape(x.shape[0], -1)
        n = h.shape[0]
        onehot = F.one_hot(y, self.n_classes).to(h.dtype)
        for layer, b in zip(self.layers, self.projections):
            z = layer(h)
            dz = -(onehot @ b) * self._act_grad(z)
            self._sgd(layer, dz.T @ h / n, dz.sum(0) / n, lr)
            h = self._act(z)
        logits = self.output(h)
        dz = torch.softmax(logits, -1) - onehot
        self._sgd(self.output, dz.T @ h / n, dz.sum(0) / n, lr, is_output=True)
        self.forwards += n
        return {"loss": float(F.cross_entropy(logits, y))}


class PEPITA(_Baseline):
    """Error-driven input modulation: a second forward pass on ``x + e Fᵀ``."""

    base = "PEPITA"

    def __init__(self, sizes, n_classes=10, *, f_scale: float = 0.05, **kw) -> None:
        super().__init__(sizes, n_classes, **kw)
        d = self.sizes[0]
        self.feedback = ((torch.rand(d, n_classes, generator=self.generator) * 2 - 1)
                         * f_scale * math.sqrt(6.0 / d))

    def _pass(self, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        hs, h = [], x
        for layer in self.layers:
            h = act(layer(h), self.variant.binary_activations)
            hs.append(h)
        return hs, self.output(h)

    @torch.no_grad()
    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        self._check_labels(x, y)
        x = x.reshape(x.shape[0], -1)
        n = x.shape[0]
        onehot = F.one_hot(y, self.n_classes).to(x.dtype)
        hs, logits = self._pass(x)
        e = torch.softmax(logits, -1) - onehot
        x_mod = x + e @ self.feedback.T
        hs_mod, _ = self._pass(x_mod)
        inputs = [x_mod, *hs_mod[:-1]]
        for layer, h, hm, hin in zip(self.layers, hs, hs_mod, inputs):
            d = h - hm
            self._sgd(layer, d.T @ hin / n, d.sum(0) / n, lr)
        self._sgd(self.output, e.T @ hs_mod[-1] / n, e.sum(0) / n, lr, is_output=True)
        self.forwards += 2 * n
        return {"loss": float(F.cross_entropy(logits, y))}


class FF(_Baseline):
    """Forward-Forward: per-layer goodness, positive vs negative (wrong-label) data."""

    base = "FF"

    def __init__(self, sizes, n_classes=10, *, threshold: float | None = None, **kw) -> None:
        super().__init__(sizes, n_classes, **kw)
        if self.sizes[0] < n_classes:
            raise ValueError(f"FF embeds the label in the first {n_classes} inputs, but the "
                             f"input has only {self.sizes[0]}")
        self.thresholds = [float(threshold) if threshold is not None else float(b)
                           for b in self.sizes[1:]]

    def embed(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], -1).clone()
        x[:, :self.n_classes] = 0
        x[torch.arange(x.shape[0]), labels] = 1.0
        return x

    def negative_labels(self, y: torch.Tensor) -> torch.Tensor:
        """A random label different from ``y`` for every sample."""
        shift = torch.randint(1, self.n_classes, y.shape, generator=self.generator)
        return (y + shift) % self.n_classes

    @staticmethod
    def normalise(h: torch.Tensor) -> torch.Tensor:
        return h / (h.pow(2).mean(1, keepdim=True).sqrt() + 1e-8)

    def layer_loss(self, layer: BinaryLinear, theta: float, pos: torch.Tensor,
                   neg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ba = self.variant.binary_activations
        hp = act(layer(self.normalise(pos)), ba)
        hn = act(layer(self.normalise(neg)), ba)
        gp, gn = hp.pow(2).sum(1), hn.pow(2).sum(1)
        loss = F.softplus(theta - gp).mean() + F.softplus(gn - theta).mean()
        return loss, hp, hn

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        self._check_labels(x, y)
        pos, neg = self.embed(x, y), self.embed(x, self.negative_labels(y))
        total = 0.0
        for layer, theta in zip(self.layers, self.thresholds):
            layer.weight.grad = layer.bias.grad = None
            loss, hp, hn = self.layer_loss(layer, theta, pos.detach(), neg.detach())
            loss.backward()
            self._sgd(layer, layer.weight.grad, layer.bias.grad, lr, ste=False)
            total += float(loss.detach())
            pos, neg = hp.detach(), hn.detach()
        self.forwards += 2 * x.shape[0]
        return {"loss": total}

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Summed goodness for every candidate label (``[B, N_c]``; argmax = prediction)."""
        scores = []
        for c in range(self.n_classes):
            h = self.embed(x, torch.full((x.shape[0],), c, dtype=torch.long))
            g = torch.zeros(x.shape[0])
            for layer in self.layers:
                h = act(layer(self.normalise(h)), self.variant.binary_activations)
                g += h.pow(2).sum(1)
            scores.append(g)
        return torch.stack(scores, 1)
