"""The data set and its client partition (``data``), the model (``model``) and the client
population (``clients``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from fedgmr.config.base import Section, check_known, is_real


class DataConfig(Section):
    """Data set and client partition."""

    name: str = "digits"
    root: str | None = None
    partition: Literal["iid", "dirichlet", "shards", "natural"] = "dirichlet"
    alpha: float = Field(0.6, gt=0)
    #: ``shards`` partition: label-sorted shards per client (at most that many classes each)
    shards_per_client: int = Field(2, ge=1)
    val_fraction: float = Field(0.1, ge=0, lt=1)
    client_val_fraction: float = Field(0.0, ge=0, lt=1)
    #: each client's own held-out *test* split, carved from its shard after
    #: ``client_val_fraction`` (personalised evaluation: ``run.personal_eval_every``)
    client_test_fraction: float = Field(0.0, ge=0, lt=1)
    #: feature-shifted clients: client i's images (train, validation and test) under the
    #: fixed transform ``feature_shift[i mod len]`` (fedgmr.data.shift.FEATURE_SHIFTS:
    #: none, invert, rotate, noise, blur, low_contrast, and the exact rotations rot0,
    #: rot90, rot180, rot270); the global test split cycles through them sample by
    #: sample. Empty: no shift.
    feature_shift: list[str] = Field(default_factory=list)
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("feature_shift")
    @classmethod
    def _shifts(cls, v: list[str]) -> list[str]:
        from fedgmr.data.shift import FEATURE_SHIFTS

        check_known(v, FEATURE_SHIFTS, "feature shift")
        return v


class ModelConfig(Section):
    """Model architecture (a registered builder) and its options."""

    name: str = "cnn"
    options: dict[str, Any] = Field(default_factory=dict)


class ClientsConfig(Section):
    """Client population: count, bandwidth tiers and concurrency."""

    num_clients: int = Field(10, ge=1)
    heterogeneity: Literal["high", "medium", "low", "none"] | list[float] = "high"
    concurrency: int | None = Field(None, ge=1)

    @field_validator("heterogeneity", mode="before")
    @classmethod
    def _densities(cls, v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            if not v:
                raise ValueError("must list one initial density per client")
            for i, d in enumerate(v):
                if not is_real(d) or not 0 < float(d) <= 1:
                    raise ValueError(f"density #{i + 1} is {d!r}; each initial density must be a number in (0, 1]")
        elif isinstance(v, str) and v not in ("high", "medium", "low", "none"):
            raise ValueError("must be 'high', 'medium', 'low', 'none' or a list of densities in (0, 1]")
        return v
