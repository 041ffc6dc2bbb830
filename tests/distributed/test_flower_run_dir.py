"""A Flower run directory is a run directory like a simulator's: one schema (records and
summary; ``time`` on the wall clock, ``clock: wall``), read by ``fedgmr compare``,
``plot`` and ``table`` (as a user runs them: subprocesses), also next to a simulator
run; and the ServerApp's per-step lines reach the output Flower streams to
``flwr run --stream``.

The Flower run is Flower's real ServerApp and ClientApp objects
(``fedgmr.flower.server_app:app``, ``fedgmr.flower.client_app:app``) exchanging real
Flower ``Message`` objects through a ``Grid`` whose SuperNodes live in this process: no
SuperLink, no Ray, a few seconds. The SuperLink path is
``test_flower_deployment.py`` (slow).
"""

from __future__ import annotations

import io
import json
import os
import queue
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable
from uuid import uuid4

import pytest
import yaml

from conftest import tiny_config

pytest.importorskip("flwr", reason="Flower is not installed: pip install 'fedgmr[flower]'")

from flwr.app import Context, Message, RecordDict  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402

from fedgmr.config import parse_config  # noqa: E402
from fedgmr.experiment.metrics import RECORD_KEYS, SUMMARY_KEYS  # noqa: E402
from fedgmr.experiment.runner import run_experiment  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "FEDGMR_PROGRESS": "0"}
NODES, STEPS, T_STAR = 4, 6, 1.0


class InProcessGrid(Grid):
    """Flower's Grid with its SuperNodes in this process: a pushed message is handled at
    once by the ClientApp, with one Context per node (``partition-id`` = node id - 1)."""

    def __init__(self, client_app: Any, nodes: int, run_config: dict[str, Any]) -> None:
        self.client_app = client_app
        self.contexts = {n: Context(run_id=1, node_id=n, node_config={"partition-id": n - 1, "num-partitions": nodes},
                                    state=RecordDict(), run_config=run_config) for n in range(1, nodes + 1)}
        self.replies: dict[str, Message] = {}

    def set_run(self, run: Any) -> None:  # pragma: no cover - not used by FedGMR
        raise NotImplementedError

    @property
    def run(self) -> Any:  # pragma: no cover
        raise NotImplementedError

    def create_message(self, *args: Any, **kwargs: Any) -> Message:  # pragma: no cover
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid4().hex  # as Flower's InMemoryGrid does
            self.replies[msg.metadata.message_id] = self.client_app(msg, self.contexts[msg.metadata.dst_node_id])
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self.replies.pop(i) for i in message_ids if i in self.replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        raise NotImplementedError  # pragma: no cover


def _config(path: Path) -> Path:
    raw = tiny_config(clients={"num_clients": NODES, "heterogeneity": "high"},
                      run={"max_steps": STEPS, "eval_every": 2, "t_star": T_STAR})
    path.write_text(yaml.safe_dump(raw))
    return path


def _flower_run(tmp: Path, cfg: Path) -> tuple[Path, list[str]]:
    """Run the ServerApp into ``tmp/flower``; returns the run directory and what the
    ServerApp process wrote to the queue Flower uploads to the SuperLink (the source of
    ``flwr run --stream`` and ``flwr log``), captured as ``flwr-serverapp`` does."""
    from flwr.supercore import logger as flwr_logger
    from flwr.supercore.task_identity import TaskIdentity

    from fedgmr.flower.client_app import app as client_app
    from fedgmr.flower.server_app import app as server_app

    out = tmp / "flower"
    run_config = {"config": str(cfg), "out-dir": str(out), "num-server-steps": STEPS, "k": 2, "eval-every": 2,
                  "reply-timeout": 600.0, "step-timeout": 600.0, "node-wait": 0.0, "t-star": T_STAR}
    grid = InProcessGrid(client_app, NODES, run_config)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    logs: queue.Queue[str | None] = queue.Queue()
    saved = sys.stdout, sys.stderr, flwr_logger.console_handler.stream
    identity = TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id
    sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
    try:
        flwr_logger.mirror_output_to_queue(logs)  # what flwr-serverapp / flwr-simulation do first
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0  # as run_serverapp sets them
        server_app(grid, context)
    finally:
        sys.stdout, sys.stderr, flwr_logger.console_handler.stream = saved
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = identity
    lines = []
    while not logs.empty():
        item = logs.get()
        if item is not None:
            lines.append(item)
    return out, "".join(lines).splitlines()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("mixed")
    cfg = _config(tmp / "fedgmr.yaml")
    flower, streamed = _flower_run(tmp, cfg)
    sim = tmp / "sim"
    run_experiment(parse_config(yaml.safe_load(cfg.read_text())), sim)
    return {"flower": flower, "sim": sim, "streamed": streamed, "tmp": tmp}


