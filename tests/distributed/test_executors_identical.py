"""Process-pool and Ray executors give exactly the serial executor's metrics (docs/reference.md §6.6)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import tiny_config
from fedgmr.experiment.build import build_experiment
from fedgmr.methods import resolve_config


def _run(executor: str, steps: int = 16, **run_opts: object) -> tuple[list[dict], torch.Tensor, dict]:
    raw = tiny_config(model={"name": "cnn", "options": {}}, training={"lr": 0.1, "local_steps": 3},
                      run={"max_steps": steps, "eval_every": 2, "executor": executor, "workers": 2, **run_opts})
    records: list[dict] = []
    exp = build_experiment(resolve_config(raw), on_record=records.append)
    try:
        exp.simulator.run(steps)
        exp.simulator.finish()
    finally:
        exp.executor.close()
    return records, exp.strategy.params.clone(), {k: v.clone() for k, v in exp.strategy.buffers.items()}


@pytest.fixture(scope="module")
def serial_run() -> tuple[list[dict], torch.Tensor, dict]:
    return _run("serial")


def _assert_same(a: tuple, b: tuple) -> None:
    recs_a, params_a, bufs_a = a
    recs_b, params_b, bufs_b = b
    assert recs_a == recs_b  # every field of every record, floats compared exactly
    assert torch.equal(params_a, params_b)
    assert bufs_a.keys() == bufs_b.keys() and all(torch.equal(bufs_a[k], bufs_b[k]) for k in bufs_a)


def test_process_pool_matches_serial_exactly(serial_run):
    _assert_same(serial_run, _run("process"))


def test_process_pool_with_spawn_matches_serial(serial_run):
    """``spawn`` sends the workload through torch's pickler (shared memory): each worker
    must still train a private model."""
    from fedgmr.sim.executors import ProcessPoolExecutor

    records: list[dict] = []
    raw = tiny_config(model={"name": "cnn", "options": {}}, training={"lr": 0.1, "local_steps": 3},
                      run={"max_steps": 16, "eval_every": 2})
    exp = build_experiment(resolve_config(raw), on_record=records.append)
    exp.simulator.executor = ProcessPoolExecutor(
        exp.simulator.executor.workload, workers=2, threads=1, start_method="spawn")
    try:
        exp.simulator.run(16)
        exp.simulator.finish()
    finally:
        exp.simulator.executor.close()
    _assert_same(serial_run, (records, exp.strategy.params, exp.strategy.buffers))


@pytest.fixture
def ray_installed() -> None:
    """Ray installed, and not running in this process: the executor joins the cluster named
    by its address only when no instance runs here (it would use the one it finds)."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'fedgmr[ray]'")
    if ray.is_initialized():  # the tests' shared instance (conftest.ray_session starts it again)
        ray.shutdown()


def test_ray_local_matches_serial_exactly(ray_session, serial_run):
    _assert_same(serial_run, _run("ray"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ray_joins_a_cluster_started_with_ray_start(ray_installed, serial_run):
    """``ray start --head`` on loopback, a port picked here; ``run.ray_address`` joins it.

    The head runs with ``--block`` in its own process group, and is stopped by signalling
    that group: ``ray stop`` would also stop every other Ray instance on the machine
    (including a parallel test's).
    """
    ray_cli = Path(sys.executable).with_name("ray")
    if not ray_cli.exists():
        pytest.skip("the 'ray' command is not installed next to this Python")
    port = _free_port()
    temp = Path(f"/tmp/fgmr-ray-{port}")  # short: Ray's unix socket paths must fit 107 bytes
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    log_path = Path(f"/tmp/fgmr-ray-{port}.log")
    with open(log_path, "w") as log_file:
        head = subprocess.Popen(
            [str(ray_cli), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
             "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"],
            env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while "Ray runtime started" not in log_path.read_text():
            assert head.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "ray start --head did not come up in 90 s"
            time.sleep(0.5)
        got = _run("ray", ray_address=f"127.0.0.1:{port}")
    finally:
        _stop_group(head)
        shutil.rmtree(temp, ignore_errors=True)
        log_path.unlink(missing_ok=True)
    _assert_same(serial_run, got)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group we started, then SIGKILL whatever is left of it."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    os.killpg(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)
