"""Experiment trackers fed from the runner's record hook: ``run.loggers: [tensorboard,
mlflow, wandb]``.

Every metrics record a run writes to ``metrics.jsonl`` goes to each logger too: each
numeric scalar against the record's ``step`` (the virtual ``time`` is one of them), lists
and mappings flattened to named scalars (``level_accuracy/0.05`` per ladder density,
``client_accuracy/3`` per client, ``densities/0``, ...; nulls left out). The resolved
config is logged as parameters / hyperparameters and the summary at the end.

* ``tensorboard``: ``torch.utils.tensorboard.SummaryWriter`` in ``<run dir>/tensorboard/``.
* ``mlflow``: a run in the experiment named after the config's ``name``, in
  ``run.mlflow_uri``, else ``$MLFLOW_TRACKING_URI``, else the local file store
  ``file:<run dir>/mlruns``.
* ``wandb``: W&B in offline mode (``$WANDB_MODE`` overrides), files under ``<run dir>/wandb/``.

A missing library is one :class:`~fedgmr.errors.ConfigError` line before the run starts,
naming the pip extra, and so is an MLflow tracking server that cannot be reached (probed
for :data:`PROBE_SECONDS`); MLflow's own HTTP retries are bounded (:data:`MLFLOW_HTTP_BOUNDS`).
A logger that fails to start or fails later is dropped with one warning and the run goes
on; the summary names it (``"logger_failures": {name: why}``). Loggers are closed on every
path (the run ends, fails, raises or is interrupted), and a resumed run appends to what
the interrupted one logged, so each logger ends up holding exactly the records of
``metrics.jsonl``. Add your own with
``@LOGGERS.register("name")`` on a :class:`RunLogger` subclass.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Sequence

from fedgmr.errors import ConfigError, FedGMRError
from fedgmr.logger_names import LOGGERS as _LOGGERS
from fedgmr.registry import Registry

if TYPE_CHECKING:
    from fedgmr.config import ExperimentConfig

log = logging.getLogger(__name__)

#: a run directory's record of its loggers' identities (MLflow run id, W&B run id), so a
#: resume continues the same tracker run
STATE_FILE = "loggers.json"
#: every name the built-in loggers may write into a run directory; a run claims (and
#: ``--overwrite`` removes) only those of the loggers it had (:meth:`RunLogger.entries`)
LOGGER_ENTRIES: tuple[str, ...] = (STATE_FILE, f".{STATE_FILE}.tmp", "tensorboard", "mlruns", "wandb")

#: how long the start of a run waits to reach a remote tracking server (MLflow over HTTP)
PROBE_SECONDS = 5.0
#: MLflow's HTTP client settings while fedgmr's logger calls it (unless set in the
#: environment): its defaults retry an unreachable server for about 4 minutes per call
MLFLOW_HTTP_BOUNDS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                      "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
#: the summary's key naming the loggers that failed (logger name -> what failed)
FAILURES_KEY = "logger_failures"

#: list keys whose entries are named by another key of the same record
LABELLED_BY = {"level_accuracy": "levels"}
#: keys that only label other lists
LABEL_KEYS = frozenset({"levels"})
#: lists of client ids: logged as how many there are
COUNTED_KEYS = frozenset({"restored"})


def _label(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def scalars(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """A record as named scalars: numbers as they are (booleans as 0/1), lists and dicts
    flattened to ``key/label`` (a list named by :data:`LABELLED_BY`, else by position),
    strings and nulls left out."""
    out: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if not prefix and key in LABEL_KEYS:
            continue
        if not prefix and key in COUNTED_KEYS and isinstance(value, (list, tuple)):
            out[name] = float(len(value))
        elif isinstance(value, (bool, int, float)):
            out[name] = float(value)
        elif isinstance(value, dict):
            out.update(scalars(value, name + "/"))
        elif isinstance(value, (list, tuple)):
            labels = record.get(LABELLED_BY.get(key, "")) if not prefix else None
            if not isinstance(labels, (list, tuple)) or len(labels) != len(value):
                labels = range(len(value))
            out.update(scalars({_label(lab): v for lab, v in zip(labels, value)}, name + "/"))
    return out


def config_params(cfg: "ExperimentConfig") -> dict[str, str | int | float | bool]:
    """The resolved config as dotted keys with scalar values (lists, mappings and nulls as
    their JSON text), for trackers' parameter / hyperparameter tables."""
    from fedgmr.experiment.metrics import flatten_config

    flat = flatten_config(cfg.model_dump(mode="json"))
    return {k: v if isinstance(v, (str, int, float, bool)) else json.dumps(v, sort_keys=True)
            for k, v in flat.items()}


