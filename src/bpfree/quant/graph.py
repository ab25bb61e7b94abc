"""The integer model as a forward-only trainer sees it: trainable layers, stages, partial forwards.

PMT's trainer, QZO-FF's integer path and the integer ZO baselines (MeZO, DeepZero CGE) all
train a real-quantized model through this view (it moved here from ``bpfree.pmt.graph``,
which re-exports it).

PMT (§3.4.2) starts every perturbed forward pass at the layer being estimated, from an input
activation kept in the activation buffer. A real-quantized model here is a
:class:`~bpfree.quant.ptq.QuantizedModel`-like module: ``body`` is an ``nn.Sequential`` of
stages that each map one int8 tensor to one int8 tensor (an inverted-residual block with its
residual add is one stage), ``input_quant`` quantizes images and ``output_quant`` dequantizes
logits. :class:`StagedModel` caches the input of every stage during the clean forward, so a
perturbed pass for a layer in stage ``k`` recomputes only stages ``k`` onward.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .engine import ENGINES, BlockOp, fast_stages, to_nchw, to_nhwc
from .layers import QConv2d, QLinear, _check_int8_input
from .stages import QInvertedResidual

__all__ = ["AFFINE_TYPES", "StageEntry", "StagedModel", "TrainableLayer", "find_layers",
           "per_sample_loss", "select_layers"]

AFFINE_TYPES = (QConv2d, QLinear)


@dataclass(frozen=True)
class TrainableLayer:
    """One integer affine layer: its qualified name, module, stage index and dimensions.

    ``d_w`` is the number of weights, ``d_a`` the number of output nodes per sample (PMT §3.2.2:
    WP is chosen for the layer when ``d_w < d_a``, else NP).
    """

    name: str
    module: nn.Module
    stage: int
    d_w: int
    d_a: int
    output_shape: tuple[int, ...]

    @property
    def preferred_mode(self) -> str:
        return "wp" if self.d_w < self.d_a else "np"


def _check_model(model: nn.Module) -> None:
    missing = [a for a in ("body", "input_quant", "output_quant") if not hasattr(model, a)]
    if missing or not isinstance(model.body, nn.Sequential):
        raise ValueError("PMT trains a real-quantized model with an nn.Sequential `body` of int8 "
                         "stages and `input_quant` / `output_quant` (build one with "
                         "bpfree.quant.quantize_model); got "
                         f"{type(model).__name__} missing {missing or ['Sequential body']}")


def find_layers(model: nn.Module, sample: torch.Tensor) -> list[TrainableLayer]:
    """Every QConv2d / QLinear of ``model.body`` in forward order, with d_w and d_a.

    ``sample`` is one int8 (or float) input batch used only to record output shapes.
    """
    _check_model(model)
    shapes: dict[str, tuple[int, ...]] = {}
    order: list[str] = []
    handles = []
    modules = {}
    for name, module in model.body.named_modules():
        if isinstance(module, AFFINE_TYPES):
            modules[name] = module

            def hook(mod, args, out, name=name):
                if name not in shapes:
                    order.append(name)
                    shapes[name] = tuple(out.shape[1:])
            handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            x = sample[:1]
            model.body(x if x.dtype == torch.int8 else model.input_quant.quantize(x))
    finally:
        for h in handles:
            h.remove()
    layers = []
    for name in order:
        module = modules[name]
        shape = shapes[name]
        layers.append(TrainableLayer(
            name=f"body.{name}", module=module, stage=int(name.split(".")[0]),
            d_w=module.weight.numel(), d_a=int(torch.Size(shape).numel()),
            output_shape=shape))
    return layers


def select_layers(layers: list[TrainableLayer], trainable) -> list[TrainableLayer]:
    """The layers named by ``trainable`` (a name or names; None: all), in forward order.

    Raises ValueError naming any unknown layer and the model's integer layers."""
    if trainable is None:
        return list(layers)
    names = [trainable] if isinstance(trainable, str) else list(trainable)
    known = {layer.name for layer in layers}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown trainable layer(s) {unknown}; the model's integer layers are "
                         f"{sorted(known)}")
    chosen = set(names)
    return [layer for layer in layers if layer.name in chosen]


