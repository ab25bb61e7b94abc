"""Analytic training memory from layer shapes: a registry of per-method rules.

A rule is ``fn(profile, *, batch_size, num_queries, dtype_bytes, trainable, **options)``
returning a :class:`~bpfree.memory.report.MemoryReport`. ``profile`` is a
:class:`~bpfree.memory.profile.ModelProfile`; ``batch_size`` is N; ``num_queries`` is Q;
``dtype_bytes`` is the storage size of one parameter / activation element (4 for fp32, 1
for int8 on an MCU); ``trainable`` is a frozenset of parameter names. Later issues add
each method's refined rules with :func:`register_rule`.

The built-in rules follow PMT (Poor Man's Training) Table 3 "Memory Cost Comparison"
(inference N(2d_a + d_w); WP vanilla L·d_w, efficient L·Q; NP vanilla N·L·d_a + L·d_w,
efficient N·L·Q + d_w; BP N·L·d_a + L·d_w), made concrete for a real network: per-layer
d_a and d_w come from the profile instead of "L identical layers".

Shared assumptions: every element of parameters and activations takes ``dtype_bytes``;
seeds are uint32 (4 bytes) and losses fp32 (4 bytes) whatever ``dtype_bytes`` is;
activations scale linearly with batch; the live set of a layer is its input, its output
and the tensors held across it (a residual skip); no kernel workspaces.

Each method's own rules are registered next to its code, when its module is imported:
the int8 MCU rules of PMT and its baselines (``pmt``, ``pmt-sparse``, ``mezo``, ``cge``,
``bp-int8``, ``sparse-bp``) by :mod:`bpfree.pmt.memory`, QZO-FF's ``ff`` and
``bp-ff-compare`` by :mod:`bpfree.qzoff.memory`, ``tinyfoa`` by
:mod:`bpfree.tinyfoa.accounting`; they build on the terms of :mod:`.terms`. The registry
finds them itself: :data:`PROVIDERS` names the module that provides each, which a lookup of
a name not yet registered imports (so ``import bpfree.memory`` alone is enough). Each method
registers its defaults (:func:`method_defaults`) and, where known, a compute rule:
:func:`macs_per_iteration` gives the multiply-accumulates of one training iteration.
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .profile import ModelProfile, profile_model
from .report import MemoryReport
from .terms import (BIAS_BYTES, GRAD_BYTES, LOSS_BYTES, NONLINEAR_LAYER_TYPES, SEED_BYTES,
                    bp_macs, canonical_parts, forward_macs, inference_peak_bytes, inputs_bytes,
                    layer_trainable_numel, np_layerwise_macs, parameters_bytes, positive_int,
                    queries_macs, saves_input, seeds_losses_bytes, trainable_numel)

__all__ = [
    "BIAS_BYTES",
    "GRAD_BYTES",
    "LOSS_BYTES",
    "NONLINEAR_LAYER_TYPES",
    "SEED_BYTES",
    "PROVIDERS",
    "analytic",
    "available_rules",
    "macs_per_iteration",
    "method_defaults",
    "prepare_profile",
    "register_rule",
    "registered_rules",
    "resolve_trainable",
]


Rule = Callable[..., MemoryReport]
MacsRule = Callable[..., int]


@dataclass(frozen=True)
class _Method:
    rule: Rule
    dtype_bytes: int = 4
    fold_bn: bool = False
    macs: MacsRule | None = None


_RULES: dict[str, _Method] = {}

#: Method name -> the module that registers its rule when imported. Looked up, not imported
#: here: each provider imports this registry (``register_rule``), so a static import back
#: would be a cycle (``tests/test_import_graph.py``); the dependency stays one-way and the
#: provider is loaded with :func:`importlib.import_module` on the first lookup of its name,
#: the way plugin registries find their plugins. A test checks the table against every
#: ``register_rule`` call in the package, so it cannot go stale.
PROVIDERS: dict[str, str] = {
    "pmt": "bpfree.pmt.memory",
    "pmt-sparse": "bpfree.pmt.memory",
    "mezo": "bpfree.pmt.memory",
    "cge": "bpfree.pmt.memory",
    "bp-int8": "bpfree.pmt.memory",
    "sparse-bp": "bpfree.pmt.memory",
    "ff": "bpfree.qzoff.memory",
    "bp-ff-compare": "bpfree.qzoff.memory",
    "tinyfoa": "bpfree.tinyfoa.accounting",
}


def register_rule(name: str, fn: Rule, *, replace: bool = False, dtype_bytes: int = 4,
                  fold_bn: bool = False, macs: MacsRule | None = None) -> None:
    """Register ``fn(profile, **options) -> MemoryReport`` as the rule for method ``name``.

    Re-registering an existing name needs ``replace=True`` so two issues cannot silently
    overwrite each other's rule. ``dtype_bytes`` and ``fold_bn`` are the method's
    defaults in :func:`analytic` (1 and True for a method that runs the int8 graph);
    ``macs(profile, *, batch_size, num_queries, trainable, coordinates) -> int`` is its
    compute per iteration for :func:`macs_per_iteration`.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if macs is not None and not callable(macs):
        raise TypeError(f"macs must be callable or None, got {type(macs).__name__}")
    positive_int("dtype_bytes", dtype_bytes)
    if name in _RULES and not replace:
        raise ValueError(f"name {name!r} is already registered; pass replace=True to override")
    _RULES[name] = _Method(fn, dtype_bytes, bool(fold_bn), macs)


