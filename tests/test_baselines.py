"""The one back-propagation baseline trainer (bpfree.baselines.BPTrainer)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bpfree.baselines import BPTrainer
from bpfree.pmt import FullTrainFP32
from bpfree.ttzo import BPTrainer as TTZOBPTrainer


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(12, 6, generator=g), torch.randint(0, 3, (12,), generator=g)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def test_the_papers_bp_baselines_are_one_trainer():
    assert TTZOBPTrainer is BPTrainer and issubclass(FullTrainFP32, BPTrainer)


def test_adamw_first_step_is_the_sign_step_plus_decoupled_decay_by_hand():
    """With zero moments, AdamW's first bias-corrected step is lr * g / (|g| + eps) and the
    decoupled decay lr * wd * w (Loshchilov & Hutter), on the mean cross-entropy."""
    x, y = _data()
    model = _model()
    ref = copy.deepcopy(model)
    lr, wd, eps = 0.01, 0.1, 1e-8
    out = BPTrainer(model, "adamw", betas=(0.9, 0.95), weight_decay=wd,
                    loss_fn=F.cross_entropy).step(x, y, lr)
    loss = F.cross_entropy(ref(x), y)
    loss.backward()
    assert out == {"loss": pytest.approx(loss.item()), "forwards": 12}
    for p, r in zip(model.parameters(), ref.parameters()):
        expected = r.detach() * (1 - lr * wd) - lr * r.grad / (r.grad.abs() + eps)
        assert torch.allclose(p.detach(), expected, atol=1e-6, rtol=0)
        assert p.grad is None  # gradients are not kept between steps


def test_lr_scale_groups_and_frozen_statistics_apply_to_any_optimizer():
    x, y = _data()
    model = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.Linear(5, 3)).train()
    mean = model[1].running_mean.clone()
    ref = copy.deepcopy(model).eval()
    trainer = BPTrainer(model, "sgd", momentum=0.5, lr_scale={"2": 0.0}, frozen_statistics=True)
    trainer.step(x, y, 0.1)
    assert not model.training and torch.equal(model[1].running_mean, mean)
    assert torch.equal(model[2].weight, ref[2].weight)  # factor 0: that group does not move
    assert not torch.equal(model[0].weight, ref[0].weight)
    with pytest.raises(ValueError, match=r"optimizer must be one of \('sgd', 'adam', 'adamw'\)"):
        BPTrainer(_model(), "rmsprop")
    with pytest.raises(ValueError, match="unknown trainable module"):
        BPTrainer(_model(), trainable=["9"])
    with pytest.raises(FloatingPointError, match="non-finite"):
        BPTrainer(_model()).step(x * float("nan"), y, 0.1)


def _same_objects(old_module: str, homes: dict[str, str]) -> None:
    """Every name the old module lists is the object of its new home (not a copy)."""
    import importlib

    old = importlib.import_module(old_module)
    assert sorted(old.__all__) == sorted(homes)
    for name, home in homes.items():
        assert getattr(old, name) is getattr(importlib.import_module(home), name), name


def test_ttzo_baselines_old_path_reexports_the_new_homes():
    _same_objects("bpfree.ttzo.baselines", {
        "BPTrainer": "bpfree.baselines.bp",
        "grasp_scores": "bpfree.models.pruning", "grasp_prune": "bpfree.models.pruning",
        "MaskedModel": "bpfree.models.pruning",
        "ForwardGradientW": "bpfree.baselines.forward_gradient",
        "ForwardGradientA": "bpfree.baselines.forward_gradient",
        "FeedbackAlignment": "bpfree.baselines.feedback_alignment",
        "DirectFeedbackAlignment": "bpfree.baselines.feedback_alignment"})


def test_forward_gradient_w_is_the_zo_trainers_forward_gradient_setting():
    """FG-W composes the same optimizer as ZOTrainer(estimator="forward_gradient"): the same
    weights, losses and counters after a few momentum steps from the same seed."""
    from bpfree.baselines import ForwardGradientW
    from bpfree.ttzo import ZOTrainer

    x, y = _data()
    a, b = _model(), _model()
    fg = ForwardGradientW(a, num_queries=3, momentum=0.9, seed=5)
    zo = ZOTrainer(b, "forward_gradient", num_queries=3, momentum=0.9, seed=5)
    for _ in range(3):
        assert fg.step(x, y, 0.1) == zo.step(x, y, 0.1)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    assert (fg.forwards, fg.batch_forwards) == (zo.forwards, zo.batch_forwards) == (12 * 9, 9)
    assert fg.batch_forwards_per_step() == zo.batch_forwards_per_step() == 3
    assert fg.num_parameters == zo.num_parameters == 53


def test_pmt_old_paths_reexport_the_new_homes():
    _same_objects("bpfree.pmt.baselines", {
        "MeZO": "bpfree.baselines.integer_zo", "DeepZeroCGE": "bpfree.baselines.integer_zo",
        "FullTrainFP32": "bpfree.baselines.integer_bp",
        "FullTrainINT8": "bpfree.baselines.integer_bp", "SparseBP": "bpfree.baselines.integer_bp"})
    _same_objects("bpfree.pmt.graph", {
        name: "bpfree.quant.graph" for name in ("AFFINE_TYPES", "StagedModel", "TrainableLayer",
                                                "find_layers", "per_sample_loss", "select_layers")})
    _same_objects("bpfree.pmt.update", {
        name: "bpfree.updates.integer_layer" for name in (
            "INT32_MAX", "INT32_MIN", "LayerEstimate", "apply_update", "quantization_aware_scales")})


def test_tinyfoa_old_paths_reexport_the_new_homes():
    _same_objects("bpfree.tinyfoa.baselines", {
        **{name: "bpfree.baselines.local_rules" for name in ("BP", "DRTP", "FF", "PEPITA")},
        "make_method": "bpfree.tinyfoa.baselines"})
    import bpfree.quant.binary as binary

    _same_objects("bpfree.tinyfoa.binary", {name: "bpfree.quant.binary" for name in binary.__all__})
    _same_objects("bpfree.tinyfoa.variants", {
        **{name: "bpfree.baselines.variants" for name in ("BASES", "Variant", "parse_variant")},
        **{name: "bpfree.tinyfoa.variants" for name in ("TABLE1", "TABLE2", "TABLE3")}})