def fedgmr(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedgmr", *args], capture_output=True, text=True, env=ENV,
                          timeout=300)


def _records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_flower_run_writes_the_simulators_schema_on_the_wall_clock(runs):
    flower, sim = runs["flower"], runs["sim"]
    for run in (flower, sim):
        assert {"config.yaml", "metrics.jsonl", "summary.json"} <= {p.name for p in run.iterdir()}
        for rec in _records(run):
            assert set(RECORD_KEYS) <= set(rec), (run, set(RECORD_KEYS) - set(rec))
        summary = json.loads((run / "summary.json").read_text())
        assert set(SUMMARY_KEYS) | {"t_star", "acc_at_t_star"} <= set(summary), set(SUMMARY_KEYS) - set(summary)
        assert summary["method"] == "fedgmr" and summary["t_star"] == T_STAR
    records = _records(flower)
    assert [r["step"] for r in records] == [0, 2, 4, 6]
    assert all(r["time"] == r["wall_time"] for r in records)  # time is the wall clock, kept as wall_time too
    assert [r["time"] for r in records] == sorted(r["time"] for r in records)
    assert records[-1]["uploads"] >= STEPS and records[-1]["downloads"] >= records[-1]["uploads"]
    summary = json.loads((flower / "summary.json").read_text())
    assert (summary["clock"], summary["runtime"]) == ("wall", "flower")
    assert summary["time"] == records[-1]["time"] and summary["steps"] == STEPS
    assert summary["eval_interval"] is None and summary["evaluations"] == len(records)
    sim_summary = json.loads((sim / "summary.json").read_text())
    assert (sim_summary["clock"], sim_summary["runtime"]) == ("virtual", "simulator")
    assert yaml.safe_load((flower / "config.yaml").read_text())["clients"]["num_clients"] == NODES


def test_compare_plot_and_table_read_a_flower_run_next_to_a_simulator_run(runs):
    flower, sim, tmp = runs["flower"], runs["sim"], runs["tmp"]
    proc = fedgmr("compare", str(flower), str(sim), "--t-star", "1")
    assert proc.returncode == 0, proc.stderr
    print(proc.stdout)
    assert "fedgmr (flower)" in proc.stdout and "MRI of fedgmr (flower) over fedgmr" in proc.stdout
    # no --t-star: the summaries agree on t* = 1
    proc = fedgmr("compare", str(flower), str(sim), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["t_star"] == T_STAR
    # one row each: a Flower run and a simulation of one config are not seeds of one experiment
    assert [(r["method"], r["n"]) for r in result["runs"]] == [("fedgmr (flower)", 1), ("fedgmr", 1)]
    assert result["runs"][0]["final_accuracy"] == _records(flower)[-1]["accuracy"]
    png = tmp / "mixed.png"
    proc = fedgmr("plot", str(flower), str(sim), "--out", str(png))
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    proc = fedgmr("table", str(flower), str(sim), "--t-star", "1", "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    print(proc.stdout)
    assert "virtual" in proc.stdout and "wall" in proc.stdout  # the clock tells the two apart


def test_a_flower_run_written_before_the_schema_is_one_line(runs, tmp_path):
    old = tmp_path / "old-flower"
    old.mkdir()
    lines = [json.dumps({k: v for k, v in r.items() if k != "time"}) for r in _records(runs["flower"])]
    (old / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    from typer.testing import CliRunner

    from fedgmr.cli import app

    for args in (["compare", str(old), str(runs["sim"]), "--t-star", "1"],
                 ["plot", str(old), "--out", str(tmp_path / "p.png")]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 3 and isinstance(result.exception, SystemExit), result.exception
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
        assert "no 'time' field" in result.stderr and "wall_time" in result.stderr


def test_per_step_lines_reach_what_flower_streams(runs):
    steps = [line for line in runs["streamed"] if "fedgmr: step " in line]
    assert [line.split("fedgmr: step ")[1].split()[0] for line in steps] == ["0/6", "2/6", "4/6", "6/6"]
    assert all("accuracy" in line and "avg density" in line and "t=" in line for line in steps)
    assert any("fedgmr: summary: " in line for line in runs["streamed"])
