"""The command line, exercised as a user would: real files on disk. The commands run in this
process (``conftest.run_cli``: the same code without an interpreter and PyTorch start-up
per command); a run and the listings go through the installed ``fedgmr`` entry point in a
subprocess of its own, and tests/test_run_dir.py kills a run with SIGKILL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import fedgmr_in_process, tiny_config

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "FEDGMR_PROGRESS": "0"}


def fedgmr(*args: str, check: bool = True, env: dict | None = None) -> Any:
    """``fedgmr ARGS`` in this process (``env``: variables set for the command)."""
    return fedgmr_in_process(*args, check=check, env=env)


def installed(*args: str) -> subprocess.CompletedProcess:
    """``fedgmr ARGS`` through the installed console script (``python -m fedgmr`` where the
    script is not next to this Python), in a process of its own."""
    script = Path(sys.executable).with_name("fedgmr")
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "fedgmr"]
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, env=ENV, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"fedgmr {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def write_config(path: Path, **sections) -> Path:
    path.write_text(yaml.safe_dump(tiny_config(**sections)))
    return path


def test_run_writes_the_run_directory(tmp_path: Path):
    cfg = write_config(tmp_path / "tiny.yaml")
    out = tmp_path / "run"
    proc = installed("run", str(cfg), "--out", str(out), "-q")
    assert "final accuracy" in proc.stdout
    resolved = yaml.safe_load((out / "config.yaml").read_text())
    assert resolved["method"] == "fedgmr" and resolved["training"]["local_steps"] == 2
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for key in ("time", "step", "accuracy", "loss", "avg_density", "bytes_up", "bytes_down"):
        assert key in rows[-1]
    summary = json.loads((out / "summary.json").read_text())
    for key in ("method", "final_accuracy", "time", "steps"):
        assert key in summary
    assert summary["steps"] == 30 and summary["final_accuracy"] == rows[-1]["accuracy"]
    assert (out / "accuracy_density.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_same_seed_twice_gives_identical_metrics_files(tmp_path: Path):
    cfg = write_config(tmp_path / "tiny.yaml")
    fedgmr("run", str(cfg), "--out", str(tmp_path / "a"), "-q")
    fedgmr("run", str(cfg), "--out", str(tmp_path / "b"), "-q")
    assert (tmp_path / "a" / "metrics.jsonl").read_bytes() == (tmp_path / "b" / "metrics.jsonl").read_bytes()


@pytest.mark.parametrize("args, needle", [
    (["--set", "trainingg.lr=0.1"], "unknown config key 'trainingg'"),
    (["--set", "training.lrr=0.1"], "unknown config key 'training.lrr'"),
    (["--set", "training.lr=-1"], "'training.lr'"),
    (["--set", "data.partition=random"], "'data.partition'"),
    (["--set", "method=nosuch"], "unknown method 'nosuch'"),
    (["--set", "method=fedavg", "--set", "coordination.mode=semi_async"], "fixed to 'sync' by method 'fedavg'"),
])
def test_bad_key_or_value_is_one_line_and_exit_code_2(tmp_path: Path, args, needle):
    cfg = write_config(tmp_path / "tiny.yaml")
    proc = fedgmr("run", str(cfg), "--out", str(tmp_path / "x"), "-q", *args, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0]


def test_bad_key_in_the_config_file(tmp_path: Path):
    raw = tiny_config()
    raw["network"]["bandwidth"] = 3
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(raw))
    proc = fedgmr("run", str(tmp_path / "bad.yaml"), "--out", str(tmp_path / "x"), check=False)
    assert proc.returncode == 2 and "unknown config key 'network.bandwidth'" in proc.stderr


def test_malformed_config_file(tmp_path: Path):
    (tmp_path / "bad.yaml").write_text("data: [unclosed\n")
    proc = fedgmr("run", str(tmp_path / "bad.yaml"), "--out", str(tmp_path / "x"), check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_set_method_switches_and_compare_reports(tmp_path: Path):
    cfg = write_config(tmp_path / "tiny.yaml")
    for m in ("fedgmr", "fedavg", "fedgmr_wo_gmr"):
        fedgmr("run", str(cfg), "--out", str(tmp_path / m), "-q", "--set", f"method={m}")
    assert yaml.safe_load((tmp_path / "fedavg" / "config.yaml").read_text())["coordination"]["mode"] == "sync"
    dirs = [str(tmp_path / m) for m in ("fedgmr", "fedavg", "fedgmr_wo_gmr")]
    table = fedgmr("compare", *dirs, "--t-star", "10").stdout
    assert "Acc@t*" in table and "MRI of fedgmr over fedavg, fedgmr_wo_gmr" in table
    data = json.loads(fedgmr("compare", *dirs, "--t-star", "10", "--json").stdout)
    assert [r["method"] for r in data["runs"]] == ["fedgmr", "fedavg", "fedgmr_wo_gmr"]
    assert isinstance(data["mri"], float)
    png = tmp_path / "cmp.png"
    fedgmr("plot", *dirs, "--out", str(png))
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_refuses_to_overwrite_a_run(tmp_path: Path):
    cfg = write_config(tmp_path / "tiny.yaml", run={"max_steps": 4, "eval_every": 2})
    fedgmr("run", str(cfg), "--out", str(tmp_path / "r"), "-q")
    proc = fedgmr("run", str(cfg), "--out", str(tmp_path / "r"), "-q", check=False)
    assert proc.returncode == 3 and "already holds a run" in proc.stderr
    fedgmr("run", str(cfg), "--out", str(tmp_path / "r"), "-q", "--overwrite")


def test_resume_without_checkpoint_is_a_clear_error(tmp_path: Path):
    cfg = write_config(tmp_path / "tiny.yaml", run={"max_steps": 4, "eval_every": 2, "checkpoint_every": None,
                                                    "checkpoint_seconds": None})
    fedgmr("run", str(cfg), "--out", str(tmp_path / "r"), "-q")
    (tmp_path / "r" / "summary.json").unlink()  # as if killed at the very end
    proc = fedgmr("run", "--resume", str(tmp_path / "r"), check=False)
    assert proc.returncode == 3 and "no checkpoint" in proc.stderr


def test_quickstart_preset_runs_with_progress_bar(tmp_path: Path):
    proc = fedgmr("run", "quickstart", "--out", str(tmp_path / "q"), "--set", "run.max_time=30",
                  env={**ENV, "FEDGMR_PROGRESS": "1"})
    assert "fedgmr" in proc.stdout and "step" in proc.stdout  # the progress line
    assert json.loads((tmp_path / "q" / "summary.json").read_text())["method"] == "fedgmr"


def test_methods_and_presets_are_listed():
    assert "fedgmr_wo_gmr" in installed("methods").stdout
    assert "quickstart" in installed("presets").stdout


def test_custom_experiment_example_runs():
    script = Path(__file__).resolve().parents[1] / "examples" / "custom_experiment.py"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "step  60" in proc.stdout and "final densities" in proc.stdout


def test_toml_config_is_accepted(tmp_path: Path):
    (tmp_path / "tiny.toml").write_text(
        'method = "fedgmr_wo_gmr"\n[model]\nname = "mlp"\n[run]\nmax_steps = 4\neval_every = 2\n')
    fedgmr("run", str(tmp_path / "tiny.toml"), "--out", str(tmp_path / "r"), "-q")
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["steps"] == 4


def test_a_bad_data_path_leaves_no_half_made_run(tmp_path: Path):
    out = tmp_path / "r"
    proc = fedgmr("run", "mnist", "--out", str(out), "--set", f"data.root={tmp_path / 'nowhere'}", check=False)
    assert proc.returncode == 4 and "train-images-idx3-ubyte" in proc.stderr  # DatasetFormatError
    assert not out.exists()
