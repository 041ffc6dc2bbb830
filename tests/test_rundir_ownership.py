"""What a run owns in its directory (issue 42, items 1, 2, 3, 6 and 9).

* A run writes and deletes only what it created: the names it records in
  ``.fedgmr.manifest.json`` before creating them. Folders and files of yours (``mlruns/``,
  ``wandb/``, a file called ``tensorboard``) stay, with or without ``--overwrite``; a name
  the run must write that is yours is refused, not replaced.
* A run never writes through a link planted in its directory (the lock file, the
  temporaries of atomic writes, ``metrics.jsonl``, the checkpoint's folders).
* The Flower ServerApp's ``out-dir`` goes through the same guard: a lock, "already holds a
  run", the same link refusals.
* Reading a run directory's files takes regular files of bounded size only: a FIFO or a
  link to a device is one line, never a hang or an unbounded read.
* A run killed while it loads its data and builds has written its config first, and
  ``--resume`` runs it from "no checkpoint yet" to the uninterrupted result.

Everything runs in this process; a read that would hang is stopped by an alarm (a guard
against hanging the suite, not a timing check).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from conftest import dev_zero as _dev_zero, fifo as _fifo, no_hang, tiny_config
from fedgmr.errors import RunDirError
from fedgmr.experiment import rundir
from fedgmr.experiment.loggers import LOGGERS, RunLogger
from fedgmr.experiment.metrics import read_metrics, read_summary
from fedgmr.experiment.runner import run_experiment, saved_config
from fedgmr.methods import resolve_config

RUNNER = CliRunner()


def tiny(**run: Any) -> Any:
    return resolve_config(tiny_config(run={"max_steps": 8, "eval_every": 2, **run}))


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (links not followed) with a file's bytes (None: a folder
    or a link, whose target is shown instead)."""
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = f"-> {os.readlink(path)}"
            elif path.is_dir():
                out[rel] = None
            else:
                out[rel] = path.read_bytes()
    return out




