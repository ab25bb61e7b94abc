"""The claim ledger: what a paper claims, what this run measured, and whether it holds.

A benchmark's ``run()`` may return ``(rows, {"claims": [...], ...})``; the runner lifts the
list to a top-level ``"claims"`` key of the result document, and ``bpfree docs`` opens
``docs/BENCHMARKS.md`` with a "Claim status" table built from every result file. A claim is
a plain dict::

    {"id": str, "paper_ref": str, "statement": str,
     "paper": str | float | None, "ours": str | float | None,
     "holds": bool | "not decided" | None,   # None: not measured in this run
     "note": str,                            # optional
     "kind": "paper" | "sanity" | "engineering"}   # optional, see claim_kind

``holds`` is computed by a rule written in the benchmark from that run's rows, never typed
by hand; build each entry with :func:`claim` so that a wrong type fails at the source.

A comparison of measured quantities carries a tolerance from their seed spread
(:func:`tolerance`: ``k`` standard errors of the difference, 2 by default): an ordering or a
margin inside it is :data:`UNDECIDED` ("not decided"), neither "holds" nor "fails"
(:func:`exceeds`, :func:`order`, :func:`within`, :func:`all_hold`). A tie is never decided.
:func:`sanity_claim` is the check every baseline row gets: its training loss falls and its
accuracy moves off its start by more than the seed noise.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

CLAIM_KEYS = ("id", "paper_ref", "statement", "paper", "ours", "holds")
_OPTIONAL_KEYS = ("note", "kind")
UNDECIDED = "not decided"
"""The third verdict: the measured difference lies inside the seed noise."""
KINDS = ("paper", "sanity", "engineering")
"""What a claim checks: a paper's number or ordering, that a baseline trains at all, or the
project's own engineering promise (an issue's "Done when")."""
PAPERS = ("PMT", "QZO-FF", "TT-ZO", "BP-free PINN", "TinyFoA")
"""The five papers the benchmarks reproduce (docs/PAPERS.md), in the order the docs count them."""
# The paper a benchmark reproduces; a claim's paper_ref naming another paper overrides it.
BENCHMARK_PAPERS = {"pmt": "PMT", "pmt-seeds": "PMT", "pmt-cosine": "PMT", "mcunet": "PMT",
                    "pmt-ratios": "PMT", "pmt-q-budget": "PMT", "pmt-t6": "PMT", "device": "PMT",
                    "qzo-ff": "QZO-FF", "tt-zo": "TT-ZO", "pinn": "BP-free PINN",
                    "tinyfoa": "TinyFoA"}
_PAPER_TAGS = (("PMT", "PMT"), ("QZO-FF", "QZO-FF"), ("TT-ZO", "TT-ZO"), ("PINN", "BP-free PINN"),
               ("TinyFoA", "TinyFoA"))
_TEXT_KEYS = ("id", "paper_ref", "statement")


class ClaimError(ValueError):
    """A claim breaks the ledger's contract (the runner reports it as a BenchmarkError)."""