def per_sample_loss(logits_q: torch.Tensor, target: torch.Tensor, output_quant) -> torch.Tensor:
    """Cross-entropy of each sample from int8 logits, in float64.

    The MCU dequantizes the logits to compute the loss; float64 makes the loss differences
    ``l_q - l`` of Eq. 6 / 9 free of float32 cancellation.
    """
    logits = (logits_q.to(torch.float64) - output_quant.zero_point) * output_quant.scale
    return F.cross_entropy(logits, target, reduction="none")


@dataclass(frozen=True)
class StageEntry:
    """A partial forward's starting point (:meth:`StagedModel.entry`): stage ``stage``, op
    ``index`` of its chain, that op's input ``inner`` and the stage's input ``stage_input``
    (for its residual add), both in the engine's layout."""

    stage: int
    index: int
    inner: torch.Tensor
    stage_input: torch.Tensor


class StagedModel:
    """Clean forward with cached stage inputs, and partial forwards from any stage.

    ``engine`` picks how stages run: "auto" (default) runs them on the fused channels-last
    int8 kernels of :mod:`bpfree.quant.engine` when they compile and the model is on the CPU,
    else on the reference layers; "reference" always uses the reference layers; "fast"
    insists on the kernels. Both give the same bits; cached stage inputs are NCHW either way.
    """

    def __init__(self, model: nn.Module, engine: str = "auto") -> None:
        _check_model(model)
        self.model = model
        self.stages = list(model.body)
        self.inputs: list[torch.Tensor] = []
        on_cpu = all(t.device.type == "cpu" for t in itertools.chain(model.parameters(),
                                                                     model.buffers()))
        if engine == "fast" and not on_cpu:
            raise ValueError("engine='fast' runs on the CPU; the model is on another device")
        self.fast = fast_stages(self.stages, engine) if on_cpu or engine not in ENGINES \
            else None
        self.engine = "fast" if self.fast is not None else "reference"
        self._nhwc: tuple | None = None

    def __getstate__(self) -> dict:
        # The compiled kernels are ctypes handles, which do not pickle (an epoch snapshot,
        # checkpoint.resume, pickles the trainer): a copy rebuilds them from its stages.
        state = dict(self.__dict__, fast=None, _nhwc=None)
        state["_had_fast"] = self.fast is not None
        return state

    def __setstate__(self, state: dict) -> None:
        had_fast = state.pop("_had_fast", False)
        self.__dict__.update(state)
        if had_fast:
            self.fast = fast_stages(self.stages, "auto")
            self.engine = "fast" if self.fast is not None else "reference"

    def _run(self, start: int, h: torch.Tensor, end: int | None = None) -> torch.Tensor:
        """Stages ``start .. end - 1`` on ``h`` (NCHW int8), on the fast path when there is one."""
        if self.fast is None:
            for stage in self.stages[start:end]:
                h = stage(h)
            return h
        _check_int8_input(h)
        return to_nchw(self.fast.run_nhwc(start, self._channels_last(h), end))

    def _channels_last(self, h: torch.Tensor) -> torch.Tensor:
        # A perturbed forward starts from the same cached stage input Q times: convert once.
        if h.dim() != 4:
            return h
        key = (h.data_ptr(), h._version, tuple(h.shape), tuple(h.stride()))
        if self._nhwc is None or self._nhwc[0] != key:
            self._nhwc = (key, to_nhwc(h), h)
        return self._nhwc[1]

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.dtype == torch.int8 else self.model.input_quant.quantize(x)

    @torch.no_grad()
    def clean(self, xq: torch.Tensor, cache: bool = True, keep: int = 0) -> torch.Tensor:
        """Full forward from int8 ``xq``; returns int8 logits.

        ``cache=True`` keeps the input of every stage (fast partial forwards from any stage);
        ``cache=False`` keeps only the input of stage ``keep`` (``xq`` for 0), and
        :meth:`advance` moves the buffer stage by stage as Algorithm 1 does (one activation
        buffer instead of one per stage).
        """
        self.inputs = [xq if cache or keep == 0 else None] + [None] * len(self.stages)
        h = xq
        for k in range(len(self.stages)):
            h = self._run(k, h, k + 1)
            if cache or k + 1 == keep:
                self.inputs[k + 1] = h
        return h

    @torch.no_grad()
    def advance(self, k: int) -> torch.Tensor:
        """Compute the input of stage ``k + 1`` from that of stage ``k`` and free the latter."""
        h = self._run(k, self.inputs[k], k + 1)
        self.inputs[k + 1], self.inputs[k] = h, None
        return h

    def by_stage(self, layers: list[TrainableLayer], estimate: Callable, finish: Callable,
                 start: int = 0) -> None:
        """Algorithm 1's schedule with one activation buffer, from the held input of ``start``.

        For each stage holding some of ``layers`` (in forward order): ``estimate(layer)`` for
        each of its layers while the stage input is held; then the stage output is recomputed
        with the step-t weights (line 34) and ``finish(layer, estimate)`` applies or stores each
        estimate (line 33). Later stages thus see step-t activations (the synchronized update)
        while at most one stage's estimates are pending. Frozen stages are only advanced.
        """
        current = start
        for stage, group in itertools.groupby(layers, key=lambda layer: layer.stage):
            group = list(group)
            while current < stage:
                self.advance(current)
                current += 1
            estimates = [estimate(layer) for layer in group]
            self.advance(stage)
            current = stage + 1
            for layer in group:
                # Popped, not iterated: a name still holding a finished stage's estimates
                # would keep their buffers alive through the next stage's estimation.
                finish(layer, estimates.pop(0))

    @torch.no_grad()
    def from_stage(self, k: int, h: torch.Tensor | None = None) -> torch.Tensor:
        """Forward from stage ``k`` on, starting from ``h`` (default: the cached input)."""
        if h is None:
            h = self.inputs[k]
        return self._run(k, h)

    def _chain(self, k: int) -> nn.Sequential | None:
        """Stage ``k``'s chain of modules when the stage can be entered inside it: a MobileNetV2
        block's body (then its residual add) or a plain Sequential; None otherwise."""
        stage = self.stages[k]
        if self.fast is not None and self.fast.block(k) is None:
            return None
        if type(stage) is QInvertedResidual:
            return stage.body
        return stage if type(stage) is nn.Sequential else None

    def _block(self, k: int) -> BlockOp:
        """Stage ``k`` as a chain enterable at any op: the engine's compiled one, or the same
        walk over the reference modules (only called where :meth:`_chain` found a chain)."""
        if self.fast is not None:
            return self.fast.block(k)
        stage = self.stages[k]
        add = stage.add if type(stage) is QInvertedResidual else None
        return BlockOp(list(self._chain(k)), add)

    def entry(self, k: int, module: nn.Module | None = None) -> StageEntry:
        """Where a perturbed forward of ``module`` (a layer of stage ``k``) starts: the input of
        ``module`` inside its stage, computed once from the cached stage input.

        Perturbing a layer changes nothing before it, so Q queries need not recompute the
        layers of its stage that precede it (Algorithm 1 holds the activation buffer a^(i) of
        the layer, not only of its block). Without ``module``, or where the stage cannot be
        entered inside, the entry is the stage input itself.
        """
        chain = self._chain(k) if module is not None else None
        i = next((j for j, m in enumerate(chain) if m is module), 0) if chain is not None else 0
        x = self.inputs[k]
        if self.fast is not None:
            _check_int8_input(x)
            x = self._channels_last(x)
        with torch.no_grad():
            return StageEntry(k, i, self._block(k).prefix(i, x) if i else x, x)

    @torch.no_grad()
    def from_entry(self, entry: StageEntry, copies: int = 1) -> torch.Tensor:
        """int8 logits of the forward from ``entry`` on, the batch repeated ``copies`` times
        (one copy per query of a batched node perturbation)."""
        k, i, inner, x = entry.stage, entry.index, entry.inner, entry.stage_input
        if copies > 1:
            inner = inner.repeat(copies, *[1] * (inner.dim() - 1))
            x = x.repeat(copies, *[1] * (x.dim() - 1)) if i else inner
        if i:  # inside stage k: finish it, then run the stages after it
            inner, k = self._block(k).from_inner(i, inner, x), k + 1
        if self.fast is None:
            return self._run(k, inner)
        return to_nchw(self.fast.run_nhwc(k, inner))

    @torch.no_grad()
    def refresh_from(self, k: int) -> torch.Tensor:
        """Recompute the cached inputs of stages after ``k`` (after an update to stage ``k``)."""
        h = self.inputs[k]
        for j in range(k, len(self.stages)):
            h = self._run(j, h, j + 1)
            self.inputs[j + 1] = h
        return h
