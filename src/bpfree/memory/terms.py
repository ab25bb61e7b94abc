"""The terms memory and compute rules are built from: byte sizes, the elements a profile's
layers hold, and the multiply-accumulates of one iteration (counts are elements unless named
``*_bytes``). :mod:`.rules` and each method's own rules (e.g. :mod:`bpfree.pmt.memory`,
:mod:`bpfree.qzoff.memory`) share them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .profile import LayerProfile, ModelProfile

__all__ = [
    "BIAS_BYTES", "GRAD_BYTES", "LOSS_BYTES", "NONLINEAR_LAYER_TYPES", "SEED_BYTES",
    "bp_macs", "canonical_parts", "forward_macs", "inference_peak_bytes", "inputs_bytes",
    "layer_trainable_numel", "layer_trainable_weight_numel", "layerwise_macs",
    "live_per_layer", "macs_layers", "np_layerwise_macs", "parameters_bytes",
    "positive_int", "queries_macs", "saves_input", "scaled", "seeds_losses_bytes",
    "trainable_layer_indices", "trainable_numel",
]


#: A perturbation seed is a uint32 (the device's XORShift32 state).
SEED_BYTES = 4
#: A loss value is one fp32 scalar.
LOSS_BYTES = 4
#: A bias of the int8 graph is int32 (TinyEngine / TFLite convention).
BIAS_BYTES = 4
#: A gradient (or gradient accumulator) value is fp32 or int32.
GRAD_BYTES = 4

#: Parameter-free layers whose backward needs their input (or output) kept: BP keeps it.
NONLINEAR_LAYER_TYPES: frozenset[str] = frozenset({
    "ReLU", "ReLU6", "LeakyReLU", "PReLU", "RReLU", "ELU", "SELU", "CELU", "GELU", "SiLU",
    "Mish", "Sigmoid", "Tanh", "Hardtanh", "Hardswish", "Hardsigmoid", "Softplus",
    "Softsign", "Softmax", "LogSoftmax", "Softmin", "Tanhshrink", "GLU", "LogSigmoid",
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    # The same operations called functionally in a container's forward (profile op names).
    "relu", "relu6", "leaky_relu", "elu", "selu", "celu", "gelu", "silu", "mish", "sigmoid",
    "tanh", "hardtanh", "hardswish", "hardsigmoid", "softplus", "softmax", "log_softmax",
    "max_pool1d", "max_pool2d", "max_pool3d", "adaptive_max_pool2d",
})


def positive_int(name: str, value: Any) -> int:
    """``value``, or a ValueError naming ``name`` unless it is an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def scaled(numel: int, profile_batch: int, batch_size: int) -> int:
    """Elements at batch ``batch_size`` for a count measured at ``profile_batch`` (ceil)."""
    return -(-numel * batch_size // profile_batch)


def parameters_bytes(profile: ModelProfile, dtype_bytes: int) -> int:
    return profile.num_parameters * dtype_bytes


def inference_peak_bytes(profile: ModelProfile, batch_size: int, dtype_bytes: int) -> int:
    return scaled(profile.inference_peak_numel, profile.batch_size, batch_size) * dtype_bytes


def trainable_numel(profile: ModelProfile, trainable: frozenset[str]) -> int:
    return sum(n for name, n in profile.parameter_numel.items() if name in trainable)


def layer_trainable_numel(layer: LayerProfile, trainable: frozenset[str]) -> int:
    return sum(n for name, n in layer.parameter_numel.items() if name in trainable)


def saves_input(layer: LayerProfile) -> bool:
    # Parametrized layers need a^(i) for dW = dz · a^T (PMT Eq. 3); nonlinear ones need
    # z^(i) for h'(z). Views and Dropout-at-eval keep nothing worth counting.
    return bool(layer.parameter_numel) or layer.type in NONLINEAR_LAYER_TYPES


def inputs_bytes(layers: Iterable[LayerProfile], profile: ModelProfile, batch_size: int,
                 dtype_bytes: int) -> int:
    numel = sum(layer.input_numel for layer in layers)
    return scaled(numel, profile.batch_size, batch_size) * dtype_bytes


def seeds_losses_bytes(num_seeds: int, num_losses: int) -> int:
    return num_seeds * SEED_BYTES + num_losses * LOSS_BYTES


def canonical_parts(**parts: int) -> dict[str, int]:
    # Every built-in rule reports all canonical parts so stacked figures line up.
    base = dict.fromkeys(
        ("parameters", "trainable_copy", "activations", "gradient_buffers", "optimizer_state",
         "seeds_losses"), 0)
    base.update(parts)
    return base


def layer_trainable_weight_numel(layer: LayerProfile, trainable: frozenset[str]) -> int:
    return sum(n for name, n in layer.parameter_numel.items()
               if name in trainable and not name.endswith("bias"))


def trainable_layer_indices(profile: ModelProfile, trainable: frozenset[str]) -> list[int]:
    return [i for i, layer in enumerate(profile.layers)
            if layer_trainable_numel(layer, trainable)]


def live_per_layer(profile: ModelProfile, batch_size: int) -> list[int]:
    """Per layer, elements live while it runs (input + output + held) for ``batch_size``."""
    return [scaled(layer.live_numel, profile.batch_size, batch_size) for layer in profile.layers]


# ---------------------------------------------------------------------------------------
# Compute rules: multiply-accumulates of one training iteration (N samples, Q queries).


def macs_layers(profile: ModelProfile) -> list[int]:
    return [layer.macs for layer in profile.layers]


def forward_macs(profile: ModelProfile, *, batch_size: int, **_: Any) -> int:
    return batch_size * profile.macs


def queries_macs(profile: ModelProfile, *, batch_size: int, num_queries: int,
                 **_: Any) -> int:
    # Model-wise estimators: one clean forward and Q perturbed ones.
    return (num_queries + 1) * batch_size * profile.macs


def layerwise_macs(profile: ModelProfile, *, batch_size: int, num_queries: int,
                   trainable: frozenset[str], mode: Callable[[LayerProfile], str]) -> int:
    """Algorithm 1: clean forward (line 4) + the layer-by-layer forward up to the last
    trainable layer (line 6) + per trainable layer i, Q·N perturbed partial forwards
    (WP: layers i.., line 10; NP: layers i+1.., line 23) and the recompute of layer i
    (line 34)."""
    n, q = batch_size, num_queries
    macs = macs_layers(profile)
    total = n * sum(macs)
    indices = trainable_layer_indices(profile, trainable)
    if not indices:
        return total
    total += n * sum(macs[:indices[-1] + 1])
    for i in indices:
        start = i if mode(profile.layers[i]) == "WP" else i + 1
        total += q * n * sum(macs[start:]) + n * macs[i]
    return total


def np_layerwise_macs(profile: ModelProfile, **kw: Any) -> int:
    kw.pop("coordinates", None)
    return layerwise_macs(profile, mode=lambda layer: "NP", **kw)


def bp_macs(profile: ModelProfile, *, batch_size: int, trainable: frozenset[str],
            **_: Any) -> int:
    """Forward + backward ≈ 3·N·MACs: the backward computes ∇a through every layer after
    the first trainable one f (one layer's MACs each) and ∇W of every layer whose weight
    trains (its MACs again); a frozen prefix costs forward only (sparse-bp)."""
    macs = macs_layers(profile)
    indices = trainable_layer_indices(profile, trainable)
    total = sum(macs)
    if indices:
        f = indices[0]
        total += sum(macs[f + 1:])
        total += sum(m for layer, m in zip(profile.layers, macs)
                     if layer_trainable_weight_numel(layer, trainable))
    return batch_size * total
