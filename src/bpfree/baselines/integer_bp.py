"""Back-propagation baselines of PMT Table 7: FullTrain FP32, FullTrain INT8 and sparse BP.

* :class:`FullTrainFP32` — "FullTrain FP32": plain SGD with back-propagation on the float model
  (the shared :class:`~bpfree.baselines.BPTrainer` with PMT's settings).
* :class:`FullTrainINT8` — "FullTrain INT8" / MCUTrain-style [54, 55] real-quantized BP:
  gradients through a fake-quantized float twin (straight-through estimator) of the int8 model,
  integer update with quantization-aware scaling (QAS, Lin et al. 2022), written into the int8
  model every step.
* :class:`SparseBP` — MCUTrain-style sparse update: :class:`FullTrainINT8` restricted to a
  selected set of layers.

Each implements the :class:`~bpfree.harness.Method` protocol (``forwards`` counts N per step,
``backwards`` the N backward passes, ``step(x, y, lr) -> dict`` with the batch loss before the
update). There is no momentum and no weight decay (PMT §4.1: vanilla SGD).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..harness import check_batch, check_learning_rate
from ..quant.graph import AFFINE_TYPES, _check_model
from ..quant.twin import float_twin
from ..quant.fixed_point import INT32_MAX, INT32_MIN
from ..updates.integer import scaled_step_
from ..updates.integer_layer import (LayerEstimate, _all_finite, apply_update,
                                     quantization_aware_scales)
from .bp import BPTrainer, model_device

__all__ = ["FullTrainFP32", "FullTrainINT8", "SparseBP"]


def _affine_names(qmodel: nn.Module) -> list[str]:
    """Qualified names (``body.…``) of the QConv2d / QLinear layers, in module order."""
    _check_model(qmodel)
    return [f"body.{n}" for n, m in qmodel.body.named_modules() if isinstance(m, AFFINE_TYPES)]


def _select_names(valid: list[str], trainable, what: str = "integer layers") -> list[str]:
    if trainable is None:
        return list(valid)
    names = [trainable] if isinstance(trainable, str) else list(trainable)
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(f"unknown trainable layer(s) {unknown}; the model's {what} are "
                         f"{valid}")
    chosen = set(names)
    out = [n for n in valid if n in chosen]
    if not out:
        raise ValueError(f"no trainable layers selected; choose among {valid}")
    return out


class FullTrainFP32(BPTrainer):
    """"FullTrain" in FP32 (PMT Table 7): plain SGD with back-propagation on the float model.

    ``theta <- theta - lr * dL/dtheta`` with ``L`` the mean cross-entropy of the batch; no
    momentum, no weight decay (§4.1): the shared :class:`~bpfree.baselines.BPTrainer` with
    ``frozen_statistics=True``. The model is kept in ``eval()`` mode, so BatchNorm uses (and
    keeps) its running statistics — the trained model stays foldable into an int8 one — and
    dropout is off; BatchNorm's affine parameters are trained like any other.

    ``forwards`` counts forward passes only (N per step), Table 5's unit; BP also runs one
    backward pass per sample, counted in ``backwards``.

    Args:
        model: the float ``nn.Module`` (``accuracy(method.model, x, y)`` evaluates it).
        trainable: names of modules (``model.named_modules()``) whose parameters train; the
            others get ``requires_grad = False``. Default: every parameter.
        lr_scale: optional ``{module name: factor}``; that module's parameters step at
            ``factor * lr`` (parameter groups, as ``PMTTrainer(lr_scale=...)``): a freshly
            initialised head beside pretrained layers needs a far larger rate than they do.
    """

    def __init__(self, model: nn.Module, *, trainable=None,
                 lr_scale: dict[str, float] | None = None) -> None:
        if isinstance(model, nn.Module) and trainable is None:
            for p in model.parameters():  # "every parameter", frozen ones included
                p.requires_grad_(True)
        super().__init__(model, "sgd", loss_fn=F.cross_entropy, trainable=trainable,
                         lr_scale=lr_scale, frozen_statistics=True)


class FullTrainINT8:
    """Real-quantized BP, "FullTrain INT8" / MCUTrain [54, 55] (PMT Table 7).

    The int8 model is the one trained and evaluated; back-propagation runs through a float twin
    (:func:`bpfree.quant.twin.float_twin` with ``fake_quant=True``) whose parameters hold the
    int8 weights ``W̄`` and int32 biases in integer units and whose activations are
    fake-quantized with the int8 model's scales (straight-through estimator). Each step:

    1. the twin is re-synced from the int8 buffers;
    2. ``g = dL/dW̄`` (and ``dL/db̄``) by autograd on the mean cross-entropy of the batch;
    3. the integer update ``W̄ <- clip(round(W̄ - lr * g / s_w^2))`` with QAS (MCUTrain's
       quantization-aware scaling, which makes it the float SGD step at the weight's scale;
       bias at ``s_in s_w``) or ``W̄ <- clip(round(W̄ - lr * g))`` without, via
       :func:`~bpfree.updates.integer_layer.apply_update` (``gns=False``) directly on the int8 buffers.

    Without QAS a typical float learning rate moves almost nothing: ``|lr * g| < 0.5`` LSB is
    rounded away (PMT §3.1.2, Table 7's weak INT8 FullTrain).

    ``latent_weights=True`` keeps what MCUTrain's training code keeps (tiny-training's
    ``SGDScale`` steps float Parameters in integer units and never rounds them; the forward
    rounds): a float64 copy of each trained layer's weights and biases in integer units
    (clipped to the int8 / int32 range), stepped by the same QAS update without rounding,
    with ``round(latent)`` written into the int8 model after every step. Updates below half
    an LSB then accumulate instead of being rounded away each step (with a freshly
    initialised head and a small rate, none of the head's steps reached half an LSB, so the
    per-step rounding left it untouched). It costs 8 bytes per trained value on the host;
    the int8 model is still the one evaluated. If the int8 buffers are changed from outside,
    the copy restarts from them.

    ``"loss"`` is the twin's (fake-quantized) loss, which BP differentiates; ``forwards`` counts
    N per step and ``backwards`` N per step.

    Args:
        qmodel: the real-quantized model (``accuracy(method.model, x, y)`` evaluates it).
        qas: quantization-aware scaling. trainable: names of the integer layers to train
            (``body.…``, default all); the others' twin parameters get ``requires_grad=False``.
        latent_weights: keep the unrounded copy described above (default: round every step).
    """

    def __init__(self, qmodel: nn.Module, *, qas: bool = True, trainable=None,
                 latent_weights: bool = False) -> None:
        valid = _affine_names(qmodel)
        if not valid:
            raise ValueError("the model has no QConv2d / QLinear layers to train")
        self.names = _select_names(valid, trainable)
        self.model = qmodel
        self.qas = bool(qas)
        self.latent_weights = bool(latent_weights)
        # Keyed by the layer module itself, not id(): an epoch snapshot (checkpoint.resume)
        # pickles this trainer, and ids do not survive a pickle.
        self._latent: dict[nn.Module, tuple[torch.Tensor, torch.Tensor | None]] = {}
        modules = dict(qmodel.named_modules())
        self.qlayers = {name: modules[name] for name in valid}
        self.twin = float_twin(qmodel, fake_quant=True)
        twin_modules = dict(self.twin.named_modules())
        missing = [name for name in valid if name not in twin_modules]
        if missing:
            raise RuntimeError(f"float_twin lacks layers {missing}")
        self.tlayers = {name: twin_modules[name] for name in valid}
        chosen = set(self.names)
        for p in self.twin.parameters():
            p.requires_grad_(False)
        for name in self.names:
            t = self.tlayers[name]
            t.weight.requires_grad_(True)
            if getattr(t, "bias", None) is not None:
                t.bias.requires_grad_(True)
        self._trained = [self.tlayers[n] for n in valid if n in chosen]
        self.forwards = 0
        self.backwards = 0
        self.steps = 0

    @torch.no_grad()
    def sync(self) -> None:
        """Copy the int8 / int32 buffers of the int8 model into the twin's parameters."""
        for name, q in self.qlayers.items():
            t = self.tlayers[name]
            t.weight.copy_(q.weight.to(t.weight.dtype))
            if getattr(t, "bias", None) is not None:
                t.bias.copy_(q.bias.to(t.bias.dtype))

    def gradients(self, x: torch.Tensor, y: torch.Tensor
                  ) -> tuple[dict[str, LayerEstimate], torch.Tensor]:
        """(name -> exact BP gradient in integer units, mean twin loss) at the current int8
        weights. Counts N forwards and N backwards."""
        check_batch(x, y)
        device = model_device(self.model)
        x, y = x.to(device), y.to(device)
        self.sync()
        self.twin.eval()
        for t in self._trained:
            t.weight.grad = None
            if getattr(t, "bias", None) is not None:
                t.bias.grad = None
        loss = F.cross_entropy(self.twin(x), y)
        if not bool(torch.isfinite(loss)):
            raise FloatingPointError("non-finite loss; model unchanged")
        loss.backward()
        out = {}
        for name in self.names:
            t = self.tlayers[name]
            gw = t.weight.grad
            gw = torch.zeros_like(t.weight, dtype=torch.float64) if gw is None else gw.double()
            b = getattr(t, "bias", None)
            gb = None if b is None else (torch.zeros_like(b, dtype=torch.float64)
                                         if b.grad is None else b.grad.double())
            out[name] = LayerEstimate(gw.detach(), None if gb is None else gb.detach(),
                                      directions=1, dimension=1)
            t.weight.grad = None
            if b is not None:
                b.grad = None
        n = x.shape[0]
        self.forwards += n
        self.backwards += n
        return out, loss.detach()

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> dict:
        lr = check_learning_rate(lr)
        start_forwards = self.forwards
        grads, loss = self.gradients(x, y)
        update = self._latent_update if self.latent_weights else (
            lambda layer, g, rate: apply_update(layer, g, rate, gns=False, qas=self.qas))
        stats = {name: update(self.qlayers[name], grads[name], lr) for name in self.names}
        self.sync()
        self.steps += 1
        changed = [s["changed"] for s in stats.values()]
        return {"loss": float(loss), "forwards": self.forwards - start_forwards,
                "changed": sum(changed) / len(changed)}

    @torch.no_grad()
    def _latent_of(self, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The float64 copy of ``layer``'s weights and bias, (re)started from the integer
        buffers when it is missing or no longer rounds to them."""
        key = layer
        kept = self._latent.get(key)
        if kept is not None and torch.equal(kept[0].round().to(layer.weight.dtype), layer.weight) \
                and (kept[1] is None or torch.equal(kept[1].round().to(layer.bias.dtype),
                                                    layer.bias)):
            return kept
        bias = getattr(layer, "bias", None)
        kept = (layer.weight.to(torch.float64).clone(),
                None if bias is None else bias.to(torch.float64).clone())
        self._latent[key] = kept
        return kept

    @torch.no_grad()
    def _latent_update(self, layer: nn.Module, estimate: LayerEstimate, lr: float
                       ) -> dict[str, float]:
        """``latent <- clip(latent - lr * QAS * g)`` and ``W̄ <- round(latent)`` (no GNS: the
        gradient is exact)."""
        if not (_all_finite(estimate.weight) and (estimate.bias is None or
                                                 _all_finite(estimate.bias))):
            raise FloatingPointError(f"non-finite gradient; {type(layer).__name__} unchanged")
        w, b = self._latent_of(layer)
        qw, qb = quantization_aware_scales(layer) if self.qas else (None, None)
        w.add_(scaled_step_(estimate.weight, lr, qw)).clamp_(-128, 127)
        w_new = w.round().to(layer.weight.dtype)
        changed = float((w_new != layer.weight).sum()) / max(w_new.numel(), 1)
        layer.weight.copy_(w_new)
        if b is not None and estimate.bias is not None:
            b.add_(scaled_step_(estimate.bias, lr, qb)).clamp_(INT32_MIN, INT32_MAX)
            layer.bias.copy_(b.round().to(layer.bias.dtype))
        return {"gns": 1.0, "changed": changed}


class SparseBP(FullTrainINT8):
    """MCUTrain-style sparse back-propagation [55]: :class:`FullTrainINT8` on selected layers.

    MCUTrain updates only a statically chosen set of layers (found offline by evolutionary
    search under the memory budget, PMT §4.3); here the selection is given. Only those layers'
    twin parameters receive gradients; the rest of the int8 model is frozen.

    Args:
        qmodel: the real-quantized model.
        trainable: non-empty list of integer layer names (``body.…``).
        qas: quantization-aware scaling (MCUTrain uses it).
        latent_weights: MCUTrain's unrounded copy (:class:`FullTrainINT8`).
    """

    def __init__(self, qmodel: nn.Module, *, trainable, qas: bool = True,
                 latent_weights: bool = False) -> None:
        if trainable is None or (not isinstance(trainable, str) and len(list(trainable)) == 0):
            valid = _affine_names(qmodel)
            raise ValueError(f"SparseBP needs a non-empty list of trainable layers among {valid}")
        super().__init__(qmodel, qas=qas, trainable=trainable, latent_weights=latent_weights)
