"""Aggregation: the rule, weighting, staleness, buffer and BatchNorm statistics (``aggregation``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fedgmr.config.base import Section


class StalenessConfig(Section):
    kind: Literal["constant", "polynomial", "hinge", "fedbuff"] = "polynomial"
    a: float = Field(0.6, ge=0)
    b: float = Field(4.0, ge=0)


class AggregationConfig(Section):
    """Aggregation rule, weighting, staleness, buffer and BatchNorm statistics (docs/reference.md §4).

    weighting: beta = s(tau) x the client's training-set size (``samples``), x the
        samples its local steps processed (``processed``, the authors' count), or s(tau)
        alone (``equal``).
    bn_stats: how BatchNorm running statistics are aggregated: only full-density
        clients' (``full``), weighted by density (``density``), every client's
        (``all``), or re-estimated on the server's validation split (``server``).
    max_samples: cap on the training-set size a reply claims where the server does not
        know it (the simulator knows every client's; a Flower deployment defaults to the
        largest partition the config makes).
    max_update_norm: L2 bound on one client's update (its change from the model it was
        sent, parameters on its mask plus float buffers); larger updates are clipped to it.
    update_norm_multiple: adaptive bound: this multiple of the median norm of recent
        accepted updates (a Flower deployment defaults to 3 when neither bound is set).
    coverage_floor: a rule of this library, not the paper's: MA's per-coordinate
        denominator is floored at this share of the total weight, so a coordinate that
        clients holding less of the weight cover shrinks toward zero as under FA (0: MA;
        1: FA on covered coordinates). Needs ``rule: ma``.
    trim: ``rule: trimmed_mean``: the share of the covering clients' values cut at each end
        of every coordinate (``floor(trim * k)`` of ``k``).
    krum_byzantine: ``rule: krum``: the number ``f`` of faulty clients assumed; each
        update is scored on its ``n - f - 2`` nearest others.
    krum_select: ``rule: krum``: how many of the best-scored updates are averaged (MA);
        default ``n - f`` (Multi-Krum), 1 for Krum.
    """

    rule: str = "ma"
    weighting: Literal["samples", "processed", "equal"] = "samples"
    staleness: StalenessConfig = Field(default_factory=StalenessConfig)
    buffer: bool = True
    max_staleness: int | None = Field(None, ge=0)
    fedasync_alpha: float = Field(0.9, gt=0, le=1)
    bn_stats: Literal["full", "density", "all", "server"] = "full"
    max_samples: int | None = Field(None, ge=1)
    max_update_norm: float | None = Field(None, gt=0)
    update_norm_multiple: float | None = Field(None, gt=0)
    coverage_floor: float | None = Field(None, ge=0, le=1)
    trim: float = Field(0.1, ge=0, lt=0.5)
    krum_byzantine: int = Field(1, ge=0)
    krum_select: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _floor_needs_ma(self) -> "AggregationConfig":
        if self.coverage_floor is not None and self.rule != "ma":
            raise ValueError(f"aggregation.coverage_floor floors mask-aware aggregation's denominator; it needs "
                             f"aggregation.rule 'ma', got {self.rule!r}")
        return self
