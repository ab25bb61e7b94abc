"""One benchmark job of ``bpfree bench tinyfoa`` (benchmarks/tinyfoa.py), in a module of its
own so that a spawned worker can import it.

A job is a dict: ``dataset`` (an IDX kind, or ``"mitbih"``), ``method`` (a variant name),
``arch`` (``"fc"`` or ``"lc"``; LC needs images), ``m``, ``seed``, ``epochs``, ``batch``,
``train``/``test`` (sample counts; ``None`` = all), ``val`` (validation samples carved from
the training split, default 0), ``width`` (FC hidden width), optional ``optimizer`` /
``layerwise`` / ``schedule`` (TinyFoA's training regime, :class:`bpfree.tinyfoa.TinyFoA`; FC
only), ``exchanges`` (``F``; None → ``visits`` × the slice count), ``visits``, optional
``lr`` and ``eval_on`` (``"test"``, default, or ``"val"``: a learning-rate sweep never sees
the test split).
:func:`run_job` returns ``(job, error %)`` on the split ``eval_on`` names.

Validation split: for the image sets the last ``val`` images of the training split (the
training images are the first ``train`` of the rest); for MIT-BIH a fixed (seed 0) random
``val`` of the 3,210 training beats, the rest training. The test split is never touched by
a sweep.

MIT-BIH (``"mitbih"``): :func:`bpfree.data.mitbih_split` with its defaults -- the five AAMI
classes, 168-sample beat windows (72 before the R peak), each window standardised, an
intra-patient split balanced to 802 beats per class (the rarest class, F) of which 20 % are
test beats: 3,210 training / 800 test beats, the same split (seed 0) for every run; the
model seed varies. ``train``/``test`` below those counts take a fixed random subset.
"""

from __future__ import annotations

import numpy as np
import torch

from bpfree.data import flat_image_splits, mitbih_split, split_indices
from bpfree.tinyfoa import BP, TinyFoA, evaluate, fit_epochs, make_method, parse_variant

__all__ = ["LC_SPEC", "MITBIH", "default_lr", "n_classes", "run_job"]

#: The dataset name of the MIT-BIH beats (the rest are IDX kinds).
MITBIH = "mitbih"

#: Our LC network for Table 3 (the paper does not give its LC architecture):
#: (kernels, kernel size, stride) per layer on 1×28×28 inputs.
LC_SPEC = [(16, 5, 2), (16, 3, 2)]


def default_lr(name: str, dataset: str | None = None) -> float:
    """The centre of each method's SGD learning-rate grid (the benchmark chooses the rate from
    ``default_lr × (1/3, 1, 3)`` on a validation split; these centres came from an earlier
    by-hand sweep on MNIST training images, width 256). MIT-BIH: PEPITA's centre is 0.06,
    since 0.2 diverges on the standardised beats.
    """
    v = parse_variant(name)
    if dataset == MITBIH and v.base == "PEPITA":
        return 0.06
    if v.base == "TinyFoA":
        return 0.3
    if v.base == "BP":
        return 0.2 if v.binary_activations else 0.05
    return {"DRTP": 0.05, "PEPITA": 0.2, "FF": 0.003}[v.base]


_DATA: dict = {}


def n_classes(dataset: str) -> int:
    """Classes of a benchmark dataset: 5 AAMI classes for MIT-BIH, else 10."""
    return 5 if dataset == MITBIH else 10


def _data(kind: str, n_train: int | None, n_test: int | None, n_val: int = 0):
    """``(x, y, x_val, y_val, x_test, y_test)`` of a benchmark dataset (module docstring)."""
    key = (kind, n_train, n_test, n_val)
    if key in _DATA:
        return _DATA[key]
    if kind == MITBIH:
        x, y, xt, yt = mitbih_split(seed=0)
        tr, va = split_indices(len(y), n_train, n_val, shuffle=True)
        te = np.random.default_rng(0).permutation(len(yt))[:n_test]
        out = tuple(torch.from_numpy(a) for a in (x[tr], y[tr], x[va], y[va], xt[te], yt[te]))
    else:
        out = flat_image_splits(kind, n_train=n_train, n_val=n_val, n_test=n_test)
    _DATA[key] = out
    return out


def run_job(job: dict) -> tuple[dict, float]:
    """Train one (dataset, method, architecture, M, F, seed) and return its test error.

    A run whose loss turns non-finite returns error 100 (%) and the job with a ``diverged`` key
    holding the reason."""
    torch.set_num_threads(1)
    x, y, xv, yv, xt, yt = _data(job["dataset"], job["train"], job["test"], job.get("val", 0))
    eval_on = job.get("eval_on", "test")
    if eval_on not in ("test", "val"):
        raise ValueError(f"eval_on must be 'test' or 'val', got {eval_on!r}")
    if eval_on == "val" and not len(yv):
        raise ValueError("eval_on='val' needs a validation split: set job['val'] > 0")
    name, m, seed = job["method"], job["m"], job["seed"]
    classes = n_classes(job["dataset"])
    v = parse_variant(name)
    if job["arch"] == "lc":
        if x.shape[1] != 784:
            raise ValueError(f"the LC network takes 28×28 images; {job['dataset']!r} has "
                             f"{x.shape[1]} inputs")
        cls = TinyFoA if v.base == "TinyFoA" else BP
        method = cls(None, classes, variant=v, m=m, seed=seed, lc=LC_SPEC, in_shape=(1, 28))
        slices = m if v.vertical else 1
    else:
        depth = 3 if v.base == "PEPITA" else 4
        regime = {k: job[k] for k in ("optimizer", "layerwise", "schedule") if k in job}
        method = make_method(name, [x.shape[1]] + [job["width"]] * depth, classes, m=m,
                             seed=seed, **regime)
        slices = m * m if v.vertical and regime.get("schedule", "slice") == "slice" else 1
        if regime.get("layerwise"):
            slices *= depth           # every layer's phase visits each slice ``visits`` times
    f = job["exchanges"] if job["exchanges"] else job["visits"] * slices
    try:
        fit_epochs(method, x, y, epochs=job["epochs"], batch_size=job["batch"],
                   lr=job.get("lr") or default_lr(name, job["dataset"]), exchanges=f,
                   seed=seed)
    except FloatingPointError as exc:
        # A rate at which training blows up is a result of the search (the rate loses), not
        # a reason to abort hours of other jobs: it scores 100 % error and is listed.
        return dict(job, diverged=str(exc)), 100.0
    return job, (evaluate(method, xv, yv) if eval_on == "val" else evaluate(method, xt, yt))