def summary_scalars(summary: dict[str, Any]) -> dict[str, float]:
    """The summary's numbers as ``summary/<key>`` scalars."""
    return {f"summary/{k}": float(v) for k, v in summary.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _step(record: dict[str, Any], index: int) -> int:
    """The record's server step (its position in metrics.jsonl when it has none)."""
    step = record.get("step")
    return int(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else index


def _read_state(out: Path) -> dict[str, Any]:
    from fedgmr.experiment.rundir import read_run_file

    try:
        state = json.loads(read_run_file(out / STATE_FILE, follow=False))
    except (OSError, ValueError, FedGMRError):
        return {}
    return state if isinstance(state, dict) else {}


def _write_state(out: Path, key: str, value: Any) -> None:
    from fedgmr.experiment.rundir import write_atomic

    state = _read_state(out)
    state[key] = value
    write_atomic(out / STATE_FILE, json.dumps(state, indent=2) + "\n")


class RunLogger:
    """One experiment tracker. The runner calls :meth:`open` once the run directory is
    ready, :meth:`log` with every record, :meth:`finish` with the summary of a run that
    ended (completed or failed) and :meth:`close` on every path.

    ``open(resume, kept)``: ``kept`` are the records of ``metrics.jsonl`` that a resumed
    run keeps (the records written after its checkpoint are recomputed and logged again).
    """

    #: the module the tracker needs, and the pip extra that installs it
    module: ClassVar[str] = ""
    extra: ClassVar[str] = ""

    def __init__(self, name: str, cfg: "ExperimentConfig", out: Path) -> None:
        self.name, self.cfg, self.out = name, cfg, out

    @classmethod
    def check(cls, name: str) -> None:
        """``ConfigError`` when the tracker's library is not installed."""
        if cls.module and importlib.util.find_spec(cls.module) is None:
            raise ConfigError(f"run.loggers: {name} needs the {cls.module} package: "
                              f"pip install 'fedgmr[{cls.extra or name}]'")

    @classmethod
    def reachable(cls, name: str, cfg: "ExperimentConfig") -> None:
        """``ConfigError`` when the tracker's server cannot be reached (checked before the
        run writes anything; default: nothing to check). Bounded in time."""

    def entries(self) -> tuple[str, ...]:
        """The names this logger writes in the run directory (files or folders): the run
        records them as its own before it starts, refuses to start when one of them exists
        and is not a run's, and ``--overwrite`` removes them. Default: none."""
        return ()

    def open(self, resume: bool, kept: Sequence[dict[str, Any]]) -> None:
        raise NotImplementedError

    def log(self, record: dict[str, Any]) -> None:
        raise NotImplementedError

    def finish(self, summary: dict[str, Any]) -> None:
        """Log the summary (default: nothing)."""

    def close(self, status: str) -> None:
        """Flush and close; ``status`` is ``completed``, ``failed`` or ``interrupted``."""


LOGGERS: Registry[type[RunLogger]] = _LOGGERS  # the registry lives in fedgmr.logger_names


@LOGGERS.register("tensorboard")
class TensorBoardLogger(RunLogger):
    """TensorBoard event files in ``<run dir>/tensorboard/``.

    A resume writes a new event file beside the old ones that starts by purging every step
    (TensorBoard's ``purge_step=0``) and re-writes the kept records: TensorBoard then
    shows exactly ``metrics.jsonl``, whatever the interrupted process had flushed."""

    module, extra = "tensorboard", "tensorboard"

    def entries(self) -> tuple[str, ...]:
        return ("tensorboard",)

    def open(self, resume: bool, kept: Sequence[dict[str, Any]]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        logdir = self.out / "tensorboard"
        if resume:
            _after_event_files(logdir)
        self.writer = SummaryWriter(log_dir=str(logdir), purge_step=0 if resume else None, flush_secs=10)
        self.index = 0
        from fedgmr.config import dump_config

        self.writer.add_text("config", "```yaml\n" + dump_config(self.cfg) + "```", 0)
        for record in kept:
            self.log(record)

    def log(self, record: dict[str, Any]) -> None:
        step = _step(record, self.index)
        self.index += 1
        for tag, value in scalars(record).items():
            self.writer.add_scalar(tag, value, step)

    def finish(self, summary: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        metrics = summary_scalars(summary)
        for summ in hparams(config_params(self.cfg), metrics):
            self.writer._get_file_writer().add_summary(summ)  # in this event file (add_hparams: a new one)
        step = int(summary.get("steps") or 0)
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value, step)

    def close(self, status: str) -> None:
        self.writer.close()


def _after_event_files(logdir: Path) -> None:
    """Wait (at most a second) until the clock is past the newest event file's timestamp,
    so a new event file sorts after it (TensorBoard reads them in name order)."""
    stamps = [int(p.name.split(".")[3]) for p in logdir.glob("events.out.tfevents.*")
              if len(p.name.split(".")) > 3 and p.name.split(".")[3].isdigit()]
    deadline = time.monotonic() + 1.5  # a file stamped in the future (the clock was set back): do not hang
    while stamps and time.time() < max(stamps) + 1 and time.monotonic() < deadline:
        time.sleep(0.05)


@contextlib.contextmanager
def _mlflow_bounds() -> Iterator[None]:
    """:data:`MLFLOW_HTTP_BOUNDS` for the calls in the block (each variable you set in the
    environment is left as it is); the process's environment is restored after."""
    added = {k: v for k, v in MLFLOW_HTTP_BOUNDS.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def _bounded(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _mlflow_bounds():
            return method(*args, **kwargs)

    return call


@LOGGERS.register("mlflow")
class MLflowLogger(RunLogger):
    """An MLflow run (experiment: the config's ``name``) with the config as parameters,
    every record's scalars as metrics at its ``step``, the summary as ``summary/*``
    metrics, ``config.yaml`` and ``summary.json`` as artifacts.

    A resume continues the same MLflow run (its id is in ``loggers.json``): the records
    the interrupted process logged after the checkpoint are the ones the resume
    recomputes (a resume is exact), so they are not logged twice."""

    module, extra = "mlflow", "mlflow"
    #: MLflow's limits per log_batch call
    MAX_PARAMS, MAX_METRICS, MAX_PARAM_LENGTH = 100, 1000, 6000

    def uri(self) -> str:
        return (self.cfg.run.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI")
                or f"file:{(self.out / 'mlruns').resolve()}")

    @classmethod
    def reachable(cls, name: str, cfg: "ExperimentConfig") -> None:
        """An ``http(s)://`` tracking URI must accept a connection within
        :data:`PROBE_SECONDS` (else MLflow would retry for minutes, then stop the run)."""
        import socket
        from urllib.parse import urlsplit

        uri = cfg.run.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI")
        source = "run.mlflow_uri" if cfg.run.mlflow_uri else "$MLFLOW_TRACKING_URI"
        if not uri:
            return
        try:
            parts = urlsplit(uri)
            scheme, host = parts.scheme.lower(), parts.hostname
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError:
            return  # not a URL MLflow would open over HTTP: its own error, at start
        if scheme not in ("http", "https") or not host:
            return
        try:
            socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
        except OSError as exc:
            why = "no answer" if isinstance(exc, (socket.timeout, TimeoutError)) else (exc.strerror or str(exc))
            raise ConfigError(f"run.loggers: mlflow cannot reach the tracking server {uri} ({source}): {why} "
                              f"within {PROBE_SECONDS:g} s; start the server or fix {source}") from None

    def entries(self) -> tuple[str, ...]:
        local = not (self.cfg.run.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI"))
        return (STATE_FILE, f".{STATE_FILE}.tmp") + (("mlruns",) if local else ())

    @_bounded
    def open(self, resume: bool, kept: Sequence[dict[str, Any]]) -> None:
        uri = self.uri()
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 keeps the file store only on request; it is what a local run needs
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        self.skip = 0
        run_id = _read_state(self.out).get("mlflow_run_id") if resume else None
        logged = self._logged(run_id) if run_id else None
        if logged is not None:
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")
            self.skip = max(0, logged - len(kept))
            backlog = kept[logged:]  # kept records the interrupted process never logged
        else:
            exp = self.client.get_experiment_by_name(self.cfg.name)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(self.cfg.name)
            run = self.client.create_run(exp_id, run_name=self.out.name, tags={
                "fedgmr.run_dir": str(self.out.resolve()), "fedgmr.method": self.cfg.method,
                "fedgmr.seed": str(self.cfg.seed)})
            self.run_id = run.info.run_id
            _write_state(self.out, "mlflow_run_id", self.run_id)
            params = [Param(k, str(v)[:self.MAX_PARAM_LENGTH]) for k, v in config_params(self.cfg).items()]
            for i in range(0, len(params), self.MAX_PARAMS):
                self.client.log_batch(self.run_id, params=params[i:i + self.MAX_PARAMS])
            if (self.out / "config.yaml").exists():
                self.client.log_artifact(self.run_id, str(self.out / "config.yaml"))
            backlog = kept
        self.index = len(kept) - len(backlog)
        for record in backlog:
            self._log(record)

    @_bounded
    def _logged(self, run_id: str) -> int | None:
        """How many records the run holds (None: the tracking store has no such run)."""
        try:
            self.client.get_run(run_id)
        except Exception:  # noqa: BLE001 - MlflowException: a store that lost (or never had) the run
            log.warning("MLflow run %s is not in %s: logging to a new run", run_id, self.uri())
            return None
        return len(self.client.get_metric_history(run_id, "accuracy"))

    def log(self, record: dict[str, Any]) -> None:
        if self.skip:
            self.skip -= 1
            self.index += 1
            return
        self._log(record)

    def _log(self, record: dict[str, Any]) -> None:
        self._metrics(scalars(record), _step(record, self.index))
        self.index += 1

    @_bounded
    def _metrics(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in values.items()]
        for i in range(0, len(metrics), self.MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + self.MAX_METRICS])

    @_bounded
    def finish(self, summary: dict[str, Any]) -> None:
        self._metrics(summary_scalars(summary), int(summary.get("steps") or 0))
        self.client.set_tag(self.run_id, "fedgmr.status", str(summary.get("status", "completed")))
        if (self.out / "summary.json").exists():
            self.client.log_artifact(self.run_id, str(self.out / "summary.json"))

    @_bounded
    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, {"completed": "FINISHED", "failed": "FAILED"}.get(status, "KILLED"))


@LOGGERS.register("wandb")
class WandbLogger(RunLogger):
    """A W&B run in offline mode (``$WANDB_MODE`` overrides; ``wandb sync`` uploads it)
    under ``<run dir>/wandb/``, project: the config's ``name``. Records are logged with
    ``step`` as their x axis; a resume continues the same run id."""

    module, extra = "wandb", "wandb"

    def entries(self) -> tuple[str, ...]:
        return (STATE_FILE, f".{STATE_FILE}.tmp", "wandb")

    def open(self, resume: bool, kept: Sequence[dict[str, Any]]) -> None:
        import wandb

        run_id = _read_state(self.out).get("wandb_run_id") if resume else None
        self.run = wandb.init(project=self.cfg.name, name=self.out.name, dir=str(self.out),
                              mode=os.environ.get("WANDB_MODE", "offline"), config=config_params(self.cfg),
                              id=run_id, resume="allow" if run_id else None, reinit="create_new",
                              settings=wandb.Settings(silent=True, console="off"))  # fedgmr's output stays its own
        _write_state(self.out, "wandb_run_id", self.run.id)
        self.run.define_metric("*", step_metric="step")
        self.index = 0
        if run_id is None:
            for record in kept:
                self.log(record)
        else:
            self.index = len(kept)

    def log(self, record: dict[str, Any]) -> None:
        values = scalars(record)
        values.setdefault("step", float(_step(record, self.index)))
        self.run.log(values, step=self.index)  # W&B's own step: the record's position (never repeats)
        self.index += 1

    def finish(self, summary: dict[str, Any]) -> None:
        self.run.summary.update({k: v for k, v in summary.items() if isinstance(v, (str, int, float, bool))})

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "completed" else 1)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"[:300]


class RunLoggers:
    """The loggers ``cfg.run.loggers`` names, used as one; a context manager that closes
    each of them however the block ends (its status: ``interrupted`` for Ctrl-C or a run
    stopped early, ``failed`` for an exception, else the summary's).

    A logger never stops or hangs a run: one that fails to open, or fails while the run
    goes on, is closed and dropped with one warning (the run and its metrics.jsonl are not
    lost to a tracker), and the run's ``summary.json`` names it under
    :data:`FAILURES_KEY`. A tracking server that cannot be reached at all is refused by
    :meth:`check`, before the run writes anything."""

    def __init__(self, cfg: "ExperimentConfig", out: Path) -> None:
        self.loggers = [LOGGERS.get(name)(name, cfg, out) for name in cfg.run.loggers]
        self.out = out
        self.opened: list[RunLogger] = []
        self.status: str | None = None
        #: logger name -> what failed (``could not start: ...``, ``failed to log a record: ...``)
        self.failures: dict[str, str] = {}
        self.summary: dict[str, Any] | None = None

    @staticmethod
    def check(cfg: "ExperimentConfig") -> None:
        """Before anything runs: each named logger exists, its library is installed and its
        server (if any) can be reached (:meth:`RunLogger.reachable`, bounded in time)."""
        for name in cfg.run.loggers:
            LOGGERS.get(name).check(name)
        for name in cfg.run.loggers:
            LOGGERS.get(name).reachable(name, cfg)

    def __bool__(self) -> bool:
        return bool(self.loggers)

    def entries(self) -> set[str]:
        """The names the loggers write in the run directory (:meth:`RunLogger.entries`)."""
        return {name for logger in self.loggers for name in logger.entries()}

    def _failed(self, logger: RunLogger, what: str, exc: BaseException) -> None:
        """One warning, and the failure kept for the summary."""
        self.failures.setdefault(logger.name, f"{what}: {_why(exc)}")
        if what == "close":
            log.warning("logger %s failed to close (%s)", logger.name, _why(exc))
        else:
            log.warning("logger %s failed to %s (%s); it is closed and logs nothing more, the run goes on",
                        logger.name, what, _why(exc))
        log.debug("logger %s failed", logger.name, exc_info=exc)

    def open(self, resume: bool, kept: Callable[[], Sequence[dict[str, Any]]]) -> None:
        """Open every logger (``kept``: the records a resumed run keeps, read only when a
        logger is configured). One that cannot start is left out with a warning."""
        if not self.loggers:
            return
        records = kept() if resume else []
        for logger in self.loggers:
            try:
                logger.open(resume, records)
            except Exception as exc:  # noqa: BLE001 - a tracker's own error: the run goes on without it
                self._failed(logger, "start", exc)
                try:
                    logger.close("failed")
                except Exception:  # noqa: BLE001 - half-opened: nothing more to do
                    pass
                continue
            self.opened.append(logger)

    def _each(self, what: str, call: Callable[[RunLogger], None]) -> None:
        for logger in list(self.opened):
            try:
                call(logger)
            except Exception as exc:  # noqa: BLE001
                self._failed(logger, what, exc)
                self.opened.remove(logger)
                try:
                    logger.close("failed")
                except Exception:  # noqa: BLE001
                    pass

    def log(self, record: dict[str, Any]) -> None:
        self._each("log a record", lambda lg: lg.log(record))

    def finish(self, summary: dict[str, Any]) -> None:
        """Log the summary; a run whose loggers failed gets :data:`FAILURES_KEY` in its
        ``summary.json`` (and in ``summary``)."""
        self.status = "failed" if summary.get("status") == "failed" else "completed"
        self.summary = summary
        self._each("log the summary", lambda lg: lg.finish(summary))
        self._publish()

    def _publish(self) -> None:
        """Name the failed loggers in the written summary (rewritten atomically)."""
        if not self.failures or self.summary is None or self.summary.get(FAILURES_KEY) == self.failures:
            return
        from fedgmr.experiment.rundir import SUMMARY_FILE, write_atomic

        self.summary[FAILURES_KEY] = dict(self.failures)
        try:
            write_atomic(self.out / SUMMARY_FILE, json.dumps(self.summary, indent=2) + "\n")
        except FedGMRError as exc:
            log.warning("could not name the failed loggers in %s: %s", self.out / SUMMARY_FILE, exc)

    def close(self, status: str) -> None:
        """Close every open logger; a failure to close one is a warning (and named in the
        summary when the run wrote one)."""
        while self.opened:
            logger = self.opened.pop()
            try:
                logger.close(status)
            except Exception as exc:  # noqa: BLE001
                self._failed(logger, "close", exc)
        self._publish()

    def __enter__(self) -> "RunLoggers":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: Any) -> None:
        if exc_type is None:
            status = self.status or "interrupted"  # no summary: stopped early, resumable
        elif issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
            status = "interrupted"
        else:
            status = "failed"
        self.close(status)
