"""A run directory is a unit: one writer at a time, one run's results only, a resume that
continues only the run its checkpoint belongs to, checkpoints on by default, a failed run
that fails, and workers that die with their parent.

Subprocess tests poll for a condition with generous timeouts (the machine is slow and
busy); none sleeps for a fixed time or checks a wall-clock duration.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from conftest import as_an_ordinary_user, fedgmr_in_process, tiny_config
from fedgmr.errors import RunDirError, RunFailedError
from fedgmr.experiment.build import EXECUTORS
from fedgmr.experiment.runner import run_experiment, saved_config
from fedgmr.methods import resolve_config
from fedgmr.sim.executor import SerialExecutor

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "FEDGMR_PROGRESS": "0"}
TIMEOUT = 600  # seconds: generous, the machine is shared


def fedgmr(*args: str, check: bool = True, own_process: bool = False) -> Any:
    """``fedgmr ARGS``: in this process (``conftest.run_cli``: no interpreter and PyTorch
    start-up per command), or with ``own_process`` in a subprocess, for what must be another
    process (a second writer while this one holds the run directory's lock)."""
    if not own_process:
        return fedgmr_in_process(*args, check=check)
    proc = subprocess.run([sys.executable, "-m", "fedgmr", *args], capture_output=True, text=True, env=ENV,
                          timeout=TIMEOUT)
    if check and proc.returncode != 0:
        raise AssertionError(f"fedgmr {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def error_line(proc: Any) -> str:
    """The one ``error:`` line of a refused command (warnings may come before it)."""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return errors[0]


def wait_for(cond: Callable[[], bool], what: str, proc: subprocess.Popen | None = None,
             timeout: float = TIMEOUT) -> None:
    """Poll ``cond`` until it holds; fail if ``proc`` exits first or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) before: {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(0.05)


def records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def manifest_step(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "checkpoint" / "manifest.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def tiny(**run: Any) -> Any:
    return resolve_config(tiny_config(run={"max_steps": 30, "eval_every": 2, **run}))


def write_tiny(path: Path, **run: Any) -> Path:
    path.write_text(yaml.safe_dump(tiny_config(run={"max_steps": 30, "eval_every": 2, **run})))
    return path


def without_wall(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k != "wall_time_s"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted tiny run (checkpoints every 10 steps)."""
    out = tmp_path_factory.mktemp("ref") / "run"
    run_experiment(tiny(checkpoint_every=10), out)
    return out


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run stopped at step 15: resumable from its step-10 checkpoint."""
    out = tmp_path_factory.mktemp("cut") / "run"
    assert run_experiment(tiny(checkpoint_every=10), out, stop_after_steps=15) == {"interrupted": True, "steps": 15}
    assert manifest_step(out) == 10
    return out


@pytest.fixture
def resumable(interrupted: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(interrupted, out)
    return out


# ---------------------------------------------------------------------------- the lock
class _GateExecutor(SerialExecutor):
    """Serial training that holds the first job until the test opens the gate."""

    gate = threading.Event()

    def submit(self, job: Any) -> Any:
        assert self.gate.wait(TIMEOUT), "the gate was never opened"
        return super().submit(job)


if "test-gate" not in EXECUTORS:
    EXECUTORS.register("test-gate", lambda workload, cfg: _GateExecutor(workload))


def test_a_second_writer_is_refused_and_the_first_run_is_intact(reference: Path, tmp_path: Path):
    out = tmp_path / "run"
    _GateExecutor.gate.clear()
    result: dict[str, Any] = {}

    def first() -> None:
        try:
            result["summary"] = run_experiment(tiny(checkpoint_every=10, executor="test-gate"), out)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertions below
            result["error"] = exc

    thread = threading.Thread(target=first)
    thread.start()
    try:
        # the first run holds the lock, wrote its t=0 record and waits at its first job
        wait_for(lambda: len(records(out)) == 1 or not thread.is_alive(), "the first run's first record")
        before = (out / "metrics.jsonl").read_bytes()
        with pytest.raises(RunDirError, match="in use by another fedgmr run"):
            run_experiment(tiny(checkpoint_every=10), out, overwrite=True)
        with pytest.raises(RunDirError, match="in use"):
            run_experiment(tiny(checkpoint_every=10, executor="test-gate"), out, resume=True)
        # another process: the CLI's one-line refusal, exit code 3
        proc = fedgmr("run", "--resume", str(out), "-q", check=False, own_process=True)
        assert proc.returncode == 3 and "in use by another fedgmr run" in error_line(proc)
        proc = fedgmr("run", str(write_tiny(tmp_path / "t.yaml")), "--out", str(out), "--overwrite", "-q",
                      check=False, own_process=True)
        assert proc.returncode == 3 and f"process {os.getpid()}" in error_line(proc)
        assert (out / "metrics.jsonl").read_bytes() == before  # nothing was touched
    finally:
        _GateExecutor.gate.set()
        thread.join(TIMEOUT)
    assert "error" not in result, result.get("error")
    assert (out / "metrics.jsonl").read_bytes() == (reference / "metrics.jsonl").read_bytes()
    # the lock went with the run: the directory can be used again
    with pytest.raises(RunDirError, match="finished run"):
        run_experiment(tiny(checkpoint_every=10), out, resume=True)


# ---------------------------------------------------------------------------- overwrite
def test_overwrite_clears_the_old_run_and_its_checkpoint(tmp_path: Path):
    out = tmp_path / "run"
    old = tiny(checkpoint_every=10)
    assert run_experiment(old, out, stop_after_steps=25)["interrupted"]  # killed, resumable from step 20
    assert manifest_step(out) == 20
    (out / "notes.txt").write_text("mine")
    new = tiny(max_steps=5, checkpoint_every=None, checkpoint_seconds=None)
    with pytest.raises(RunDirError, match="already holds a run"):
        run_experiment(new, out)
    run_experiment(new, out, overwrite=True)
    assert not (out / "checkpoint").exists()  # the old run's checkpoint is gone
    assert (out / "notes.txt").read_text() == "mine"  # not fedgmr's: left alone
    fresh = tmp_path / "fresh"
    run_experiment(new, fresh)
    assert (out / "metrics.jsonl").read_bytes() == (fresh / "metrics.jsonl").read_bytes()
    # the probe's sequence: a resume now cannot pick up the old run's state
    proc = fedgmr("run", "--resume", str(out), check=False)
    assert proc.returncode == 3 and "finished run" in error_line(proc)
    assert (out / "metrics.jsonl").read_bytes() == (fresh / "metrics.jsonl").read_bytes()


def test_overwrite_with_checkpoints_keeps_only_the_new_runs(tmp_path: Path):
    out = tmp_path / "run"
    run_experiment(tiny(checkpoint_every=10), out, stop_after_steps=25)
    killed = tiny(max_steps=40, checkpoint_every=10)
    run_experiment(killed, out, overwrite=True, stop_after_steps=12)
    assert manifest_step(out) == 10
    run_experiment(killed, out, resume=True)
    ref = tmp_path / "ref"
    run_experiment(killed, ref)
    assert (out / "metrics.jsonl").read_bytes() == (ref / "metrics.jsonl").read_bytes()


def test_overwrite_refuses_a_directory_fedgmr_did_not_write(tmp_path: Path):
    out = tmp_path / "project"
    out.mkdir()
    (out / "config.yaml").write_text("my: own config\n")
    proc = fedgmr("run", str(write_tiny(tmp_path / "t.yaml", max_steps=4)), "--out", str(out), "--overwrite",
                  check=False)
    assert proc.returncode == 3 and "not a fedgmr run directory" in error_line(proc)
    assert (out / "config.yaml").read_text() == "my: own config\n"


# ---------------------------------------------------------------------------- resume rules
@pytest.mark.parametrize("extra, named", [
    (["--set", "training.lr=0.2"], "--set"),
    (["--out", "OTHER"], "--out"),
    (["quickstart"], "CONFIG"),
    (["--overwrite"], "--overwrite"),
])
def test_resume_refuses_options_that_would_change_the_run(resumable: Path, tmp_path: Path, extra, named):
    before = (resumable / "metrics.jsonl").read_bytes()
    extra = [str(tmp_path / "other") if a == "OTHER" else a for a in extra]
    proc = fedgmr("run", "--resume", str(resumable), *extra, check=False)
    line = error_line(proc)
    assert proc.returncode == 2 and named in line and "--resume" in line
    assert (resumable / "metrics.jsonl").read_bytes() == before
    assert not (tmp_path / "other").exists()


def test_resume_refuses_a_config_edited_after_the_checkpoint(resumable: Path):
    path = resumable / "config.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["clients"]["num_clients"] = 12
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    before = (resumable / "metrics.jsonl").read_bytes()
    proc = fedgmr("run", "--resume", str(resumable), check=False)
    assert proc.returncode == 3 and "config.yaml was changed after the checkpoint" in error_line(proc)
    assert (resumable / "metrics.jsonl").read_bytes() == before
    # the Python API checks the config it is given as well
    raw["clients"]["num_clients"] = 10
    path.write_text(yaml.safe_dump(raw, sort_keys=False) + "# a comment changes no value\n")
    with pytest.raises(RunDirError, match="config given differs"):
        run_experiment(tiny(checkpoint_every=20), resumable, resume=True)


def test_resume_after_a_comment_only_edit_gives_the_uninterrupted_metrics(resumable: Path, reference: Path):
    with open(resumable / "config.yaml", "a") as fh:
        fh.write("# resumed on another day\n")
    run_experiment(saved_config(resumable), resumable, resume=True)
    assert (resumable / "metrics.jsonl").read_bytes() == (reference / "metrics.jsonl").read_bytes()
    assert without_wall(json.loads((resumable / "summary.json").read_text())) == \
        without_wall(json.loads((reference / "summary.json").read_text()))


def test_a_run_started_by_an_older_library_resumes_to_the_uninterrupted_metrics(resumable: Path, reference: Path):
    """Keys added to the config since the run started take their defaults on resume."""
    from fedgmr.experiment.checkpoint import load_checkpoint, save_checkpoint
    from fedgmr.experiment.rundir import config_digest

    path = resumable / "config.yaml"
    raw = yaml.safe_load(path.read_text())
    for key in ("level_eval_every", "client_eval_every", "loggers", "mlflow_uri"):  # not there before
        raw["run"].pop(key)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    state, tensors = load_checkpoint(resumable)
    state["config_sha256"] = config_digest(raw)  # as that library wrote it
    save_checkpoint(resumable, state, tensors)
    proc = fedgmr("run", "--resume", str(resumable), "-q")
    assert proc.returncode == 0, proc.stderr
    assert (resumable / "metrics.jsonl").read_bytes() == (reference / "metrics.jsonl").read_bytes()


def _flip(path: Path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name, damage", [
    ("state.safetensors", lambda p: _flip(p, 0.9)),  # a flipped bit in a tensor's data
    ("state.safetensors", lambda p: _flip(p, 0.001)),  # ... in its header
    ("state.json", lambda p: _flip(p, 0.5)),
    ("state.json", lambda p: p.write_text(p.read_text()[:-20])),  # truncated JSON
    ("state.json", lambda p: p.unlink()),
    ("manifest.json", lambda p: p.write_text("{not json")),
    ("manifest.json", lambda p: p.unlink()),
])
def test_a_damaged_checkpoint_is_one_line_naming_the_file(resumable: Path, name: str, damage):
    damage(resumable / "checkpoint" / name)
    before = (resumable / "metrics.jsonl").read_bytes()
    proc = fedgmr("run", "--resume", str(resumable), check=False)
    line = error_line(proc)
    assert proc.returncode == 3 and str(resumable / "checkpoint" / name) in line
    assert (resumable / "metrics.jsonl").read_bytes() == before


def test_metrics_changed_before_the_checkpoint_are_refused(resumable: Path):
    path = resumable / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2] + lines[3:]))  # a record the checkpoint counts is gone
    proc = fedgmr("run", "--resume", str(resumable), check=False)
    assert proc.returncode == 3 and "metrics.jsonl does not match the checkpoint" in error_line(proc)


def test_a_crash_between_the_checkpoint_renames_resumes_from_the_previous_one(resumable: Path, reference: Path):
    (resumable / "checkpoint").rename(resumable / ".checkpoint.old")
    run_experiment(saved_config(resumable), resumable, resume=True)
    assert (resumable / "metrics.jsonl").read_bytes() == (reference / "metrics.jsonl").read_bytes()


def test_resume_of_nothing_is_a_run_directory_error(tmp_path: Path):
    proc = fedgmr("run", "--resume", str(tmp_path / "nowhere"), check=False)
    assert proc.returncode == 3 and "nowhere" in error_line(proc)
    out = tmp_path / "off"
    run_experiment(tiny(checkpoint_every=None, checkpoint_seconds=None), out, stop_after_steps=10)
    proc = fedgmr("run", "--resume", str(out), check=False)
    assert proc.returncode == 3 and "no checkpoint" in error_line(proc)


# ---------------------------------------------------------------------------- checkpoints by default
def test_checkpoints_are_on_by_default_and_never_change_the_results(reference: Path, tmp_path: Path, monkeypatch):
    import fedgmr.experiment.runner as runner

    monkeypatch.setattr(runner, "CHECKPOINT_COST_FACTOR", 0.0)  # the clock trigger may fire after every step
    cfg = tiny()
    assert cfg.run.checkpoint_every is not None and cfg.run.checkpoint_seconds is not None
    off = tmp_path / "off"
    run_experiment(tiny(checkpoint_every=None, checkpoint_seconds=None), off)
    assert not (off / "checkpoint").exists()
    # a checkpoint after every step, by the step and by the wall-clock trigger
    for name, opts in (("steps", {"checkpoint_every": 1}),
                       ("clock", {"checkpoint_every": None, "checkpoint_seconds": 1e-9})):
        run_experiment(tiny(**opts), tmp_path / name)
        assert manifest_step(tmp_path / name) == 30
        assert (tmp_path / name / "metrics.jsonl").read_bytes() == (off / "metrics.jsonl").read_bytes()
    assert (reference / "metrics.jsonl").read_bytes() == (off / "metrics.jsonl").read_bytes()


@pytest.mark.slow
def test_default_checkpoints_let_a_killed_quickstart_resume_exactly(tmp_path: Path):
    """kill -9 half-way through a default quickstart run (shortened to 160 steps, its CNN
    narrowed to 8/16 channels: a third of the compute a step, the checkpoint settings left at
    their defaults), resume, compare with an uninterrupted run.

    The suite's one kill -9 of a run (SIGKILL: no handler, no clean-up, the process is gone);
    the resume and the reference run in this process. The exact resume of each method with
    client state is checked in-process from the checkpoint such a kill leaves
    (tests/test_client_state_runs.py, test_client_state_resumes_exactly)."""
    short = ["--set", "run.max_steps=160", "--set", "model.options.channels=[8,16]", "-q"]
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "fedgmr", "run", "quickstart", "--out", str(out), *short],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # a checkpoint after step 0 (the defaults: every 100 steps or 60 s of wall time)
        wait_for(lambda: manifest_step(out) > 0, "a checkpoint past step 0", proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (out / "summary.json").exists(), "the run finished before it could be killed"
    killed_at = manifest_step(out)
    assert 0 < killed_at < 160
    fedgmr("run", "--resume", str(out), "-q")
    ref = tmp_path / "ref"
    fedgmr("run", "quickstart", "--out", str(ref), *short)
    assert (out / "metrics.jsonl").read_bytes() == (ref / "metrics.jsonl").read_bytes()
    got, want = (json.loads((d / "summary.json").read_text()) for d in (out, ref))
    assert without_wall(got) == without_wall(want) and got["steps"] == 160


def _sigint_default() -> None:
    """In the child: SIGINT back to its default. A test suite started in the background
    (`pytest ... &` from a script) ignores SIGINT, its children inherit that, and a run that
    starts with SIGINT ignored keeps ignoring it, as a background job should: the Ctrl-C
    this test sends would be lost."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_exits_130_and_names_the_resume_command(tmp_path: Path):
    out = tmp_path / "run"
    cfg = write_tiny(tmp_path / "t.yaml", max_steps=100000)
    proc = subprocess.Popen([sys.executable, "-m", "fedgmr", "run", str(cfg), "--out", str(out), "-q"],
                            env={**ENV, "PYTHONFAULTHANDLER": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    try:
        wait_for(lambda: len(records(out)) >= 3, "a few records", proc)
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:  # say where the run was: the fault handler dumps every stack on SIGABRT
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=TIMEOUT)
            pytest.fail(f"the run did not exit within {TIMEOUT} s of SIGINT; its stacks on SIGABRT:\n{err}")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and f"fedgmr run --resume {out}" in err and "Traceback" not in err
    assert manifest_step(out) >= 0 and not (out / "summary.json").exists()


class _SignalsInAFinaliser:
    """Raises SIGINT's KeyboardInterrupt inside ``__del__``, where Python prints "Exception
    ignored" and carries on: the way a Ctrl-C can be lost."""

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)


def _swallowed_ctrl_c() -> None:
    try:
        _SignalsInAFinaliser()  # dropped at once: the finaliser runs here
    except KeyboardInterrupt:  # (should the interpreter let it out after all)
        pass


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the finaliser's, on purpose
def test_a_ctrl_c_swallowed_by_a_finaliser_still_stops_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("signal handlers can only be tested from the main thread")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        cfg = resolve_config(tiny_config(method="fedavg", run={"max_steps": 50, "eval_every": 1}))
        original, steps = SerialExecutor.submit, []

        def submit(self, job):
            steps.append(job.version)
            if len(steps) == 25:  # the third round's fifth job
                _swallowed_ctrl_c()
            return original(self, job)

        monkeypatch.setattr(SerialExecutor, "submit", submit)
        with pytest.raises(KeyboardInterrupt):
            run_experiment(cfg, tmp_path / "r")
        assert max(steps) == 2  # stopped in the round it was pressed in, not 47 rounds later
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # and the handler put back
    finally:
        signal.signal(signal.SIGINT, previous)


# ---------------------------------------------------------------------------- a failed run fails
def test_a_run_whose_every_update_is_rejected_fails_with_exit_code_5(tmp_path: Path):
    out = tmp_path / "nan"
    proc = fedgmr("run", "quickstart", "--out", str(out), "--set", "training.lr=1e30", "-q", check=False)
    line = error_line(proc)
    assert proc.returncode == 5 and "no update could be aggregated" in line and "10 of 10" in line
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["steps"] == 0
    assert summary["rejected_updates"] == 10  # every reply, not the 3 seen by the last evaluation
    assert "no update could be aggregated" in summary["failure"]
    assert records(out) and records(out)[0]["time"] == 0.0  # the metrics were written


def test_a_run_that_ends_before_its_first_round_says_so(tmp_path: Path):
    """FedAvg's first synchronous round outlasts 30 virtual seconds: nothing was rejected,
    and the error says what to raise instead of blaming the updates."""
    out = tmp_path / "short"
    proc = fedgmr("run", "quickstart", "--out", str(out), "--set", "method=fedavg", "--set", "run.max_time=30",
                  "-q", check=False)
    line = error_line(proc)
    assert proc.returncode == 5 and "none rejected" in line and "raise run.max_time" in line
    assert json.loads((out / "summary.json").read_text())["steps"] == 0


def test_a_synchronous_run_that_keeps_stepping_on_rejected_updates_fails(tmp_path: Path):
    cfg = resolve_config(tiny_config(method="fedavg", training={"lr": 1e30, "local_steps": 2},
                                     run={"max_steps": 200, "eval_every": 2}))
    with pytest.raises(RunFailedError, match="the last 30 client updates were all rejected"):
        run_experiment(cfg, tmp_path / "r")
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["rejected_updates"] == 30 and summary["steps"] < 200


def test_a_completed_run_is_marked_completed(reference: Path):
    summary = json.loads((reference / "summary.json").read_text())
    assert summary["status"] == "completed" and "failure" not in summary and summary["rejected_updates"] == 0


# ---------------------------------------------------------------------------- --out problems
def test_out_that_is_a_file_or_below_a_file_is_one_line_exit_3(tmp_path: Path):
    cfg = str(write_tiny(tmp_path / "t.yaml", max_steps=4))
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (afile, afile / "sub"):
        proc = fedgmr("run", cfg, "--out", str(out), check=False)
        assert proc.returncode == 3 and str(afile) in error_line(proc)
    assert afile.read_text() == "x"


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permission bits")
def test_out_in_a_read_only_directory_is_one_line_exit_3(tmp_path: Path):
    def body(where: Path) -> None:  # as root (CI): in a child that dropped to an ordinary user
        ro = where / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        try:
            proc = fedgmr("run", str(write_tiny(where / "t.yaml", max_steps=4)), "--out", str(ro / "r"),
                          check=False)
            assert proc.returncode == 3 and "Permission denied" in error_line(proc)
            assert not (ro / "r").exists()
        finally:
            ro.chmod(0o755)

    as_an_ordinary_user(body, tmp_path)


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc")
def test_out_where_nothing_can_be_written_is_one_line_exit_3(tmp_path: Path):
    """The root-proof version of a read-only directory: /proc refuses new entries."""
    proc = fedgmr("run", str(write_tiny(tmp_path / "t.yaml", max_steps=4)), "--out", "/proc/fedgmr-run",
                  check=False)
    assert proc.returncode == 3 and "/proc/fedgmr-run" in error_line(proc)


def test_a_full_disk_while_checkpointing_is_a_run_directory_error(tmp_path: Path, monkeypatch):
    import fedgmr.experiment.checkpoint as checkpoint

    def full(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(checkpoint, "_write", full)
    with pytest.raises(RunDirError, match="No space left on device") as err:
        run_experiment(tiny(checkpoint_every=10), tmp_path / "r")
    assert str(tmp_path / "r") in str(err.value)


# ---------------------------------------------------------------------------- workers die with their parent
def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                kids.append(int(entry.name))
    return kids


def _state(pid: int) -> str | None:
    """The process state letter from /proc (R running, S sleeping, Z zombie), None if gone."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet counts as gone)."""
    return _state(pid) not in (None, "Z", "X")


def _cpu_ticks(pid: int) -> int | None:
    try:
        fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # utime + stime


def _idle(workers: list[int], seen: dict[int, int | None]) -> bool:
    """Every worker sleeps and used no CPU since the previous poll: all are blocked on the
    job queue (the state in which they used to outlive a killed parent)."""
    now = {pid: _cpu_ticks(pid) for pid in workers}
    still = all(_state(pid) in ("S", None) for pid in workers) and now == seen
    seen.clear()
    seen.update(now)
    return still


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the workers through /proc")


@needs_proc
def test_process_pool_workers_die_when_the_run_is_killed(tmp_path: Path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "fedgmr", "run", "quickstart", "--out", str(out), "-q",
                             "--set", "run.executor=process", "--set", "run.workers=2"],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        def started() -> bool:
            workers[:] = _children(proc.pid)
            return len(workers) >= 2 and len(records(out)) >= 2  # the workers trained a step or more
        wait_for(started, "two pool workers", proc)
        proc.send_signal(signal.SIGSTOP)  # no new jobs: the workers finish theirs and wait for more
        seen: dict[int, int | None] = {}
        wait_for(lambda: _idle(workers, seen) or time.sleep(0.2), "the workers to wait for jobs")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    wait_for(lambda: not any(_alive(pid) for pid in workers), f"workers {workers} to exit after their parent")


@needs_proc
def test_idle_pool_workers_die_when_their_parent_is_killed(tmp_path: Path):
    """The pool alone, deterministically idle: the parent waits on stdin after its jobs."""
    script = tmp_path / "pool.py"
    script.write_text(
        "import sys\n"
        "from conftest import tiny_config\n"
        "from fedgmr.experiment.build import build_experiment\n"
        "from fedgmr.methods import resolve_config\n"
        "from fedgmr.sim.executors import ProcessPoolExecutor\n"
        "exp = build_experiment(resolve_config(tiny_config()))\n"
        "pool = ProcessPoolExecutor(exp.executor.workload, workers=2)\n"
        "exp.simulator.executor = pool\n"
        "exp.simulator.run(max_steps=2)\n"
        "for f in exp.simulator.in_flight.values():\n"
        "    f.handle.result()\n"  # every job done: both workers wait on the job queue
        "print(*pool.worker_pids(), flush=True)\n"
        "sys.stdin.readline()\n")
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), ENV.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        workers = [int(pid) for pid in proc.stdout.readline().split()]
        assert len(workers) == 2 and all(_alive(pid) for pid in workers)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    wait_for(lambda: not any(_alive(pid) for pid in workers), f"workers {workers} to exit after their parent")


def test_the_watchdog_ends_a_worker_whose_parent_died_without_prctl(tmp_path: Path):
    """The portable path alone (prctl disabled): a watchdog thread notices the new parent."""
    script = tmp_path / "orphan.py"
    script.write_text(
        "import os, sys, time\n"
        "import fedgmr.sim.executors as ex\n"
        "if os.fork() == 0:\n"
        "    sys.platform = 'other'  # no prctl: only the watchdog remains\n"
        "    ex.die_with_parent(os.getppid(), interval=0.05)\n"
        "    os.write(1, f'ready {os.getpid()}\\n'.encode())\n"
        "    while True:\n"
        "        time.sleep(1)\n"
        "sys.stdin.readline()\n"  # the test reads the child's pid, then closes stdin: the parent exits
        "os._exit(0)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=ENV)
    word, pid = proc.stdout.readline().split()
    child = int(pid)
    assert word == "ready" and _pid_alive(child)
    proc.stdin.close()
    proc.wait(TIMEOUT)
    wait_for(lambda: not _pid_alive(child), f"orphaned child {child} to exit")


def _pid_alive(pid: int) -> bool:
    if Path("/proc").exists():
        return _alive(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_close_stops_busy_workers_at_once():
    from fedgmr.experiment.build import build_experiment
    from fedgmr.sim.executors import ProcessPoolExecutor

    exp = build_experiment(tiny())
    pool = ProcessPoolExecutor(exp.executor.workload, workers=2)
    exp.simulator.executor = pool
    exp.simulator.start()  # dispatches the first wave: the workers are training
    pids = pool.worker_pids()
    assert len(pids) == 2
    pool.close()
    pool.close()  # idempotent
    assert not any(_pid_alive(pid) for pid in pids)


# ---------------------------------------------------------------------------- executors closed on every exit path
class _Boom(Exception):
    pass


class _FailingExecutor(SerialExecutor):
    """Raises ``error`` at job ``at``; counts ``close`` calls."""

    closed = 0
    at = 0
    error: BaseException = _Boom("boom")

    def __init__(self, workload: Any) -> None:
        super().__init__(workload)
        self.jobs = 0

    def submit(self, job: Any) -> Any:
        self.jobs += 1
        if self.jobs == self.at:
            raise self.error
        return super().submit(job)

    def close(self) -> None:
        type(self).closed += 1


if "test-failing" not in EXECUTORS:
    EXECUTORS.register("test-failing", lambda workload, cfg: _FailingExecutor(workload))


@pytest.mark.parametrize("error", [_Boom("boom"), KeyboardInterrupt()])
def test_the_executor_is_closed_and_the_lock_released_on_errors_and_ctrl_c(tmp_path: Path, error):
    _FailingExecutor.closed, _FailingExecutor.at, _FailingExecutor.error = 0, 25, error
    out = tmp_path / "r"
    with pytest.raises(type(error)):
        run_experiment(tiny(checkpoint_every=1, executor="test-failing"), out)
    assert _FailingExecutor.closed == 1
    _FailingExecutor.at = 0
    run_experiment(saved_config(out), out, resume=True)  # not locked, resumable
    assert _FailingExecutor.closed == 2 and json.loads((out / "summary.json").read_text())["steps"] == 30


@pytest.mark.slow
def test_ray_executor_close_kills_actors_and_stops_only_its_own_ray():
    ray = pytest.importorskip("ray")
    from fedgmr.experiment.build import build_experiment
    from fedgmr.sim.executors import RayExecutor

    if ray.is_initialized():  # the tests' shared instance (conftest.ray_session starts it again)
        ray.shutdown()
    workload = build_experiment(tiny()).executor.workload
    ex = RayExecutor(workload, workers=1, init_options={"num_cpus": 1, "object_store_memory": 80 * 2**20})
    ex.close()
    assert not ray.is_initialized() and ex.actors == []
    ex.close()  # idempotent
    ray.init(num_cpus=1, include_dashboard=False, object_store_memory=80 * 2**20)
    try:
        ex = RayExecutor(workload, workers=1)
        actor = ex.actors[0]
        ex.close()
        assert ray.is_initialized()  # not ours to stop

        def dead() -> bool:  # ray.kill is asynchronous: poll until calls fail
            try:
                ray.get(actor.ready.remote(), timeout=TIMEOUT)
            except ray.exceptions.RayActorError:
                return True
            return False
        wait_for(dead, "the actor to be killed")
    finally:
        ray.shutdown()


def test_a_restored_strategy_reports_the_same_min_coverage():
    """Gamma* of the last aggregation is part of the checkpoint: a record written after a
    resume and before the next aggregation reads the same value (found by a kill/resume
    under load, where the wall-clock trigger checkpointed at such a step)."""
    from conftest import tiny_config
    from fedgmr.experiment.build import build_experiment
    from fedgmr.methods import resolve_config

    cfg = resolve_config(tiny_config(clients={"num_clients": 4, "heterogeneity": [1.0, 1.0, 1.0, 1.0]},
                                     run={"max_steps": 6, "eval_every": 2}))
    exp = build_experiment(cfg)
    exp.simulator.run(3, None)
    want = exp.strategy.min_coverage()
    assert want >= 1
    state, tensors = exp.strategy.state_dict()
    fresh = build_experiment(cfg)
    fresh.strategy.load_state_dict(state, tensors)
    assert fresh.strategy.min_coverage() == want
    exp.executor.close()
    fresh.executor.close()


# ---------------------------------------------------------------------- the environment
def test_the_summary_records_the_stack_that_computed_the_run(reference: Path, monkeypatch: pytest.MonkeyPatch):
    """Same config, another CPU: close but not bit-identical metrics. The summary says which
    processor, kernel level and versions made the run, so such runs can be told apart."""
    import numpy
    import torch

    from fedgmr.experiment import environment as env_module

    env = json.loads((reference / "summary.json").read_text())["environment"]
    assert env["torch"] == torch.__version__ and env["numpy"] == numpy.__version__
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["device"] == "cpu" and env["torch_threads"] == tiny().run.torch_threads == 1
    assert env["python"].count(".") == 2 and env["platform"].startswith(sys.platform)
    # a stack that cannot name its processor or kernel level still gets its summary
    monkeypatch.setattr(env_module, "_cpu_model", lambda: None)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: (_ for _ in ()).throw(RuntimeError("no")))
    partial = env_module.environment("cpu")
    assert partial["cpu"] is None and partial["cpu_capability"] is None and partial["torch"] == torch.__version__


def test_the_environment_records_the_kernel_limits_and_the_processors_isa(monkeypatch: pytest.MonkeyPatch):
    """docs/protocol.md: ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA and MKL_ENABLE_INSTRUCTIONS at
    AVX2 make an AVX-512 CPU compute what an AVX2 one does; the record says which were set."""
    from fedgmr.experiment import environment as env_module

    for var in env_module.KERNEL_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    env = env_module.environment()
    assert env["kernel_env"] == {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    expected = "avx512" if " avx512f" in flags else "avx2" if " avx2" in flags else "avx" if " avx" in flags else None
    assert env["cpu_isa"] == expected


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_environment_names_the_code_commit_and_the_package_files_changed_since(tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch):
    """A run's summary says which code computed it: the package version, and for a checkout
    the commit with the package files that differ from it (P7's cells ran on later commits
    than P1's and nothing in their records said which)."""
    import fedgmr
    from fedgmr.experiment import environment as env_module

    assert env_module.environment()["fedgmr"] == fedgmr.__version__
    repo = tmp_path / "checkout"
    (repo / "fedgmr").mkdir(parents=True)
    (repo / "fedgmr" / "a.py").write_text("x = 1\n")
    (repo / "docs.md").write_text("d\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "c"]):
        subprocess.run(git + args, check=True, capture_output=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    monkeypatch.setattr(env_module, "SOURCE_ROOT", repo)
    assert env_module.environment()["source"] == {"commit": head, "modified": []}
    (repo / "fedgmr" / "a.py").write_text("x = 2\n")
    (repo / "docs.md").write_text("changed, but not the package\n")
    (repo / "fedgmr" / "new.py").write_text("untracked\n")
    assert env_module.source_version() == {"commit": head, "modified": ["fedgmr/a.py"]}
    monkeypatch.setattr(env_module, "SOURCE_ROOT", tmp_path / "an_installed_wheel")
    assert "source" not in env_module.environment()
