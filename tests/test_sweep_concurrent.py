"""Two sweeps into one directory (issue 42, item 8): a cell another sweep is running is
left to it ("running in another process"), never marked failed; a cell another sweep
finished meanwhile is done; and ``sweep.json`` is re-read and merged under a lock, so
neither sweep's index update undoes the other's cells."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import scaled, tiny_config
from fedgmr.config import read_config_file
from fedgmr.experiment import sweep as sweep_mod
from fedgmr.experiment.rundir import RunLock
from fedgmr.experiment.runner import run_experiment
from fedgmr.experiment.sweep import Cell, SweepSpec, load_sweep, run_sweep
from fedgmr.methods import resolve_config

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "FEDGMR_PROGRESS": "0"}


def _sweep_file(tmp_path: Path, grid: dict) -> Path:
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(tiny_config(run={"max_steps": 6, "eval_every": 2})))
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "base": "base.yaml", "grid": grid}))
    return path


def _index(out: Path) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in json.loads((out / "sweep.json").read_text())["cells"]}


def test_a_cell_another_sweep_is_running_is_left_to_it_not_failed(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    path = _sweep_file(tmp_path, {"seed": [0]})
    spec, root = load_sweep(path)
    out = tmp_path / "out"
    (out / "run").mkdir(parents=True)
    # the other sweep: its index says the cell runs, and its cell process holds the cell's lock
    (out / "sweep.json").write_text(json.dumps({"name": "t", "cells": [
        {"name": "run", "base": "x", "overrides": {"seed": 0}, "point": {"seed": 0}, "status": "running",
         "error": None}]}))
    lock = RunLock(out / "run")
    lock.acquire()
    try:
        events: list[tuple[str, str]] = []
        with caplog.at_level(logging.WARNING, logger="fedgmr.experiment.sweep"):
            outcome = run_sweep(spec, path, root, out, jobs=1,
                                on_event=lambda kind, cell, *_: events.append((kind, cell.name)))
    finally:
        lock.release()
    assert outcome.failed == [] and [c.name for c in outcome.elsewhere] == ["run"]
    assert events == [("left", "run")]  # a display hears of it, and never plans to run it
    entry = _index(out)["run"]
    assert entry["status"] == "running" and entry["error"] is None
    assert any("sweep cell run is running in another process" in r.getMessage() for r in caplog.records)
    assert not (out / "logs" / "run.log").exists()  # no process was started to be refused


@pytest.mark.slow
def test_a_cell_another_sweep_finished_meanwhile_is_done_not_failed(tmp_path: Path):
    path = _sweep_file(tmp_path, {"seed": [0, 1]})
    spec, root = load_sweep(path)
    out = tmp_path / "out"

    def other_sweep(kind: str, cell: Cell, finished: int, total: int) -> None:
        # while this sweep ran seed=0, another one ran seed=1 to its end
        if kind == "done" and cell.name == "seed=0":
            cfg = resolve_config(read_config_file(out / "configs" / "seed=1.yaml"))
            run_experiment(cfg, out / "seed=1")

    outcome = run_sweep(spec, path, root, out, jobs=1, on_event=other_sweep)
    assert outcome.failed == [] and [c.status for c in outcome.cells] == ["done", "done"]
    index = _index(out)
    assert {n: e["status"] for n, e in index.items()} == {"seed=0": "done", "seed=1": "done"}
    summary = json.loads((out / "seed=1" / "summary.json").read_text())
    assert index["seed=1"]["final_accuracy"] == summary["final_accuracy"]
    assert not (out / "logs" / "seed=1.log").exists()  # not started again: it was done


def test_a_refused_cell_whose_run_another_sweep_completed_is_done(tmp_path: Path):
    """A cell process refused (exit 3) because the other sweep's run finished first."""
    out = tmp_path / "out"
    raw = tiny_config(run={"max_steps": 6, "eval_every": 2})
    cfg = resolve_config(raw)
    run_experiment(cfg, out / "run")
    cell = Cell("run", "base", {}, config=cfg, status="running", mine=True)
    sweep_mod._finish(cell, out, 3, f"error: {out / 'run'} already holds a run; ...")
    assert cell.status == "done" and cell.error is None and cell.result["steps"] == 6


