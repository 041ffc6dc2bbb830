"""``run.loggers``: TensorBoard and MLflow fed from the record hook, read back with the
real libraries (TensorBoard's EventAccumulator, MLflow's client on the local file store)
and compared with ``metrics.jsonl`` number for number; closed on every path (completed,
failed, interrupted) and continued, not clobbered, by a resume."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from conftest import scaled, tiny_config
from fedgmr.cli import app
from fedgmr.errors import ConfigError, RunFailedError
from fedgmr.experiment.loggers import LOGGER_ENTRIES, LOGGERS, RunLogger, scalars
from fedgmr.experiment.metrics import EXECUTION_KEYS, experiment_identity, read_metrics
from fedgmr.experiment.rundir import RUN_ENTRIES
from fedgmr.experiment.runner import run_experiment, saved_config
from fedgmr.methods import resolve_config

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")


@pytest.fixture(autouse=True)
def _mlflow_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # the logger opts in to MLflow 3's file store; the reading client in this process too
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def config(loggers: list[str], **run: Any):
    return resolve_config(tiny_config(run={"max_steps": 10, "eval_every": 2, "loggers": loggers, **run}))


def tb_scalars(out: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def as_f32(records: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """What TensorBoard stores for ``key``: (step, the value rounded to float32)."""
    return [(r["step"], float(np.float32(r[key]))) for r in records]


def mlflow_run(out: Path, name: str = "tiny"):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{out.resolve() / 'mlruns'}")
    exp = client.get_experiment_by_name(name)
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return client, runs[0]


def history(client, run, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]


# ---------------------------------------------------------------------------- flattening
def test_a_record_flattens_to_named_scalars():
    record = {"time": 12.5, "step": 3, "accuracy": 0.75, "loss": None, "val_accuracy": None, "flag": True,
              "note": "text", "densities": [0.1, 1.0], "restored": [4, 7, 9], "levels": [0.05, 0.5, 1.0],
              "level_accuracy": [0.25, 0.5, 0.75], "client_accuracy": [0.5, None, 1.0], "extra": {"a": 1, "b": [2]}}
    assert scalars(record) == {
        "time": 12.5, "step": 3.0, "accuracy": 0.75, "flag": 1.0, "densities/0": 0.1, "densities/1": 1.0,
        "restored": 3.0, "level_accuracy/0.05": 0.25, "level_accuracy/0.5": 0.5, "level_accuracy/1": 0.75,
        "client_accuracy/0": 0.5, "client_accuracy/2": 1.0, "extra/a": 1.0, "extra/b/0": 2.0}


def test_level_accuracy_not_aligned_with_levels_is_named_by_position():
    assert scalars({"levels": [0.5], "level_accuracy": [0.25, 0.5]}) == {"level_accuracy/0": 0.25,
                                                                         "level_accuracy/1": 0.5}


# ---------------------------------------------------------------------------- config and errors
def test_loggers_default_to_none_and_do_not_change_the_experiment(tmp_path: Path):
    assert resolve_config(tiny_config()).run.loggers == []
    assert {"run.loggers", "run.mlflow_uri"} <= EXECUTION_KEYS
    assert set(LOGGER_ENTRIES) <= set(RUN_ENTRIES)  # --overwrite removes the trackers' files too
    for name, loggers in (("a", []), ("b", ["tensorboard", "mlflow"])):
        (tmp_path / name).mkdir()
        cfg = resolve_config(tiny_config(seed=1 if name == "b" else 0, run={"max_steps": 4, "loggers": loggers}))
        (tmp_path / name / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    assert experiment_identity(tmp_path / "a") == experiment_identity(tmp_path / "b")  # seeds of one row


@pytest.mark.parametrize("loggers, needle", [(["neptune"], "unknown logger 'neptune' (known: mlflow, tensorboard, "
                                                           "wandb)"),
                                             (["mlflow", "mlflow"], "names a logger twice")])
def test_a_bad_logger_list_is_refused(loggers: list[str], needle: str):
    with pytest.raises(ConfigError, match="run.loggers") as err:
        resolve_config(tiny_config(run={"max_steps": 4, "loggers": loggers}))
    assert needle in str(err.value)


@pytest.mark.parametrize("name", ["tensorboard", "mlflow", "wandb"])
def test_a_missing_library_is_one_line_naming_the_extra(name: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, name, None)  # as if not installed: importlib finds no spec
    cfg_file = tmp_path / "tiny.yaml"
    cfg_file.write_text(yaml.safe_dump(tiny_config(run={"max_steps": 4})))
    result = CliRunner().invoke(app, ["run", str(cfg_file), "--out", str(tmp_path / "r"), "-q",
                                      "--set", f"run.loggers=[{name}]"])
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stderr.strip().splitlines() == [
        f"error: run.loggers: {name} needs the {name} package: pip install 'fedgmr[{name}]'"]
    assert not (tmp_path / "r").exists()  # refused before anything was written


# ---------------------------------------------------------------------------- the real libraries
def test_tensorboard_holds_the_records_of_metrics_jsonl(tmp_path: Path):
    out = tmp_path / "r"
    summary = run_experiment(config(["tensorboard"]), out)
    records = read_metrics(out)
    assert len(records) == 6 and [r["step"] for r in records] == [0, 2, 4, 6, 8, 10]
    assert tb_scalars(out, "accuracy") == as_f32(records, "accuracy")
    assert tb_scalars(out, "time") == as_f32(records, "time")  # virtual time, against the step
    assert tb_scalars(out, "densities/9") == [(r["step"], float(np.float32(r["densities"][9]))) for r in records]
    assert tb_scalars(out, "summary/final_accuracy") == [(10, float(np.float32(summary["final_accuracy"])))]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    assert "config/text_summary" in acc.Tags()["tensors"]
    assert acc.PluginTagToContent("hparams")  # the config as hyperparameters, the summary as their metrics


def test_mlflow_holds_metrics_params_and_status(tmp_path: Path):
    out = tmp_path / "r"
    summary = run_experiment(config(["mlflow"]), out)
    records = read_metrics(out)
    client, run = mlflow_run(out)
    assert history(client, run, "accuracy") == [(r["step"], r["accuracy"]) for r in records]
    assert history(client, run, "bytes_up") == [(r["step"], r["bytes_up"]) for r in records]
    assert history(client, run, "summary/final_accuracy") == [(10, summary["final_accuracy"])]
    params = run.data.params
    assert params["training.lr"] == "0.1" and params["method"] == "fedgmr" and params["run.max_steps"] == "10"
    assert params["model.options"] == '{"hidden": [32]}' and params["run.loggers"] == '["mlflow"]'
    assert run.info.status == "FINISHED" and run.info.run_name == "r"
    assert run.data.tags["fedgmr.status"] == "completed"
    assert json.loads((out / "loggers.json").read_text()) == {"mlflow_run_id": run.info.run_id}
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"config.yaml", "summary.json"}


def test_mlflow_uri_from_the_config(tmp_path: Path):
    store = tmp_path / "store"
    run_experiment(config(["mlflow"], max_steps=4, mlflow_uri=f"file:{store}"), tmp_path / "r")
    assert not (tmp_path / "r" / "mlruns").exists()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{store}")
    (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "accuracy")] == [0, 2, 4]


def test_a_resume_appends_and_each_logger_holds_exactly_the_metrics(tmp_path: Path):
    """The interrupted process logged records past its last checkpoint; the resume
    recomputes them: TensorBoard (after its purge) and MLflow hold each record once."""
    out = tmp_path / "r"
    cfg = config(["tensorboard", "mlflow"], max_steps=14, checkpoint_every=4)
    assert run_experiment(cfg, out, stop_after_steps=11)["interrupted"]
    client, run = mlflow_run(out)
    assert run.info.status == "KILLED"
    assert [s for s, _ in history(client, run, "accuracy")] == [0, 2, 4, 6, 8, 10]  # 10: after the checkpoint at 8
    run_experiment(saved_config(out), out, resume=True)
    records = read_metrics(out)
    assert [r["step"] for r in records] == [0, 2, 4, 6, 8, 10, 12, 14]
    assert tb_scalars(out, "accuracy") == as_f32(records, "accuracy")
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 2  # appended, not clobbered
    client, run = mlflow_run(out)  # the same run, continued
    assert history(client, run, "accuracy") == [(r["step"], r["accuracy"]) for r in records]
    assert run.info.status == "FINISHED"
    fresh = tmp_path / "fresh"
    run_experiment(cfg, fresh)
    assert read_metrics(fresh) == records  # the resume is exact: the skipped records were these


class _FailAt(RunLogger):
    """A logger that raises ``error`` at its ``at``-th record."""

    at: int
    error: BaseException

    def open(self, resume: bool, kept: Any) -> None:
        self.seen = 0

    def log(self, record: dict[str, Any]) -> None:
        self.seen += 1
        if self.seen == self.at:
            raise self.error


class _Interrupt(_FailAt):
    """Ctrl-C at the third record (the user interrupts the run)."""

    at, error = 3, KeyboardInterrupt()


class _Broken(_FailAt):
    """The tracker fails at the second record."""

    at, error = 2, RuntimeError("tracker went away")


def test_loggers_are_closed_when_the_run_is_interrupted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(LOGGERS._items, "interrupt", _Interrupt)
    out = tmp_path / "r"
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config(["mlflow", "interrupt"]), out)
    client, run = mlflow_run(out)
    assert run.info.status == "KILLED"
    assert [s for s, _ in history(client, run, "accuracy")] == [0, 2, 4]


def test_a_failed_run_marks_the_tracker_run_failed(tmp_path: Path):
    cfg = resolve_config(tiny_config(method="fedavg", training={"lr": 1e30, "local_steps": 2},
                                     run={"max_steps": 200, "eval_every": 2, "loggers": ["mlflow"]}))
    with pytest.raises(RunFailedError):
        run_experiment(cfg, tmp_path / "r")
    client, run = mlflow_run(tmp_path / "r")
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert run.info.status == "FAILED" and run.data.tags["fedgmr.status"] == "failed"
    assert history(client, run, "summary/rejected_updates") == [(summary["steps"], 30.0)]


def test_a_tracker_failing_mid_run_is_dropped_and_the_run_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture):
    monkeypatch.setitem(LOGGERS._items, "broken", _Broken)
    out = tmp_path / "r"
    summary = run_experiment(config(["broken", "mlflow"]), out)
    assert summary["status"] == "completed" and len(read_metrics(out)) == 6
    assert "logger broken failed to log a record" in caplog.text
    client, run = mlflow_run(out)
    assert run.info.status == "FINISHED" and len(history(client, run, "accuracy")) == 6
    # the summary names the logger that failed (issue 42, item 8)
    expected = {"broken": "log a record: RuntimeError: tracker went away"}
    assert summary["logger_failures"] == expected
    assert json.loads((out / "summary.json").read_text())["logger_failures"] == expected


def test_overwrite_removes_the_trackers_files(tmp_path: Path):
    out = tmp_path / "r"
    run_experiment(config(["tensorboard", "mlflow"], max_steps=4), out)
    run_experiment(config([], max_steps=4), out, overwrite=True)
    assert not any((out / name).exists() for name in ("tensorboard", "mlruns", "loggers.json"))


# ---------------------------------------------------------------------------- bounded, never stopping (issue 42)
@contextlib.contextmanager
def no_hang(seconds: float) -> Iterator[None]:
    """Fail (instead of waiting out MLflow's minutes of retries) if the block takes longer."""
    def alarm(*_: Any) -> None:
        raise AssertionError(f"took longer than {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(max(1, int(seconds)))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("where", ["config", "environment"])
def test_an_unreachable_mlflow_server_is_refused_in_one_line_before_anything_is_written(
        where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    uri = f"http://127.0.0.1:{_closed_port()}"
    cfg_file = tmp_path / "tiny.yaml"
    cfg_file.write_text(yaml.safe_dump(tiny_config(run={"max_steps": 4})))
    args = ["run", str(cfg_file), "--out", str(tmp_path / "r"), "-q", "--set", "run.loggers=[mlflow]"]
    if where == "config":
        args += ["--set", f"run.mlflow_uri={uri}"]
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    start = time.monotonic()
    with no_hang(scaled(60)):
        result = CliRunner().invoke(app, args)
    assert time.monotonic() - start < scaled(30)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, (result.stdout, result.stderr, result.exception)
    source = "run.mlflow_uri" if where == "config" else "$MLFLOW_TRACKING_URI"
    assert lines[0].startswith(f"error: run.loggers: mlflow cannot reach the tracking server {uri} ({source}): ")
    assert not (tmp_path / "r").exists()  # refused before anything was written


class _Failing(BaseHTTPRequestHandler):
    """A tracking server that answers every request with 503 (it accepts connections)."""

    def _fail(self) -> None:
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PATCH = do_PUT = _fail

    def log_message(self, *a: Any) -> None:
        pass


def test_a_failing_mlflow_server_costs_seconds_not_minutes_and_the_run_goes_on(tmp_path: Path,
                                                                               caplog: pytest.LogCaptureFixture):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    out = tmp_path / "r"
    try:
        cfg = config(["mlflow"], mlflow_uri=f"http://127.0.0.1:{server.server_address[1]}")
        start = time.monotonic()
        with no_hang(scaled(120)), caplog.at_level(logging.WARNING, logger="fedgmr.experiment.loggers"):
            summary = run_experiment(cfg, out)
        assert time.monotonic() - start < scaled(60)  # MLflow's defaults: ~4 minutes of retries
    finally:
        server.shutdown()
        server.server_close()
    assert summary["status"] == "completed" and len(read_metrics(out)) == 6
    assert list(summary["logger_failures"]) == ["mlflow"]
    assert summary["logger_failures"]["mlflow"].startswith("start: ")
    assert json.loads((out / "summary.json").read_text())["logger_failures"] == summary["logger_failures"]
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and r.name == "fedgmr.experiment.loggers"]
    assert len(warnings) == 1 and warnings[0].startswith("logger mlflow failed to start (")
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # the bounds were for fedgmr's calls only


class _NoStart(_FailAt):
    def open(self, resume: bool, kept: Any) -> None:
        raise PermissionError("token expired")


def test_a_logger_that_cannot_start_is_dropped_with_one_warning_and_named_in_the_summary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture):
    monkeypatch.setitem(LOGGERS._items, "nostart", _NoStart)
    out = tmp_path / "r"
    with caplog.at_level(logging.WARNING, logger="fedgmr"):
        summary = run_experiment(config(["nostart", "tensorboard"]), out)
    assert summary["status"] == "completed" and len(read_metrics(out)) == 6
    assert summary["logger_failures"] == {"nostart": "start: PermissionError: token expired"}
    assert len(tb_scalars(out, "accuracy")) == 6  # the other logger still logs
    lines = [r.getMessage() for r in caplog.records if "nostart" in r.getMessage()]
    assert lines == ["logger nostart failed to start (PermissionError: token expired); it is closed and logs "
                     "nothing more, the run goes on"]
    # nothing of the failed start blocks the next run in this directory
    assert run_experiment(config([]), out, overwrite=True)["status"] == "completed"


def test_a_run_whose_loggers_all_work_has_no_failures_key(tmp_path: Path):
    summary = run_experiment(config(["tensorboard"], max_steps=4), tmp_path / "r")
    assert "logger_failures" not in summary


def test_the_shipped_logger_names_are_the_registered_trackers():
    """Config checks read logger names from fedgmr.logger_names (below the schema, no
    tracker imported); the trackers register there - the two lists must agree."""
    from fedgmr.experiment import loggers
    from fedgmr.logger_names import BUILTIN_LOGGERS, LOGGERS, known_loggers

    assert loggers.LOGGERS is LOGGERS
    assert sorted(BUILTIN_LOGGERS) == sorted(n for n in LOGGERS.names() if LOGGERS.get(n).__module__ == loggers.__name__)
    assert known_loggers() == sorted(LOGGERS.names())
