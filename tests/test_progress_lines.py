"""`fedgmr run` without a terminal (nohup, SLURM, CI): plain progress lines on stderr
every ``FEDGMR_PROGRESS_EVERY`` seconds; ``-q`` and ``FEDGMR_PROGRESS=0`` silence them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from conftest import scaled, tiny_config
from fedgmr.cli import app

STEPS = 12
LINE = re.compile(r"^progress: step=(?P<step>\d+)/(?P<total>\d+) virtual_time=(?P<time>[\d.]+)s "
                  r"acc=(?P<acc>[\d.]+%|n/a) avg_density=(?P<density>[\d.]+) restorations=(?P<rest>\d+) "
                  r"elapsed=\d+:\d\d:\d\d eta=(?P<eta>\d+:\d\d:\d\d|\?)$")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDGMR_PROGRESS")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_config(run={"max_steps": STEPS, "eval_every": 2})))
    return path


def test_progress_lines_on_a_pipe(tmp_path: Path) -> None:
    # an interval far below a step's duration: a line after every step, and one at the end
    proc = subprocess.Popen([sys.executable, "-m", "fedgmr", "run", str(_config(tmp_path)), "--out",
                             str(tmp_path / "run")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(FEDGMR_PROGRESS_EVERY="1e-9"))
    try:
        lines = [line.rstrip("\n") for line in proc.stderr]  # read as they come, until the run exits
        proc.wait(timeout=scaled(300))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, "\n".join(lines)
    matched = [m for m in map(LINE.match, lines) if m]
    others = [line for line in lines if line.startswith("progress:") and not LINE.match(line)]
    assert not others, others
    steps = [int(m["step"]) for m in matched]
    assert len(steps) >= STEPS // 2 and steps == sorted(steps), steps
    assert all(m["total"] == str(STEPS) for m in matched)
    last = matched[-1]
    assert last["step"] == str(STEPS) and last["eta"] == "0:00:00" and last["acc"].endswith("%")
    times = [float(m["time"]) for m in matched]
    assert times == sorted(times) and times[-1] > 0
    assert 0 < float(last["density"]) <= 1
    assert "final accuracy" in proc.stdout.read()  # type: ignore[union-attr]


def test_quiet_and_progress_0_print_no_progress_lines(tmp_path: Path, monkeypatch) -> None:
    cfg = _config(tmp_path)
    monkeypatch.setenv("FEDGMR_PROGRESS_EVERY", "1e-9")
    monkeypatch.delenv("FEDGMR_PROGRESS", raising=False)
    runner = CliRunner()
    result = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "q"), "-q"])
    assert result.exit_code == 0, result.output
    assert "progress:" not in result.stderr
    monkeypatch.setenv("FEDGMR_PROGRESS", "0")
    result = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "zero")])
    assert result.exit_code == 0, result.output
    assert "progress:" not in result.stderr
    # the same run, not silenced: the lines are there (CliRunner's stderr is no terminal)
    monkeypatch.delenv("FEDGMR_PROGRESS")
    result = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "loud")])
    assert result.exit_code == 0, result.output
    assert sum(bool(LINE.match(line)) for line in result.stderr.splitlines()) >= 1


def test_a_bad_interval_is_one_line_and_exit_code_2(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("FEDGMR_PROGRESS", raising=False)
    for bad in ("soon", "0", "-1", "nan"):
        monkeypatch.setenv("FEDGMR_PROGRESS_EVERY", bad)
        result = CliRunner().invoke(app, ["run", str(_config(tmp_path)), "--out", str(tmp_path / "r")])
        assert result.exit_code == 2, result.output
        assert result.stderr.count("\n") == 1 and "FEDGMR_PROGRESS_EVERY" in result.stderr
        assert not (tmp_path / "r").exists()


def test_blind_progress_lines_and_last_line_show_no_accuracy(tmp_path: Path, monkeypatch) -> None:
    """``fedgmr run --blind``: the same progress lines without their ``acc=`` field and a last
    line that says ``finished``; the records are the plain run's, byte for byte."""
    cfg = _config(tmp_path)
    monkeypatch.setenv("FEDGMR_PROGRESS_EVERY", "1e-9")
    monkeypatch.delenv("FEDGMR_PROGRESS", raising=False)
    runner = CliRunner()
    blind = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "blind"), "--blind"])
    plain = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "plain")])
    assert blind.exit_code == 0 and plain.exit_code == 0, blind.output + plain.output
    lines = [ln for ln in blind.stderr.splitlines() if ln.startswith("progress:")]
    unblind = re.compile(LINE.pattern.replace(r"acc=(?P<acc>[\d.]+%|n/a) ", ""))
    assert len(lines) >= STEPS // 2 and all(unblind.match(ln) for ln in lines), lines
    assert "acc" not in blind.stderr and "accuracy" not in blind.stdout
    assert "finished at t=" in blind.stdout and "final accuracy" in plain.stdout
    assert (tmp_path / "blind" / "metrics.jsonl").read_bytes() == (tmp_path / "plain" / "metrics.jsonl").read_bytes()
