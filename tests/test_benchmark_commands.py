"""The `python benchmarks/...` commands shown in README.md and docs/ name scripts that ship
and options those scripts accept (each script's ``parser()`` parses the documented
arguments exactly); and `benchmarks/vs_flower.py` runs, on a tiny workload, the way a user
runs it."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
PATTERN = re.compile(r"python (benchmarks/[\w]+\.py)([^`\n]*)")


def _commands() -> list[tuple[str, str, str]]:
    found = []
    for doc in DOCS:
        for m in PATTERN.finditer(doc.read_text()):
            args = m.group(2).split(" #")[0].strip()
            found.append((f"{doc.relative_to(REPO)}: {m.group(0).strip()}", m.group(1), args))
    return found


COMMANDS = _commands()


def _module(script: str):
    spec = importlib.util.spec_from_file_location(Path(script).stem, REPO / script)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_docs_show_benchmark_commands():
    scripts = {s for _, s, _ in COMMANDS}
    assert {"benchmarks/sim_overhead.py", "benchmarks/vs_flower.py", "benchmarks/memory_clients.py"} <= scripts


@pytest.mark.parametrize("where,script,args", COMMANDS, ids=[w for w, _, _ in COMMANDS])
def test_documented_benchmark_command_parses(where: str, script: str, args: str):
    assert (REPO / script).is_file(), f"{where}: {script} does not ship"
    try:
        _module(script).parser().parse_args(shlex.split(args))
    except SystemExit as exc:  # argparse's way of refusing
        pytest.fail(f"{where}: the script refuses {args!r} (exit {exc.code})")


@pytest.mark.slow
def test_vs_flower_runs_and_prints_each_runtime_with_its_ratio():
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "benchmarks/vs_flower.py", "--repeats", "1", "--rounds", "2", "--warmup", "1",
                          "--clients", "3", "--runtimes", "bare", "bare_parallel", "serial", "process"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert "3 clients x 5 local steps" in lines[0] and "1 warm-up + 2 measured rounds" in lines[0]
    rows = {name: line for name in ("bare PyTorch loop", "bare loop, 2 forked processes", "fedgmr simulator, serial",
                                    "fedgmr simulator, process pool x2")
            for line in lines if line.startswith(name)}
    assert len(rows) == 4, out.stdout
    for name, line in rows.items():
        s_per_round, mem = float(line[40:].split()[0]), float(line.split()[-3])
        assert s_per_round > 0 and mem > 50, line  # a process tree with torch loaded: tens of MB at least
    assert rows["bare PyTorch loop"].endswith("1.00x time")
    assert any(line.startswith("process pool / serial speed-up: ") for line in lines)
    ceiling = [line for line in lines if line.startswith("bare loop in 2 processes / bare loop: ")]
    assert len(ceiling) == 1 and "the process pool's speed-up is " in ceiling[0], out.stdout


def test_flower_deployment_rate_is_read_between_the_warmup_and_the_last_step():
    mod = _module("benchmarks/flower_deployment.py")
    records = [{"step": 0, "wall_time": 0.5}, {"step": 1, "wall_time": 9.0}, {"step": 2, "wall_time": 12.0},
               {"step": 4, "wall_time": 21.0}]
    assert mod.steps_per_minute(records, 1, "wall_time") == 60.0 * 3 / 12.0
    cfg = mod.raw_config(mod.parser().parse_args(["--nodes", "5", "--steps", "6", "--warmup", "1"]))
    assert cfg["clients"]["num_clients"] == 5 and cfg["run"]["max_steps"] == 7 and cfg["run"]["eval_every"] == 1


@pytest.mark.slow
def test_flower_deployment_runs_its_simulator_mode():
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "benchmarks/flower_deployment.py", "--repeats", "1", "--steps", "2",
                          "--warmup", "1", "--nodes", "3", "--modes", "simulator"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    row = next(line for line in out.stdout.splitlines() if line.startswith("fedgmr simulator, serial"))
    assert float(row.split()[3]) > 0 and row.endswith("1.00x"), out.stdout


def test_table1_cells_compares_every_field_but_the_resumed_cells_upload_counts():
    mod = _module("benchmarks/table1_cells.py")
    want = [{"time": 1800.0, "accuracy": 0.9, "loss": 0.3, "uploads": 10, "client_uploads": [5, 5]}]
    same_but_counts = [{**want[0], "client_uploads": [1, 9]}]
    assert mod._differences(same_but_counts, want) == []
    assert mod._differences([{**want[0], "loss": 0.30000001}], want) == [
        "record 0 (time 1800.0): loss 0.30000001 != 0.3"]
    assert mod._differences([{**want[0], "extra": 1}], want)  # a field only one side has
    assert mod._differences([], want) == ["0 records against 1"]


def test_table1_cells_picks_each_methods_one_matching_cell(tmp_path):
    mod = _module("benchmarks/table1_cells.py")
    for method in ("fedavg", "fiarse"):
        for seed in (0, 1):
            cell = tmp_path / f"preset=mnist,method={method},heterogeneity=high,partition=dirichlet,seed={seed}"
            cell.mkdir()
            (cell / "config.yaml").write_text("name: x\n")
            (cell / "metrics.jsonl").write_text("")
    picked = mod._cells(tmp_path, ["fiarse", "fedavg"], mod._selection(["seed=1"]))
    assert {m: p.name for m, p in picked.items()} == {
        "fiarse": "preset=mnist,method=fiarse,heterogeneity=high,partition=dirichlet,seed=1",
        "fedavg": "preset=mnist,method=fedavg,heterogeneity=high,partition=dirichlet,seed=1"}
    assert mod._point(picked["fedavg"])["preset"] == "mnist"
    with pytest.raises(SystemExit, match="fedavg: 2 recorded cells"):
        mod._cells(tmp_path, ["fedavg"], mod._selection(["seed=0,1"]))
    with pytest.raises(SystemExit, match="fjord: 0 recorded cells"):
        mod._cells(tmp_path, ["fjord"], mod._selection([]))
