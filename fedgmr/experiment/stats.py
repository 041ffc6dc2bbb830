"""Statistics behind a table's verdicts: seed-paired differences and the stabilisation t*.

Pure functions over numbers (no run directories, no I/O), so that the rules the protocol
(docs/protocol.md) states are written once and tested against hand-computed values.

- :func:`paired_difference`: two methods run with the same seeds share each seed's data
  split and initial weights, so their per-seed values pair. The difference of the pair
  means, a Student-t interval on it and the two-sided p-value of "no difference".
- :func:`holm`: Holm's step-down adjustment of a family of p-values, so that "any of these
  differences is real" keeps a 5 % family-wise error (a reading beside the uncorrected one).
- :func:`stabilisation_time`: the paper's rule for t* ("where most methods stabilise")
  made operational: the first grid time from which most curves stay within a tolerance of
  their value at the horizon.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

import numpy as np

Verdict = Literal["ahead", "behind", "level", "n/a"]

#: the confidence of every interval the tables print
CONFIDENCE = 0.95
#: the level of every test the tables print (0.05, not 1 - 0.95's 0.050000000000000044)
ALPHA = round(1 - CONFIDENCE, 12)


@dataclass(frozen=True)
class PairedDiff:
    """The seed-paired difference ``reference - other`` of one table cell.

    ``lo``/``hi``: the two-sided ``confidence`` interval of the mean difference (Student t
    with ``n - 1`` degrees of freedom); ``p``: the two-sided p-value of a zero mean
    difference. With fewer than two pairs there is no interval (NaN) and no verdict."""

    n: int
    mean: float
    lo: float
    hi: float
    p: float
    seeds: tuple[Any, ...]
    confidence: float = CONFIDENCE

    @property
    def verdict(self) -> Verdict:
        """``ahead``: the interval lies above 0 (the reference is higher); ``behind``:
        below 0; ``level``: it holds 0; ``n/a``: fewer than two pairs."""
        if self.n < 2 or math.isnan(self.lo):
            return "n/a"
        if self.lo > 0:
            return "ahead"
        if self.hi < 0:
            return "behind"
        return "level"


def paired_difference(reference: Mapping[Any, float], other: Mapping[Any, float],
                      confidence: float = CONFIDENCE) -> PairedDiff:
    """The paired difference ``reference[s] - other[s]`` over the seeds ``s`` both hold.

    A seed that only one side holds is left out (``n`` counts the pairs). Equal pairs
    (zero spread) give a zero-width interval: p = 1 when the difference is 0, else p = 0."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    seeds = tuple(s for s in reference if s in other
                  and math.isfinite(reference[s]) and math.isfinite(other[s]))
    diffs = np.asarray([reference[s] - other[s] for s in seeds], dtype=float)
    n = len(diffs)
    if n == 0:
        return PairedDiff(0, math.nan, math.nan, math.nan, math.nan, seeds, confidence)
    mean = float(diffs.mean())
    if n == 1:
        return PairedDiff(1, mean, math.nan, math.nan, math.nan, seeds, confidence)
    sd = float(diffs.std(ddof=1))
    if sd == 0.0:
        return PairedDiff(n, mean, mean, mean, 1.0 if mean == 0 else 0.0, seeds, confidence)
    from scipy import stats

    se = sd / math.sqrt(n)
    t_stat = mean / se
    q = float(stats.t.ppf(0.5 + confidence / 2, n - 1))
    p = float(2 * stats.t.sf(abs(t_stat), n - 1))
    return PairedDiff(n, mean, mean - q * se, mean + q * se, p, seeds, confidence)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given.

    With the ``m`` finite p-values sorted ascending, the ``i``-th (from 1) becomes
    ``max over j <= i of min(1, (m - j + 1) p_(j))``; a NaN stays NaN and is not counted in
    ``m``. Rejecting where the adjusted p is below ``alpha`` keeps the family-wise error at
    ``alpha`` whatever the dependence between the tests (Holm, 1979)."""
    finite = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    out = [math.nan] * len(pvalues)
    m, running = len(finite), 0.0
    for j, (p, i) in enumerate(finite):
        running = max(running, min(1.0, (m - j) * p))
        out[i] = running
    return out


def adjusted_verdict(mean: float, p_adjusted: float, alpha: float = ALPHA) -> Verdict:
    """The verdict by an adjusted p-value: ``ahead``/``behind`` (by the sign of ``mean``)
    where it is below ``alpha``, ``level`` otherwise, ``n/a`` without one."""
    if math.isnan(p_adjusted) or math.isnan(mean):
        return "n/a"
    if p_adjusted < alpha and mean != 0:
        return "ahead" if mean > 0 else "behind"
    return "level"


@dataclass(frozen=True)
class Stabilisation:
    """The outcome of :func:`stabilisation_time`."""

    t_star: float | None  # None: most curves never stabilise on the scanned grid
    stable: int           # curves stable from t_star on (at the horizon when t_star is None)
    total: int            # curves judged
    horizon: float
    tolerance: float
    start: float          # the first grid time scanned


def stable_from(values: Sequence[float], tolerance: float) -> int:
    """The first index ``i`` from which every value lies within ``tolerance`` of the last
    one (the value at the horizon). ``len(values)`` (never) when only the horizon itself
    qualifies, or when the horizon's value is NaN; a NaN before it breaks a stable run."""
    vals = np.asarray(values, dtype=float)
    if vals.size == 0 or math.isnan(vals[-1]):
        return len(vals)
    ok = np.abs(vals - vals[-1]) <= tolerance + 1e-12  # NaN compares False: not stable there
    i = len(vals) - 1
    while i > 0 and ok[i - 1]:
        i -= 1
    return len(vals) if i == len(vals) - 1 else i


def stabilisation_time(grid: Sequence[float], curves: Mapping[Any, Sequence[float]],
                       tolerance: float) -> Stabilisation:
    """The first time of ``grid`` from which most curves stay within ``tolerance`` of their
    value at the horizon (``grid[-1]``).

    ``curves``: one value per grid time per curve (a table cell's mean Acc@t across seeds).
    "Most": more than half of the curves. Each curve is stable from :func:`stable_from`
    on; t* is the earliest grid time by which a majority is stable. The horizon itself is
    never the answer: a curve that holds its final value only there has not stabilised."""
    if not grid:
        raise ValueError("an empty grid has no stabilisation time")
    if tolerance < 0 or math.isnan(tolerance):
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    if any(len(c) != len(grid) for c in curves.values()):
        raise ValueError("every curve needs one value per grid time")
    firsts = sorted(stable_from(c, tolerance) for c in curves.values())
    total = len(firsts)
    need = total // 2 + 1  # a strict majority
    if total == 0 or firsts[need - 1] >= len(grid):
        stable = sum(f < len(grid) for f in firsts)
        return Stabilisation(None, stable, total, float(grid[-1]), tolerance, float(grid[0]))
    i = firsts[need - 1]
    return Stabilisation(float(grid[i]), sum(f <= i for f in firsts), total, float(grid[-1]), tolerance,
                         float(grid[0]))


__all__ = ["CONFIDENCE", "PairedDiff", "Stabilisation", "Verdict", "paired_difference", "stabilisation_time",
           "stable_from"]
