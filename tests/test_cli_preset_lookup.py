"""How the CLI resolves CONFIG: a file wins over a preset, a directory never shadows one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "FEDGMR_PROGRESS": "0"}


def _config(cwd: Path, name: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedgmr", "config", name], capture_output=True, text=True,
                          cwd=cwd, env=ENV, timeout=300)


def test_a_directory_named_like_a_preset_does_not_shadow_it(tmp_path: Path):
    (tmp_path / "quickstart").mkdir()  # e.g. the run directory of an earlier `--out quickstart`
    proc = _config(tmp_path, "quickstart")
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["name"] == "quickstart"


def test_a_file_named_like_a_preset_wins(tmp_path: Path):
    (tmp_path / "quickstart").write_text("name: mine\nrun: {max_steps: 3}\n")
    proc = _config(tmp_path, "quickstart")
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["name"] == "mine"


def test_a_directory_that_is_no_preset_is_one_line_exit_2(tmp_path: Path):
    (tmp_path / "mydir").mkdir()
    proc = _config(tmp_path, "mydir")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "mydir" in proc.stderr
