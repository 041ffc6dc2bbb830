"""The warm SuperExec's executor (fedgmr.flower.warm_exec), without a deployment: a
ClientApp task runs in a forked child with the parent's state, its exit status is reaped
and reported, other task types go to Flower's own launcher. The loopback deployment test
(tests/distributed/test_flower_deployment.py) runs it against real SuperNodes."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is not installed: pip install 'fedgmr[flower]'")

from flwr.supercore.constant import TaskType  # noqa: E402
from flwr.supercore.superexec.executor import ExecutionSpec, LaunchResultStatus  # noqa: E402

from fedgmr.flower import warm_exec  # noqa: E402

WARM_STATE: dict[str, str] = {}


def _spec(task_type: TaskType = TaskType.CLIENT_APP, task_id: int = 7) -> ExecutionSpec:
    return ExecutionSpec(task_type=task_type, runtime_api_address="127.0.0.1:1", token="tok", insecure=True,
                         root_certificates_path=None, runtime_dependency_install=False, parent_pid=os.getpid(),
                         suppress_output=False, task_id=task_id)


def _reap_all(ex: warm_exec.ForkExecutor, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while ex.children:
        assert time.monotonic() < deadline, f"children still running: {ex.children}"
        ex.reconcile()
        time.sleep(0.02)


def test_clientapp_task_runs_in_a_fork_with_the_parents_state(tmp_path, monkeypatch, caplog):
    import flwr.supernode.runtime.run_clientapp as rc

    WARM_STATE["loaded"] = "in the parent before the fork"
    seen = tmp_path / "child.txt"

    def fake_run_clientapp(runtime_api_address, token, insecure, certificates, parent_pid,
                           runtime_dependency_install):
        seen.write_text(f"{os.getpid()} {os.getppid()} {token} {runtime_api_address} {insecure} "
                        f"{WARM_STATE['loaded']}")
        raise SystemExit(3)  # as flwr_exit ends a task

    monkeypatch.setattr(rc, "run_clientapp", fake_run_clientapp)
    ex = warm_exec.ForkExecutor(fallback=object())
    with caplog.at_level(logging.INFO, logger="fedgmr.flower.warm_exec"):
        result = ex.launch(_spec(task_id=7))
        assert result.status == LaunchResultStatus.ACCEPTED
        assert ex.launched == 1 and len(ex.children) == 1
        (pid,) = ex.children
        _reap_all(ex)
    child_pid, parent, token, address, insecure, state = seen.read_text().split(" ", 5)
    assert int(child_pid) == pid != os.getpid() and int(parent) == os.getpid()
    assert (token, address, insecure) == ("tok", "127.0.0.1:1", "True")
    assert state == "in the parent before the fork"
    assert f"task 7: ClientApp in forked process {pid}" in caplog.text
    assert f"task 7: ClientApp process {pid} exited with status 3" in caplog.text


def test_a_crashing_clientapp_never_returns_into_the_parents_loop(tmp_path, monkeypatch):
    import flwr.supernode.runtime.run_clientapp as rc

    marker = tmp_path / "returned"

    def crash(**kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(rc, "run_clientapp", crash)
    ex = warm_exec.ForkExecutor(fallback=object())
    ex.launch(_spec())
    if not ex.children:  # only a child that came back from launch() would get here
        marker.write_text("child returned")
        os._exit(0)
    pid = next(iter(ex.children))
    _, status = os.waitpid(pid, 0)
    ex.children.clear()
    assert os.waitstatus_to_exitcode(status) == 1
    assert not marker.exists()


def test_other_task_types_go_to_flowers_launcher():
    launched = []

    class Fallback:
        def launch(self, spec):
            launched.append(spec.task_type)
            return "flower's result"

        def close(self):
            launched.append("closed")

    ex = warm_exec.ForkExecutor(fallback=Fallback())
    assert ex.launch(_spec(TaskType.SERVER_APP)) == "flower's result"
    assert ex.children == {} and ex.launched == 0
    assert ex.get_eligible_capacity({TaskType.CLIENT_APP}) == ({TaskType.CLIENT_APP}, set())
    ex.close()
    assert launched == [TaskType.SERVER_APP, "closed"]


def test_close_stops_running_children(monkeypatch):
    import flwr.supernode.runtime.run_clientapp as rc

    monkeypatch.setattr(rc, "run_clientapp", lambda **kw: time.sleep(600))
    ex = warm_exec.ForkExecutor(fallback=type("F", (), {"close": lambda self: None})())
    ex.launch(_spec())
    (pid,) = ex.children
    ex.close()
    assert ex.children == {}
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped


def test_a_stop_sent_as_the_child_is_forked_ends_it_even_where_the_parent_ignores_it(monkeypatch, caplog):
    """The parent's SIGTERM handler ignores the signal and the child is slow to set its own
    (``perf_counter``, its first call, sleeps in the child): the SIGTERM that close() sends
    meanwhile is held (blocked across the fork) until the child has the default action,
    so it ends the child (status -15), not the parent's handler swallowing it and a SIGKILL
    after the grace period (status -9)."""
    import flwr.supernode.runtime.run_clientapp as rc

    monkeypatch.setattr(rc, "run_clientapp", lambda **kw: time.sleep(600))
    parent = os.getpid()
    real = time.perf_counter

    def slow_in_the_child() -> float:
        if os.getpid() != parent:
            time.sleep(1.0)
        return real()

    monkeypatch.setattr(warm_exec.time, "perf_counter", slow_in_the_child)
    previous = signal.signal(signal.SIGTERM, lambda *a: None)
    try:
        ex = warm_exec.ForkExecutor(fallback=type("F", (), {"close": lambda self: None})())
        with caplog.at_level(logging.INFO, logger=warm_exec.log.name):
            ex.launch(_spec())
            (pid,) = ex.children
            ex.close(grace_s=30.0)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert ex.children == {}
    assert f"process {pid} exited with status -15" in caplog.text, caplog.text
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the parent's mask restored


def test_close_kills_a_child_that_outlives_the_grace_period(monkeypatch, caplog):
    import flwr.supernode.runtime.run_clientapp as rc

    def deaf(**kw):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)

    monkeypatch.setattr(rc, "run_clientapp", deaf)
    ex = warm_exec.ForkExecutor(fallback=type("F", (), {"close": lambda self: None})())
    with caplog.at_level(logging.INFO, logger=warm_exec.log.name):
        ex.launch(_spec())
        (pid,) = ex.children
        deadline = time.monotonic() + 60  # until the child has set SIG_IGN (it logs nothing before)
        while time.monotonic() < deadline and _ignores_sigterm(pid) is False:
            time.sleep(0.05)
        ex.close(grace_s=0.5)
    assert ex.children == {}
    assert f"ClientApp processes [{pid}] still running" in caplog.text and "after SIGTERM: killed" in caplog.text
    assert f"process {pid} exited with status -9" in caplog.text
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _ignores_sigterm(pid: int) -> bool | None:
    """Whether the process ignores SIGTERM (its ``SigIgn`` mask in /proc); None off Linux."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    ign = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
    return bool(ign >> (signal.SIGTERM - 1) & 1)


