"""`fedgmr evaluate --classes`: each class's accuracy of a run's saved global model, in full
and under each level's mask, computed from the checkpoint, kept by --save and printed again
by --saved, exercised from the command line on real run directories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import yaml

from conftest import fedgmr_in_process, tiny_config, tiny_text_config


def fedgmr(*args: str) -> Any:
    return fedgmr_in_process(*args)


def _run(tmp_path: Path, name: str, raw: dict[str, Any]) -> Path:
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    out = tmp_path / name
    proc = fedgmr("run", str(cfg), "--out", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    return out


def _class_table(stdout: str) -> list[list[str]]:
    """The rows of the per-class table (after its heading), cells stripped."""
    lines = stdout.split("Test accuracy per class (%)", 1)[1].splitlines()
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| ")]


def test_classes_are_the_per_class_accuracy_the_run_logged_at_its_last_step(tmp_path: Path):
    """A run logging ``class_accuracy`` at every evaluation: evaluating its final checkpoint
    with --classes gives, exactly, the per-class accuracy of its last record; the full level's
    row is the model itself, and each level's row is the masked model's (its mean over classes,
    weighted by the test split's class counts, is the level's accuracy)."""
    out = _run(tmp_path, "r", tiny_config(run={"max_steps": 12, "eval_every": 4, "level_eval_every": 1,
                                                 "class_eval_every": 1}))
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    proc = fedgmr("evaluate", str(out), "--json", "--classes")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["class_accuracy"] == last["class_accuracy"]
    assert len(got["level_class_accuracy"]) == len(got["levels"]) == len(last["levels"])
    assert got["level_class_accuracy"][-1] == got["class_accuracy"]  # level 1.0: the model itself
    assert got["level_class_accuracy"][0] != got["class_accuracy"]  # the 5 % mask changes the model

    # each level's accuracy is its per-class accuracies weighted by the classes' test counts
    counts = _test_class_counts(out)
    for acc, per_class in zip(got["level_accuracy"], got["level_class_accuracy"]):
        hits = sum(a * n for a, n in zip(per_class, counts) if a is not None)
        assert abs(hits / sum(counts) - acc) < 1e-9

    # without --classes nothing per class is printed or kept: the saved file is as before
    plain = fedgmr("evaluate", str(out), "--json")
    assert "class_accuracy" not in plain.stdout
    assert fedgmr("evaluate", str(out), "--save").returncode == 0
    assert "class_accuracy" not in (out / "evaluation.json").read_text()
    refused = fedgmr("evaluate", str(out), "--saved", "--classes")
    assert refused.returncode == 3 and "has no per-class evaluation saved" in refused.stderr
    assert "--save --classes" in refused.stderr and not refused.stdout


def _test_class_counts(run: Path) -> list[int]:
    from fedgmr.experiment.build import build_experiment
    from fedgmr.methods import resolve_config

    raw = yaml.safe_load((run / "config.yaml").read_text())
    exp = build_experiment(resolve_config(raw))
    try:
        y = exp.data.test.y
        return [int(n) for n in torch.bincount(torch.as_tensor(y), minlength=exp.data.num_classes)]
    finally:
        exp.executor.close()


def test_saved_classes_print_again_without_the_checkpoint(tmp_path: Path):
    """--save --classes keeps the per-class numbers in evaluation.json; --saved --classes
    prints the same table from that file with the checkpoint gone; --no-levels keeps only the
    full model's row; a damaged per-class entry is refused in one line."""
    out = _run(tmp_path, "s", tiny_config(run={"max_steps": 8, "eval_every": 4}))
    live = fedgmr("evaluate", str(out), "--save", "--classes")
    assert live.returncode == 0, live.stderr
    body = json.loads((out / "evaluation.json").read_text())
    assert len(body["class_accuracy"]) == 10 and len(body["level_class_accuracy"]) == len(body["levels"])
    rows = _class_table(live.stdout)
    assert [r[1] for r in rows[1:]] == ["full", *(f"@{d:.3g}" for d in body["levels"])]
    assert [float(c) for c in rows[1][2:]] == [float(f"{100 * a:.1f}") for a in body["class_accuracy"]]

    import shutil
    shutil.rmtree(out / "checkpoint")
    again = fedgmr("evaluate", str(out), "--saved", "--classes")
    assert again.returncode == 0, again.stderr
    assert again.stdout == live.stdout
    only_full = _class_table(fedgmr("evaluate", str(out), "--saved", "--classes", "--no-levels").stdout)
    assert [r[1] for r in only_full[1:]] == ["full"]

    for broken in ({"level_class_accuracy": body["level_class_accuracy"][:-1]},  # one level's row lost
                   {"level_class_accuracy": [row[:-1] for row in body["level_class_accuracy"]]},  # a class lost
                   {"class_accuracy": []},  # the full model's row lost, the levels' kept
                   {"class_accuracy": "85.0"}):  # not a list
        (out / "evaluation.json").write_text(json.dumps({**body, **broken}))
        damaged = fedgmr("evaluate", str(out), "--saved", "--classes")
        assert damaged.returncode == 3 and "is damaged" in damaged.stderr, broken
        assert len(damaged.stderr.strip().splitlines()) == 1 and not damaged.stdout, broken


def test_classes_are_refused_in_one_line_for_a_task_without_classes(tmp_path: Path):
    raw = tiny_text_config("tiny_text_for_evaluate_classes", run={"max_steps": 4, "eval_every": 2})
    out = _run(tmp_path, "text", raw)
    assert fedgmr("evaluate", str(out), "--no-levels").returncode == 0  # without --classes: evaluated
    proc = fedgmr("evaluate", str(out), "--classes")
    assert proc.returncode == 3 and "--classes measures each class's accuracy" in proc.stderr
    assert "classification task" in proc.stderr and "Traceback" not in proc.stderr and not proc.stdout
