"""The hostile-input suite (issue 42), kept so the next probe starts from it.

A representative set of the probe's cases, in this process where possible, each now a
one-line refusal with its exit code, never a hang, a traceback or a silent success:

* bounded readers (item 6): config and sweep files, a sweep's ``sweep.json``, a cell's
  ``config.yaml`` / ``summary.json``, the summary ``fedgmr evaluate`` reads - a FIFO or a
  link to ``/dev/zero`` is one line (an alarm fails a read that blocks, instead of
  hanging the suite);
* the Ctrl-C message of a run stopped before its first record (item 9's resume);
* links planted in a run directory, bad config and run-config values, malformed files,
  huge grids, a plugin that exits (items 2, 4, 5, 6, 7, 8).

Other files cover the rest in depth: test_rundir_ownership (items 1-3, 6, 9),
test_deployment_validation (4), test_evaluate_refusals (5), test_sweep_bounds (6),
test_one_line_errors (7, 8), test_loggers (8: loggers), test_sweep_concurrent (8: two
sweeps), tests/distributed/test_flower_loop_faults (10).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

from conftest import dev_zero as _dev_zero, fifo as _fifo, no_hang, run_cli, tiny_config
from fedgmr.config import loading as config_mod  # the module whose MAX_CONFIG_BYTES read_config_file reads
from fedgmr.config import read_config_file
from fedgmr.errors import ConfigError, FedGMRError, RunDirError
from fedgmr.experiment.runner import run_experiment
from fedgmr.methods import resolve_config

SPECIAL = [pytest.param(_fifo, "a FIFO (named pipe)", id="fifo"), pytest.param(_dev_zero, "a device", id="dev-zero")]


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run with a final checkpoint (what `fedgmr evaluate` reads)."""
    out = tmp_path_factory.mktemp("ref") / "run"
    run_experiment(resolve_config(tiny_config(run={"max_steps": 6, "eval_every": 2, "checkpoint_every": 3})), out)
    return out


def _fake_run(root: Path, name: str, seed: int) -> Path:
    """A run directory as `fedgmr table` reads it (config, metrics, summary)."""
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"name": "t", "method": "fedgmr", "seed": seed,
                                                   "run": {"eval_interval": 1.0}}))
    rows = [{"time": float(t), "step": t, "accuracy": 0.5 + 0.01 * seed} for t in range(0, 11)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"method": "fedgmr"}))
    return d


# ---------------------------------------------------------------------------- bounded readers (item 6)
@pytest.mark.parametrize("plant, what", SPECIAL)
def test_a_special_config_file_is_one_line(tmp_path: Path, plant: Callable[[Path], None], what: str):
    path = tmp_path / "c.yaml"
    plant(path)
    with no_hang(), pytest.raises(ConfigError) as err:
        read_config_file(path)
    assert str(err.value) == f"cannot read config file {path}: it is {what}, not a regular file"
    assert err.value.exit_code == 2


def test_a_config_file_above_the_bound_is_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny_config()))
    monkeypatch.setattr(config_mod, "MAX_CONFIG_BYTES", 100)
    with pytest.raises(ConfigError, match=r"c.yaml: [\d,]+ bytes, more than the 100 a config file may hold"):
        read_config_file(path)