def registered_rules() -> tuple[str, ...]:
    """Names of the methods registered so far, sorted (a provider of :data:`PROVIDERS` adds
    its names once imported; :func:`available_rules` lists them all)."""
    return tuple(sorted(_RULES))


def available_rules() -> tuple[str, ...]:
    """Names :func:`analytic` accepts, sorted: those registered and those of
    :data:`PROVIDERS`, whose module is imported on first use."""
    return tuple(sorted(set(_RULES) | set(PROVIDERS)))


def method_defaults(method: str) -> dict[str, Any]:
    """``{"dtype_bytes", "fold_bn", "has_macs"}``: what :func:`analytic` uses for ``method``
    when not told otherwise, and whether :func:`macs_per_iteration` knows it."""
    entry = _entry(method)
    return {"dtype_bytes": entry.dtype_bytes, "fold_bn": entry.fold_bn,
            "has_macs": entry.macs is not None}


def _entry(method: str) -> _Method:
    if method not in _RULES and method in PROVIDERS:
        importlib.import_module(PROVIDERS[method])
        if method not in _RULES:
            raise RuntimeError(f"{PROVIDERS[method]} was imported but did not register method "
                               f"{method!r}; PROVIDERS in bpfree.memory.rules is stale")
    if method not in _RULES:
        raise ValueError(
            f"method {method!r} is not registered; available: {', '.join(available_rules())}"
        )
    return _RULES[method]


# ---------------------------------------------------------------------------------------
# Built-in rules.


def inference_rule(profile: ModelProfile, *, batch_size: int, num_queries: int,
                   dtype_bytes: int, trainable: frozenset[str]) -> MemoryReport:
    """Plain inference: parameters + the layer-by-layer activation peak.

    PMT Table 3 "Inference Only": N(2d_a + d_w) — the largest layer's input and output for
    N samples (here the max over layers of (input + output) elements) plus the weights,
    which an MCU keeps in flash/SRAM for all layers (we count all of them).
    """
    return MemoryReport("inference", canonical_parts(
        parameters=parameters_bytes(profile, dtype_bytes),
        activations=inference_peak_bytes(profile, batch_size, dtype_bytes),
    ))


def bp_rule(profile: ModelProfile, *, batch_size: int, num_queries: int, dtype_bytes: int,
            trainable: frozenset[str], momentum: bool = False,
            optimizer_states: int | None = None) -> MemoryReport:
    """Back-propagation: PMT Table 3 "Back-propagation" N·L·d_a + L·d_w, and §2 "Extra Memory".

    Assumptions:
    - activations: the input of every parametrized or nonlinear layer is kept for the
      backward pass, for all N samples (PMT §2: all a^(i) and z^(i)); all parameters stay
      resident even if frozen;
    - activation_gradients (extra part): while a layer back-propagates, its output
      gradient and input gradient are both live — at most the inference peak;
    - gradient_buffers: one ``.grad`` per trainable parameter;
    - optimizer_state: ``optimizer_states`` tensors per trainable parameter (1 for SGD
      momentum, 2 for Adam); ``momentum=True`` is shorthand for 1. Default 0 (plain SGD).
    """
    if optimizer_states is None:
        optimizer_states = 1 if momentum else 0
    if isinstance(optimizer_states, bool) or not isinstance(optimizer_states, int) \
            or optimizer_states < 0:
        raise ValueError(f"optimizer_states must be an int >= 0, got {optimizer_states!r}")
    n_train = trainable_numel(profile, trainable)
    kept = [layer for layer in profile.layers if saves_input(layer)]
    return MemoryReport("bp", canonical_parts(
        parameters=parameters_bytes(profile, dtype_bytes),
        activations=inputs_bytes(kept, profile, batch_size, dtype_bytes),
        activation_gradients=inference_peak_bytes(profile, batch_size, dtype_bytes),
        gradient_buffers=n_train * dtype_bytes,
        optimizer_state=optimizer_states * n_train * dtype_bytes,
    ))


