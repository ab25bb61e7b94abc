"""`profile_model`: per-layer shapes and sizes from one forward pass, for analytic memory rules.

The profile is the layer-by-layer view an inference engine on an MCU has of a network
(PMT §2 "Extra Memory"): each leaf module is one layer, it reads its input activation and
writes its output activation, and only those two need to be live at once. Per-layer
``d_w`` and ``d_a`` follow PMT §3.2.2 / Table 3.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
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
        """PMT §3.2.2 weight dimension: all of this layer's parameters (weight + bias).

        The bias is included because a ZO estimator perturbs, and a gradient buffer holds,
        both; PMT's d_w names the weight alone, the difference is d_a elements.
        """
        return self.weight_numel + self.bias_numel

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
        """Elements live while this layer runs: input + output, once if they alias."""
        if self.aliases_input:
            return max(self.input_numel, self.output_numel)
        return self.input_numel + self.output_numel

    @property
    def live_bytes(self) -> int:
        """Bytes live while this layer runs, at the observed dtypes."""
        if self.aliases_input:
            return max(self.input_bytes, self.output_bytes)
        return self.input_bytes + self.output_bytes


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

    @property
    def num_parameters(self) -> int:
        return sum(self.parameter_numel.values())

    @property
    def inference_peak_numel(self) -> int:
        """Max over layers of live (input + output) elements, for the profiled batch.

        This is the live set of a layer-by-layer engine (PMT Table 3, inference N·2d_a).
        A residual connection would also hold its skip tensor across the block; that is
        not modelled yet (only leaf-module inputs/outputs are seen).
        """
        return max((layer.live_numel for layer in self.layers), default=0)

    @property
    def inference_peak_bytes(self) -> int:
        """:attr:`inference_peak_numel` in bytes at the observed activation dtypes."""
        return max((layer.live_bytes for layer in self.layers), default=0)

    def table(self) -> str:
        """One line per layer: name, type, shapes, d_w, d_a."""
        lines = [f"{'layer':<20} {'type':<14} {'in':<18} {'out':<18} {'d_w':>9} {'d_a':>9}"]
        for layer in self.layers:
            ins = ",".join(str(list(s)) for s in layer.input_shapes)
            outs = ",".join(str(list(s)) for s in layer.output_shapes)
            lines.append(
                f"{layer.name or '(root)':<20} {layer.type:<14} {ins:<18} {outs:<18} "
                f"{layer.d_w:>9} {layer.d_a:>9}"
            )
        return "\n".join(lines)


def _tensors(obj: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(obj)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _storage_ptrs(tensors: list[torch.Tensor]) -> set[int]:
    ptrs = set()
    for t in tensors:
        try:
            ptrs.add(t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):  # sparse / storage-less tensors
            continue
    return ptrs


def _layer_from_call(
    name: str, module: nn.Module, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
    batch_size: int,
) -> LayerProfile:
    prefix = f"{name}." if name else ""
    params = {f"{prefix}{p}": t.numel() for p, t in module.named_parameters(recurse=False)}
    in_ptrs = _storage_ptrs(inputs)
    aliases = bool(in_ptrs) and bool(_storage_ptrs(outputs) & in_ptrs)
    return LayerProfile(
        name=name,
        type=type(module).__name__,
        input_shapes=tuple(tuple(t.shape) for t in inputs),
        output_shapes=tuple(tuple(t.shape) for t in outputs),
        input_numel=sum(t.numel() for t in inputs),
        output_numel=sum(t.numel() for t in outputs),
        input_bytes=sum(t.numel() * t.element_size() for t in inputs),
        output_bytes=sum(t.numel() * t.element_size() for t in outputs),
        aliases_input=aliases,
        parameter_numel=params,
        batch_size=batch_size,
    )


def _batch_size_of(args: tuple) -> int:
    tensors = _tensors(args)
    if not tensors:
        raise ValueError("example_input must be a tensor or a tuple containing at least one tensor")
    first = tensors[0]
    return int(first.shape[0]) if first.dim() > 0 and first.shape[0] > 0 else 1


def profile_model(model: nn.Module, example_input: Any) -> ModelProfile:
    """Run one forward of ``model`` on ``example_input`` and record every leaf layer.

    ``example_input`` is a tensor (batch first) or a tuple of positional arguments. The
    forward runs under ``torch.no_grad()`` and in eval mode (so BatchNorm statistics are
    not updated and Dropout is off); training flags are restored afterwards, and the
    forward hooks are removed even if the forward raises.

    Only leaf-module boundaries are seen: functional ops inside a ``forward`` (``x.view``,
    ``F.relu``, ``x + skip``) are invisible, so the profile treats them as free. Parameters
    owned by non-leaf modules are counted in ``parameter_numel`` but belong to no layer.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    args = example_input if isinstance(example_input, tuple) else (example_input,)
    batch_size = _batch_size_of(args)

    records: list[LayerProfile] = []
    handles = []

    def make_hook(name: str):
        def hook(module, hook_args, hook_kwargs, output):
            records.append(
                _layer_from_call(
                    name, module, _tensors((hook_args, hook_kwargs)), _tensors(output), batch_size
                )
            )

        return hook

    modes = {m: m.training for m in model.modules()}
    try:
        for name, module in model.named_modules():
            if next(module.children(), None) is None:
                handles.append(module.register_forward_hook(make_hook(name), with_kwargs=True))
        model.eval()
        with torch.no_grad():
            model(*args)
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes.items():
            module.training = training

    named = dict(model.named_parameters())  # dedupes shared parameters
    return ModelProfile(
        layers=tuple(records),
        batch_size=batch_size,
        parameter_numel={k: p.numel() for k, p in named.items()},
        parameter_bytes=sum(p.numel() * p.element_size() for p in named.values()),
    )
