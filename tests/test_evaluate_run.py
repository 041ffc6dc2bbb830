"""`fedgmr evaluate`: a run's saved global model, in full and under each level's mask,
exercised from the command line on real run directories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from conftest import fedgmr_in_process, tiny_config


def fedgmr(*args: str) -> Any:
    """``fedgmr ARGS`` in this process (``conftest.run_cli``): the command's exit code and output."""
    return fedgmr_in_process(*args)


def _run(tmp_path: Path, name: str, **run) -> Path:
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config(run={"max_steps": 12, "eval_every": 4, "level_eval_every": 1,
                                                   **run})))
    out = tmp_path / name
    proc = fedgmr("run", str(cfg), "--out", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    return out


def test_evaluate_reproduces_the_final_records_accuracy_and_level_accuracy(tmp_path: Path):
    """A finished run checkpoints its final model; evaluating it gives, exactly, the
    accuracy and per-level accuracy its last record logged at that step."""
    out = _run(tmp_path, "r", checkpoint_every=5)  # periodic checkpoints at 5 and 10, the final one at 12
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 12 and "level_accuracy" in last
    proc = fedgmr("evaluate", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["step"] == 12 and got["final"] is True and got["time"] == last["time"]
    assert got["accuracy"] == last["accuracy"] and got["levels"] == last["levels"]
    assert got["level_accuracy"] == last["level_accuracy"]
    assert got["level_accuracy"][-1] == got["accuracy"]  # the full level is the model itself

    table = fedgmr("evaluate", str(tmp_path))  # a directory of runs: every one found
    assert table.returncode == 0, table.stderr
    header = next(line for line in table.stdout.splitlines() if line.startswith("| run"))
    assert [f"@{d:g}" for d in last["levels"]] == [c.strip() for c in header.strip("|").split("|")][5:]
    row = next(line for line in table.stdout.splitlines() if line.startswith("| r "))
    assert f"{100 * last['accuracy']:.2f}" in row and "| yes" in row
    assert fedgmr("evaluate", str(out), "--json", "--no-levels").stdout.count('"level_accuracy": []') == 1

    # a config.yaml edited after the run no longer matches the checkpoint: refused, not evaluated
    # (a run made on Ray or a pool is evaluated serially: tests/test_evaluate_refusals.py)
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    cfg["run"]["executor"] = "no_such_executor"
    (out / "config.yaml").write_text(yaml.safe_dump(cfg))
    again = fedgmr("evaluate", str(out), "--json")
    assert again.returncode == 3 and "config hash" in again.stderr and not again.stdout



def test_a_run_that_ends_while_the_server_aggregates_is_evaluated_on_the_model_its_records_saw(tmp_path: Path):
    """At max_time the server can be in the middle of an aggregation (a 4 s server_time
    here): the final checkpoint then holds that unfinished step's model too, but the run's
    final model is the one published before it, which the last record measured."""
    cfg = tmp_path / "busy.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config(
        run={"max_steps": None, "max_time": 50, "eval_every": None, "eval_interval": 5.0, "checkpoint_every": 5,
             "level_eval_every": 1},
        coordination={"server_time": 4.0})))
    out = tmp_path / "busy"
    assert fedgmr("run", str(cfg), "--out", str(out), "-q").returncode == 0
    manifest = json.loads((out / "checkpoint" / "manifest.json").read_text())
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    summary = json.loads((out / "summary.json").read_text())
    assert last["time"] == 50 and manifest["step"] == last["step"] + 1 == summary["steps"] + 1  # one step unpublished
    proc = fedgmr("evaluate", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["step"] == last["step"] and got["final"] is True and got["time"] == 50
    assert got["accuracy"] == last["accuracy"] and got["level_accuracy"] == last["level_accuracy"]

def test_evaluate_refuses_a_run_without_a_checkpoint(tmp_path: Path):
    out = _run(tmp_path, "nock", checkpoint_every=None, checkpoint_seconds=None)
    assert not (out / "checkpoint").exists()
    proc = fedgmr("evaluate", str(out))
    assert proc.returncode != 0 and "has no checkpoint to evaluate" in proc.stderr and "Traceback" not in proc.stderr
    proc = fedgmr("evaluate", str(tmp_path / "missing"))
    assert proc.returncode != 0 and "is not a directory" in proc.stderr


def test_level_columns_are_labelled_to_three_significant_figures_unless_that_merges_levels():
    from fedgmr.experiment.evaluate_run import level_labels

    # FIARSE's measured densities differ in the sixth digit between seeds: one column each
    assert level_labels([0.0500009, 0.0999993, 0.2, 0.5, 1.0]) == ["@0.05", "@0.1", "@0.2", "@0.5", "@1"]
    assert level_labels([0.0499996, 0.1000004, 0.2, 0.5, 1.0]) == ["@0.05", "@0.1", "@0.2", "@0.5", "@1"]
    assert level_labels([0.0073, 0.0287, 1.0]) == ["@0.0073", "@0.0287", "@1"]
    # two levels of one run that 3 digits would merge keep more
    assert level_labels([0.05001, 0.05004, 1.0]) == ["@0.05001", "@0.05004", "@1"]


def test_a_saved_evaluation_reprints_the_same_table_without_the_checkpoint(tmp_path: Path):
    """`--save` keeps each run's result in its directory; once the checkpoint is gone (as in
    measured/, which keeps none), `--saved` prints the very table the live evaluation did."""
    import shutil

    out = _run(tmp_path, "kept", checkpoint_every=5)
    live = fedgmr("evaluate", str(tmp_path), "--save")
    assert live.returncode == 0, live.stderr
    saved = json.loads((out / "evaluation.json").read_text())
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert saved["run"] == "kept" and saved["step"] == 12 and saved["final"] is True
    assert saved["level_accuracy"] == last["level_accuracy"] and saved["accuracy"] == last["accuracy"]
    assert saved["environment"]["torch"] and len(saved["config_sha256"]) == 64
    live_json = json.loads(fedgmr("evaluate", str(out), "--json").stdout)

    shutil.rmtree(out / "checkpoint")
    assert fedgmr("evaluate", str(out)).returncode != 0  # nothing left to evaluate live
    again = fedgmr("evaluate", str(tmp_path), "--saved")
    assert again.returncode == 0, again.stderr
    assert again.stdout == live.stdout
    assert json.loads(fedgmr("evaluate", str(out), "--saved", "--json").stdout) == live_json
    no_levels = json.loads(fedgmr("evaluate", str(out), "--saved", "--json", "--no-levels").stdout)
    assert no_levels["levels"] == [] and no_levels["accuracy"] == live_json["accuracy"]


def test_a_blind_save_keeps_the_same_result_and_prints_no_accuracy(tmp_path: Path):
    """``--save --blind`` (cells of a grid not yet read): the same ``evaluation.json`` as a
    plain ``--save`` writes, a one-line count instead of the table; ``--blind`` without
    ``--save`` is refused, since it would do nothing."""
    out = _run(tmp_path, "blind", checkpoint_every=5)
    blind = fedgmr("evaluate", str(tmp_path), "--save", "--blind")
    assert blind.returncode == 0, blind.stderr
    assert blind.stdout.strip() == ("saved the evaluation of 1 run(s) (evaluation.json in each; print them "
                                    "with --saved)")
    kept = json.loads((out / "evaluation.json").read_text())
    plain = fedgmr("evaluate", str(tmp_path), "--save")
    assert plain.returncode == 0 and "accuracy (%)" in plain.stdout
    again = json.loads((out / "evaluation.json").read_text())
    assert {k: v for k, v in kept.items() if k != "environment"} == {k: v for k, v in again.items()
                                                                      if k != "environment"}
    refused = fedgmr("evaluate", str(tmp_path), "--blind")
    assert refused.returncode == 2 and "only makes sense with --save" in refused.stderr


def test_saved_evaluations_that_are_missing_damaged_or_stale_are_refused_in_one_line(tmp_path: Path):
    out = _run(tmp_path, "r", checkpoint_every=5)
    proc = fedgmr("evaluate", str(out), "--saved")
    assert proc.returncode != 0 and "has no saved evaluation" in proc.stderr and "--save" in proc.stderr
    both = fedgmr("evaluate", str(out), "--save", "--saved")
    assert both.returncode != 0 and "give one" in both.stderr and not (out / "evaluation.json").exists()

    assert fedgmr("evaluate", str(out), "--save").returncode == 0
    good = (out / "evaluation.json").read_text()
    for damaged in ("{not json", json.dumps({"format": 99}), json.dumps({**json.loads(good), "levels": [0.5]})):
        (out / "evaluation.json").write_text(damaged)
        proc = fedgmr("evaluate", str(out), "--saved")
        assert proc.returncode != 0 and "is damaged" in proc.stderr and "Traceback" not in proc.stderr
    (out / "evaluation.json").write_text(good)
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    cfg["seed"] = 12345  # another experiment than the one evaluated
    (out / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = fedgmr("evaluate", str(out), "--saved")
    assert proc.returncode != 0 and "was changed after evaluation.json was saved" in proc.stderr


def test_only_evaluates_part_of_a_sweep_directory(tmp_path: Path):
    """`--only KEY=VALUES` keeps the runs of a directory whose config has one of the values,
    as `fedgmr table --only` does (`--exclude` and `--drop` leave them out); a value no run has is
    refused, naming the values there are."""
    runs = tmp_path / "sweep"
    for method in ("fedgmr", "fedgmr_wo_gmr"):
        cfg = tmp_path / f"{method}.yaml"
        cfg.write_text(yaml.safe_dump({**tiny_config(run={"max_steps": 4, "eval_every": 2}), "method": method}))
        assert fedgmr("run", str(cfg), "--out", str(runs / method), "-q").returncode == 0
    assert fedgmr("evaluate", str(runs), "--save").returncode == 0
    every = fedgmr("evaluate", str(runs), "--saved")
    assert "| fedgmr " in every.stdout and "| fedgmr_wo_gmr " in every.stdout
    one = fedgmr("evaluate", str(runs), "--saved", "--only", "method=fedgmr_wo_gmr")
    assert one.returncode == 0, one.stderr
    rows = [line for line in one.stdout.splitlines() if line.startswith("| fedgmr")]
    assert rows == [line for line in every.stdout.splitlines() if line.startswith("| fedgmr_wo_gmr ")]
    rest = fedgmr("evaluate", str(runs), "--saved", "--exclude", "method=fedgmr")
    assert rest.returncode == 0, rest.stderr
    assert [line for line in rest.stdout.splitlines() if line.startswith("| fedgmr")] == rows
    dropped = fedgmr("evaluate", str(runs), "--saved", "--drop", "method=fedgmr_wo_gmr", "--drop", "method=fedgmr")
    assert dropped.returncode != 0 and "no run is left by --drop 'method=fedgmr_wo_gmr' --drop 'method=fedgmr'" \
        in dropped.stderr
    kept = fedgmr("evaluate", str(runs), "--saved", "--drop", "method=fedgmr seed=0")
    assert [line for line in kept.stdout.splitlines() if line.startswith("| fedgmr")] == rows
    none = fedgmr("evaluate", str(runs), "--saved", "--only", "method=fjord")
    assert none.returncode != 0 and "no run has fjord" in none.stderr and "fedgmr_wo_gmr" in none.stderr
