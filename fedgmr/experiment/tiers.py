"""Participation per bandwidth tier: what a client of each tier sends, and how often, before
and after its first restoration (the paper's Table 12, "a communication example").

Read from a run's records alone (``metrics.jsonl``: ``time``, ``step``, per-client
``densities`` and cumulative ``client_uploads``) and its config (the tiers:
``clients.heterogeneity``; the model size: ``network.model_size_mb``). A tier's *first
restoration* is the first record at which some client of the tier holds a density above
the tier's initial one; the records are on the evaluation grid, so the time is known to
one grid step. *Uploads per step* is the tier's uploads over an interval, per client of
the tier and per server step of the interval: under synchronous rounds 1.0 means "one
training per round", 0.5 "one every two rounds".

``fedgmr tiers RUN...`` prints the table for one configuration, mean over its seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fedgmr.errors import FedGMRError


@dataclass(frozen=True)
class TierPhase:
    """One tier over one interval of a run: before its first restoration, or after it
    (up to the tier's next restoration or the run's end)."""

    density: float
    #: the model a client of the tier sends, in MB (density x network.model_size_mb)
    model_mb: float
    #: uploads per client of the tier per server step over the interval (nan: no step in it)
    uploads_per_step: float
    start: float
    end: float


@dataclass(frozen=True)
class TierRow:
    tier: float
    clients: int
    before: TierPhase
    #: None: the tier was never restored
    after: TierPhase | None
    #: virtual time of the record at which the first restoration shows (None: never)
    restored_at: float | None


def _rate(records: Sequence[dict[str, Any]], a: int, b: int, members: Sequence[int]) -> float:
    steps = records[b]["step"] - records[a]["step"]
    if steps <= 0:
        return math.nan
    ups = sum(records[b]["client_uploads"][c] - records[a]["client_uploads"][c] for c in members)
    return ups / len(members) / steps


def tier_participation(records: Sequence[dict[str, Any]], tiers: Sequence[float],
                       model_mb: float) -> list[TierRow]:
    """Per tier (highest first): density, model size and uploads per client per step,
    before and after the tier's first restoration. ``tiers[i]`` is client i's initial
    density (its bandwidth tier)."""
    if not records:
        raise FedGMRError("no records to read participation from")
    for key in ("time", "step", "densities", "client_uploads"):
        if any(key not in r for r in records):
            raise FedGMRError(f"the records lack {key!r} (a run of this library's simulator logs it)")
    if any(not isinstance(r[k], list) or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in r[k])
           for r in records for k in ("densities", "client_uploads")):
        raise FedGMRError("the records' 'densities' and 'client_uploads' must be lists of finite numbers")
    if any(len(r["densities"]) != len(tiers) or len(r["client_uploads"]) != len(tiers) for r in records):
        raise FedGMRError(f"the records' per-client lists do not have the config's {len(tiers)} clients")
    rows = []
    last = len(records) - 1
    for tier in sorted(set(tiers), reverse=True):
        members = [i for i, t in enumerate(tiers) if t == tier]
        start_density = records[0]["densities"][members[0]]

        def first_above(level: float, after: int) -> int | None:
            return next((k for k in range(after, len(records))
                         if max(records[k]["densities"][c] for c in members) > level + 1e-12), None)

        k1 = first_above(start_density, 0)
        end1 = last if k1 is None else k1
        before = TierPhase(start_density, start_density * model_mb, _rate(records, 0, end1, members),
                           float(records[0]["time"]), float(records[end1]["time"]))
        after = None
        if k1 is not None:
            d1 = max(records[k1]["densities"][c] for c in members)
            k2 = first_above(d1, k1)
            end2 = last if k2 is None else k2
            after = TierPhase(d1, d1 * model_mb, _rate(records, k1, end2, members),
                              float(records[k1]["time"]), float(records[end2]["time"]))
        rows.append(TierRow(tier, len(members), before, after,
                            None if k1 is None else float(records[k1]["time"])))
    return rows


def mean_rows(runs: Sequence[Sequence[TierRow]]) -> list[dict[str, Any]]:
    """The per-tier rows of several seeds of one configuration, as table rows: means over
    the seeds (an "after" mean over the seeds that restored the tier, with their count)."""
    def mean(values: Sequence[float]) -> float:
        vals = [v for v in values if not math.isnan(v)]
        return sum(vals) / len(vals) if vals else math.nan

    table = []
    for rows in zip(*runs):
        tier = rows[0].tier
        if any(r.tier != tier for r in rows):
            raise FedGMRError("the runs do not share their bandwidth tiers")
        restored = [r for r in rows if r.after is not None]
        line: dict[str, Any] = {
            "tier": f"{tier:g}x", "clients": rows[0].clients,
            "density before": mean([r.before.density for r in rows]),
            "MB before": mean([r.before.model_mb for r in rows]),
            "uploads/step before": mean([r.before.uploads_per_step for r in rows]),
            "first restoration (s)": mean([r.restored_at for r in restored]) if restored else math.nan,
        }
        if restored:
            line.update({"density after": mean([r.after.density for r in restored if r.after]),
                         "MB after": mean([r.after.model_mb for r in restored if r.after]),
                         "uploads/step after": mean([r.after.uploads_per_step for r in restored if r.after])})
        else:
            line.update({"density after": math.nan, "MB after": math.nan, "uploads/step after": math.nan})
        line["seeds restored"] = f"{len(restored)}/{len(rows)}"
        table.append(line)
    return table


__all__ = ["TierPhase", "TierRow", "mean_rows", "tier_participation"]
