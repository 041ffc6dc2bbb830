"""A run whose server rejected client updates says so: in the run's last line, in the
sweep's report, and as a marked cell in ``fedgmr table`` (caption and CSV), so a figure
produced with a client silently excluded is not read as the method's."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import fedgmr_in_process, scaled

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "FEDGMR_PROGRESS": "0"}

PLUGIN = '''"""An executor that corrupts client 0's every reply with NaN: the server must reject them."""
import dataclasses

import torch

from fedgmr.experiment.build import EXECUTORS
from fedgmr.sim.executor import DoneHandle, SerialExecutor


class NanClientZero(SerialExecutor):
    def submit(self, job):
        out = self.workload.run(job)
        if job.client_id == 0:
            out = dataclasses.replace(out, values=torch.full_like(out.values, float("nan")))
        return DoneHandle(out)


EXECUTORS.register("nan_client0", lambda workload, cfg: NanClientZero(workload))
'''


def fedgmr(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedgmr", *args], capture_output=True, text=True, env=ENV,
                          cwd=cwd, timeout=scaled(900))


@pytest.mark.slow
def test_rejected_updates_are_reported_by_run_and_marked_by_table(tmp_path: Path):
    (tmp_path / "nan_plugin.py").write_text(PLUGIN)
    run = fedgmr("run", "quickstart", "--import", "nan_plugin.py", "--set", "run.executor=nan_client0",
                 "--set", "run.max_time=120", "--set", "run.t_star=100", "-q", "--out", "bad", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    summary = json.loads((tmp_path / "bad" / "summary.json").read_text())
    last = json.loads((tmp_path / "bad" / "metrics.jsonl").read_text().splitlines()[-1])
    # every reply of client 0 and nothing else was rejected
    assert summary["rejected_updates"] == last["client_uploads"][0] > 0
    assert (f"warning: the server rejected {summary['rejected_updates']} of {summary['uploads']} client updates"
            in run.stderr)
    assert "rejected update from client 0" in run.stderr and "from client 1" not in run.stderr

    clean = fedgmr("run", "quickstart", "--set", "run.max_time=120", "--set", "run.t_star=100", "--set", "seed=1",
                   "-q", "--out", "good", cwd=tmp_path)
    assert clean.returncode == 0 and "warning" not in clean.stderr, clean.stderr

    # the tables: in this process (the runs above are processes of their own: --import, and the
    # warnings the installed command's logging prints)
    table = fedgmr_in_process("table", "bad", "good", "--t-star", "100", "--cols", "run.executor", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    lines = {line.split("|")[1].strip(): line for line in table.stdout.splitlines() if line.startswith("| fedgmr")}
    assert lines["fedgmr"].count("†") == 1  # only the executor=nan_client0 column's cell is marked
    assert (f"†: the server rejected client updates in 1 run of the marked cell ({summary['rejected_updates']} "
            "updates in all") in table.stdout
    latex = fedgmr_in_process("table", "bad", "good", "--t-star", "100", "--cols", "run.executor", "--format",
                              "latex", cwd=tmp_path)
    body = latex.stdout.split("\n", 1)[1]  # after the caption's comment line
    assert body.count(r"\textsuperscript{\dag}") == 1 and "†" not in body
    csv = fedgmr_in_process("table", "bad", "good", "--t-star", "100", "--cols", "run.executor", "--format", "csv",
                            cwd=tmp_path)
    frame = pd.read_csv(io.StringIO(csv.stdout)).set_index("run.executor")
    assert frame.loc["nan_client0", "rejected_updates"] == summary["rejected_updates"]
    assert frame.loc["serial", "rejected_updates"] == 0


@pytest.mark.slow
def test_a_sweep_names_the_cells_whose_server_rejected_updates(tmp_path: Path):
    (tmp_path / "nan_plugin.py").write_text(PLUGIN)
    (tmp_path / "rej.yaml").write_text(
        "name: rej\nbase: quickstart\nset: {run.max_time: 60}\nimports: [nan_plugin.py]\n"
        "grid:\n  run.executor: [nan_client0, serial]\n")
    proc = fedgmr("sweep", "rej.yaml", "--out", "sw", "--jobs", "2", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    index = {c["name"]: c for c in json.loads((tmp_path / "sw" / "sweep.json").read_text())["cells"]}
    bad = next(c for name, c in index.items() if "nan_client0" in name)
    good = next(c for name, c in index.items() if "serial" in name)
    assert bad["rejected_updates"] > 0 and good["rejected_updates"] == 0
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("  warning:")]
    assert len(warnings) == 1 and bad["name"] in warnings[0]
    assert f"rejected {bad['rejected_updates']} client updates" in warnings[0]
