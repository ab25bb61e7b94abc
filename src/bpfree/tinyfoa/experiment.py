"""One benchmark job for ``benchmarks/tinyfoa.py`` (importable, so a spawned worker can run it).

A job is a dict: ``dataset`` (an IDX kind), ``method`` (a variant name), ``arch`` (``"fc"``
or ``"lc"``), ``m``, ``seed``, ``epochs``, ``batch``, ``train``/``test`` (image counts),
``width`` (FC hidden width), ``exchanges`` (``F``; None → ``visits`` × the slice count),
``visits``, optional ``lr``. :func:`run_job` returns ``(job, test error %)``.
"""

from __future__ import annotations

__all__ = ["LC_SPEC", "default_lr", "run_job"]

#: Our LC network for Table 3 (the paper does not give its LC architecture):
#: (kernels, kernel size, stride) per layer on 1×28×28 inputs.
LC_SPEC = [(16, 5, 2), (16, 3, 2)]


def default_lr(name: str) -> float:
    """SGD learning rate per method (a small sweep on 6000 MNIST images, width 256)."""
    from bpfree.tinyfoa import parse_variant

    v = parse_variant(name)
    if v.base == "TinyFoA":
        return 0.3
    if v.base == "BP":
        return 0.2 if v.binary_activations else 0.05
    return {"DRTP": 0.05, "PEPITA": 0.2, "FF": 0.003}[v.base]


_DATA: dict = {}


def _data(kind: str, n_train: int, n_test: int):
    import torch

    from bpfree.data import load_mnist

    key = (kind, n_train, n_test)
    if key not in _DATA:
        xi, yi = load_mnist(split="train", kind=kind)
        xt, yt = load_mnist(split="test", kind=kind)
        _DATA[key] = (torch.from_numpy(xi[:n_train]).float().div_(255).reshape(n_train, -1),
                      torch.from_numpy(yi[:n_train]).long(),
                      torch.from_numpy(xt[:n_test]).float().div_(255).reshape(n_test, -1),
                      torch.from_numpy(yt[:n_test]).long())
    return _DATA[key]


def run_job(job: dict) -> tuple[dict, float]:
    """Train one (dataset, method, architecture, M, F, seed) and return its test error."""
    import torch

    torch.set_num_threads(1)
    from bpfree.tinyfoa import BP, TinyFoA, evaluate, fit_epochs, make_method, parse_variant

    x, y, xt, yt = _data(job["dataset"], job["train"], job["test"])
    name, m, seed = job["method"], job["m"], job["seed"]
    v = parse_variant(name)
    if job["arch"] == "lc":
        cls = TinyFoA if v.base == "TinyFoA" else BP
        method = cls(None, 10, variant=v, m=m, seed=seed, lc=LC_SPEC, in_shape=(1, 28))
        slices = m if v.vertical else 1
    else:
        depth = 3 if v.base == "PEPITA" else 4
        method = make_method(name, [784] + [job["width"]] * depth, 10, m=m, seed=seed)
        slices = m * m if v.vertical else 1
    f = job["exchanges"] if job["exchanges"] else job["visits"] * slices
    fit_epochs(method, x, y, epochs=job["epochs"], batch_size=job["batch"],
               lr=job.get("lr") or default_lr(name), exchanges=f, seed=seed)
    return job, evaluate(method, xt, yt)
