"""One benchmark job for ``benchmarks/tinyfoa.py`` (importable, so a spawned worker can run it).

A job is a dict: ``dataset`` (an IDX kind, or ``"mitbih"``), ``method`` (a variant name),
``arch`` (``"fc"`` or ``"lc"``; LC needs images), ``m``, ``seed``, ``epochs``, ``batch``,
``train``/``test`` (sample counts; ``None`` = all), ``width`` (FC hidden width),
``exchanges`` (``F``; None → ``visits`` × the slice count), ``visits``, optional ``lr``.
:func:`run_job` returns ``(job, test error %)``.

MIT-BIH (``"mitbih"``): :func:`bpfree.data.mitbih_split` with its defaults -- the five AAMI
classes, 168-sample beat windows (72 before the R peak), each window standardised, an
intra-patient split balanced to 802 beats per class (the rarest class, F) of which 20 % are
test beats: 3,210 training / 800 test beats, the same split (seed 0) for every run; the
model seed varies. ``train``/``test`` below those counts take a fixed random subset.
"""

from __future__ import annotations

__all__ = ["LC_SPEC", "MITBIH", "default_lr", "n_classes", "run_job"]

#: The dataset name of the MIT-BIH beats (the rest are IDX kinds).
MITBIH = "mitbih"

#: Our LC network for Table 3 (the paper does not give its LC architecture):
#: (kernels, kernel size, stride) per layer on 1×28×28 inputs.
LC_SPEC = [(16, 5, 2), (16, 3, 2)]


def default_lr(name: str, dataset: str | None = None) -> float:
    """SGD learning rate per method (a small sweep on 6000 MNIST images, width 256).

    MIT-BIH: the same sweep (×0.1, 0.3, 1, 3; 10 epochs, validation beats held out of the
    training split) kept every rate but PEPITA's, which diverges at 0.2 (80 % error) on the
    standardised beats and is best at 0.06.
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


def _data(kind: str, n_train: int | None, n_test: int | None):
    import torch

    key = (kind, n_train, n_test)
    if key in _DATA:
        return _DATA[key]
    if kind == MITBIH:
        import numpy as np

        from bpfree.data import mitbih_split

        x, y, xt, yt = mitbih_split(seed=0)
        rng = np.random.default_rng(0)
        tr, te = rng.permutation(len(y))[:n_train], rng.permutation(len(yt))[:n_test]
        _DATA[key] = (torch.from_numpy(x[tr]), torch.from_numpy(y[tr]),
                      torch.from_numpy(xt[te]), torch.from_numpy(yt[te]))
    else:
        from bpfree.data import load_mnist

        xi, yi = load_mnist(split="train", kind=kind)
        xt, yt = load_mnist(split="test", kind=kind)
        xi, yi, xt, yt = xi[:n_train], yi[:n_train], xt[:n_test], yt[:n_test]
        _DATA[key] = (torch.from_numpy(xi).float().div_(255).reshape(len(xi), -1),
                      torch.from_numpy(yi).long(),
                      torch.from_numpy(xt).float().div_(255).reshape(len(xt), -1),
                      torch.from_numpy(yt).long())
    return _DATA[key]


def run_job(job: dict) -> tuple[dict, float]:
    """Train one (dataset, method, architecture, M, F, seed) and return its test error."""
    import torch

    torch.set_num_threads(1)
    from bpfree.tinyfoa import BP, TinyFoA, evaluate, fit_epochs, make_method, parse_variant

    x, y, xt, yt = _data(job["dataset"], job["train"], job["test"])
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
        method = make_method(name, [x.shape[1]] + [job["width"]] * depth, classes, m=m,
                             seed=seed)
        slices = m * m if v.vertical else 1
    f = job["exchanges"] if job["exchanges"] else job["visits"] * slices
    fit_epochs(method, x, y, epochs=job["epochs"], batch_size=job["batch"],
               lr=job.get("lr") or default_lr(name, job["dataset"]), exchanges=f, seed=seed)
    return job, evaluate(method, xt, yt)