def zo_wp_lean_rule(profile: ModelProfile, *, batch_size: int, num_queries: int,
                    dtype_bytes: int, trainable: frozenset[str]) -> MemoryReport:
    """MeZO-style weight perturbation in place: PMT Table 3 "Weight Perturbation (Efficient)".

    θ is perturbed to θ+μξ in place and restored, ξ regenerated from its seed for the
    update (PMT §3.2.1: WP stores only scalars). Memory = parameters + the inference
    activation peak + Q seeds (uint32) + Q+1 batch losses (the clean one and one per
    query, fp32). No trainable copy, no gradient buffer, no optimizer state (ZO-SGD).
    PMT's L·Q counts one seed per layer and query for layer-wise WP; this is model-wise.
    """
    q = num_queries
    return MemoryReport("zo_wp_lean", canonical_parts(
        parameters=parameters_bytes(profile, dtype_bytes),
        activations=inference_peak_bytes(profile, batch_size, dtype_bytes),
        seeds_losses=seeds_losses_bytes(q, q + 1),
    ))


def zo_wp_batched_rule(profile: ModelProfile, *, batch_size: int, num_queries: int,
                       dtype_bytes: int, trainable: frozenset[str]) -> MemoryReport:
    """Weight perturbation with all Q queries evaluated in one stacked (vmap) forward.

    Trades memory for speed against PMT Table 3 "Weight Perturbation": Q perturbed copies
    of the trainable parameters are materialized (trainable_copy = Q·d_trainable), and the
    stacked forward runs Q·N samples, so the activation peak is Q times the inference peak.
    Seeds/losses as in ``zo_wp_lean`` (Q seeds kept to regenerate ξ for the update).
    The clean forward is assumed to run separately, not stacked with the Q queries.
    """
    q = num_queries
    return MemoryReport("zo_wp_batched", canonical_parts(
        parameters=parameters_bytes(profile, dtype_bytes),
        trainable_copy=q * trainable_numel(profile, trainable) * dtype_bytes,
        activations=inference_peak_bytes(profile, q * batch_size, dtype_bytes),
        seeds_losses=seeds_losses_bytes(q, q + 1),
    ))


def zo_np_lean_rule(profile: ModelProfile, *, batch_size: int, num_queries: int,
                    dtype_bytes: int, trainable: frozenset[str]) -> MemoryReport:
    """Layer-wise node perturbation, memory-efficient: PMT Table 3 "Node Perturbation
    (Efficient)" N·L·Q + d_w.

    One layer at a time: its output z^(i) is perturbed per sample and query (Eq. 9),
    the weight gradient ∇W = ∇z · a^T (Eq. 10) is formed in one buffer of that layer's
    d_w (largest trainable layer counted, weight + bias) and applied at once, so no
    activation outlives the layer-by-layer engine. Seeds: one per (sample, query), N·Q;
    losses: sample-wise, N·(Q+1).
    """
    n, q = batch_size, num_queries
    largest = max((layer_trainable_numel(layer, trainable) for layer in profile.layers),
                  default=0)
    return MemoryReport("zo_np_lean", canonical_parts(
        parameters=parameters_bytes(profile, dtype_bytes),
        activations=inference_peak_bytes(profile, n, dtype_bytes),
        gradient_buffers=largest * dtype_bytes,
        seeds_losses=seeds_losses_bytes(n * q, n * (q + 1)),
    ))


