"""Run length, evaluation, checkpoints and execution (``run``), and the device forms it accepts."""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from fedgmr.config.base import Section


#: the most torch threads a run may ask for: far above any machine's core count, far below
#: the ~100k at which torch's thread pool crashes the process (a fixed bound, so a config
#: validates the same on every machine)
MAX_TORCH_THREADS = 1024

#: the forms ``run.device`` accepts (whether the machine has the device is checked when
#: the run is built: fedgmr.device.resolve_device)
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
DEVICE_FORMS = "auto, cpu, cuda, cuda:N (N = 0, 1, ...) or mps"
#: the largest device index torch represents (an 8-bit index: ``cuda:128`` wraps to -128)
MAX_DEVICE_INDEX = 127


def device_index_error(spec: str) -> str | None:
    """Why a well-formed ``cuda:N`` cannot name any device (N above torch's range); None if it can."""
    _, sep, index = spec.partition(":")
    if sep and index.isdigit() and int(index) > MAX_DEVICE_INDEX:
        return (f"device index {index[:30]} is out of range: torch numbers devices 0 to {MAX_DEVICE_INDEX} "
                f"(e.g. cuda:0)")
    return None


class RunConfig(Section):
    """Run length, evaluation, checkpoints and execution.

    eval_interval: test evaluation on a virtual-time grid, every that many seconds, the
        same grid for every method (docs/reference.md §9). eval_every: instead, every that many server
        steps (the authors' cadence). Set at most one; with neither, the grid is
        ``max_time / 100`` (or every 5 steps when only ``max_steps`` is set).
    """

    max_steps: int | None = Field(None, ge=1)
    max_time: float | None = Field(None, gt=0)
    eval_interval: float | None = Field(None, gt=0)
    eval_every: int | None = Field(None, ge=1)
    #: on the time grid, skip the test evaluations before this virtual time (null: none
    #: skipped). Training is unchanged, and so is every record from then on: a sweep that
    #: only needs Acc@t* evaluates its window and saves the rest (most of an asynchronous
    #: run's wall time on a small model is spent evaluating)
    eval_from: float | None = Field(None, ge=0)
    #: checkpoint every that many server steps or ``checkpoint_seconds`` of wall time,
    #: whichever comes first (both null: no checkpoints, the run cannot be resumed)
    checkpoint_every: int | None = Field(100, ge=1)
    checkpoint_seconds: float | None = Field(60.0, gt=0)
    #: the run fails after that many client updates in a row were rejected;
    #: null: 3 x the number of clients training at once
    fail_after_rejections: int | None = Field(None, ge=1)
    executor: str = "serial"
    workers: int | None = Field(None, ge=1)
    torch_threads: int | None = Field(1, ge=1, le=MAX_TORCH_THREADS)
    #: Ray cluster to join (``"auto"`` or ``"HOST:PORT"``); None starts Ray locally
    ray_address: str | None = None
    #: where training, evaluation and aggregation run: ``auto`` (CUDA when available,
    #: else the CPU), ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` (checked when the run is built)
    device: str = "auto"
    t_star: float | None = Field(None, gt=0)
    #: per-level accuracy (the global model under each ladder level's mask), logged as
    #: ``level_accuracy`` every that many test evaluations (null: off)
    level_eval_every: int | None = Field(None, ge=1)
    #: per-client accuracy (the global model on each client's held-out split; needs
    #: data.client_val_fraction > 0), logged as ``client_accuracy`` every that many test
    #: evaluations (null: off)
    client_eval_every: int | None = Field(None, ge=1)
    #: per-class test accuracy of the global model and the share of test samples it
    #: predicts as each class (classification tasks), logged as ``class_accuracy`` and
    #: ``predicted_share`` every that many test evaluations (null: off)
    class_eval_every: int | None = Field(None, ge=1)
    #: personalised accuracy (each client's own model - the global one, or its personal
    #: model for Ditto / FedBN - on its own test split; needs data.client_test_fraction >
    #: 0), logged as ``personal_accuracy``, ``personal_std``, ``personal_worst10`` and the
    #: per-client ``personal_accuracies`` every that many test evaluations (null: off)
    personal_eval_every: int | None = Field(None, ge=1)
    #: coverage of the last aggregation over the updates it used and the pruned-weight
    #: energy (docs/methods/epm.md), logged as ``coverage_hist``, ``coverage_min``,
    #: ``coverage_groups``, ``coverage_group_min``, ``pruned_energy`` and
    #: ``pruned_energy_mean`` every that many test evaluations (null: off)
    coverage_eval_every: int | None = Field(None, ge=1)
    #: with coverage_eval_every: also the coverage of the last this many aggregations
    #: together (``window_coverage_min``, ``window_coverage_none``) and the share of
    #: coordinates never covered so far (``coverage_never``); null: off
    coverage_window: int | None = Field(10, ge=1)
    #: experiment trackers fed every metrics record: tensorboard, mlflow, wandb
    #: (fedgmr.experiment.loggers; each needs its pip extra, e.g. fedgmr[tensorboard])
    loggers: list[str] = Field(default_factory=list)
    #: MLflow tracking URI (null: $MLFLOW_TRACKING_URI, else file:<run dir>/mlruns)
    mlflow_uri: str | None = None

    @field_validator("loggers")
    @classmethod
    def _loggers(cls, v: list[str]) -> list[str]:
        # the names are checked against the registry by fedgmr.methods.check_builder_options
        if len(set(v)) != len(v):
            raise ValueError("names a logger twice")
        return v

    @field_validator("mlflow_uri")
    @classmethod
    def _tracking_uri(cls, v: str | None) -> str | None:
        if v is None:
            return v
        scheme, sep, rest = v.partition(":")
        well_formed = bool(v.strip()) and v == v.strip() and not any(c in v for c in "\r\n\t\0")
        if sep and not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
            well_formed = False
        if sep and scheme.lower() in ("http", "https") and not re.match(r"//[^/\s]+", rest):
            well_formed = False  # http:, https: need a host
        if not well_formed:
            raise ValueError("must be an MLflow tracking URI (http://HOST:PORT, https://..., file:///path, "
                             "sqlite:///path.db, databricks, ...) or a folder path")
        return v

    @field_validator("max_time", mode="before")
    @classmethod
    def _finite_end(cls, v: Any) -> Any:
        if isinstance(v, float) and math.isinf(v):
            raise ValueError("must be finite: a run needs an end (a finite run.max_time, or run.max_steps "
                             "with run.max_time: null)")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not DEVICE_PATTERN.fullmatch(v):
            raise ValueError(f"must be {DEVICE_FORMS}")
        why = device_index_error(v)
        if why:
            raise ValueError(why)
        return v

    @model_validator(mode="after")
    def _length(self) -> "RunConfig":
        if self.max_steps is None and self.max_time is None:
            raise ValueError("set max_steps or max_time")
        if self.eval_interval is not None and self.eval_every is not None:
            raise ValueError("set one of run.eval_interval (virtual seconds) and run.eval_every (server steps), "
                             "not both (e.g. --set run.eval_interval=null for the step cadence)")
        if self.eval_interval is None and self.eval_every is None:
            if self.max_time is not None:
                self.eval_interval = self.max_time / 100
            else:
                self.eval_every = 5
        if self.eval_from is not None:
            if self.eval_interval is None:
                raise ValueError("run.eval_from needs the time grid (run.eval_interval), not run.eval_every")
            window = 10 * self.eval_interval  # Acc@t*'s default window (docs/reference.md §9.2)
            if self.t_star is not None and self.eval_from > self.t_star - window:
                raise ValueError(f"run.eval_from {self.eval_from:g} would leave out part of Acc@t*'s window "
                                 f"[{self.t_star - window:g}, {self.t_star + window:g}]: set it at most "
                                 f"{self.t_star - window:g}")
        return self
