"""`profile_model`: per-layer shapes and sizes from one forward pass, for analytic memory rules.

The profile is the layer-by-layer view an inference engine on an MCU has of a network
(PMT §2 "Extra Memory"): each leaf module is one layer, it reads its input activation and
writes its output activation, and only those two need to be live at once — plus any
tensor held across the layer for later (a residual block's skip input). Per-layer
``d_w`` and ``d_a`` follow PMT §3.2.2 / Table 3; ``macs`` counts multiply-accumulates.

Functional operations outside leaf modules (``x + out`` in a residual block, ``x.view``)
are recorded as parameter-free pseudo-layers named ``"<module>:<op>"`` so that liveness
sees who still reads a tensor. :meth:`ModelProfile.fold_batchnorm` folds BatchNorm into
the preceding convolution / linear layer, as post-training quantization does (PMT §4.1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

__all__ = ["LayerProfile", "ModelProfile", "profile_model"]


@dataclass(frozen=True)
class LayerProfile:
    """One call of a leaf module, as seen during the profiling forward.

    Activation counts (``input_numel``, ``output_numel``, ``*_bytes``) are totals for the
    profiled batch; ``d_in`` and ``d_a`` are per sample. A module called twice (e.g. a
    shared ``ReLU``) appears twice, in execution order.
    """

    name: str
    type: str
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    input_numel: int
    output_numel: int
    input_bytes: int
    output_bytes: int
    #: Output shares storage with the input (in-place ReLU, Flatten, eval Dropout).
    aliases_input: bool
    #: Names (model-qualified) and sizes of this module's own parameters.
    parameter_numel: dict[str, int] = field(default_factory=dict)
    batch_size: int = 1
    #: Multiply-accumulates per sample (Conv: out_h·out_w·c_out·c_in/groups·k_h·k_w;
    #: Linear: positions·in·out); 0 for layers without a weight product.
    macs: int = 0
    #: Tokens of the activation buffers read / written (one per tensor, same token =
    #: same storage); empty for hand-built profiles.
    input_ids: tuple[int, ...] = ()
    output_ids: tuple[int, ...] = ()
    #: Activations that are neither input nor output of this layer but are still needed
    #: later (a residual skip), for the profiled batch.
    held_numel: int = 0
    held_bytes: int = 0

    @property
    def weight_numel(self) -> int:
        """Elements in the module's parameters other than ``bias``."""
        return sum(n for k, n in self.parameter_numel.items() if not k.endswith("bias"))

    @property
    def bias_numel(self) -> int:
        """Elements in the module's ``bias`` parameter (0 if none)."""
        return sum(n for k, n in self.parameter_numel.items() if k.endswith("bias"))

    @property
    def d_w(self) -> int:
        """PMT §3.2.2 weight dimension: this layer's weight elements, bias excluded.

        PMT's d_w ("the dimension of weight", Algorithm 1 line 7 ``d_W < d_a``) names the
        weight alone, as :class:`bpfree.pmt.PMTTrainer` does (its WP perturbs only the
        weights); an NP gradient buffer also holds the bias (:attr:`bias_numel`).
        """
        return self.weight_numel

    @property
    def d_a(self) -> int:
        """PMT §3.2.2 activation dimension: output elements per sample."""
        return -(-self.output_numel // self.batch_size)

    @property
    def d_in(self) -> int:
        """Input elements per sample."""
        return -(-self.input_numel // self.batch_size)

    @property
    def live_numel(self) -> int:
        """Elements live while this layer runs: input + output (once if they alias) plus
        the tensors held across it (:attr:`held_numel`)."""
        if self.aliases_input:
            return max(self.input_numel, self.output_numel) + self.held_numel
        return self.input_numel + self.output_numel + self.held_numel

    @property
    def live_bytes(self) -> int:
        """Bytes live while this layer runs, at the observed dtypes."""
        if self.aliases_input:
            return max(self.input_bytes, self.output_bytes) + self.held_bytes
        return self.input_bytes + self.output_bytes + self.held_bytes


@dataclass(frozen=True)
class ModelProfile:
    """Execution-ordered leaf layers plus the model's parameters, from one forward.

    ``batch_size`` is the leading dimension of the example input; per-sample numbers divide
    by it, so activations must scale linearly with batch (true for feed-forward nets).
    """

    layers: tuple[LayerProfile, ...]
    batch_size: int
    #: Every parameter of the model (shared ones once), name -> elements.
    parameter_numel: dict[str, int]
    #: Bytes of every parameter at its actual dtype.
    parameter_bytes: int
    #: Names of the BatchNorm layers folded away by :meth:`fold_batchnorm`.
    folded_batchnorm: tuple[str, ...] = ()
    #: Token -> elements / bytes of each activation buffer seen (profiled batch); used to
    #: recompute held tensors after folding.
    buffer_numel: dict[int, int] = field(default_factory=dict, repr=False)
    buffer_bytes: dict[int, int] = field(default_factory=dict, repr=False)

    @property
    def num_parameters(self) -> int:
        return sum(self.parameter_numel.values())

    @property
    def macs(self) -> int:
        """Multiply-accumulates of one forward, per sample (sum of :attr:`LayerProfile.macs`)."""
        return sum(layer.macs for layer in self.layers)

    def fold_batchnorm(self) -> ModelProfile:
        """The profile after folding every foldable BatchNorm into the preceding layer.

        Post-training quantization fuses BatchNorm into the adjacent convolution (PMT §4.1;
        MCUNet's int8 graph): a BatchNorm whose only input is the sole output of a
        Conv1d/2d/3d or Linear, which nothing else reads, disappears — no parameters, no
        activation, no layer of its own. Its scale goes into the weight and its shift into
        the bias, so a bias-free conv gains a ``"<conv>.bias"`` of one value per output
        channel (int32 in the int8 graph). ``parameter_bytes`` is rescaled at the average
        bytes per parameter. Idempotent; a BatchNorm that cannot be folded stays.
        """
        uses: dict[int, int] = {}
        for layer in self.layers:
            for tok in layer.input_ids:
                uses[tok] = uses.get(tok, 0) + 1
        remap: dict[int, int] = {}
        kept: list[LayerProfile] = []
        params = dict(self.parameter_numel)
        folded: list[str] = list(self.folded_batchnorm)
        for layer in self.layers:
            layer = replace(layer, input_ids=tuple(remap.get(t, t) for t in layer.input_ids))
            prev = kept[-1] if kept else None
            if prev is not None and _foldable(prev, layer, uses):
                channels = layer.output_shapes[0][1] if len(layer.output_shapes[0]) > 1 \
                    else layer.output_shapes[0][0]
                for name in layer.parameter_numel:
                    params.pop(name, None)
                layer_params = dict(prev.parameter_numel)
                if not prev.bias_numel:
                    bias = f"{prev.name}.bias" if prev.name else "bias"
                    layer_params[bias] = channels
                    params = _insert_after(params, tuple(prev.parameter_numel), bias, channels)
                kept[-1] = replace(prev, parameter_numel=layer_params)
                if layer.output_ids and prev.output_ids:
                    remap[layer.output_ids[0]] = prev.output_ids[0]
                folded.append(layer.name)
                continue
            kept.append(layer)
        if len(kept) == len(self.layers):
            return self
        old, new = self.num_parameters, sum(params.values())
        per = self.parameter_bytes / old if old else 4.0
        return ModelProfile(
            layers=_with_held(kept, self.buffer_numel, self.buffer_bytes),
            batch_size=self.batch_size,
            parameter_numel=params,
            parameter_bytes=round(per * new),
            folded_batchnorm=tuple(folded),
            buffer_numel=self.buffer_numel,
            buffer_bytes=self.buffer_bytes,
        )

    @property
    def inference_peak_numel(self) -> int:
        """Max over layers of live (input + output + held) elements, for the profiled batch.

        This is the live set of a layer-by-layer engine (PMT Table 3, inference N·2d_a),
        including a residual block's skip tensor, held from its producer to the add.
        """
        return max((layer.live_numel for layer in self.layers), default=0)

    @property
    def inference_peak_bytes(self) -> int:
        """:attr:`inference_peak_numel` in bytes at the observed activation dtypes."""
        return max((layer.live_bytes for layer in self.layers), default=0)

    def table(self) -> str:
        """One line per layer: name, type, shapes, d_w, d_a, MACs per sample."""
        lines = [f"{'layer':<20} {'type':<14} {'in':<18} {'out':<18} {'d_w':>9} {'d_a':>9} "
                 f"{'macs':>10}"]
        for layer in self.layers:
            ins = ",".join(str(list(s)) for s in layer.input_shapes)
            outs = ",".join(str(list(s)) for s in layer.output_shapes)
            lines.append(
                f"{layer.name or '(root)':<20} {layer.type:<14} {ins:<18} {outs:<18} "
                f"{layer.d_w:>9} {layer.d_a:>9} {layer.macs:>10}"
            )
        return "\n".join(lines)


_BATCHNORM_TYPES = frozenset({"BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"})
_FOLD_INTO_TYPES = frozenset({"Conv1d", "Conv2d", "Conv3d", "Linear"})


def _foldable(prev: LayerProfile, layer: LayerProfile, uses: dict[int, int]) -> bool:
    if layer.type not in _BATCHNORM_TYPES or prev.type not in _FOLD_INTO_TYPES:
        return False
    if len(layer.input_shapes) != 1 or layer.input_shapes != prev.output_shapes:
        return False
    if layer.input_ids and prev.output_ids:
        return layer.input_ids == prev.output_ids and uses.get(prev.output_ids[0], 0) == 1
    return True  # hand-built profile without buffer tokens: go by shapes and order


def _insert_after(params: dict[str, int], after: tuple[str, ...], name: str,
                  numel: int) -> dict[str, int]:
    """``params`` with ``name`` inserted after the last of ``after`` it holds (else at the end)."""
    anchor = next((k for k in reversed(after) if k in params), None)
    if anchor is None:
        return {**params, name: numel}
    out: dict[str, int] = {}
    for key, value in params.items():
        out[key] = value
        if key == anchor:
            out[name] = numel
    return out


def _with_held(layers: list[LayerProfile] | tuple[LayerProfile, ...], buffer_numel: dict[int, int],
               buffer_bytes: dict[int, int]) -> tuple[LayerProfile, ...]:
    """Set each layer's held_* to the buffers live across it: produced (or first read)
    before it, read again after it, and neither its input nor its output."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, layer in enumerate(layers):
        for tok in (*layer.input_ids, *layer.output_ids):
            first.setdefault(tok, i)
            last[tok] = i
    out = []
    for i, layer in enumerate(layers):
        own = {*layer.input_ids, *layer.output_ids}
        held = [t for t in first if first[t] < i < last[t] and t not in own]
        out.append(replace(layer, held_numel=sum(buffer_numel.get(t, 0) for t in held),
                           held_bytes=sum(buffer_bytes.get(t, 0) for t in held)))
    return tuple(out)


def _tensors(obj: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(obj)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _storage_ptr(t: torch.Tensor) -> int | None:
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # sparse / storage-less tensors
        return None
    return ptr or None  # empty tensors all report 0


def _storage_ptrs(tensors: list[torch.Tensor]) -> set[int]:
    return {p for p in map(_storage_ptr, tensors) if p is not None}


def _module_macs(module: nn.Module, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
                 batch_size: int) -> int:
    """Multiply-accumulates per sample of a Conv*/ConvTranspose*/Linear call (or of a module
    with ``in_channels``/``out_channels``/``kernel_size``[/``groups``] or
    ``in_features``/``out_features``), else 0."""
    if not outputs:
        return 0
    out_numel = -(-outputs[0].numel() // batch_size)
    if isinstance(module, nn.modules.conv._ConvNd):
        kernel = math.prod(module.kernel_size)
        if module.transposed:
            # Every input value is scattered into c_out/groups · k outputs.
            in_numel = -(-inputs[0].numel() // batch_size) if inputs else 0
            return in_numel * (module.out_channels // module.groups) * kernel
        return out_numel * (module.in_channels // module.groups) * kernel
    if isinstance(module, nn.Linear):
        return out_numel * module.in_features
    # Duck-typed conv / linear layers (e.g. the int8 QConv2d / QLinear of bpfree.quant).
    if all(isinstance(getattr(module, a, None), int) for a in ("in_channels", "out_channels")) \
            and getattr(module, "kernel_size", None) is not None:
        kernel = module.kernel_size
        kernel = math.prod(kernel) if isinstance(kernel, (tuple, list)) else int(kernel)
        groups = int(getattr(module, "groups", 1) or 1)
        return out_numel * (module.in_channels // groups) * kernel
    if isinstance(getattr(module, "in_features", None), int) \
            and isinstance(getattr(module, "out_features", None), int):
        return out_numel * module.in_features
    return 0


class _Buffers:
    """Tokens for activation storages; keeps every tensor seen alive so a freed storage's
    address is never reused for another tensor during the profiling forward."""

    def __init__(self, exclude: set[int]) -> None:
        self.exclude = exclude  # parameter / buffer storages: not activations
        self.tokens: dict[int, int] = {}
        self.numel: dict[int, int] = {}
        self.bytes: dict[int, int] = {}
        self._keep: list[torch.Tensor] = []

    def is_state(self, t: torch.Tensor) -> bool:
        return _storage_ptr(t) in self.exclude

    def token(self, t: torch.Tensor) -> int:
        ptr = _storage_ptr(t)
        key = ptr if ptr is not None else -(len(self._keep) + 1)
        tok = self.tokens.setdefault(key, len(self.tokens))
        self.numel[tok] = max(self.numel.get(tok, 0), t.numel())
        self.bytes[tok] = max(self.bytes.get(tok, 0), t.numel() * t.element_size())
        self._keep.append(t)
        return tok


def _layer_from_call(
    name: str, type_name: str, module: nn.Module | None, inputs: list[torch.Tensor],
    outputs: list[torch.Tensor], batch_size: int, buffers: _Buffers,
) -> LayerProfile:
    prefix = f"{name}." if name else ""
    params = ({} if module is None else
              {f"{prefix}{p}": t.numel() for p, t in module.named_parameters(recurse=False)})
    in_ptrs = _storage_ptrs(inputs)
    aliases = bool(in_ptrs) and bool(_storage_ptrs(outputs) & in_ptrs)
    return LayerProfile(
        name=name,
        type=type_name,
        input_shapes=tuple(tuple(t.shape) for t in inputs),
        output_shapes=tuple(tuple(t.shape) for t in outputs),
        input_numel=sum(t.numel() for t in inputs),
        output_numel=sum(t.numel() for t in outputs),
        input_bytes=sum(t.numel() * t.element_size() for t in inputs),
        output_bytes=sum(t.numel() * t.element_size() for t in outputs),
        aliases_input=aliases,
        parameter_numel=params,
        batch_size=batch_size,
        macs=0 if module is None else _module_macs(module, inputs, outputs, batch_size),
        input_ids=tuple(buffers.token(t) for t in inputs),
        output_ids=tuple(buffers.token(t) for t in outputs),
    )


def _batch_size_of(args: tuple) -> int:
    tensors = _tensors(args)
    if not tensors:
        raise ValueError("example_input must be a tensor or a tuple containing at least one tensor")
    first = tensors[0]
    return int(first.shape[0]) if first.dim() > 0 and first.shape[0] > 0 else 1


def _op_name(func: Any) -> str:
    name = getattr(func, "__name__", None) or type(func).__name__
    if name == "__get__":  # a property such as Tensor.T
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    return name.strip("_") or name


class _FunctionalOps(TorchFunctionMode):
    """Calls ``record(func, args, kwargs, result)`` for every torch function; the profiler
    keeps only those made outside leaf modules."""

    def __init__(self, record) -> None:
        super().__init__()
        self.record = record

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        self.record(func, args, kwargs, result)
        return result


def profile_model(model: nn.Module, example_input: Any, *, fold_bn: bool = False,
                  functional: bool = True) -> ModelProfile:
    """Run one forward of ``model`` on ``example_input`` and record every leaf layer.

    ``example_input`` is a tensor (batch first) or a tuple of positional arguments. The
    forward runs under ``torch.no_grad()`` and in eval mode (so BatchNorm statistics are
    not updated and Dropout is off); training flags are restored afterwards, and the
    forward hooks are removed even if the forward raises.

    With ``functional`` (default), torch operations made outside leaf modules (a residual
    ``x + out``, ``x.view``, ``F.relu`` in a container's ``forward``) are recorded too, as
    parameter-free layers named ``"<module>:<op>"``, and every layer's ``held_numel``
    counts the activations kept alive across it for a later reader (a skip tensor).
    ``fold_bn=True`` returns :meth:`ModelProfile.fold_batchnorm` of the profile (the
    int8-deployed graph). Parameters owned by non-leaf modules are counted in
    ``parameter_numel`` but belong to no layer.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    args = example_input if isinstance(example_input, tuple) else (example_input,)
    batch_size = _batch_size_of(args)
    state = [*model.parameters(), *model.buffers()]
    buffers = _Buffers(_storage_ptrs(state))

    records: list[LayerProfile] = []
    handles = []
    stack: list[str] = []  # names of the modules whose forward is running
    leaf_depth = [0]

    def make_pre_hook(name: str, leaf: bool):
        def pre_hook(module, hook_args, hook_kwargs):
            stack.append(name)
            if leaf:
                leaf_depth[0] += 1

        return pre_hook

    def make_hook(name: str, leaf: bool):
        def hook(module, hook_args, hook_kwargs, output):
            if leaf:
                records.append(_layer_from_call(
                    name, type(module).__name__, module, _tensors((hook_args, hook_kwargs)),
                    _tensors(output), batch_size, buffers,
                ))
                leaf_depth[0] -= 1
            stack.pop()

        return hook

    def record_op(func, op_args, op_kwargs, result):
        if leaf_depth[0] or not stack:
            return
        outputs = [t for t in _tensors(result) if not buffers.is_state(t)]
        if not outputs:
            return
        inputs = [t for t in _tensors((op_args, op_kwargs)) if not buffers.is_state(t)]
        op = _op_name(func)
        parent = stack[-1]
        records.append(_layer_from_call(f"{parent}:{op}" if parent else op, op, None, inputs,
                                        outputs, batch_size, buffers))

    modes = {m: m.training for m in model.modules()}
    try:
        for name, module in model.named_modules():
            leaf = next(module.children(), None) is None
            if not (leaf or functional):
                continue
            handles.append(module.register_forward_pre_hook(make_pre_hook(name, leaf),
                                                            with_kwargs=True))
            handles.append(module.register_forward_hook(make_hook(name, leaf), with_kwargs=True))
        model.eval()
        with torch.no_grad():
            if functional:
                with _FunctionalOps(record_op):
                    model(*args)
            else:
                model(*args)
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes.items():
            module.training = training

    named = dict(model.named_parameters())  # dedupes shared parameters
    profile = ModelProfile(
        layers=_with_held(records, buffers.numel, buffers.bytes),
        batch_size=batch_size,
        parameter_numel={k: p.numel() for k, p in named.items()},
        parameter_bytes=sum(p.numel() * p.element_size() for p in named.values()),
        buffer_numel=dict(buffers.numel),
        buffer_bytes=dict(buffers.bytes),
    )
    return profile.fold_batchnorm() if fold_bn else profile
