"""BP-free sparse training (PMT §3.3.1): pick the one block worth training, with forwards only.

The model's trainable layers are split into four contiguous, non-overlapping blocks ("Block 1"
... "Block 4" from input to output, following surgical fine-tuning [52]). For a new task, each
block gets a 1-epoch BP-free trial from the same starting weights; the block whose trial gives
the largest accuracy gain on a held-out part of the training data is selected, and only it is
trained afterwards. The selection costs the trials' forward passes and a few scalars of memory.

Choice where the paper is silent: blocks are cut at stage boundaries (a residual block is never
split) so that each block holds as close to ``L / 4`` integer layers as possible.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn

from ..quant.graph import TrainableLayer
from ..harness import accuracy, fit, holdout_split


def split_blocks(layers: list[TrainableLayer], num_blocks: int = 4) -> list[list[str]]:
    """Contiguous blocks of layer names, cut only between stages, balanced by layer count."""
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
        raise ValueError(f"num_blocks must be an int >= 1, got {num_blocks!r}")
    stages = [[layer.name for layer in group]
              for _, group in itertools.groupby(layers, key=lambda layer: layer.stage)]
    if len(stages) < num_blocks:
        raise ValueError(f"cannot split {len(stages)} stages with trainable layers into "
                         f"{num_blocks} blocks")
    total = len(layers)
    cumulative, running = [], 0
    for stage in stages:
        running += len(stage)
        cumulative.append(running)
    # Cut after the stage whose cumulative count is closest to each ideal boundary k*L/B,
    # keeping cuts strictly increasing so every block is non-empty.
    cuts, prev = [], -1
    for k in range(1, num_blocks):
        ideal = k * total / num_blocks
        lo, hi = prev + 1, len(stages) - (num_blocks - k) - 1
        best = min(range(lo, hi + 1), key=lambda j: (abs(cumulative[j] - ideal), j))
        cuts.append(best)
        prev = best
    blocks, start = [], 0
    for cut in cuts + [len(stages) - 1]:
        blocks.append([name for stage in stages[start:cut + 1] for name in stage])
        start = cut + 1
    return blocks


def block(blocks: list[list[str]], index: int) -> list[str]:
    """Layer names of block ``index`` (1-based, as in the paper), with a clear range error."""
    if isinstance(index, bool) or not isinstance(index, int) or not 1 <= index <= len(blocks):
        raise ValueError(f"block index must be an int in [1, {len(blocks)}], got {index!r}")
    return blocks[index - 1]


@dataclass
class BlockSelection:
    """Outcome of the selection trials: per-block held-out accuracy and gain, and the choice."""

    blocks: list[list[str]]
    base_accuracy: float
    accuracies: list[float]
    gains: list[float]
    chosen: int  # 1-based
    forwards: int

    def as_dict(self) -> dict:
        return asdict(self)


def select_block(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *,
                 blocks: list[list[str]], make_method: Callable[[nn.Module, list[str]], object],
                 lr: float, batch_size: int, holdout: float = 0.2, epochs: int = 1,
                 seed: int = 0, progress: bool = False) -> BlockSelection:
    """Run a BP-free trial per block on a copy of ``model`` and choose the best (§3.3.1).

    ``make_method(model_copy, layer_names)`` builds the trainer of one trial (e.g. a
    :class:`~bpfree.pmt.PMTTrainer` restricted to the block). ``model`` is not modified.
    Ties go to the earlier block. Forward passes of the trials and of the held-out
    evaluations are counted.
    """
    if not blocks or not all(isinstance(b, (list, tuple)) and b for b in blocks):
        raise ValueError("blocks must be a non-empty list of non-empty lists of layer names "
                         f"(see split_blocks), got {blocks!r}")
    train_idx, held_idx = holdout_split(x.shape[0], holdout, seed)
    xt, yt, xh, yh = x[train_idx], y[train_idx], x[held_idx], y[held_idx]
    base = accuracy(model, xh, yh)
    forwards = xh.shape[0]
    accs = []
    for i, names in enumerate(blocks):
        trial = copy.deepcopy(model)
        method = make_method(trial, names)
        fit(method, xt, yt, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed,
            progress=f"block {i + 1} trial" if progress else False)
        forwards += method.forwards + xh.shape[0]
        accs.append(accuracy(trial, xh, yh))
    gains = [a - base for a in accs]
    chosen = max(range(len(blocks)), key=lambda i: (gains[i], -i)) + 1
    return BlockSelection(blocks=blocks, base_accuracy=base, accuracies=accs, gains=gains,
                          chosen=chosen, forwards=forwards)