def zo_np_batched_rule(profile: ModelProfile, *, batch_size: int, num_queries: int,
                       dtype_bytes: int, trainable: frozenset[str]) -> MemoryReport:
    """Model-wise node perturbation with Q queries stacked: PMT Table 3 "Node Perturbation
    (Vanilla)" N·L·d_a + L·d_w, with the Q queries run as one Q·N-sample forward.

    Activations: Q times the inference peak (Q×N stacked samples) plus the input a^(i) of
    every trainable layer, kept for N samples until ∇W = ∇z · a^T (Eq. 10) is formed;
    gradient_buffers: every trainable layer's weight gradient at once (L·d_w).
    Seeds/losses as in ``zo_np_lean``.
    """
    n, q = batch_size, num_queries
    trained_layers = [layer for layer in profile.layers
                      if layer_trainable_numel(layer, trainable)]
    stacked = inference_peak_bytes(profile, q * n, dtype_bytes)
    return MemoryReport("zo_np_batched", canonical_parts(
        parameters=parameters_bytes(profile, dtype_bytes),
        activations=stacked + inputs_bytes(trained_layers, profile, n, dtype_bytes),
        gradient_buffers=trainable_numel(profile, trainable) * dtype_bytes,
        seeds_losses=seeds_losses_bytes(n * q, n * (q + 1)),
    ))


register_rule("inference", inference_rule, macs=forward_macs)
register_rule("bp", bp_rule, macs=bp_macs)
register_rule("zo_wp_lean", zo_wp_lean_rule, macs=queries_macs)
register_rule("zo_wp_batched", zo_wp_batched_rule, macs=queries_macs)
register_rule("zo_np_lean", zo_np_lean_rule, macs=np_layerwise_macs)
register_rule("zo_np_batched", zo_np_batched_rule, macs=queries_macs)


# ---------------------------------------------------------------------------------------
# Entry points.


_GLOB_CHARS = frozenset("*?[")


def _module_prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:k]) for k in range(1, len(parts))]


def resolve_trainable(profile: ModelProfile, trainable: Any) -> frozenset[str]:
    """Parameter names that train: all (None), a predicate on the name, or names/prefixes.

    A name selects the parameter of that name or every parameter under that module prefix
    (``"0"`` selects ``"0.weight"`` and ``"0.bias"``). A name with ``*``, ``?`` or ``[`` is
    a glob (:mod:`fnmatch`, case-sensitive) matched against the parameter names and their
    module prefixes (``"4.*"`` selects block 4, ``"*.conv.1.0"`` every depthwise conv).
    """
    names = tuple(profile.parameter_numel)
    if trainable is None:
        return frozenset(names)
    if callable(trainable):
        return frozenset(n for n in names if trainable(n))
    if isinstance(trainable, str):
        trainable = (trainable,)
    try:
        wanted = tuple(trainable)
    except TypeError:
        raise TypeError(
            "trainable must be None, a predicate name -> bool, or an iterable of parameter / "
            f"module names, got {type(trainable).__name__}"
        ) from None
    selected: set[str] = set()
    for want in wanted:
        if not isinstance(want, str):
            raise TypeError(f"trainable: names must be str, got {want!r}")
        if _GLOB_CHARS & set(want):
            hits = [n for n in names if fnmatch.fnmatchcase(n, want)
                    or any(fnmatch.fnmatchcase(p, want) for p in _module_prefixes(n))]
        else:
            hits = [n for n in names if n == want or n.startswith(f"{want}.")]
        if not hits:
            raise ValueError(
                f"trainable: {want!r} matches no parameter; parameters are {', '.join(names)}"
            )
        selected.update(hits)
    return frozenset(selected)


def _profile_for(model: Any, input_shape: Any, example_input: Any) -> ModelProfile:
    if isinstance(model, ModelProfile):
        if input_shape is not None or example_input is not None:
            raise ValueError(
                "input_shape/example_input must be None when model is a ModelProfile"
            )
        return model
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module or ModelProfile, got {type(model).__name__}"
        )
    if (input_shape is None) == (example_input is None):
        raise ValueError(
            "give exactly one of input_shape (per sample, no batch dim) or example_input"
        )
    if example_input is None:
        # Profile one sample: per-sample counts are all the rules need.
        example_input = torch.zeros((1, *tuple(input_shape)))
    return profile_model(model, example_input)


def prepare_profile(model: Any, method: str, input_shape: Any, example_input: Any,
                    fold_bn: Any, trainable: Any) -> tuple[_Method, ModelProfile, frozenset[str]]:
    """``(method entry, profile, trainable names)`` as :func:`analytic` sees them: ``model``
    profiled (or a given profile), BatchNorm folded per ``fold_bn`` (None: the method's
    default) and ``trainable`` resolved (:func:`resolve_trainable`)."""
    entry = _entry(method)
    profile = _profile_for(model, input_shape, example_input)
    if fold_bn is None:
        fold_bn = entry.fold_bn
    if not isinstance(fold_bn, bool):
        raise ValueError(f"fold_bn must be True, False or None (the method's default), "
                         f"got {fold_bn!r}")
    if fold_bn:
        profile = profile.fold_batchnorm()
    return entry, profile, resolve_trainable(profile, trainable)