def _value(value: Any, key: str, where: str) -> str | float | None:
    """A paper or measured value: text, a finite real number (as float), or None."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ClaimError(f"{where}: {key!r} must be a string, a finite number or None, "
                             f"got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ClaimError(f"{where}: {key!r} must be finite, got {value!r}")
    return number


def _verdict(value: Any, where: str) -> bool | str | None:
    """``holds``: a real bool (numpy's converted), :data:`UNDECIDED` or None; 0/1 and other
    strings are refused."""
    if value is None or isinstance(value, bool) or (isinstance(value, str) and value == UNDECIDED):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise ClaimError(f"{where}: 'holds' must be True, False, {UNDECIDED!r} (inside the seed "
                     f"noise) or None (not measured), got {value!r} of type "
                     f"{type(value).__name__}")


def validate_claim(entry: Any, index: int = 0) -> dict:
    """Check one claim and return a normalised copy (floats, real bools)."""
    where = f"claim {index}"
    if not isinstance(entry, Mapping):
        raise ClaimError(f"{where}: a claim must be a dict with keys {list(CLAIM_KEYS)}, "
                             f"got {type(entry).__name__}")
    if isinstance(entry.get("id"), str):
        where = f"claim {index} ({entry['id']!r})"
    missing = [key for key in CLAIM_KEYS if key not in entry]
    if missing:
        raise ClaimError(f"{where}: missing keys {missing}; required: {list(CLAIM_KEYS)}")
    unknown = sorted(str(k) for k in entry if k not in CLAIM_KEYS + _OPTIONAL_KEYS)
    if unknown:
        raise ClaimError(f"{where}: unknown keys {unknown}; allowed: "
                             f"{list(CLAIM_KEYS + _OPTIONAL_KEYS)}")
    for key in _TEXT_KEYS:
        if not isinstance(entry[key], str) or not entry[key].strip():
            raise ClaimError(f"{where}: {key!r} must be a non-empty string, "
                                 f"got {entry[key]!r}")
    normalised = {key: entry[key] for key in _TEXT_KEYS}
    normalised["paper"] = _value(entry["paper"], "paper", where)
    normalised["ours"] = _value(entry["ours"], "ours", where)
    normalised["holds"] = _verdict(entry["holds"], where)
    if entry.get("note") is not None:
        if not isinstance(entry["note"], str):
            raise ClaimError(f"{where}: 'note' must be a string, got {entry['note']!r}")
        normalised["note"] = entry["note"]
    if entry.get("kind") is not None:
        if entry["kind"] not in KINDS:
            raise ClaimError(f"{where}: 'kind' must be one of {list(KINDS)}, "
                             f"got {entry['kind']!r}")
        normalised["kind"] = entry["kind"]
    return normalised


def validate_claims(claims: Any) -> list[dict]:
    """Validate every claim (see :func:`validate_claim`); duplicate ids are an error."""
    if isinstance(claims, (str, bytes, Mapping)) or not isinstance(claims, Sequence):
        raise ClaimError(f"claims must be a list of dicts, got {type(claims).__name__}")
    normalised = [validate_claim(entry, index) for index, entry in enumerate(claims)]
    seen: dict[str, int] = {}
    for index, entry in enumerate(normalised):
        if entry["id"] in seen:
            raise ClaimError(f"claim {index}: duplicate id {entry['id']!r} "
                                 f"(also claim {seen[entry['id']]}); ids must be unique")
        seen[entry["id"]] = index
    return normalised


def claim(id: str, paper_ref: str, statement: str, *, paper: str | float | None,
          ours: str | float | None, holds: bool | str | None, note: str | None = None,
          kind: str | None = None) -> dict:
    """One ledger entry, validated: ``holds`` None means "not measured in this run",
    :data:`UNDECIDED` "measured, but inside the seed noise"."""
    entry = {"id": id, "paper_ref": paper_ref, "statement": statement, "paper": paper,
             "ours": ours, "holds": holds}
    if note is not None:
        entry["note"] = note
    if kind is not None:
        entry["kind"] = kind
    return validate_claim(entry)


VERDICTS = ("holds", "fails", UNDECIDED, "not measured")
"""Every verdict the docs name, in the order they are counted."""


def verdict_text(holds: bool | str | None) -> str:
    """How the docs name a verdict."""
    if holds is None:
        return "not measured"
    if holds == UNDECIDED:
        return UNDECIDED
    return "holds" if holds else "fails"


# ----------------------------------------------------------------------------- what a claim is


def claim_kind(entry: Mapping[str, Any]) -> str:
    """The entry's ``kind``; older entries without one are read from their ``paper_ref``:
    "baseline sanity ..." is a sanity check, "issue N ..." naming none of the five papers is
    the project's own engineering claim, anything else cites a paper."""
    if entry.get("kind") in KINDS:
        return entry["kind"]
    ref = str(entry["paper_ref"]).strip().lower()
    if ref.startswith("baseline sanity"):
        return "sanity"
    if ref.startswith("issue") and _named_paper(entry["paper_ref"]) is None:
        return "engineering"
    return "paper"


def _named_paper(paper_ref: str) -> str | None:
    return next((paper for tag, paper in _PAPER_TAGS if tag in paper_ref), None)


def claim_paper(benchmark: str, entry: Mapping[str, Any]) -> str | None:
    """The paper a claim belongs to (one of :data:`PAPERS`), None for engineering claims."""
    if claim_kind(entry) == "engineering":
        return None
    return _named_paper(entry["paper_ref"]) or BENCHMARK_PAPERS.get(benchmark)


# ----------------------------------------------------------------------------- seed noise


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error (sample std / sqrt(n)) of per-seed values; one value has no
    measured spread (SE 0)."""
    data = [float(v) for v in values]
    if not data:
        raise ValueError("mean_se needs at least one value")
    mean = sum(data) / len(data)
    if len(data) < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in data) / (len(data) - 1)
    return mean, math.sqrt(var / len(data))


def se_from_std(std: float | None, n: int) -> float:
    """The standard error of a mean reported as (mean, sample std over ``n`` seeds)."""
    if std is None or n < 2:
        return 0.0
    return float(std) / math.sqrt(n)


def binomial_se(accuracy_percent: float, n: int) -> float:
    """Standard error (points) of an accuracy (%) measured on ``n`` independent test samples:
    the test set's sampling noise, sqrt(p (1 - p) / n). A run with one seed measures no seed
    spread; this is the noise it does carry (two methods scored on the same images share part
    of it, so treating them as independent errs towards "not decided")."""
    if n < 1:
        raise ValueError(f"binomial_se needs n >= 1 test samples, got {n}")
    p = min(max(float(accuracy_percent) / 100.0, 0.0), 1.0)
    return 100.0 * math.sqrt(p * (1.0 - p) / n)


def paired_se(correct_a: Sequence[bool], correct_b: Sequence[bool]) -> float:
    """Standard error (points) of accuracy(a) - accuracy(b) when both were scored on the same
    test samples (``correct_*``: one boolean per sample, in the same order): the standard
    error of the mean of the per-sample differences in {-1, 0, 1}. Samples both got right,
    or both wrong, add no noise; only the ones they disagree on do. Zero when they never
    disagree (the difference is then exactly zero: no ordering to decide)."""
    a = np.asarray(correct_a, dtype=np.float64)
    b = np.asarray(correct_b, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape or a.size < 2:
        raise ValueError(f"paired_se needs two equal-length sequences of at least 2 samples, "
                         f"got shapes {a.shape} and {b.shape}")
    d = a - b
    return 100.0 * float(d.std(ddof=1)) / math.sqrt(d.size)


def tolerance(*standard_errors: float, k: float = 2.0) -> float:
    """``k`` standard errors of a sum or difference of independent means:
    k * sqrt(se_1^2 + se_2^2 + ...)."""
    return k * math.sqrt(sum(float(se) ** 2 for se in standard_errors))


def exceeds(value: float, threshold: float, tol: float) -> bool | str:
    """``value > threshold`` decided against a tolerance: True when value - threshold > tol,
    False when value - threshold < -tol, :data:`UNDECIDED` inside (a tie always is)."""
    if tol < 0 or not math.isfinite(tol):
        raise ValueError(f"tolerance must be finite and >= 0, got {tol!r}")
    gap = float(value) - float(threshold)
    if gap > tol:
        return True
    if gap < -tol:
        return False
    return UNDECIDED


def order(better: float, worse: float, tol: float, *, lower_is_better: bool = False) -> bool | str:
    """"``better`` beats ``worse``" (higher wins, or lower with ``lower_is_better``), decided
    only when the gap exceeds ``tol`` (see :func:`tolerance`); a tie is :data:`UNDECIDED`."""
    if lower_is_better:
        better, worse = -float(better), -float(worse)
    return exceeds(better, worse, tol)


def within(difference: float, bound: float, tol: float) -> bool | str:
    """"|difference| <= bound": holds when it does even ``tol`` further out, fails when
    |difference| exceeds bound by more than ``tol``, :data:`UNDECIDED` between."""
    return exceeds(float(bound), abs(float(difference)), tol)


def all_hold(verdicts) -> bool | str | None:
    """Several verdicts as one: fails if any fails, else not decided if any is, else not
    measured if any is, else holds (an empty list holds nothing: None)."""
    verdicts = list(verdicts)
    if not verdicts:
        return None
    if any(v is False for v in verdicts):
        return False
    if any(v == UNDECIDED for v in verdicts):
        return UNDECIDED
    if any(v is None for v in verdicts):
        return None
    return True


def chain(means: Sequence[float], standard_errors: Sequence[float], *, k: float = 2.0,
          lower_is_better: bool = False) -> bool | str:
    """"means[0] beats means[1] beats ...", each neighbouring pair decided by :func:`order`
    with :func:`tolerance` of their standard errors, combined by :func:`all_hold`."""
    if len(means) != len(standard_errors) or len(means) < 2:
        raise ValueError("chain needs at least two means, each with its standard error")
    return all_hold(order(a, b, tolerance(sa, sb, k=k), lower_is_better=lower_is_better)
                    for (a, sa), (b, sb) in zip(zip(means, standard_errors),
                                                zip(means[1:], standard_errors[1:])))


def _as_list(values: float | Sequence[float] | None) -> list[float] | None:
    if values is None:
        return None
    if isinstance(values, numbers.Real):
        return [float(values)]
    return [float(v) for v in values]


def sanity_claim(id: str, what: str, *, accuracy_start, accuracy_end, loss_start=None,
                 loss_end=None, paper_ref: str = "baseline sanity (issue 31)",
                 paper: str | float | None = None, k: float = 2.0,
                 note: str | None = None, n_test: int | None = None,
                 difference_se: float | None = None) -> dict:
    """The check every baseline row gets: ``what`` trains at all.

    Holds when its training loss falls and its accuracy (%) rises off its start, each by more
    than ``k`` standard errors of the per-seed values. A single seed measures no spread: its
    accuracy's noise is then the test set's. ``difference_se`` is the paired standard error
    of end - start on the same test images (:func:`paired_se`); without it, ``n_test`` gives
    :func:`binomial_se` over ``n_test`` images for each end, treated as independent (larger);
    with neither, no noise is known and any rise counts, which the claim says.
    Fails when either does not; a loss that was not recorded
    leaves the verdict to the accuracy and says so. ``accuracy_start`` is the accuracy
    before training (chance, or the initialised model), ``paper`` the paper's number for the
    row if it has one, shown beside ours.
    """
    acc0, acc1 = _as_list(accuracy_start), _as_list(accuracy_end)
    (a0, s0), (a1, s1) = mean_se(acc0), mean_se(acc1)
    n = max(len(acc1), len(acc0))
    test_noise = None
    if n == 1 and difference_se is not None:
        acc_tol = k * float(difference_se)
        test_noise = "the paired standard error of the change over the same test images"
    elif n == 1 and n_test is not None:
        acc_tol = tolerance(binomial_se(a0, n_test), binomial_se(a1, n_test), k=k)
        test_noise = (f"the binomial standard errors over {n_test} test images, treated as "
                      "independent")
    else:
        acc_tol = tolerance(s0, s1, k=k)
    moves = exceeds(a1, a0, acc_tol) is True
    parts = [f"accuracy {a0:.1f} -> {a1:.1f} % (needs > {acc_tol:.2f} points)"]
    verdicts = [moves]
    if loss_start is not None and loss_end is not None:
        (l0, t0), (l1, t1) = mean_se(_as_list(loss_start)), mean_se(_as_list(loss_end))
        loss_tol = tolerance(t0, t1, k=k)
        verdicts.append(exceeds(l0, l1, loss_tol) is True)
        parts.insert(0, f"training loss {l0:.4g} -> {l1:.4g}")
    else:
        note = "; ".join(t for t in ("training loss not recorded: the accuracy alone decides",
                                     note) if t)
    if n > 1:
        parts.append(f"{n} seeds")
    elif test_noise is not None:
        parts.append(f"1 seed: the accuracy's noise is {test_noise}")
    else:
        parts.append("1 seed, no spread measured")
    noise = "the test-set noise" if test_noise is not None else "the seeds"
    return claim(id, paper_ref, f"{what} trains: its training loss falls and its accuracy moves "
                 f"off its start by more than {k:g} standard errors of {noise}",
                 paper=paper, ours="; ".join(parts), holds=all(verdicts), note=note,
                 kind="sanity")