def test_the_index_is_merged_not_overwritten(tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    spec = SweepSpec.model_validate({"name": "t", "grid": {"seed": [0, 1, 2]}})
    others = {"seed=0": "running", "seed=1": "done", "seed=2": "failed"}
    (out / "sweep.json").write_text(json.dumps({"cells": [
        {"name": n, "base": "quickstart", "overrides": {"seed": i}, "point": {"seed": i}, "status": s,
         "error": "theirs" if s == "failed" else None, **({"final_accuracy": 0.5} if s == "done" else {})}
        for i, (n, s) in enumerate(others.items())]}))
    # this sweep ran none of seed=0 and seed=1 (another pass, or the other sweep, has them);
    # it ran seed=2 itself
    cells = [Cell(f"seed={i}", "quickstart", {"seed": i}, point={"seed": i}) for i in range(3)]
    cells[2].mine, cells[2].status, cells[2].result = True, "done", {"final_accuracy": 0.75}
    sweep_mod._write_index(out, spec, tmp_path / "grid.yaml", cells)
    index = _index(out)
    assert index["seed=0"]["status"] == "running"  # not reset to pending
    assert index["seed=1"]["status"] == "done" and index["seed=1"]["final_accuracy"] == 0.5
    assert index["seed=2"]["status"] == "done" and index["seed=2"]["final_accuracy"] == 0.75  # its own: it decides
    assert not (out / ".sweep.json.tmp").exists()


@pytest.mark.slow
def test_two_sweeps_into_one_directory_both_succeed_and_every_cell_is_done(tmp_path: Path):
    path = _sweep_file(tmp_path, {"seed": [0, 1]})
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "fedgmr", "sweep", str(path), "--out", str(out), "--jobs", "1", "-q"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
             for _ in range(2)]
    results = [p.communicate(timeout=scaled(600)) for p in procs]
    for proc, (stdout, stderr) in zip(procs, results):
        assert proc.returncode == 0, stderr
        assert "failed" not in stderr, stderr
    assert {n: e["status"] for n, e in _index(out).items()} == {"seed=0": "done", "seed=1": "done"}
    for name in ("seed=0", "seed=1"):
        assert json.loads((out / name / "summary.json").read_text())["status"] == "completed"
    # a third pass finds both done
    again = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=scaled(300))
    assert again.returncode == 0 and "2/2 cells done (2 already finished" in again.stdout, again.stderr


def _plant(tmp_path: Path, out: Path, planted: str) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (out / "configs").mkdir(parents=True)
    (out / "logs").mkdir()
    (out / planted).symlink_to(victim)
    return victim


def test_a_link_planted_as_a_cells_log_is_refused_and_its_target_kept(tmp_path: Path):
    """A cell's log in the sweep directory is opened without following a planted link."""
    from conftest import run_cli

    sweep, out = _sweep_file(tmp_path, {"seed": [0, 1]}), tmp_path / "out"
    victim = _plant(tmp_path, out, "logs/seed=0.log")
    proc = run_cli(["sweep", str(sweep), "--out", str(out), "-q", "--jobs", "1"], tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "symbolic link" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert victim.read_text() == "precious" and (out / "logs/seed=0.log").is_symlink()


@pytest.mark.slow
def test_a_link_planted_as_a_cells_config_is_replaced_not_written_through(tmp_path: Path):
    """A cell's config is written to a new file renamed into place: a planted link is
    replaced, its target never written."""
    from conftest import run_cli

    sweep, out = _sweep_file(tmp_path, {"seed": [0]}), tmp_path / "out"  # one cell: named "run"
    victim = _plant(tmp_path, out, "configs/run.yaml")
    proc = run_cli(["sweep", str(sweep), "--out", str(out), "-q"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert victim.read_text() == "precious"
    assert not (out / "configs/run.yaml").is_symlink() and "method:" in (out / "configs/run.yaml").read_text()


@pytest.mark.slow
def test_cell_configs_are_written_under_the_sweep_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Two sweeps into one directory write the same ``configs/.<cell>.yaml.tmp``: each
    write holds ``.sweep.lock``, else one sweep's rename finds the other's temporary gone
    (the CI failure of stop 44)."""
    import fcntl

    from fedgmr.experiment import rundir

    path = _sweep_file(tmp_path, {"seed": [0, 1]})
    spec, root = load_sweep(path)
    out = tmp_path / "out"
    held: list[bool] = []
    real = rundir.write_atomic

    def probe(target: Any, data: Any) -> None:
        if Path(target).parent.name == "configs":
            fd = os.open(out / sweep_mod.INDEX_LOCK, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except BlockingIOError:
                held.append(True)
            finally:
                os.close(fd)
        real(target, data)

    monkeypatch.setattr(rundir, "write_atomic", probe)
    outcome = run_sweep(spec, path, root, out, jobs=1)
    assert outcome.failed == []
    assert held == [True, True]
