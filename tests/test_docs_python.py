"""The Python code blocks of README.md run exactly as written.

Each ```python block runs in a fresh interpreter with an empty temporary directory as its
working directory (so a block that writes ``runs/...`` leaves nothing in the repository).
The README keeps its examples short by design (a few dozen virtual seconds), so this stays
a matter of seconds on an idle machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import scaled

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "FEDGMR_PROGRESS": "0"}


def python_blocks(path: Path) -> list[str]:
    """The contents of every fenced ```python block of a markdown file."""
    blocks, current = [], None
    for line in path.read_text(encoding="utf-8").splitlines():
        if current is None:
            if line.strip() == "```python":
                current = []
        elif line.strip() == "```":
            blocks.append("\n".join(current) + "\n")
            current = None
        else:
            current.append(line)
    return blocks


BLOCKS = python_blocks(README)


def test_the_readme_shows_python():
    assert BLOCKS, "README.md has no ```python block"
    assert any("run_experiment(" in b for b in BLOCKS), "the README's API example writes no run directory"


@pytest.mark.slow
@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_block_runs_as_written(code: str, tmp_path: Path):
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=scaled(300))
    assert proc.returncode == 0, f"{code}\n--- stderr ---\n{proc.stderr[-3000:]}"
    if 'run_experiment(cfg, "runs/api")' in code:  # the run directory the README says it writes
        run = tmp_path / "runs" / "api"
        for name in ("config.yaml", "metrics.jsonl", "summary.json", "accuracy_density.png", "checkpoint"):
            assert (run / name).exists(), f"runs/api/{name} is missing"
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["acc_at_t_star"] is not None