@pytest.mark.parametrize("plant, what", SPECIAL)
def test_table_of_a_sweep_whose_index_is_special_is_not_a_hang(tmp_path: Path, plant: Callable[[Path], None],
                                                               what: str):
    from fedgmr.experiment.table import find_runs, sweep_cases

    root = tmp_path / "sweep"
    runs = [_fake_run(root, f"seed={s}", s) for s in (0, 1)]
    plant(root / "sweep.json")
    with no_hang():
        assert find_runs([root]) == runs  # the index only orders the cells: path order without it
        assert sweep_cases(runs[0]) == {}
        result = run_cli(["table", str(root), "--t-star", "5", "--format", "csv"], tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("plant, what", SPECIAL)
def test_table_refuses_a_special_config_yaml_in_one_line(tmp_path: Path, plant: Callable[[Path], None], what: str):
    from fedgmr.experiment.table import read_run

    run = _fake_run(tmp_path, "r", 0)
    plant(run / "config.yaml")
    with no_hang(), pytest.raises(RunDirError) as err:
        read_run(run)
    assert str(err.value) == f"cannot read {run / 'config.yaml'}: it is {what}, not a regular file"


@pytest.mark.parametrize("plant, what", SPECIAL)
def test_evaluate_refuses_a_special_summary_in_one_line(reference: Path, tmp_path: Path,
                                                        plant: Callable[[Path], None], what: str):
    run = tmp_path / "run"
    shutil.copytree(reference, run, symlinks=True)
    plant(run / "summary.json")
    with no_hang():
        result = run_cli(["evaluate", str(run)], tmp_path)
    assert result.returncode == 3
    assert f"summary.json: it is {what}, not a regular file" in one_line(result.stderr)


@pytest.mark.parametrize("plant, what", SPECIAL)
def test_a_sweep_reads_its_index_and_cells_without_blocking(tmp_path: Path, plant: Callable[[Path], None],
                                                            what: str):
    from fedgmr.experiment.sweep import _cell_state, read_index

    cfg = resolve_config(tiny_config(run={"max_steps": 4}))
    out = tmp_path / "sweep"
    cell = out / "run"
    cell.mkdir(parents=True)
    from fedgmr.config import dump_config

    (cell / "config.yaml").write_text(dump_config(cfg))
    plant(cell / "summary.json")
    plant(out / "sweep.json")
    with no_hang():
        assert _cell_state(cell, cfg) == "restart"  # an unreadable summary: run again, never "done"
        with pytest.raises(FedGMRError, match="has no readable sweep.json"):
            read_index(out)
        plant(cell / "config.yaml")
        assert _cell_state(cell, cfg) == "changed"  # not the sweep's config: left alone, reported


# ---------------------------------------------------------------------------- Ctrl-C before the first record
@pytest.mark.parametrize("files, checkpoints, expected", [
    ({}, True, "interrupted before the run wrote its config to {d}: start it again with the same command"),
    ({"config.yaml": "x: 1\n"}, False,
     "interrupted before the first record: run it from the start with: fedgmr run --resume {d}"),
    ({"config.yaml": "x: 1\n", "metrics.jsonl": ""}, True,
     "interrupted before the first record: run it from the start with: fedgmr run --resume {d}"),
    ({"config.yaml": "x: 1\n", "metrics.jsonl": "{}\n"}, False,
     "interrupted: checkpoints were off (run.checkpoint_every and run.checkpoint_seconds are null), so {d} "
     "cannot be resumed"),
    ({"config.yaml": "x: 1\n", "metrics.jsonl": "{}\n"}, True,
     "interrupted: continue from the last checkpoint with: fedgmr run --resume {d}"),
], ids=["no-config", "no-metrics-checkpoints-off", "empty-metrics", "records-checkpoints-off", "records"])
def test_the_ctrl_c_message_says_what_can_be_resumed(tmp_path: Path, files: dict[str, str], checkpoints: bool,
                                                     expected: str):
    from fedgmr.cli import _interrupted_message

    d = tmp_path / "r"
    d.mkdir()
    for name, text in files.items():
        (d / name).write_text(text)
    run = {} if checkpoints else {"checkpoint_every": None, "checkpoint_seconds": None}
    cfg = resolve_config(tiny_config(run={"max_steps": 4, **run}))
    assert _interrupted_message(cfg, d) == expected.format(d=d)


@pytest.mark.slow
def test_ctrl_c_while_building_with_checkpoints_off_then_resume_completes(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch):
    import fedgmr.experiment.runner as runner

    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(yaml.safe_dump(tiny_config(run={"max_steps": 4, "eval_every": 2, "checkpoint_every": None,
                                                        "checkpoint_seconds": None})))

    def ctrl_c(*a: Any, **kw: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "build_experiment", ctrl_c)
    result = run_cli(["run", str(cfg_file), "--out", "r", "-q"], tmp_path)
    assert result.returncode == 130
    assert result.stderr.strip().splitlines()[-1] == ("interrupted before the first record: run it from the start "
                                                      "with: fedgmr run --resume r")
    monkeypatch.undo()
    resumed = run_cli(["run", "--resume", "r", "-q"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["status"] == "completed"


# ---------------------------------------------------------------------------- the probe's refusals
def _base(t: Path) -> None:
    (t / "c.yaml").write_text(yaml.safe_dump(tiny_config(run={"max_steps": 4})))


def _lock_link(t: Path) -> None:
    _base(t)
    (t / "victim.txt").write_text("victim\n")
    (t / "d").mkdir()
    (t / "d" / ".fedgmr.lock").symlink_to(t / "victim.txt")


def _huge_grid(t: Path) -> None:
    _base(t)
    (t / "huge.yaml").write_text(yaml.safe_dump({"name": "h", "base": "c.yaml", "grid": {
        "seed": list(range(1000)), "training.lr": [0.01 * (i + 1) for i in range(1000)]}}))


def _special(name: str, plant: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(t: Path) -> None:
        _base(t)
        plant(t / name)
    return setup


def _write(name: str, text: str) -> Callable[[Path], None]:
    def setup(t: Path) -> None:
        _base(t)
        (t / name).write_text(text)
    return setup


PROBES = [
    # id, set-up, arguments (run in the set-up's folder), exit code, a part of the one line
    ("lock-file-symlink", _lock_link, ["run", "c.yaml", "--out", "d", "-q"], 3,
     "d/.fedgmr.lock is a symbolic link: fedgmr writes only regular files it created"),
    ("config-fifo", _special("f.yaml", _fifo), ["run", "f.yaml", "--out", "o", "-q"], 2, "f.yaml"),
    ("config-dev-zero", _special("z.yaml", _dev_zero), ["run", "z.yaml", "--out", "o", "-q"], 2, "z.yaml"),
    ("config-a-list", _write("l.yaml", "- a\n- b\n"), ["run", "l.yaml", "--out", "o", "-q"], 2,
     "must hold a mapping of keys at its top level, not a list"),
    ("config-not-yaml", _write("b.yaml", "a: [1,\n"), ["run", "b.yaml", "--out", "o", "-q"], 2,
     "cannot parse config file b.yaml"),
    ("negative-steps", _base, ["run", "c.yaml", "--out", "o", "-q", "--set", "run.max_steps=-3"], 2,
     "invalid value for 'run.max_steps'"),
    ("out-empty", _base, ["run", "c.yaml", "--out", "", "-q"], 2, "--out is empty"),
    ("mlflow-junk-uri", _base, ["run", "c.yaml", "--out", "o", "-q", "--set", "run.mlflow_uri=:::not a uri"], 2,
     "invalid value for 'run.mlflow_uri'"),
    ("device-index-overflow", _base,
     ["run", "c.yaml", "--out", "o", "-q", "--set", "run.device=cuda:99999999999999999999"], 2,
     "invalid value for 'run.device'"),
    ("concurrency-above-clients", _base, ["run", "c.yaml", "--out", "o", "-q", "--set", "clients.concurrency=50"],
     2, "clients.concurrency 50 is more than the 10 clients"),
    ("plugin-sys-exit", _write("exit0.py", "import sys\nsys.exit(0)\n"),
     ["run", "c.yaml", "--out", "o", "-q", "--import", "exit0.py"], 6, "it called sys.exit(0) while being imported"),
    ("huge-grid", _huge_grid, ["sweep", "huge.yaml", "--out", "sw", "--dry-run"], 2,
     "sweep h has 1,000,000 cells (1,000 (seed) x 1,000 (training.lr)), more than the bound of 10,000"),
    ("sweep-out-a-file", _write("afile", "x\n"), ["sweep", "demo", "--out", "afile", "--dry-run"], 3,
     "afile is a file, not a sweep directory"),
    ("sweep-file-fifo", _special("s.yaml", _fifo), ["sweep", "s.yaml", "--out", "sw"], 2,
     "cannot read config file s.yaml: it is a FIFO (named pipe), not a regular file"),
    ("sweep-file-dev-zero", _special("z.yaml", _dev_zero), ["sweep", "z.yaml", "--out", "sw"], 2,
     "cannot read config file z.yaml: it is a device, not a regular file"),
]


@pytest.mark.parametrize("setup, args, code, needle", [pytest.param(*p[1:], id=p[0]) for p in PROBES])
def test_a_probe_case_is_a_one_line_refusal(tmp_path: Path, setup: Callable[[Path], None], args: list[str],
                                            code: int, needle: str):
    setup(tmp_path)
    with no_hang():
        result = run_cli(args, tmp_path)
    assert result.returncode == code, (result.returncode, result.stderr)
    assert needle in one_line(result.stderr)
    assert not (tmp_path / "o").exists() and not (tmp_path / "sw").exists()  # refused before anything was written
    if (tmp_path / "victim.txt").exists():
        assert (tmp_path / "victim.txt").read_text() == "victim\n"  # never written through the link


@pytest.mark.parametrize("damage, needle", [
    (lambda run: (run / "config.yaml").write_text("- a list\n"), "config.yaml"),
    (lambda run: (run / "config.yaml").write_text(""), "config.yaml is empty"),
    (lambda run: (run / "summary.json").write_text('{"steps": 6, "final'), "summary.json is damaged"),
    (lambda run: (run / "config.yaml").write_text((run / "config.yaml").read_text().replace("seed: 0", "seed: 1")),
     "was changed after the checkpoint was written"),
], ids=["config-a-list", "config-empty", "summary-truncated", "config-edited"])
def test_evaluate_of_a_damaged_run_is_one_line_exit_3(reference: Path, tmp_path: Path, damage: Any, needle: str):
    run = tmp_path / "run"
    shutil.copytree(reference, run, symlinks=True)
    damage(run)
    result = run_cli(["evaluate", str(run)], tmp_path)
    assert result.returncode == 3 and needle in one_line(result.stderr)


@pytest.mark.parametrize("key, value", [("max-update-norm", -1), ("max-samples", -1),
                                        ("update-norm-multiple", float("nan")), ("num-server-steps", 0),
                                        ("k", -1), ("reply-timeout", -1), ("step-timeout", float("inf")),
                                        ("t-star", -1)])
def test_a_bad_deployment_run_config_value_is_one_line_naming_the_key(key: str, value: Any):
    from fedgmr.flower.run_config import parse_run_config

    with pytest.raises(ConfigError) as err:
        parse_run_config({"config": "fedgmr.yaml", key: value})
    assert str(err.value).startswith(f"invalid run-config value for '{key}': ") and "\n" not in str(err.value)
    assert err.value.exit_code == 2
