"""Gradual Model Restoration (``restoration``) and when the server aggregates (``coordination``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from fedgmr.config.base import Section


class RestorationConfig(Section):
    """Gradual Model Restoration (docs/reference.md §5)."""

    trigger: Literal["early_stopping", "fixed_time", "deadline", "none"] = "early_stopping"
    check_interval: int = Field(25, ge=1)
    patience: int = Field(5, ge=1)
    min_delta: float = Field(0.0, ge=0)
    cooldown: int | None = Field(None, ge=0)
    per_client_patience: int | None = Field(None, ge=1)
    horizon: float | None = Field(None, gt=0)
    fractions: list[float] = Field(default_factory=lambda: [0.2, 0.4, 0.6, 0.8, 1.0])

    @field_validator("fractions")
    @classmethod
    def _fractions(cls, v: list[float]) -> list[float]:
        # fixed_time fires one ladder step at each f x horizon: a fraction <= 0 fires at the
        # start, one > 1 never fires, and an unordered or repeated list hides a typo
        if not v or any(not 0 < f <= 1 for f in v) or any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError("must be a non-empty, strictly increasing list of fractions of the horizon in (0, 1]")
        return v


class CoordinationConfig(Section):
    """When the server aggregates (docs/reference.md §6.4)."""

    mode: Literal["semi_async", "sync"] = "semi_async"
    trigger: Literal["k", "deadline"] = "deadline"
    k: int = Field(3, ge=1)
    deadline_slack: float = Field(0.5, ge=0)
    server_time: float = Field(0.5, ge=0)
