"""Links and compute: bandwidths, IMS, jitter, payload sizing and client speeds (``network``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from fedgmr.config.base import Section


class ComputeConfig(Section):
    kind: Literal["constant", "flops"] = "constant"
    seconds_per_round: float = Field(0.5, ge=0)
    speeds: list[float] | None = None

    @field_validator("speeds")
    @classmethod
    def _speeds(cls, v: list[float] | None) -> list[float] | None:
        if v is not None:
            bad = next((i for i, c in enumerate(v) if not c > 0), None)
            if not v or bad is not None:
                where = f"speed #{bad + 1} is {v[bad]!r}; " if bad is not None else ""
                raise ValueError(f"{where}must list one finite speed > 0 per client")
        return v


class NetworkConfig(Section):
    """Bandwidths (MB/s), IMS, jitter and payload sizing (docs/reference.md §6.1-6.5)."""

    ims: bool = True
    down_per_tier: float = Field(20.0, gt=0)
    up_per_tier: float = Field(5.0, gt=0)
    server_up: float = Field(10.0, gt=0)
    server_down: float = Field(50.0, gt=0)
    jitter_sigma: float = Field(0.0, ge=0)
    model_size_mb: float | None = Field(None, gt=0)
    #: bytes every message carries beside its payload (a transport's framing, headers and
    #: fields: what a deployment measures, e.g. with ``fedgmr flower testbed``); they take
    #: link time, unscaled by ``model_size_mb``, and are not counted in ``bytes_up/down``
    message_bytes: float = Field(0.0, ge=0)
    #: seconds every message takes beside its transfer (a transport's per-message latency:
    #: polling, round trips), added to each download's and each upload's finish
    message_latency: float = Field(0.0, ge=0)
    compute: ComputeConfig = Field(default_factory=ComputeConfig)