def user_files(out: Path) -> dict[str, bytes | None]:
    """Plant the probe's user folders and files in ``out``; returns their tree."""
    (out / "mlruns" / "0").mkdir(parents=True)
    (out / "mlruns" / "0" / "meta.yaml").write_text("keep\n")
    (out / "wandb").mkdir()
    (out / "wandb" / "notes.txt").write_text("mine\n")
    (out / "tensorboard").write_text("a file of mine called tensorboard\n")
    (out / "loggers.json").write_text('{"mine": true}\n')
    (out / "notes.txt").write_text("mine\n")
    users = {"mlruns", "wandb", "tensorboard", "loggers.json", "notes.txt"}
    return {k: v for k, v in tree(out).items() if k.split(os.sep)[0] in users}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "run"
    run_experiment(tiny(checkpoint_every=4), out)
    return out


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference run stopped at step 6: resumable from its step-4 checkpoint."""
    out = tmp_path_factory.mktemp("cut") / "run"
    assert run_experiment(tiny(checkpoint_every=4), out, stop_after_steps=6)["interrupted"]
    return out


@pytest.fixture
def resumable(stopped: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(stopped, out, symlinks=True)
    return out


# ---------------------------------------------------------------------------- item 1: ownership
def test_a_fresh_run_keeps_every_folder_and_file_it_did_not_create(tmp_path: Path, reference: Path):
    out = tmp_path / "d"
    out.mkdir()
    mine = user_files(out)
    run_experiment(tiny(checkpoint_every=4), out)  # no --overwrite, no logger
    after = tree(out)
    assert {k: after.get(k) for k in mine} == mine  # mlruns/, wandb/, the file 'tensorboard', loggers.json: intact
    assert (out / "metrics.jsonl").read_bytes() == (reference / "metrics.jsonl").read_bytes()
    owned = json.loads((out / rundir.MANIFEST_FILE).read_text())["entries"]
    assert "mlruns" not in owned and "tensorboard" not in owned and "loggers.json" not in owned
    assert {"config.yaml", "metrics.jsonl", "summary.json", "checkpoint", "accuracy_density.png"} <= set(owned)


def test_overwrite_removes_only_what_the_manifest_lists(tmp_path: Path):
    out = tmp_path / "d"
    run_experiment(tiny(checkpoint_every=4), out, stop_after_steps=6)
    assert (out / "checkpoint").is_dir()
    mine = user_files(out)  # added after the run: not the run's
    run_experiment(tiny(max_steps=4, checkpoint_every=None, checkpoint_seconds=None), out, overwrite=True)
    after = tree(out)
    assert {k: after.get(k) for k in mine} == mine
    assert not (out / "checkpoint").exists()  # the old run's checkpoint: the run's, removed
    assert len(read_metrics(out)) == 3  # the new run's t=0, 2 and 4 records


def test_a_run_directory_written_before_the_manifest_is_adopted_without_its_neighbours(tmp_path: Path):
    out = tmp_path / "d"
    run_experiment(tiny(checkpoint_every=4), out, stop_after_steps=6)
    (out / rundir.MANIFEST_FILE).unlink()  # as an older fedgmr left it
    mine = user_files(out)
    assert rundir.owned_entries(out) == set(rundir.CORE_ENTRIES)  # its config names no logger
    # a resume continues it (and records the manifest), an overwrite replaces it: the user's files stay
    run_experiment(saved_config(out), out, resume=True)
    assert json.loads((out / rundir.MANIFEST_FILE).read_text())["entries"]
    run_experiment(tiny(max_steps=4), out, overwrite=True)
    after = tree(out)
    assert {k: after.get(k) for k in mine} == mine


def test_a_name_the_run_writes_that_is_not_a_runs_is_refused_and_kept(tmp_path: Path):
    out = tmp_path / "d"
    out.mkdir()
    (out / "accuracy_density.png").write_bytes(b"my figure")
    with pytest.raises(RunDirError, match=r"accuracy_density\.png exists but .* is not a fedgmr run directory; "
                                          r"fedgmr will not overwrite it"):
        run_experiment(tiny(), out)
    assert sorted(p.name for p in out.iterdir()) == [".fedgmr.lock", "accuracy_density.png"]  # nothing written
    assert (out / "accuracy_density.png").read_bytes() == b"my figure"


class _FolderLogger(RunLogger):
    """A logger that writes ``traces/`` in the run directory (and says so)."""

    def entries(self) -> tuple[str, ...]:
        return ("traces",)

    def open(self, resume: bool, kept: Any) -> None:
        (self.out / "traces").mkdir(exist_ok=True)
        (self.out / "traces" / "log.txt").write_text("opened\n")

    def log(self, record: dict[str, Any]) -> None:
        pass


def test_a_loggers_folder_is_claimed_only_when_the_logger_runs_and_a_users_folder_of_that_name_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(LOGGERS._items, "test-folder", _FolderLogger)  # gone after the test
    out = tmp_path / "d"
    run_experiment(tiny(loggers=["test-folder"]), out)
    assert "traces" in json.loads((out / rundir.MANIFEST_FILE).read_text())["entries"]
    run_experiment(tiny(), out, overwrite=True)  # the old run's traces/ was the run's: replaced with the run
    assert not (out / "traces").exists()
    (out / "traces").mkdir()
    (out / "traces" / "mine.txt").write_text("mine")  # now it is the user's
    with pytest.raises(RunDirError, match="traces exists but it is not a file of the fedgmr run"):
        run_experiment(tiny(loggers=["test-folder"]), out, overwrite=True)
    assert (out / "traces" / "mine.txt").read_text() == "mine"
    assert (out / "summary.json").exists()  # the refused overwrite touched nothing


def test_the_builtin_loggers_name_what_they_write():
    from fedgmr.experiment.loggers import MLflowLogger, TensorBoardLogger, WandbLogger

    cfg, out = tiny(), Path("/nowhere")
    assert TensorBoardLogger("tensorboard", cfg, out).entries() == ("tensorboard",)
    assert "wandb" in WandbLogger("wandb", cfg, out).entries()
    local = MLflowLogger("mlflow", cfg, out)
    remote = MLflowLogger("mlflow", tiny(mlflow_uri="http://tracking.invalid:5000"), out)
    if not os.environ.get("MLFLOW_TRACKING_URI"):
        assert "mlruns" in local.entries()
    assert "mlruns" not in remote.entries()  # its store is elsewhere: a folder mlruns/ here is not its


@pytest.mark.parametrize("entry", ["../outside", "/etc", "a/b", ""])
def test_a_manifest_naming_anything_but_a_name_in_the_directory_is_refused(tmp_path: Path, entry: str):
    out = tmp_path / "d"
    out.mkdir()
    (tmp_path / "outside").mkdir()
    (out / rundir.MANIFEST_FILE).write_text(json.dumps({"format": 1, "entries": [entry]}))
    with pytest.raises(RunDirError, match="manifest.json is damaged"):
        run_experiment(tiny(), out)
    assert (tmp_path / "outside").is_dir()


# ---------------------------------------------------------------------------- item 2: links
def test_a_link_planted_as_the_lock_file_is_refused_and_its_target_untouched(tmp_path: Path, resumable: Path):
    victim = tmp_path / "v.txt"
    victim.write_text("precious\n")
    out = tmp_path / "d2"
    out.mkdir()
    (out / ".fedgmr.lock").symlink_to(victim)
    with pytest.raises(RunDirError, match=r"\.fedgmr\.lock is a symbolic link: fedgmr .* never through a link"):
        run_experiment(tiny(), out)
    (resumable / ".fedgmr.lock").unlink()
    (resumable / ".fedgmr.lock").symlink_to(victim)
    with pytest.raises(RunDirError, match="symbolic link"):
        run_experiment(saved_config(resumable), resumable, resume=True)
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("name", [".summary.json.tmp", ".config.yaml.tmp", ".accuracy_density.png.tmp",
                                  "metrics.jsonl", ".checkpoint.tmp", ".checkpoint.old"])
def test_a_link_planted_in_a_run_directory_is_refused_on_resume(tmp_path: Path, resumable: Path, name: str):
    victim = tmp_path / "v.txt"
    victim.write_text("precious\n")
    if name == "metrics.jsonl":  # the run's metrics moved behind a link: still never written through it
        shutil.copy(resumable / name, victim)
        (resumable / name).unlink()
    saved = victim.read_bytes()
    (resumable / name).symlink_to(victim)
    with pytest.raises(RunDirError, match=f"{name.replace('.', '[.]')} is a symbolic link"):
        run_experiment(saved_config(resumable), resumable, resume=True)
    assert victim.read_bytes() == saved
    assert (resumable / name).is_symlink()  # refused, not replaced: nothing was written


def test_a_checkpoint_folder_behind_a_link_is_read_but_never_written(tmp_path: Path, resumable: Path):
    elsewhere = tmp_path / "elsewhere"
    (resumable / "checkpoint").rename(elsewhere)
    (resumable / "checkpoint").symlink_to(elsewhere)
    before = tree(elsewhere)
    with pytest.raises(RunDirError, match="checkpoint is a symbolic link"):
        run_experiment(saved_config(resumable), resumable, resume=True)
    assert tree(elsewhere) == before


def test_atomic_writes_never_follow_a_link_or_write_a_shared_file(tmp_path: Path):
    victim = tmp_path / "v.txt"
    victim.write_text("precious\n")
    (tmp_path / ".summary.json.tmp").symlink_to(victim)
    with pytest.raises(RunDirError, match="is a symbolic link"):
        rundir.write_atomic(tmp_path / "summary.json", "{}")
    assert victim.read_text() == "precious\n" and not (tmp_path / "summary.json").exists()
    # a hard link at a name written in place (metrics.jsonl, the lock file)
    os.link(victim, tmp_path / "metrics.jsonl")
    with pytest.raises(RunDirError, match="2 hard links"):
        rundir.open_for_write(tmp_path / "metrics.jsonl", os.O_WRONLY | os.O_TRUNC)
    assert victim.read_text() == "precious\n"
    # a leftover regular temporary of a killed run is replaced; a link at the target is replaced, not followed
    (tmp_path / ".summary.json.tmp").unlink()
    (tmp_path / ".summary.json.tmp").write_text("half")
    (tmp_path / "summary.json").symlink_to(victim)
    rundir.write_atomic(tmp_path / "summary.json", "{}")
    assert (tmp_path / "summary.json").read_text() == "{}" and not (tmp_path / "summary.json").is_symlink()
    assert victim.read_text() == "precious\n"


def test_a_fifo_as_the_lock_file_is_refused_without_blocking(tmp_path: Path):
    out = tmp_path / "d"
    out.mkdir()
    os.mkfifo(out / ".fedgmr.lock")
    with no_hang(), pytest.raises(RunDirError, match=r"\.fedgmr\.lock is a FIFO"):
        run_experiment(tiny(), out)


# ---------------------------------------------------------------------------- item 3: the ServerApp
class _NoLink:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the link was used ({name}) before the run directory was checked")


def _serve(run_config: dict[str, Any]) -> Any:
    pytest.importorskip("flwr")
    from fedgmr.flower.server_app import serve

    return serve(_NoLink(), run_config)  # type: ignore[arg-type]


def test_the_serverapp_refuses_an_out_dir_that_holds_a_run_and_touches_nothing(reference: Path, tmp_path: Path):
    out = tmp_path / "sim"
    shutil.copytree(reference, out, symlinks=True)
    before = tree(out)
    with pytest.raises(RunDirError, match="already holds a run; a Flower run neither continues nor replaces"):
        _serve({"out-dir": str(out)})
    assert tree(out) == before  # no server.log, config.yaml and metrics.jsonl as they were


def test_the_serverapp_refuses_a_locked_out_dir_and_links_in_it(tmp_path: Path):
    out = tmp_path / "flower"
    out.mkdir()
    with rundir.RunLock(out), pytest.raises(RunDirError, match="in use by another fedgmr run"):
        _serve({"out-dir": str(out)})
    victim = tmp_path / "v.txt"
    victim.write_text("precious\n")
    (out / "server.log").symlink_to(victim)
    with pytest.raises(RunDirError, match="server.log exists but .* is not a fedgmr run directory"):
        _serve({"out-dir": str(out)})
    (out / rundir.MANIFEST_FILE).write_text(json.dumps({"format": 1, "entries": ["server.log"]}))
    with pytest.raises(RunDirError, match="server.log is a symbolic link"):
        _serve({"out-dir": str(out)})
    assert victim.read_text() == "precious\n"


def test_the_serverapp_claims_its_files_and_keeps_the_users(tmp_path: Path):
    out = tmp_path / "flower"
    out.mkdir()
    mine = user_files(out)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config()))
    with pytest.raises(AssertionError, match="the link was used"):  # the guard passed; the loop needs nodes
        _serve({"out-dir": str(out), "config": str(cfg), "node-wait": 0})
    after = tree(out)
    assert {k: after.get(k) for k in mine} == mine
    from fedgmr.flower.server_app import RUN_FILES

    assert set(json.loads((out / rundir.MANIFEST_FILE).read_text())["entries"]) == set(RUN_FILES)
    assert (out / "server.log").is_file()
    rundir.RunLock(out).acquire()  # released when the ServerApp ended


# ---------------------------------------------------------------------------- item 6: the safe reader
@pytest.mark.parametrize("plant, what", [(_fifo, "FIFO"), (_dev_zero, "device")])
def test_special_files_in_a_run_directory_are_one_line_for_table_compare_plot(reference: Path, tmp_path: Path,
                                                                              plant: Any, what: str):
    from fedgmr.cli import app

    run = tmp_path / "run"
    shutil.copytree(reference, run, symlinks=True)
    plant(run / "metrics.jsonl")
    with no_hang():
        with pytest.raises(RunDirError, match=f"metrics.jsonl: it is a {what}"):
            read_metrics(run)
        for args in (["compare", str(run), str(reference), "--t-star", "4"],
                     ["plot", str(run), "--out", str(tmp_path / "p.png")],
                     ["table", str(run), str(reference), "--t-star", "4"]):
            result = RUNNER.invoke(app, args)
            lines = result.stderr.strip().splitlines()
            assert result.exit_code == 3 and len(lines) == 1 and "not a regular file" in lines[0], \
                (args, result.exit_code, result.stderr, result.exception)


@pytest.mark.parametrize("name", ["summary.json", "config.yaml"])
def test_a_fifo_summary_or_config_is_one_line_not_a_hang(reference: Path, tmp_path: Path, name: str):
    run = tmp_path / "run"
    shutil.copytree(reference, run, symlinks=True)
    _fifo(run / name)
    with no_hang():
        if name == "summary.json":
            with pytest.raises(RunDirError, match="summary.json: it is a FIFO"):
                read_summary(run)
        else:
            with pytest.raises(RunDirError, match="config.yaml: it is a FIFO"):
                saved_config(run)


def test_a_run_file_above_the_size_bound_is_refused_without_reading_it(reference: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch):
    run = tmp_path / "run"
    shutil.copytree(reference, run, symlinks=True)
    monkeypatch.setattr(rundir, "MAX_FILE_BYTES", 1000)
    with pytest.raises(RunDirError, match="more than the 1,000 a run-directory file may hold"):
        read_metrics(run)


@pytest.mark.parametrize("plant", [_fifo, _dev_zero])
def test_resume_refuses_special_files_in_one_line(resumable: Path, plant: Any):
    plant(resumable / "metrics.jsonl")
    with no_hang(), pytest.raises(RunDirError, match="metrics.jsonl"):
        run_experiment(saved_config(resumable), resumable, resume=True)
    plant(resumable / "checkpoint" / "state.json")
    with no_hang(), pytest.raises(RunDirError, match="state.json: it is a"):
        run_experiment(saved_config(resumable), resumable, resume=True)


def test_resume_through_the_cli_with_a_fifo_config_is_exit_3(resumable: Path):
    from fedgmr.cli import app

    _fifo(resumable / "config.yaml")
    with no_hang():
        result = RUNNER.invoke(app, ["run", "--resume", str(resumable), "-q"])
    assert result.exit_code == 3 and "config.yaml: it is a FIFO" in result.stderr, result.stderr


# ---------------------------------------------------------------------------- item 9: the start-up window
class _Killed(BaseException):
    """What SIGKILL leaves: no handler runs (not an Exception: the runner's clean-up skips it)."""


def _kill_while_building(monkeypatch: pytest.MonkeyPatch, seen: dict[str, Any]) -> None:
    import fedgmr.experiment.runner as runner

    def killed(cfg: Any, **kw: Any) -> Any:
        seen["files"] = sorted(p.name for p in Path(seen["out"]).iterdir())
        raise _Killed

    monkeypatch.setattr(runner, "build_experiment", killed)


def test_a_run_killed_while_it_builds_resumes_from_no_checkpoint_yet(tmp_path: Path, reference: Path,
                                                                    monkeypatch: pytest.MonkeyPatch):
    out = tmp_path / "run"
    seen: dict[str, Any] = {"out": out}
    with monkeypatch.context() as m:
        _kill_while_building(m, seen)
        with pytest.raises(_Killed):
            run_experiment(tiny(checkpoint_every=4), out)
    assert "config.yaml" in seen["files"]  # written before the data was loaded
    cfg = saved_config(out)
    summary = run_experiment(cfg, out, resume=True)
    assert (out / "metrics.jsonl").read_bytes() == (reference / "metrics.jsonl").read_bytes()
    assert summary["final_accuracy"] == json.loads((reference / "summary.json").read_text())["final_accuracy"]


def test_the_cli_resumes_a_run_killed_while_it_built(tmp_path: Path, reference: Path,
                                                     monkeypatch: pytest.MonkeyPatch):
    from fedgmr.cli import app

    out = tmp_path / "run"
    with monkeypatch.context() as m:
        _kill_while_building(m, {"out": out})
        with pytest.raises(_Killed):
            run_experiment(tiny(checkpoint_every=4), out)
    result = RUNNER.invoke(app, ["run", "--resume", str(out), "-q"])
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert (out / "metrics.jsonl").read_bytes() == (reference / "metrics.jsonl").read_bytes()


def test_a_run_killed_before_its_config_says_plainly_to_start_it_again(tmp_path: Path):
    out = tmp_path / "run"
    out.mkdir()
    rundir.write_manifest(out, rundir.CORE_ENTRIES)  # the manifest is written, then the kill
    with pytest.raises(RunDirError, match="stopped before it wrote its config, so there is nothing to resume; "
                                          "start it again: fedgmr run CONFIG --out"):
        saved_config(out)
    run_experiment(tiny(max_steps=2), out)  # and starting it again works
    assert len(read_metrics(out)) == 2


def test_a_build_that_fails_leaves_no_half_made_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import fedgmr.experiment.runner as runner

    def bad_data(cfg: Any, **kw: Any) -> Any:
        raise FileNotFoundError("no data here")

    monkeypatch.setattr(runner, "build_experiment", bad_data)
    with pytest.raises(FileNotFoundError):
        run_experiment(tiny(), tmp_path / "new")
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    with pytest.raises(FileNotFoundError):
        run_experiment(tiny(), kept)
    assert sorted(p.name for p in kept.iterdir()) == [".fedgmr.lock", "notes.txt"]


# ---------------------------------------------------------------------------- resume on another device, twice
def test_a_run_resumed_on_another_device_can_be_resumed_again(tmp_path: Path):
    """The checkpoints a resume writes carry the hash of config.yaml as saved, not of the
    config with the ``run.device`` it was resumed with: a second resume is not refused."""
    ref = tmp_path / "ref"
    run_experiment(tiny(checkpoint_every=4, max_steps=16), ref)
    out2 = tmp_path / "run2"
    assert run_experiment(tiny(checkpoint_every=4, max_steps=16), out2, stop_after_steps=6)["interrupted"]
    saved = saved_config(out2)
    moved = saved.model_copy(update={"run": saved.run.model_copy(update={"device": "auto"})})
    assert run_experiment(moved, out2, resume=True, stop_after_steps=10)["interrupted"]  # checkpoint at step 8
    run_experiment(saved_config(out2), out2, resume=True)
    assert (out2 / "metrics.jsonl").read_bytes() == (ref / "metrics.jsonl").read_bytes()