def analytic(model: nn.Module | ModelProfile, method: str, *, input_shape: Any = None,
             example_input: Any = None, batch_size: int | None = None, num_queries: int = 1,
             dtype_bytes: int | None = None, trainable: Any = None, fold_bn: bool | None = None,
             **options: Any) -> MemoryReport:
    """Analytic training memory of ``method`` for ``model``, from its layer shapes.

    ``model`` is an ``nn.Module`` (profiled once with ``example_input`` — batch first — or
    with zeros of ``(1, *input_shape)``) or an existing :class:`ModelProfile`.
    ``batch_size`` defaults to the example's batch (1 with ``input_shape``).
    ``trainable`` is None (all parameters), a predicate on the parameter name, or names /
    module prefixes / globs. ``dtype_bytes`` and ``fold_bn`` default to the method's own
    (:func:`method_defaults`: 1 and True for the int8 methods, 4 and False otherwise);
    with BatchNorm folded, trainable names refer to the folded graph (a conv's folded
    bias is ``"<conv>.bias"``). Extra ``options`` go to the rule (e.g. ``momentum=True``
    for ``"bp"``, ``coordinates=K`` for ``"cge"``).
    """
    entry, profile, trainable_set = prepare_profile(model, method, input_shape, example_input,
                                                    fold_bn, trainable)
    rule = entry.rule
    n = profile.batch_size if batch_size is None else positive_int("batch_size", batch_size)
    kwargs = dict(
        batch_size=n,
        num_queries=positive_int("num_queries", num_queries),
        dtype_bytes=positive_int("dtype_bytes",
                                 entry.dtype_bytes if dtype_bytes is None else dtype_bytes),
        trainable=trainable_set,
        **options,
    )
    # Check the options against the rule's signature first, so a typo names the method
    # instead of surfacing as a TypeError from deep inside the rule.
    try:
        inspect.signature(rule).bind(profile, **kwargs)
    except TypeError as exc:
        raise ValueError(f"options for method {method!r}: {exc}") from None
    except ValueError:  # no introspectable signature (builtins); let the call decide
        pass
    return rule(profile, **kwargs)


def macs_per_iteration(model: nn.Module | ModelProfile, method: str,
                       batch_size: int | None = None, num_queries: int = 1, *,
                       trainable: Any = None, coordinates: int | None = None,
                       fold_bn: bool | None = None, input_shape: Any = None,
                       example_input: Any = None) -> int:
    """Multiply-accumulates of one training iteration of ``method`` (N samples, Q queries).

    Per-layer MACs are :attr:`LayerProfile.macs` (Conv / Linear only). Rules:

    - ``inference``: N·M (M = MACs of one forward of one sample);
    - ``pmt``, ``pmt-sparse`` (Algorithm 1): N·M clean forward (line 4), the layer-wise
      forward up to the last trainable layer (line 6), and per trainable layer i: Q·N
      perturbed partial forwards (WP: layers i.., line 10; NP: layers i+1.., line 23)
      plus N·MACs(i) to recompute a^(i+1) with the old weights (line 34);
      ``zo_np_lean``: the same with NP everywhere;
    - ``mezo``, ``zo_wp_lean``, ``zo_wp_batched``, ``zo_np_batched``: (Q+1)·N·M
      (one-sided: the clean forward plus Q perturbed ones);
    - ``cge``: (K+1)·N·M with K = ``coordinates`` (default Q), capped at d;
    - ``bp``, ``bp-int8``, ``sparse-bp``: forward N·M + backward: ∇a through every layer
      after the first trainable one and ∇W of every layer whose weight trains, each one
      layer's MACs — ≈ 3·N·M when everything trains.

    ``trainable``, ``fold_bn``, ``input_shape`` and ``example_input`` are as in
    :func:`analytic`.
    """
    entry, profile, trainable_set = prepare_profile(model, method, input_shape, example_input,
                                                    fold_bn, trainable)
    if entry.macs is None:
        known = ", ".join(name for name in registered_rules() if _RULES[name].macs is not None)
        raise ValueError(f"method {method!r} has no MACs rule; methods with one: {known}")
    n = profile.batch_size if batch_size is None else positive_int("batch_size", batch_size)
    return int(entry.macs(
        profile, batch_size=n, num_queries=positive_int("num_queries", num_queries),
        trainable=trainable_set,
        coordinates=None if coordinates is None else positive_int("coordinates", coordinates),
    ))
