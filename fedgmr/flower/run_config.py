"""The Flower deployment's run config (``[tool.flwr.app.config]``, ``flwr run -c``), typed
and validated like a FedGMR config file.

:class:`DeploymentConfig` is a config section of :mod:`fedgmr.config` (the same base, so the
same rules: unknown keys are refused, numbers are finite and never booleans, each key has
its range), keyed by the run config's dashed names. :func:`parse_run_config` validates a run
config and raises :class:`~fedgmr.errors.ConfigError` naming the first bad key, in one line,
before the ServerApp builds anything. The bounds of the keys that have a config-file twin
are the twin's: ``num-server-steps`` is ``run.max_steps`` (>= 1), ``k`` is ``coordination.k``
(>= 1), ``eval-every`` is ``run.eval_every`` (>= 1), ``t-star`` is ``run.t_star`` (> 0),
``seed`` is ``seed`` (>= 0); the influence bounds take 0 for "off" where the config takes
``null``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from pydantic import ConfigDict, Field, ValidationError, field_validator

from fedgmr.config import Section, short_repr
from fedgmr.errors import ConfigError


def _dashed(name: str) -> str:
    return name.replace("_", "-")


class DeploymentConfig(Section):
    """The run-config keys of a FedGMR Flower deployment (docs/distributed.md)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, alias_generator=_dashed)

    #: the FedGMR config (YAML/TOML path); unset: the quickstart preset
    config: str | None = None
    #: overrides the config's ``seed``
    seed: int | None = Field(None, ge=0)
    #: server steps (aggregations); unset: ``run.max_steps``, else 50
    num_server_steps: int | None = Field(None, ge=1)
    #: replies per step (trigger ``k``); unset: ``coordination.k``
    k: int | None = Field(None, ge=1)
    reply_timeout: float = Field(60.0, gt=0)
    step_timeout: float = Field(30.0, gt=0)
    #: stop after this many wall-clock seconds whatever the step; unset: no bound
    max_wall: float | None = Field(None, gt=0)
    #: wait for this many nodes; unset: ``clients.num_clients``
    min_nodes: int | None = Field(None, ge=1)
    node_wait: float = Field(120.0, ge=0)
    #: test evaluation every that many server steps; unset: ``run.eval_every``, else 5
    eval_every: int | None = Field(None, ge=1)
    #: the run directory; unset: none written
    out_dir: str | None = None
    #: Acc@t* in the summary, wall-clock seconds since the start
    t_star: float | None = Field(None, gt=0)
    #: cap on a claimed sample count; unset or 0: ``aggregation.max_samples``, else the largest partition
    max_samples: int | None = Field(None, ge=0)
    #: fixed L2 bound on one update; unset: ``aggregation.max_update_norm``; 0: off
    max_update_norm: float | None = Field(None, ge=0)
    #: adaptive bound (x the median accepted norm); unset: ``aggregation.update_norm_multiple``, else 3; 0: off
    update_norm_multiple: float | None = Field(None, ge=0)
    quarantine_after: int = Field(3, ge=0)
    quarantine_window: float = Field(600.0, gt=0)
    quarantine_seconds: float = Field(600.0, gt=0)
    #: the ServerApp's longest wait before asking again for a reply's objects that are not at
    #: the SuperLink yet; unset: Flower's back-off (1 s, doubling to 10 s)
    pull_backoff: float | None = Field(None, gt=0)

    @field_validator("out_dir")
    @classmethod
    def _writable_dir(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.strip():
            raise ValueError("must name a directory (leave the key out to write no run directory)")
        path = Path(v)
        if path.exists() and not path.is_dir():
            raise ValueError(f"{v} is a file, not a directory")
        probe = path
        while not probe.exists():  # the nearest existing folder above it must be one we can write into
            if probe.parent == probe:
                break
            probe = probe.parent
        if probe.exists() and not probe.is_dir():
            raise ValueError(f"{v} is below {probe}, which is a file, not a directory")
        if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
            raise ValueError(f"{probe} is not writable")
        return v


#: the run-config keys, in the order documented
KEYS = tuple(f.alias or name for name, f in DeploymentConfig.model_fields.items())


def _format(err: ValidationError) -> str:
    first = err.errors()[0]
    key = ".".join(str(p) for p in first["loc"]) or "<root>"
    if first["type"] == "extra_forbidden":
        return f"unknown run-config key '{key}' (known: {', '.join(KEYS)})"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "finite_number":
        msg += " (inf and nan are not allowed here)"
    return f"invalid run-config value for '{key}': {msg} (got {short_repr(first.get('input'))})"


def parse_run_config(run_config: Mapping[str, Any]) -> DeploymentConfig:
    """Validate a Flower run config; :class:`ConfigError` naming the first bad key. A key
    set to ``""`` counts as unset (its default)."""
    if not isinstance(run_config, Mapping):
        raise ConfigError(f"the run config must be a mapping of keys to values, not a {type(run_config).__name__}")
    data = {str(k): v for k, v in run_config.items() if not (isinstance(v, str) and v == "")}
    try:
        return DeploymentConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format(err)) from None


__all__ = ["DeploymentConfig", "KEYS", "parse_run_config"]
