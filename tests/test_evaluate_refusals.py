"""`fedgmr evaluate` checks what it rebuilds (issue 42, item 5): the run's config.yaml must
match the checkpoint's config hash, and a malformed, empty or non-mapping config.yaml or a
truncated summary.json is one line (exit 3), never a traceback or another experiment's
accuracy. In-process: one tiny run shared by the tests, each on its own copy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import tiny_config
from fedgmr.cli import app
from fedgmr.errors import RunDirError
from fedgmr.experiment.evaluate_run import evaluate_run


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    from fedgmr.experiment.build import EXECUTORS
    from fedgmr.methods import resolve_config
    from fedgmr.experiment.runner import run_experiment

    # made with an executor this process no longer has (as a run made on Ray or a pool,
    # evaluated elsewhere): evaluate rebuilds it serially
    EXECUTORS.register("elsewhere", EXECUTORS.get("serial"))
    out = tmp_path_factory.mktemp("evaluate") / "run"
    try:
        cfg = resolve_config(tiny_config(clients={"num_clients": 4}, run={"max_steps": 6, "eval_every": 3,
                                                                          "executor": "elsewhere"}))
        run_experiment(cfg, out)
    finally:
        EXECUTORS.unregister("elsewhere")
    return out


@pytest.fixture
def run(finished: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    return copy


def _evaluate(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["evaluate", str(path), "--json", "--no-levels"])
    return result.exit_code, result.output


def test_an_unchanged_run_is_evaluated_serially_and_final(run):
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    got = evaluate_run(run, levels=False)
    assert got.step == last["step"] == 6 and got.final and got.accuracy == last["accuracy"]


@pytest.mark.parametrize("edit", [
    lambda c: c["data"]["options"].update(test_fraction=0.5),  # another test split: the probe's case
    lambda c: c["model"]["options"].update(hidden=[64]),  # another width
    lambda c: c.update(seed=1),
])
def test_a_config_changed_after_the_checkpoint_is_refused(run, edit):
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    edit(cfg)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    with pytest.raises(RunDirError, match="does not match the checkpoint's config hash"):
        evaluate_run(run)
    code, out = _evaluate(run)
    assert code == 3 and "config hash" in out and "Traceback" not in out and "accuracy" not in out


def test_formatting_alone_is_not_a_change(run):
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text("# a comment\n" + yaml.safe_dump(cfg, sort_keys=True, indent=4))
    assert evaluate_run(run, levels=False).final


@pytest.mark.parametrize("text,why", [
    ("run: [unclosed\n", "cannot parse config file"),
    ("", "is empty"),
    ("- 1\n- 2\n", "must hold a mapping"),
    ("just a string\n", "must hold a mapping"),
    (b"\xff\xfe bad", "not UTF-8"),
])
def test_a_malformed_empty_or_list_config_is_one_line(run, text, why):
    path = run / "config.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(RunDirError, match=why):
        evaluate_run(run)
    code, out = _evaluate(run)
    assert code == 3 and out.startswith("error:") and why in out and len(out.strip().splitlines()) == 1


@pytest.mark.parametrize("text", ['{"steps": 6, "final_acc', "", "[1, 2]", '{"status": "completed"}',
                                  '{"steps": "6"}'])
def test_a_truncated_or_damaged_summary_is_one_line(run, text):
    (run / "summary.json").write_text(text)
    with pytest.raises(RunDirError, match="summary.json is damaged"):
        evaluate_run(run)
    code, out = _evaluate(run)
    assert code == 3 and len(out.strip().splitlines()) == 1 and "Traceback" not in out


def test_without_a_summary_the_checkpoint_is_not_final(run):
    (run / "summary.json").unlink()
    assert not evaluate_run(run, levels=False).final
