"""QZO-FF Table 5's three fine-tuning blocks and Fig. 2's enhancements on one tiny ViT.

The ViT part of ``bpfree bench qzo-ff`` (benchmarks/qzo_ff.py). Table 5 (§4.3) adapts a ViT
tiny pretrained on CIFAR-10 to CIFAR-10-C with three trainable sets: "LP 1 LN" (one linear
decoder layer), "LP 3 LN" ("3 linear layer of decoder", the caption) and D-VPT (deep visual
prompts in every encoder layer, Jia et al. 2022, plus the decoder). The MNIST analogue keeps
one backbone for all three, so that "more trainable parameters adapt better" compares
trainable sets and nothing else:

* :func:`pretrain_vit` -- ``mnist-vit`` (:class:`bpfree.models.vit.TinyViT`, dim 64, depth
  4) with :data:`PROMPT_TOKENS` prompts per layer, BP-trained on clean MNIST (prompts
  included: the paper's D-VPT zero-shot, 89.52 against LP's 82.48 on the easy level, says
  its prompts were tuned before the corruption), then a 3-layer decoder
  (:func:`three_layer_decoder`) BP-trained on the frozen clean features.
* :func:`vit_ood_task` -- one corrupted task (:func:`_qzoff_experiment.ood_data`): per block,
  zero-shot and every variant (BP, FF, FF 16w8a, FF with the §3.4 enhancements), each rate
  chosen on a held-out fifth of the adaptation images from one grid, then one run per seed.
  The LP blocks train on cached features (:func:`bpfree.qzoff.frozen_features`, as the CNN's
  LP 1 LN rows); D-VPT runs the whole ViT every forward, prompts and head trainable
  (:func:`bpfree.training_modes.trainable_parameters` mode ``"deep-vpt"``); in 16w8a its
  activations are fake-quantized to 8 bits by :class:`bpfree.qzoff.QZOFF` itself.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from _qzoff_experiment import (_select_lr, _variant_config, bp_pretrain_loop, load_images,
                               ood_data, train_head)
from bpfree.bench.parallel import run_named_task
from bpfree.bench.rate_grid import rate_past_edge
from bpfree.harness import accuracy
from bpfree.models.vit import TinyViT
from bpfree.qzoff import frozen_features, precision_bits
from bpfree.training_modes import trainable_numel, trainable_parameters

__all__ = ["BLOCKS", "HEAD3_HIDDEN", "MAX_WIDEN", "PROMPT_TOKENS", "ViTFeatures", "block_model",
           "pretrain_vit", "run_task", "select_rate", "three_layer_decoder", "vit_ood_task"]

#: Table 5's blocks, fewest trainable parameters first (650 / 2,410 / 2,698 here).
BLOCKS = ("LP 1 LN", "LP 3 LN", "D-VPT")
#: Deep prompts per encoder layer: 4 x 8 x 64 = 2,048 prompt values (+ the 650-weight head).
PROMPT_TOKENS = 8
#: Width of the 3-layer decoder's hidden layers: 64 -> 24 -> 24 -> 10, 2,410 weights, between
#: the linear decoder's 650 and D-VPT's 2,698, as Table 5 orders its blocks.
HEAD3_HIDDEN = 24


class ViTFeatures(nn.Module):
    """``vit.features`` as a module, so that ``nn.Sequential(ViTFeatures(vit), decoder)``
    is a backbone + decoder that :func:`bpfree.qzoff.frozen_features` can cut at ``[:-1]``."""

    def __init__(self, vit: TinyViT) -> None:
        super().__init__()
        self.vit = vit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.vit.features(x)


def three_layer_decoder(dim: int = 64, hidden: int = HEAD3_HIDDEN, classes: int = 10
                        ) -> nn.Sequential:
    """Table 5's "3 LN" decoder: three linear layers with ReLU between them (without a
    non-linearity three linear layers are one)."""
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, classes))


def _vit(state: dict | None = None) -> TinyViT:
    vit = TinyViT(prompt_tokens=PROMPT_TOKENS)
    if state is not None:
        vit.load_state_dict(state)
    return vit.eval()


def block_model(block: str, state: dict, head3: dict) -> tuple[nn.Module, list[str] | None]:
    """``(model, trainable names)`` of a block: for the LP blocks an ``nn.Sequential(
    ViTFeatures, decoder)`` whose decoder trains on cached features (names None: all of the
    decoder); for D-VPT the whole ViT and its prompts + head."""
    vit = _vit(state)
    if block == "LP 1 LN":
        return nn.Sequential(ViTFeatures(vit), vit.head).eval(), None
    if block == "LP 3 LN":
        dec = three_layer_decoder()
        dec.load_state_dict(head3)
        return nn.Sequential(ViTFeatures(vit), dec).eval(), None
    if block == "D-VPT":
        return vit, trainable_parameters(vit, "deep-vpt")
    raise ValueError(f"block must be one of {BLOCKS}, got {block!r}")


def pretrain_vit(images: int = 10000, epochs: int = 2, head_epochs: int = 5, lr: float = 2e-3,
                 batch_size: int = 128, seed: int = 0, threads: int = 1) -> dict:
    """BP pretraining on clean MNIST (the first ``images`` training images, all digits): the
    ViT with its prompts, then the 3-layer decoder on the frozen ViT's features for
    ``head_epochs``. Returns ``{"state", "head3", "test_accuracy" (ViT), "head3_test_accuracy",
    "trainable" (per block), "seconds"}`` (test: the first 2000 test images)."""
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    x, y = load_images("mnist", "train", None, images)
    torch.manual_seed(seed)
    vit = bp_pretrain_loop(TinyViT(prompt_tokens=PROMPT_TOKENS), x, y, epochs=epochs, lr=lr,
                           batch_size=batch_size, seed=seed)
    for p in vit.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        feats = torch.cat([vit.features(x[i:i + 1000]) for i in range(0, len(x), 1000)])
    torch.manual_seed(seed + 1)
    dec = bp_pretrain_loop(three_layer_decoder(), feats, y, epochs=head_epochs, lr=lr,
                           batch_size=batch_size, seed=seed + 1)
    xt, yt = load_images("mnist", "test", None, 2000)
    with torch.no_grad():
        test_acc = accuracy(vit, xt, yt)
        head3_acc = accuracy(nn.Sequential(ViTFeatures(vit), dec), xt, yt)
    state = {k: v.detach().clone() for k, v in vit.state_dict().items()}
    head3 = {k: v.detach().clone() for k, v in dec.state_dict().items()}
    trainable = {}
    for block in BLOCKS:
        model, names = block_model(block, state, head3)
        trainable[block] = (trainable_numel(model, names) if names is not None
                            else sum(p.numel() for p in model[-1].parameters()))
    return {"state": state, "head3": head3, "images": int(len(y)), "epochs": epochs,
            "head_epochs": head_epochs, "test_accuracy": test_acc,
            "head3_test_accuracy": head3_acc, "trainable": trainable,
            "prompt_tokens": PROMPT_TOKENS, "head3_hidden": HEAD3_HIDDEN,
            "seconds": time.perf_counter() - t0}


#: How many times :func:`select_rate` widens a grid past the edge its choice sits at. Four
#: since the full run at 65940e8, where two left BP on LP 1 LN under contrast at the top of
#: its widened grid (0.111) at all three levels, its held-out accuracy still rising.
MAX_WIDEN = 4


def select_rate(module, variant, ftr, ytr, grid, epochs, batch_size, seed, trainable=None
                ) -> tuple[float, dict, bool]:
    """The rate of ``grid`` with the best held-out accuracy
    (:func:`_qzoff_experiment._select_lr`), widened at an edge: while the choice is the
    grid's largest (smallest) rate, one rate further by the grid's end ratio is tried, up to
    :data:`MAX_WIDEN` times (a grid of fewer than 3 rates is not widened). Returns the rate,
    every tried rate's score, and whether the choice still sits at an edge."""
    lr, scores = _select_lr(module, variant, ftr, ytr, grid, epochs, batch_size, seed,
                            trainable=trainable)
    for _ in range(MAX_WIDEN):
        new = rate_past_edge(scores, lr, min_rates=3, digits=3)
        if new is None:
            break
        scores.update(_select_lr(module, variant, ftr, ytr, (new,), epochs, batch_size, seed,
                                 trainable=trainable)[1])
        lr = max(sorted(scores), key=lambda r: (scores[r], -r))
    return lr, scores, rate_past_edge(scores, lr, min_rates=3) is not None


