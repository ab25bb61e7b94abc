"""benchmarks/_qzoff_vit.py (Table 5's LP 1 LN / LP 3 LN / D-VPT blocks of `bpfree bench
qzo-ff` on one tiny ViT): the blocks' trainable sets, that a block trains only them, and the
task's rate choice on one grid; MNIST files only where marked."""

from __future__ import annotations

import pytest
import torch

from _qzoff_experiment import ff_config, train_head
from _qzoff_vit import (BLOCKS, MAX_WIDEN, PROMPT_TOKENS, ViTFeatures, block_model,
                        three_layer_decoder, vit_ood_task)

from bpfree.models.vit import TinyViT


def _states(seed=0):
    torch.manual_seed(seed)
    vit = TinyViT(prompt_tokens=PROMPT_TOKENS)
    return vit.state_dict(), three_layer_decoder().state_dict()


def test_blocks_train_more_values_in_table_order():
    """650 (one 64x10 layer) < 2,410 (64-24-24-10) < 2,698 (4 x 8 x 64 prompts + the head):
    Table 5 orders its blocks by trainable parameters."""
    state, head3 = _states()
    counts = []
    for block in BLOCKS:
        model, names = block_model(block, state, head3)
        if names is None:
            counts.append(sum(p.numel() for p in model[-1].parameters()))
        else:
            params = dict(model.named_parameters())
            counts.append(sum(params[n].numel() for n in names))
            assert set(names) == {"prompts", "head.weight", "head.bias"}
    assert counts == [650, 64 * 24 + 24 + 24 * 24 + 24 + 24 * 10 + 10, 4 * 8 * 64 + 650]
    with pytest.raises(ValueError, match="block must be one of"):
        block_model("LP 2 LN", state, head3)


def test_lp_blocks_read_the_vits_features():
    state, head3 = _states()
    x = torch.rand(4, 1, 28, 28)
    model, _ = block_model("LP 3 LN", state, head3)
    vit, _ = block_model("D-VPT", state, head3)
    with torch.no_grad():
        assert torch.equal(model[:-1](x), vit.features(x))
        assert torch.equal(ViTFeatures(vit)(x), vit.features(x))
        lp1, _ = block_model("LP 1 LN", state, head3)
        assert torch.equal(lp1(x), vit(x))           # LP 1 LN is the ViT with its own head


@pytest.mark.parametrize("method", ["bp", "ff"])
def test_dvpt_trains_only_prompts_and_head(method):
    """D-VPT through train_head(trainable=...): the frozen ViT weights stay bit-identical,
    the prompts and the head move, for BP and for QZO-FF."""
    state, head3 = _states()
    vit, names = block_model("D-VPT", state, head3)
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(40, 1, 28, 28, generator=g), torch.randint(0, 10, (40,), generator=g)
    cfg = None if method == "bp" else ff_config("fp32", seed=0)
    out = train_head(vit, method, x, y, epochs=2, batch_size=20, lr=1e-2, config=cfg,
                     trainable=names)
    before, after = dict(vit.named_parameters()), dict(out["model"].named_parameters())
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert moved == set(names)
    assert len(out["epoch_loss"]) == 2


def test_vit_task_chooses_each_rate_on_one_grid_and_reports_the_loss_fall():
    from bpfree.data import require_data_root

    require_data_root("mnist")
    state, head3 = _states()
    variants = {"Zero-shot": {"method": "zero-shot"}, "BP": {"method": "bp"},
                "FF": {"method": "ff", "precision": "fp32"}}
    res = vit_ood_task(state, head3, "contrast", 5,
                       {"LP 1 LN": variants, "D-VPT": {"BP": {"method": "bp"}}},
                       epochs=2, batch_size=50, lrs=(1e-3, 1e-2, 1e-1), seeds=(0, 1),
                       n_train=100, n_test=50)
    lp = res["LP 1 LN"]
    assert len(lp["Zero-shot"]["accuracy"]) == 1
    for label in ("BP", "FF"):
        v = lp[label]
        tried = sorted(float(r) for r in v["lr_scores"])
        assert {1e-3, 1e-2, 1e-1} <= set(tried) and len(tried) == 3 + v["widened"]
        assert v["widened"] <= MAX_WIDEN
        # a widened grid goes on by the grid's ratio (10 here) past the edge it left
        assert all(b / a == pytest.approx(10) for a, b in zip(tried, tried[1:]))
        if v["widened"] == 0:                          # the choice was inside the grid
            assert v["lr"] == 1e-2
        assert v["lr_scores"][str(v["lr"])] == max(v["lr_scores"].values())
        assert v["grid_edge"] == (v["lr"] in (tried[0], tried[-1]))
        assert len(v["accuracy"]) == len(v["loss_drop"]) == 2
        assert v["loss_drop"][0] == pytest.approx(v["first_epoch_loss"] - v["last_epoch_loss"])
    assert lp["FF"]["forwards"] == 2 * 2 * 6 * 50       # 2 epochs x 2 steps x 2m x batch
    assert set(res["D-VPT"]) == {"BP"} and res["_meta"]["n_train"] == 100
