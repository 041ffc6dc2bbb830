"""`fedgmr sweep`: grids of runs, resumable, a failing cell does not stop the others."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import fedgmr_in_process, scaled, tiny_config
from fedgmr.errors import ConfigError
from fedgmr.experiment.metrics import flatten_config
from fedgmr.experiment.sweep import SweepSpec, expand, load_sweep, resolve_cells
from fedgmr.experiment.table import _resolve_key

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "FEDGMR_PROGRESS": "0"}


def _sweep_file(tmp_path: Path, grid: dict, set_: dict | None = None, **extra) -> Path:
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(tiny_config(run={"max_steps": 6, "eval_every": 2})))
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "base": "base.yaml", "set": set_ or {}, "grid": grid, **extra}))
    return path


def _fedgmr(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """A sweep that runs cells: ``fedgmr`` in a process of its own (a sweep's process group,
    signals and cell processes as a user has them)."""
    return subprocess.run([sys.executable, "-m", "fedgmr", *args], capture_output=True, text=True, env=ENV,
                          timeout=scaled(timeout))


def _in_process(*args: str) -> Any:
    """A command that runs no cell (a table, a dry run, a refusal): in this process."""
    return fedgmr_in_process(*args)


def _index(out: Path) -> dict:
    return json.loads((out / "sweep.json").read_text())


# ---------------------------------------------------------------------- the grid
def test_cells_are_the_product_of_the_axes_in_order_with_readable_names(tmp_path: Path):
    spec = SweepSpec.model_validate({"base": "quickstart", "set": {"run.max_time": 50},
                                     "grid": {"method": ["fedgmr", "fedavg"], "seed": [0, 1],
                                              "clients.heterogeneity": ["high"]}})
    cells = expand(spec, tmp_path)
    assert [c.name for c in cells] == ["method=fedgmr,seed=0", "method=fedgmr,seed=1", "method=fedavg,seed=0",
                                       "method=fedavg,seed=1"]  # one-valued axes stay out of names
    assert cells[3].overrides == {"run.max_time": 50, "method": "fedavg", "seed": 1, "clients.heterogeneity": "high"}
    assert {c.base for c in cells} == {"quickstart"}


def test_presets_and_cases_are_axes_too(tmp_path: Path):
    spec = SweepSpec.model_validate({"base": ["quickstart", "mnist"],
                                     "cases": [{"label": "ims", "set": {"network.ims": True}},
                                               {"label": "no-ims", "set": {"network.ims": False}}],
                                     "grid": {"clients.num_clients": [5, 30]}})
    cells = expand(spec, tmp_path)
    assert len(cells) == 8
    assert cells[0].name == "preset=quickstart,case=ims,num_clients=5"
    assert cells[-1].base == "mnist" and cells[-1].overrides == {"network.ims": False, "clients.num_clients": 30}


def test_named_case_axes_are_one_axis_each_applied_in_order(tmp_path: Path):
    spec = SweepSpec.model_validate({"base": "quickstart", "set": {"run.max_time": 50},
                                     "cases": {"tier": [{"label": "full", "set": {"clients.heterogeneity": "medium"}},
                                                        {"label": "half", "set": {"clients.heterogeneity": "low",
                                                                                  "run.max_time": 60}}],
                                               "policy": [{"label": "nested", "set": {"submodel.policy": "magnitude"}},
                                                          {"label": "own", "set": {"submodel.policy": "random",
                                                                                   "submodel.per_client": True,
                                                                                   "run.max_time": 70}}]},
                                     "grid": {"seed": [0]}})
    cells = expand(spec, tmp_path)
    assert [c.name for c in cells] == ["tier=full,policy=nested", "tier=full,policy=own", "tier=half,policy=nested",
                                       "tier=half,policy=own"]
    assert cells[1].point == {"tier": "full", "policy": "own", "seed": 0}
    assert cells[2].overrides == {"run.max_time": 60, "clients.heterogeneity": "low", "submodel.policy": "magnitude",
                                  "seed": 0}
    assert cells[3].overrides["run.max_time"] == 70  # the later axis wins a key both set
    for cases, message in (({"seed": [{"label": "a"}]}, "not 'preset' or a top-level config key"),
                           ({"tier": []}, "case axis 'tier' has no cases"),
                           ({"tier": [{"label": "a"}, {"label": "a"}]}, "case axis 'tier' repeats a label"),
                           ({"a-b": [{"label": "a"}]}, "must be a plain name")):
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump({"base": "quickstart", "cases": cases}))
        with pytest.raises(ConfigError, match=message):
            load_sweep(path)
    clash = SweepSpec.model_validate({"base": "quickstart", "cases": {"lr": [{"label": "a"}]},
                                      "grid": {"lr": [0.1]}})
    with pytest.raises(ConfigError, match="'lr' is both a case axis and a grid key"):
        expand(clash, tmp_path)


def test_a_bad_cell_is_refused_before_anything_runs(tmp_path: Path):
    spec = SweepSpec.model_validate({"base": "quickstart", "grid": {"training.lr": [0.1, -1.0]}})
    cells = expand(spec, tmp_path)
    with pytest.raises(ConfigError, match=r"sweep cell lr=-1.0: invalid value for 'training.lr'"):
        resolve_cells(cells)


def test_sweep_file_errors_name_the_key(tmp_path: Path):
    path = tmp_path / "s.yaml"
    path.write_text("base: quickstart\ngrids: {seed: [0]}\n")
    with pytest.raises(ConfigError, match="unknown key 'grids'"):
        load_sweep(path)
    path.write_text("base: quickstart\ngrid: {seed: []}\n")
    with pytest.raises(ConfigError, match="axis 'seed' has no values"):
        load_sweep(path)
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_sweep(path)
    proc = _in_process("sweep", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "missing.yaml" in proc.stderr


# ---------------------------------------------------------------------- running
@pytest.mark.slow
def test_sweep_runs_every_cell_and_a_rerun_redoes_nothing(tmp_path: Path):
    sweep = _sweep_file(tmp_path, {"method": ["fedgmr", "fedavg"], "seed": [0, 1]})
    out = tmp_path / "out"
    proc = _fedgmr("sweep", str(sweep), "--out", str(out), "--jobs", "2")
    assert proc.returncode == 0, proc.stderr
    index = _index(out)
    assert [c["status"] for c in index["cells"]] == ["done"] * 4
    for cell in index["cells"]:
        summary = json.loads((out / cell["name"] / "summary.json").read_text())
        assert summary["method"] == cell["overrides"]["method"] and summary["seed"] == cell["overrides"]["seed"]
        assert summary["steps"] == 6 and cell["final_accuracy"] == summary["final_accuracy"]
    stamps = {c["name"]: (out / c["name"] / "summary.json").stat().st_mtime_ns for c in index["cells"]}
    again = _fedgmr("sweep", str(sweep), "--out", str(out), "--jobs", "2")
    assert again.returncode == 0, again.stderr
    assert "4/4 cells done (4 already finished, 0 resumed)" in again.stdout
    assert stamps == {c: (out / c / "summary.json").stat().st_mtime_ns for c in stamps}


def test_a_blind_sweep_shows_no_accuracy_and_records_the_same(tmp_path: Path):
    """``--blind`` (a protocol's grid, read only when complete): the progress lines and each
    cell's log carry no accuracy, on the first pass and on a rerun that skips the cells; the
    runs' records are byte for byte those of the same sweep run plainly."""
    sweep = _sweep_file(tmp_path, {"seed": [0, 1]})
    blind, plain = tmp_path / "blind", tmp_path / "plain"
    first = _fedgmr("sweep", str(sweep), "--out", str(blind), "--jobs", "2", "--blind")
    assert first.returncode == 0, first.stderr
    done = [ln for ln in first.stderr.splitlines() if "] done" in ln]
    assert len(done) == 2 and not [ln for ln in done if "acc" in ln], first.stderr
    shown = _fedgmr("sweep", str(sweep), "--out", str(plain), "--jobs", "2")
    assert shown.returncode == 0, shown.stderr
    # the index of the blind pass holds no accuracy (a diff of sweep.json shows none); the plain one does
    entries = {d: json.loads((d / "sweep.json").read_text())["cells"] for d in (blind, plain)}
    assert all(e["status"] == "done" and e["steps"] > 0 for d in entries for e in entries[d]), entries
    assert not [k for e in entries[blind] for k in e if "accuracy" in k or k == "acc_at_t_star"], entries[blind]
    assert all("final_accuracy" in e for e in entries[plain]), entries[plain]
    for name in ("seed=0", "seed=1"):
        assert (blind / name / "metrics.jsonl").read_bytes() == (plain / name / "metrics.jsonl").read_bytes()
        log = (blind / "logs" / f"{name}.log").read_text()
        assert "finished at t=" in log and "accuracy" not in log, log
        assert "final accuracy" in (plain / "logs" / f"{name}.log").read_text()
    # a rerun of finished cells starts no process: in this process, a line per cell off a terminal
    rerun_proc, plain_proc = (_in_process("sweep", str(sweep), "--out", str(d), *flag)
                              for d, flag in ((blind, ["--blind"]), (plain, [])))
    assert rerun_proc.returncode == 0 and plain_proc.returncode == 0, rerun_proc.stderr + plain_proc.stderr
    rerun, plain_rerun = rerun_proc.stderr.splitlines(), plain_proc.stderr.splitlines()
    assert [ln for ln in rerun if "skipped (done)" in ln] and not [ln for ln in rerun if "acc" in ln], rerun
    assert [ln for ln in plain_rerun if "skipped (done)" in ln and "acc " in ln], plain_rerun
    rerun_index = json.loads((blind / "sweep.json").read_text())["cells"]
    assert not [k for e in rerun_index for k in e if k in ("final_accuracy", "acc_at_t_star")], rerun_index


@pytest.mark.slow
def test_a_table_groups_a_sweep_by_its_cases(tmp_path: Path):
    """`--rows case` reads each cell's case from sweep.json - also from an index written
    before cells recorded their point (the case is expanded again from the kept spec)."""
    sweep = _sweep_file(tmp_path, {"seed": [0, 1]}, cases=[{"label": "plain", "set": {"method": "fedavg"}},
                                                            {"label": "masked", "set": {"method": "fedgmr"}}])
    out = tmp_path / "out"
    proc = _fedgmr("sweep", str(sweep), "--out", str(out), "--jobs", "2")
    assert proc.returncode == 0, proc.stderr
    assert [c["point"] for c in _index(out)["cells"]] == [{"case": c, "seed": s} for c in ("plain", "masked")
                                                          for s in (0, 1)]

    def table() -> list[str]:
        got = _in_process("table", str(out), "--t-star", "0", "--window", "1000", "--rows", "case", "--format", "csv")
        assert got.returncode == 0, got.stderr
        return got.stdout.splitlines()

    lines = table()
    assert [line.split(",")[0] for line in lines[1:3]] == ["plain", "masked"]
    index = _index(out)
    for cell in index["cells"]:
        del cell["point"]
    (out / "sweep.json").write_text(json.dumps(index))
    assert table() == lines


@pytest.mark.slow
def test_a_table_puts_one_case_axis_in_rows_and_another_in_columns(tmp_path: Path):
    cases = {"agg": [{"label": "ma", "set": {"aggregation.rule": "ma"}},
                     {"label": "fa", "set": {"aggregation.rule": "fa"}}],
             "coord": [{"label": "async", "set": {"coordination.mode": "semi_async"}},
                       {"label": "sync", "set": {"coordination.mode": "sync"}}]}
    sweep = _sweep_file(tmp_path, {"seed": [0]}, cases=cases)
    out = tmp_path / "out"
    proc = _fedgmr("sweep", str(sweep), "--out", str(out), "--jobs", "2", "--only", "coord=sync,async")
    assert proc.returncode == 0, proc.stderr
    got = _in_process("table", str(out), "--t-star", "0", "--window", "1000", "--rows", "agg", "--cols", "coord",
                      "--format", "csv")
    assert got.returncode == 0, got.stderr
    rows = [line.split(",") for line in got.stdout.splitlines()]
    header = rows[0]
    cells = {(r[header.index("agg")], r[header.index("coord")]): r for r in rows[1:]}
    assert set(cells) == {(a, c) for a in ("ma", "fa") for c in ("async", "sync")}
    for (agg, coord), row in cells.items():  # each cell holds its own run's accuracy
        config = yaml.safe_load((out / f"agg={agg},coord={coord}" / "config.yaml").read_text())
        assert (config["aggregation"]["rule"], config["coordination"]["mode"]) == (
            agg, {"async": "semi_async", "sync": "sync"}[coord])
        lines = (out / f"agg={agg},coord={coord}" / "metrics.jsonl").read_text().splitlines()
        accs = [r["accuracy"] for r in map(json.loads, lines) if r["time"] < 1000]  # the window [-1000, 1000)
        assert abs(float(row[header.index("mean")]) - sum(accs) / len(accs)) < 1e-12


@pytest.mark.slow
def test_only_runs_part_of_the_grid_and_a_full_pass_then_skips_it(tmp_path: Path):
    sweep = _sweep_file(tmp_path, {"method": ["fedgmr", "fedavg"], "seed": [0, 1]})
    out = tmp_path / "out"
    dry = _in_process("sweep", str(sweep), "--out", str(out), "--only", "seed=1", "--only", "method=fedavg",
                      "--dry-run")
    assert dry.returncode == 0 and dry.stdout.splitlines()[0].split() == ["new", "method=fedavg,seed=1"]
    proc = _fedgmr("sweep", str(sweep), "--out", str(out), "--only", "seed=1", "--only", "method=fedavg")
    assert proc.returncode == 0, proc.stderr
    assert "1/1 cells done" in proc.stdout
    ran = sorted(p.parent.name for p in out.glob("*/summary.json"))
    assert ran == ["method=fedavg,seed=1"]  # the grid's own cell name, not a shorter one
    index = _index(out)  # the whole grid, the other cells pending
    assert {c["name"]: c["status"] for c in index["cells"]} == {
        "method=fedgmr,seed=0": "pending", "method=fedgmr,seed=1": "pending",
        "method=fedavg,seed=0": "pending", "method=fedavg,seed=1": "done"}
    # another part: the first part stays in the index as done
    proc = _fedgmr("sweep", str(sweep), "--out", str(out), "--only", "method=fedgmr,fedavg", "--only", "seed=0")
    assert proc.returncode == 0, proc.stderr
    assert [c["status"] for c in _index(out)["cells"]] == ["done", "pending", "done", "done"]
    full = _fedgmr("sweep", str(sweep), "--out", str(out))
    assert "4/4 cells done (3 already finished, 0 resumed)" in full.stdout, full.stdout + full.stderr
    for bad, message in (("seed=7", "no cell has 7 (values: 0, 1)"), ("lr=0.1", "is not an axis"),
                         ("seed", "expects axis=value")):
        proc = _in_process("sweep", str(sweep), "--out", str(out), "--only", bad)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr


@pytest.mark.slow
def test_a_failing_cell_is_reported_and_the_others_finish(tmp_path: Path):
    # the mnist loader on an empty directory fails at run time, after validation
    empty = tmp_path / "no-data"
    empty.mkdir()
    sweep = _sweep_file(tmp_path, {"data.name": ["digits", "mnist"]},
                        set_={"data.root": str(empty)})
    out = tmp_path / "out"
    proc = _fedgmr("sweep", str(sweep), "--out", str(out), "--jobs", "2")
    assert proc.returncode == 1
    assert "1 of 2 cells failed" in proc.stderr
    cells = {c["name"]: c for c in _index(out)["cells"]}
    assert cells["name=digits"]["status"] == "done" and (out / "name=digits" / "summary.json").exists()
    assert cells["name=mnist"]["status"] == "failed"
    assert cells["name=mnist"]["error"].startswith("error: ") and str(empty) in cells["name=mnist"]["error"]


def _pids_with(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def _sweep_caught_mid_cell(tmp_path: Path) -> tuple[Path, Path, subprocess.Popen]:
    """A three-cell sweep (``--jobs 1``), returned once its first cell is done and its second
    has written a checkpoint: (sweep file, sweep directory, the sweep's process)."""
    sweep = _sweep_file(tmp_path, {"seed": [0, 1, 2]},
                        set_={"run.max_steps": 40, "run.checkpoint_every": 2})
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "fedgmr", "sweep", str(sweep), "--out", str(out), "--jobs", "1"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + scaled(600)
    while not ((out / "seed=0" / "summary.json").exists() and (out / "seed=1" / "checkpoint" / "state.json").exists()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the sweep made no progress"
        time.sleep(0.1)
    return sweep, out, proc


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_terminated_sweep_stops_its_cells_records_them_pending_and_says_how_to_continue(tmp_path: Path):
    """`kill PID` (SIGTERM, as SLURM's scancel sends) ends a sweep as Ctrl-C does."""
    sweep, out, proc = _sweep_caught_mid_cell(tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=scaled(120))
    assert proc.returncode == 130, err
    assert "interrupted: rerun the same command to continue" in err
    assert not _pids_with(str(out / "seed=1")), "the running cell outlived its sweep"
    status = {c["name"]: c["status"] for c in _index(out)["cells"]}
    assert status == {"seed=0": "done", "seed=1": "pending", "seed=2": "pending"}
    rerun = _fedgmr("sweep", str(sweep), "--out", str(out), "--jobs", "1")
    assert rerun.returncode == 0, rerun.stderr
    assert "3/3 cells done (1 already finished, 1 resumed)" in rerun.stdout


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_sweep_resumes_without_redoing_finished_cells(tmp_path: Path):
    sweep, out, proc = _sweep_caught_mid_cell(tmp_path)
    second = out / "seed=1"
    proc.send_signal(signal.SIGKILL)  # kill -9: no handler runs
    proc.wait(timeout=scaled(60))
    deadline = time.monotonic() + scaled(600)
    while _pids_with(str(second)):  # its running cell dies with it
        assert time.monotonic() < deadline, "the running cell outlived its sweep"
        time.sleep(0.1)
    assert not (second / "summary.json").exists()
    first = (out / "seed=0" / "summary.json").stat().st_mtime_ns
    rerun = _fedgmr("sweep", str(sweep), "--out", str(out), "--jobs", "1")
    assert rerun.returncode == 0, rerun.stderr
    assert "3/3 cells done (1 already finished, 1 resumed)" in rerun.stdout
    assert (out / "seed=0" / "summary.json").stat().st_mtime_ns == first
    steps = [json.loads(line)["step"] for line in (second / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 40  # one run's records, no duplicates


@pytest.mark.slow
def test_sweep_cells_as_ray_tasks(tmp_path: Path):
    pytest.importorskip("ray")
    sweep = _sweep_file(tmp_path, {"seed": [0, 1]})
    out = tmp_path / "out"
    proc = _fedgmr("sweep", str(sweep), "--out", str(out), "--executor", "ray")
    assert proc.returncode == 0, proc.stderr
    assert [c["status"] for c in _index(out)["cells"]] == ["done", "done"]
    local = tmp_path / "local"
    assert _fedgmr("sweep", str(sweep), "--out", str(local), "--jobs", "2").returncode == 0
    for cell in ("seed=0", "seed=1"):  # the same seed gives the same metrics on every executor
        assert (out / cell / "metrics.jsonl").read_text() == (local / cell / "metrics.jsonl").read_text()


def test_every_shipped_sweep_file_resolves_to_valid_cells(tmp_path: Path):
    from fedgmr.experiment.sweep import SHIPPED, shipped_sweeps

    names = shipped_sweeps()
    assert {"table1", "table1_shakespeare", "table3", "table7", "table8", "table9", "table11",
            "paper/table1_femnist", "paper/table8_femnist", "paper/table9_femnist"} <= set(names)
    for name in names:
        spec, root = load_sweep(name, overrides=["data.root=/your/copy"] if name.startswith("paper/") else [])
        assert root == (SHIPPED / name).parent
        text = (SHIPPED / f"{name}.yaml").read_text()
        if name.split("/")[-1].startswith("table"):  # which table of the paper it stands for
            assert text.splitlines()[0].startswith("# Table "), name
        else:  # the other comparisons say what they compare and how to tabulate them
            assert text.startswith("# ") and ("fedgmr table" in text or name == "demo"), name
        cells = expand(spec, root)
        resolve_cells(cells)
        assert len({c.name for c in cells}) == len(cells) > 1
        # the header's `fedgmr table` command names keys these cells have, unambiguously
        keys = set(flatten_config(cells[0].config.model_dump(mode="json"))) | set(cells[0].point)
        for line in text.splitlines():
            if line.startswith("#") and "fedgmr table " in line:
                words = shlex.split(line.lstrip("# "))
                for flag in ("--rows", "--cols"):
                    if flag in words:
                        for short in words[words.index(flag) + 1].split(","):
                            _resolve_key(short, keys)  # ConfigError: unknown or ambiguous
    # Table 7's w/o (Buff, IMS) row changes two keys at once
    spec, root = load_sweep("table7")
    both = [c for c in expand(spec, root) if c.overrides.get("network.ims") is False]
    assert both and {c.overrides["method"] for c in both} == {"fedgmr_wo_buffer"}


def test_progress_lines_give_each_cells_wall_time_and_an_estimate_of_the_rest(monkeypatch, capsys):
    """Off a terminal each finished cell's line ends with its wall time and, while cells are
    left, the time they should take at the pace of this sweep's cells so far, as many at once
    as the sweep runs; a skipped cell has neither, and a blind sweep's lines no accuracy."""
    from types import SimpleNamespace

    import fedgmr.cli as cli

    clock = iter([0.0, 0.0, 600.0, 700.0, 1300.0, 1330.0])  # two cells start; one ends at 600 s, ...
    monkeypatch.setattr(cli.time, "monotonic", lambda: next(clock))
    cells = {n: SimpleNamespace(name=n, result={"acc_at_t_star": 0.9}, error=None) for n in "abcde"}
    display = cli._SweepDisplay(enabled=True, live=False, blind=True)
    display.event("skip", cells["e"], 1, 5)
    display.event("start", cells["a"], 1, 5)
    display.event("start", cells["b"], 1, 5)
    display.event("done", cells["a"], 2, 5)      # 600 s; 3 left at 600 s each, 2 at once: 900 s
    display.event("start", cells["c"], 2, 5)     # at 700 s
    display.event("done", cells["b"], 3, 5)      # 1,300 s; mean 950 s, 2 left, 2 at once: 950 s
    display.event("done", cells["c"], 4, 5)      # 630 s; mean 843 s, 1 left: 422 s
    done = "done".ljust(15)
    assert capsys.readouterr().err.splitlines() == [
        "[1/5] skipped (done)  e", f"[2/5] {done} a  (10 min 00 s; about 15 min 00 s left)",
        f"[3/5] {done} b  (21 min 40 s; about 15 min 50 s left)", f"[4/5] {done} c  (10 min 30 s; about 7 min 02 s left)"]
    assert [cli._duration(s) for s in (42.4, 60, 3599.6, 7500)] == ["42 s", "1 min 00 s", "1 h 00 min", "2 h 05 min"]


def _cell(name: str, status: str = "pending", wall: float | None = None, **point: Any):
    from fedgmr.experiment.sweep import Cell

    return Cell(name, "base", {}, status=status, point=point,
                result={} if wall is None else {"wall_time_s": wall})


def test_a_cell_is_expected_to_take_what_finished_cells_like_it_took():
    """Same task and method required; among those the same column first (every axis but
    the seed); none finished like it: no expectation. Pending or failed cells never count."""
    from fedgmr.experiment.sweep import expected_wall_times

    known = [_cell("a0", "done", 100.0, preset="p", method="a", het="high", seed=0),
             _cell("a1", "done", 300.0, preset="p", method="a", het="high", seed=1),
             _cell("a9", "done", 900.0, preset="p", method="a", het="low", seed=0),
             _cell("b0", "done", 50.0, preset="p", method="b", het="low", seed=0),
             _cell("q0", "done", 7.0, preset="q", method="c", het="low", seed=0),
             _cell("c0", "failed", 5.0, preset="p", method="c", het="low", seed=0),
             _cell("c1", "pending", 5.0, preset="p", method="c", het="low", seed=1)]
    todo = [_cell("a2", preset="p", method="a", het="high", seed=2),   # its column: 100 and 300
            _cell("a5", preset="p", method="a", het="medium", seed=0),  # no column match: every "a"
            _cell("b5", preset="p", method="b", het="high", seed=0),    # the only "b"
            _cell("c2", preset="p", method="c", het="low", seed=2),     # "c" on task q only, failed or pending on p
            _cell("x", seed=0)]                                         # no task or method axis
    expected_wall_times(todo, known + todo)
    assert [c.expected_s for c in todo] == [200.0, 1300.0 / 3, 50.0, None, None]


def test_a_cell_left_to_another_sweep_leaves_the_estimate(monkeypatch, capsys):
    """A queued cell that another sweep into the same folder turns out to run (a ``left``
    event, at its start or after its process was refused) is out of this sweep's plan: the
    estimate no longer counts it, and its line says where it went, with no accuracy."""
    from types import SimpleNamespace

    import fedgmr.cli as cli

    clock = iter([0.0, 0.0, 100.0])
    monkeypatch.setattr(cli.time, "monotonic", lambda: next(clock))
    cell = {n: SimpleNamespace(name=n, result={"acc_at_t_star": 0.9}, error=None, expected_s=e)
            for n, e in (("a", 100.0), ("b", 1000.0), ("c", 100.0), ("d", 1000.0))}
    display = cli._SweepDisplay(enabled=True, live=False, blind=False)
    for c in cell.values():
        display.event("queued", c, 0, 4)
    display.event("start", cell["a"], 0, 4)  # at 0 s
    display.event("start", cell["b"], 0, 4)  # at 0 s
    display.event("left", cell["b"], 1, 4)   # refused: the other sweep holds it
    display.event("left", cell["d"], 2, 4)   # claimed by the other sweep before it started here
    display.event("done", cell["a"], 3, 4)   # at 100 s, as expected: pace 1; left: c alone, 100 s, 2 at once: 50 s
    left = "left to another sweep"
    assert capsys.readouterr().err.splitlines() == [
        f"[1/4] {left} b", f"[2/4] {left} d", f"[3/4] {'done'.ljust(15)} a  acc 90.00%  (1 min 40 s; about 50 s left)"]
    assert display.queued == {"c": 100.0} and display.running == set()


def test_progress_estimate_sums_the_cells_left_at_their_expected_times(monkeypatch, capsys):
    """With the sweep's plan (``queued`` events), the estimate is each unfinished cell's
    expected time scaled by how the finished ones compared with theirs, less what a running
    cell has had, over the cells run at once; a cell with no expectation at the pace so far.
    A column's slow methods queued last are then counted at their own cost."""
    from types import SimpleNamespace

    import fedgmr.cli as cli

    clock = iter([0.0, 0.0, 100.0, 100.0, 400.0])
    monkeypatch.setattr(cli.time, "monotonic", lambda: next(clock))
    cell = {n: SimpleNamespace(name=n, result={}, error=None, expected_s=e)
            for n, e in (("fast", 50.0), ("fast2", 50.0), ("slow", 1000.0), ("slow2", 1000.0), ("new", None))}
    display = cli._SweepDisplay(enabled=True, live=False, blind=True)
    for c in cell.values():
        display.event("queued", c, 0, 5)
    display.event("start", cell["fast"], 0, 5)   # at 0 s
    display.event("start", cell["slow"], 0, 5)   # at 0 s
    display.event("done", cell["fast"], 1, 5)    # at 100 s: took 100 s for an expected 50: pace 2
    # left: slow 2,000 - 100 had = 1,900; fast2 100; slow2 2,000; new at the mean so far, 100;
    # 4,100 s over 2 at once: 2,050 s (the old estimate, 4 x 100 / 2, said 200 s)
    display.event("start", cell["fast2"], 1, 5)  # at 100 s
    display.event("done", cell["fast2"], 2, 5)   # at 400 s: took 300 for 50; pace (100 + 300) / 100 = 4
    # left: slow 4,000 - 400 = 3,600; slow2 4,000; new at the mean 200: 7,800 / 2 = 3,900 s
    done = "done".ljust(15)
    assert capsys.readouterr().err.splitlines() == [
        f"[1/5] {done} fast  (1 min 40 s; about 34 min 10 s left)",
        f"[2/5] {done} fast2  (5 min 00 s; about 1 h 05 min left)"]


def test_a_later_pass_expects_each_cell_to_take_what_its_methods_cells_took(tmp_path: Path):
    """On disk, through run_sweep: the pass over seed 1 is told (``queued``, before any cell
    starts) that each cell should take what the same method's seed-0 cell recorded in its
    summary, from the earlier pass; the first pass, with nothing finished, expects nothing."""
    from fedgmr.experiment.sweep import run_sweep

    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(tiny_config(run={"max_steps": 4, "eval_every": 2})))
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "base": "base.yaml",
                                    "grid": {"method": ["fedavg", "fedasync"], "seed": [0, 1]}}))
    spec, root = load_sweep(path)
    out = tmp_path / "out"
    events: list[tuple[str, str, Any]] = []

    def record(kind: str, cell: Any, finished: int, total: int) -> None:
        events.append((kind, cell.name, cell.expected_s if kind == "queued" else None))

    run_sweep(spec, path, root, out, jobs=1, on_event=record, only={"seed": ["0"]})
    assert [(k, e) for k, _, e in events if k == "queued"] == [("queued", None)] * 2
    took = {m: json.loads((out / f"method={m},seed=0" / "summary.json").read_text())["wall_time_s"]
            for m in ("fedavg", "fedasync")}
    events.clear()
    run_sweep(spec, path, root, out, jobs=1, on_event=record, only={"seed": ["1"]})
    queued = [(n, e) for k, n, e in events if k == "queued"]
    assert queued == [(f"method={m},seed=1", took[m]) for m in ("fedavg", "fedasync")]
    assert [k for k, *_ in events].index("start") > max(i for i, (k, *_) in enumerate(events) if k == "queued")