def _loss_drop(epoch_loss: list[float]) -> float:
    """First epoch's mean training loss minus the last epoch's (each in the run's own
    arithmetic; the first epoch already trains, so this understates the fall)."""
    return float(epoch_loss[0] - epoch_loss[-1])


def vit_ood_task(state: dict, head3: dict, corruption: str, severity: int, blocks: dict, *,
                 epochs: int, batch_size: int = 100, lrs=(3e-4, 1e-3, 3e-3, 1e-2),
                 seeds=(0, 1, 2), n_train: int = 1000, n_test: int = 1000,
                 data_seed: int = 0) -> dict:
    """Adaptation of the pretrained ViT's blocks on one corrupted task.

    ``blocks``: ``{block: {label: variant}}`` with variants as
    :func:`_qzoff_experiment.ood_task`'s (``{"method": "bp" | "ff" | "zero-shot",
    "precision", **QZOFFConfig overrides, optional "lrs"}``). Each variant's rate is chosen
    from its ``"lrs"`` (default ``lrs``, one grid for every method) on a held-out fifth of the
    ``n_train`` adaptation images, the grid widened at an edge (:func:`select_rate`); it
    then trains once per seed on all of them and is tested on ``n_test`` corrupted test
    images. Returns ``{block: {label: {"accuracy": [per seed], "loss_drop": [per seed],
    "lr", "lr_scores", "grid_edge", "widened", "forwards", "seconds"}}}`` and ``"_meta"``;
    ``grid_edge`` says the chosen rate is still the smallest or largest tried, ``widened``
    how many rates were added."""
    torch.set_num_threads(1)
    t_all = time.perf_counter()
    (xtr, ytr), (xte, yte) = ood_data(corruption, severity, n_train=n_train, n_test=n_test,
                                      seed=data_seed)
    out: dict = {}
    for block, variants in blocks.items():
        model, names = block_model(block, state, head3)
        feats: dict = {}

        def data(prec, model=model, names=names, feats=feats):
            """(train inputs, test inputs, the trained module) of the block in ``prec``."""
            if names is not None:  # D-VPT: whole images; QZOFF quantizes its activations
                return xtr, xte, model
            key = prec if prec in ("fp32", "fp16") else f"a{precision_bits(prec)[1]}"
            if key not in feats:
                feats[key] = (frozen_features(model, xtr, prec),
                              frozen_features(model, xte, prec, calibration=xtr))
            return (*feats[key], model[-1])

        res_block = {}
        for label, variant in variants.items():
            t0 = time.perf_counter()
            ftr, fte, module = data(variant.get("precision", "fp32"))
            if variant["method"] == "zero-shot":
                with torch.no_grad():
                    res_block[label] = {"accuracy": [accuracy(module, fte, yte)], "seconds": 0.0}
                continue
            grid = tuple(variant.get("lrs", lrs))
            lr, scores, edge = select_rate(module, variant, ftr, ytr, grid, epochs,
                                           batch_size, data_seed, trainable=names)
            res = {"accuracy": [], "loss_drop": [], "lr": lr,
                   "lr_scores": {str(k): v for k, v in scores.items()},
                   "grid_edge": edge, "widened": len(scores) - len(set(grid)),
                   "seeds": list(seeds)}
            for s in seeds:
                cfg = None if variant["method"] == "bp" else _variant_config(variant, s)
                r = train_head(module, variant["method"], ftr, ytr, epochs=epochs,
                               batch_size=batch_size, lr=lr, seed=s, config=cfg,
                               trainable=names)
                with torch.no_grad():
                    res["accuracy"].append(accuracy(r["model"], fte, yte))
                res["loss_drop"].append(_loss_drop(r["epoch_loss"]))
                if s == seeds[0]:
                    res["forwards"] = r["forwards"]
                    res["first_epoch_loss"] = float(r["epoch_loss"][0])
                    res["last_epoch_loss"] = float(r["epoch_loss"][-1])
            res["seconds"] = time.perf_counter() - t0
            res_block[label] = res
        out[block] = res_block
    out["_meta"] = {"corruption": corruption, "severity": severity, "n_train": n_train,
                    "n_test": n_test, "data_seed": data_seed,
                    "seconds": time.perf_counter() - t_all}
    return out


def seed_means(results: list[dict], block: str, label: str, key: str = "accuracy"
               ) -> list[float]:
    """Per seed, the mean over corruptions (``results``: one :func:`vit_ood_task` per
    corruption of a level) of ``key``."""
    per_c = [r[block][label][key] for r in results]
    return [statistics.mean(pc[s] for pc in per_c) for s in range(len(per_c[0]))]


TASKS = {"pretrain_vit": pretrain_vit, "vit_ood": vit_ood_task}


def run_task(task: tuple[str, dict]) -> dict:
    """Process-pool entry point for :data:`TASKS` (one CPU thread); adds ``"wall_seconds"``."""
    return run_named_task(TASKS, task, seconds_key="wall_seconds")