def test_warm_up_builds_the_workload_the_clientapp_looks_up(tmp_path):
    import yaml

    from conftest import tiny_config
    from fedgmr.flower import client as flower_client

    cfg = tmp_path / "fedgmr.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config(clients={"num_clients": 3})))
    flower_client._WORKLOADS.clear()
    warm_exec.warm_up(cfg, seed=5)
    (key,) = flower_client._WORKLOADS
    # the ClientApp's lookup for a run naming this config and seed finds it: nothing to build
    assert flower_client.load_run_config({"config": str(cfg), "seed": 5}).model_dump_json() == key
    assert flower_client.workload_for(flower_client.load_run_config({"config": str(cfg), "seed": 5})) is \
        flower_client._WORKLOADS[key]
    flower_client._WORKLOADS.clear()


def test_cli_refuses_a_flower_without_the_internals(monkeypatch):
    from typer.testing import CliRunner

    from fedgmr.cli import app

    def missing():
        raise RuntimeError("the warm SuperExec needs Flower 1.42's SuperExec internals (no module x)")

    monkeypatch.setattr(warm_exec, "check_flower_internals", missing)
    res = CliRunner().invoke(app, ["flower", "superexec", "--runtime-api-address", "127.0.0.1:1", "--insecure"])
    assert res.exit_code == 2
    assert "needs Flower 1.42's SuperExec internals" in res.output


def test_the_installed_flower_has_the_internals():
    warm_exec.check_flower_internals()
