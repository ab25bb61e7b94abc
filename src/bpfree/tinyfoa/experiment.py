"""One benchmark job for ``benchmarks/tinyfoa.py`` (importable, so a spawned worker can run it).

A job is a dict: ``dataset`` (an IDX kind, or ``"mitbih"``), ``method`` (a variant name),
``arch`` (``"fc"`` or ``"lc"``; LC needs images), ``m``, ``seed``, ``epochs``, ``batch``,
``train``/``test`` (sample counts; ``None`` = all), ``val`` (validation samples carved from
the training split, default 0), ``width`` (FC hidden width), optional ``optimizer`` / ``layerwise`` /
``schedule`` (TinyFoA's training regime, :class:`bpfree.tinyfoa.TinyFoA`; FC only), ``exchanges`` (``F``; None →
``visits`` × the slice count), ``visits``, optional ``lr`` and ``eval_on`` (``"test"``,
default, or ``"val"``: a learning-rate sweep never sees the test split).
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

__all__ = ["LC_SPEC", "MITBIH", "default_lr", "n_classes", "run_job", "split_indices"]

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
    from bpfree.tinyfoa import parse_variant

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


def split_indices(n: int, n_train: int | None, n_val: int, *, shuffle: bool):
    """``(train, val)`` index arrays into a training split of ``n`` samples: ``val`` is the
    last ``n_val`` samples (after a fixed seed-0 permutation when ``shuffle``), ``train`` the
    first ``n_train`` (None: all) of the others. Raises when they do not fit."""
    import numpy as np

    if n_val < 0 or n_val >= n:
        raise ValueError(f"the validation split must hold 0 to {n - 1} of the {n} training "
                         f"samples, got {n_val}")
    order = np.random.default_rng(0).permutation(n) if shuffle else np.arange(n)
    rest, val = order[:n - n_val], order[n - n_val:]
    if n_train is not None and n_train > len(rest):
        raise ValueError(f"{n_train} training samples requested but only {len(rest)} remain "
                         f"after the {n_val} validation samples")
    return rest[:n_train], val


def _data(kind: str, n_train: int | None, n_test: int | None, n_val: int = 0):
    """``(x, y, x_val, y_val, x_test, y_test)`` of a benchmark dataset (module docstring)."""
    import torch

    key = (kind, n_train, n_test, n_val)
    if key in _DATA:
        return _DATA[key]
    if kind == MITBIH:
        import numpy as np

        from bpfree.data import mitbih_split

        x, y, xt, yt = mitbih_split(seed=0)
        tr, va = split_indices(len(y), n_train, n_val, shuffle=True)
        te = np.random.default_rng(0).permutation(len(yt))[:n_test]
        out = tuple(torch.from_numpy(a) for a in (x[tr], y[tr], x[va], y[va], xt[te], yt[te]))
    else:
        from bpfree.data import load_mnist

        xi, yi = load_mnist(split="train", kind=kind)
        xt, yt = load_mnist(split="test", kind=kind)
        tr, va = split_indices(len(yi), n_train, n_val, shuffle=False)

        def images(a):
            return torch.from_numpy(a).float().div_(255).reshape(len(a), -1)

        out = (images(xi[tr]), torch.from_numpy(yi[tr]).long(), images(xi[va]),
               torch.from_numpy(yi[va]).long(), images(xt[:n_test]),
               torch.from_numpy(yt[:n_test]).long())
    _DATA[key] = out
    return out


def run_job(job: dict) -> tuple[dict, float]:
    """Train one (dataset, method, architecture, M, F, seed) and return its test error."""
    import torch

    torch.set_num_threads(1)
    from bpfree.tinyfoa import BP, TinyFoA, evaluate, fit_epochs, make_method, parse_variant

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
    fit_epochs(method, x, y, epochs=job["epochs"], batch_size=job["batch"],
               lr=job.get("lr") or default_lr(name, job["dataset"]), exchanges=f, seed=seed)
    return job, (evaluate(method, xv, yv) if eval_on == "val" else evaluate(method, xt, yt))
