"""Why one network trains better than another under ZO in `bench pinn` (Table 6): each network's untrained test MSE, what the full run's ZO-SG did relative to it, and its RGE step's alignment.

`bench pinn`'s Table 6 claims (TT-ZO §5.2: the TT network is the best under ZO, because
fewer trained parameters mean a less noisy ZO estimate) compare final test MSEs. A final MSE
mixes two things: where a network starts and how far ZO moves it. This probe separates them
for every Table 6 network, built exactly as `bench pinn` builds it (``pinn._models``, the same
seeds, the transformed network of §5.2):

* the untrained network's MSE on `bench pinn`'s test points, per seed;
* the full run's ZO-SG test MSE over it, per seed, read from ``results/pinn.json`` (when that
  file is there and is a full run): the factor ZO gained;
* on seed 0 and one batch of the SG loss, the cosine between an RGE estimate (N = 10 Gaussian
  directions, Eq. 4 of TT-ZO) and the autograd gradient at each μ of the full run's search,
  beside the ideal sqrt(N / d) (``bpfree.estimators.alignment.rge_alignment``);
* the derivative backends' error on the untrained TT-3 in float32 (as the runs) and in
  float64, against float64 AD: how much of each error is rounding.

Nothing is trained, so quick and full are the same (a few minutes on 2 cores).
"""

from __future__ import annotations

import json
from pathlib import Path

NAME = "pinn-zo-probe"
DESCRIPTION = __doc__.split("\n\n")[0].replace("\n", " ")
SEED = 0
ROOT = Path(__file__).resolve().parent.parent

TU = "Untrained networks: test MSE, and what the full run's ZO-SG did to it (HJB-20)"
TA = "RGE alignment per network at the search's μ (seed 0, SG loss, one batch, N = 10)"
TD = ("Derivative estimates' error against float64 AD on the untrained TT-3, in float32 (as "
      "bench pinn runs) and float64")


def derivative_errors_by_dtype(pinn, base, problem, points) -> dict:
    """``{dtype: {backend: {"gradient", "laplacian"}}}``: relative L2 errors of FD, SE and SG
    against AD in float64, with the network and points cast to each dtype.

    `bench pinn`'s derivative-error rows compare float32 estimates with float32 AD. A finite
    difference or quadrature sum of O(1) function values divided by h² or σ² cancels
    catastrophically in float32 when the Laplacian is small (an untrained network's is), so
    this separates the estimator's own error (float64) from float32 rounding.
    """
    import torch

    from bpfree.pinn import transformed

    out, reference = {}, None
    for dtype in (torch.float64, torch.float32):
        net = transformed(base.to(dtype), problem).network
        x = points.to(dtype)
        if reference is None:
            reference = [t.detach() for t in pinn._backend("AD")(
                net, x, laplacian_dims=problem.laplacian_dims)]
        # every backend's values in this dtype, SE's too (the run computes SE's in SE_DTYPE)
        out[str(dtype).removeprefix("torch.")] = pinn.derivative_errors(
            net, problem, x, reference, se_dtype=None)
    base.to(torch.float32)
    return out


def full_run_zo(path: Path) -> dict | None:
    """``network -> per-seed ZO-SG test MSE`` of a full `bench pinn` result, None when the
    file is absent or a quick run (its networks are narrower, so it does not match)."""
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    if doc.get("quick", True):
        return None
    per_seed = doc.get("extra", {}).get("per_seed_test_mse", {})
    return {key[len("ZO "):-len(" SG")]: values for key, values in per_seed.items()
            if key.startswith("ZO ") and key.endswith(" SG")}


def run(quick: bool) -> tuple[list[dict], dict]:
    import torch

    import pinn
    from bpfree.estimators.alignment import rge_alignment
    from bpfree.pinn import HJB, num_parameters, pinn_loss, transformed, validation_mse

    cfg = pinn._config(False)          # the full run's networks (768 wide) and batch
    problem = HJB(20)
    test = problem.validation_points(1000, seed=pinn.TEST_SEED)
    seeds = cfg["seeds"]
    source = ROOT / "results" / "pinn.json"
    zo = full_run_zo(source)
    rows = []

    def row(table, method, setting, metric, value):
        rows.append({"table": table, "method": method, "setting": setting, "metric": metric,
                     "value": float(value), "paper": None})

    names = list(pinn._models(cfg, 0))
    batch = problem.sample(cfg["batch"], cfg["n_initial"],
                           generator=torch.Generator().manual_seed(7))
    alignment = {}
    for name in names:
        base = pinn._models(cfg, 0)[name]()
        setting = f"{name}, {num_parameters(base)} params"
        untrained = [validation_mse(transformed(pinn._models(cfg, s)[name](), problem), problem,
                                    test) for s in seeds]
        row(TU, name, setting, f"untrained test MSE (geometric mean of {len(seeds)} seeds)",
            pinn._gmean(untrained))
        if zo is not None and name in zo:
            ratios = [a / b for a, b in zip(zo[name], untrained, strict=True)]
            row(TU, name, setting, "full run's ZO-SG test MSE / untrained (geometric mean)",
                pinn._gmean(ratios))
            row(TU, name, setting, "full run's ZO-SG test MSE (geometric mean)",
                pinn._gmean(zo[name]))
        net = transformed(base, problem)
        backend = pinn._backend("SG")
        alignment[name] = {}
        for mu in pinn.ZO_MUS:
            a = rge_alignment(list(net.parameters()),
                              lambda: pinn_loss(net, problem, backend, batch)["loss"], mu,
                              queries=10, draws=5, seed=0)
            alignment[name][f"{mu:g}"] = a["cosine"]
            row(TA, name, setting, f"RGE cosine with the gradient (μ = {mu:g})", a["cosine"])
        row(TA, name, setting, "ideal RGE cosine sqrt(N / d)", a["ideal_cosine"])
    # The derivative rows: the same untrained TT-3 and 64 points as bench pinn's.
    points = problem.sample(64, 0, generator=torch.Generator().manual_seed(7)).interior
    derivative = derivative_errors_by_dtype(pinn, pinn._models(cfg, 0)["TT-3"](), problem,
                                            points)
    for dtype, per in derivative.items():
        for b, err in per.items():
            for what in ("gradient", "laplacian"):
                row(TD, b, f"TT-3 768 (rank 8), 64 points, {dtype}",
                    f"relative {what} error vs float64 AD", err[what])
    extra = {
        "derivative_errors": derivative,
        "source": str(source.relative_to(ROOT)) if zo is not None else None,
        "alignment": alignment,
        "notes": [
            f"Networks, seeds {list(seeds)} and test points (draw {pinn.TEST_SEED}) as in "
            "`bench pinn`'s full mode; nothing is trained here.",
            ("ZO-SG rows divide the per-seed test MSEs of " + str(source.relative_to(ROOT))
             + " (extra.per_seed_test_mse) by the same seed's untrained MSE computed here.")
            if zo is not None else
            "results/pinn.json is absent or a quick run: no ZO-SG rows.",
            "RGE cosine: mean over 5 draws of the cosine between an RGE estimate (10 Gaussian "
            "directions, forward differences at μ) and the autograd gradient of one batch's "
            "SG loss (8 residual + 32 terminal points), on seed 0's untrained network.",
            "Derivative errors: FD (h = 0.01), SE (σ = 0.1, 1,024 antithetic pairs) and SG "
            "(σ = 0.1, level 3) as bench pinn builds them, against AD in float64, at the 64 "
            "residual points of bench pinn's derivative rows (draw 7); float32 is what the "
            "runs use.",
        ],
    }
    return rows, extra
