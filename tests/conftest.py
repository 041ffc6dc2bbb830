"""Shared fixtures: tiny configs that run in a second or two."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> None:
    # tests run in parallel on 2 cores; oversubscribed BLAS threads only slow them down
    torch.set_num_threads(1)


def timeout_scale() -> float:
    """How much longer than on an idle machine every wait in the tests may take.

    ``FEDGMR_TEST_TIMEOUT_SCALE`` (default 1) times the machine's current load per core
    (at least 1, at most 8): a test that waits on a process or a server never fails only
    because the machine is busy, e.g. with another test suite running beside it."""
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # pragma: no cover - platforms without a load average
        load = 1.0
    return float(os.environ.get("FEDGMR_TEST_TIMEOUT_SCALE", "1")) * min(8.0, max(1.0, load))


def scaled(seconds: float) -> float:
    """``seconds`` scaled by :func:`timeout_scale`: use for every timeout a test waits on."""
    return seconds * timeout_scale()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Keep each phase's report on the test item, so fixtures can tell a failed test
    (and, for example, print the logs of the servers it started)."""
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


def tiny_config(**sections: Any) -> dict[str, Any]:
    """A raw config dict for a seconds-long digits run; keyword sections are merged in."""
    cfg: dict[str, Any] = {
        "name": "tiny",
        "method": "fedgmr",
        "seed": 0,
        "data": {"name": "digits", "partition": "dirichlet", "alpha": 0.5},
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "clients": {"num_clients": 10, "heterogeneity": "high"},
        "training": {"lr": 0.1, "local_steps": 2},
        "restoration": {"check_interval": 2, "patience": 1},
        "network": {"model_size_mb": 2.0},
        # the CPU: these runs' bit-exact comparisons are CPU guarantees (tests/gpu: the GPU)
        "run": {"max_steps": 30, "eval_every": 2, "device": "cpu"},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


def simulate(raw: dict[str, Any]) -> tuple[list[dict[str, Any]], Any]:
    """Build ``raw`` (a raw config dict), run it to its end, and return (records, the
    experiment); the executor is closed on every path."""
    from fedgmr.experiment.build import build_experiment
    from fedgmr.methods import resolve_config

    records: list[dict[str, Any]] = []
    cfg = resolve_config(raw)
    exp = build_experiment(cfg, on_record=records.append)
    try:
        exp.simulator.run(cfg.run.max_steps, cfg.run.max_time)
        exp.simulator.finish()
    finally:
        exp.executor.close()
    return records, exp


@pytest.fixture
def tiny() -> Any:
    return tiny_config


class CliResult:
    """What :func:`run_cli` returns: the fields of a finished subprocess that tests read."""

    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def run_cli(args: list[str], cwd: Path) -> CliResult:
    """Run ``fedgmr ARGS`` in this process, in directory ``cwd`` (restored after), as the
    console script would: its exit code, stdout and stderr. A tenth of a subprocess's cost
    (no interpreter or PyTorch start-up); keep true subprocesses for the installed entry
    point and for commands that ``--import`` code into the registries."""
    from typer.testing import CliRunner

    from fedgmr.cli import app

    old = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, args, prog_name="fedgmr")
    finally:
        os.chdir(old)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return CliResult(result.exit_code, result.stdout, result.stderr)


@contextlib.contextmanager
def no_hang(seconds: int = 120) -> Iterator[None]:
    """Fail (instead of hanging the suite) if the block blocks, e.g. on a FIFO."""
    def alarm(*_: Any) -> None:
        raise AssertionError("blocked: the read hung")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
