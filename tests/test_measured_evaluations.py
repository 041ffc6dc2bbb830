"""The per-level evaluations kept in measured/ (`fedgmr evaluate --save`) load without their
checkpoints, belong to the config beside them, and their full model is the run's final one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fedgmr.experiment.evaluate_run import load_evaluation

MEASURED = Path(__file__).resolve().parents[1] / "measured"
SAVED = sorted(p.parent for p in MEASURED.rglob("evaluation.json"))


def test_some_evaluations_are_kept():
    assert len(SAVED) >= 27


@pytest.mark.parametrize("run", SAVED, ids=[p.name for p in SAVED])
def test_a_kept_evaluation_is_the_final_model_of_its_run(run: Path):
    ev = load_evaluation(run)  # refuses one whose config.yaml changed since
    summary = json.loads((run / "summary.json").read_text())
    assert ev.final and ev.step == summary["steps"]
    assert round(ev.accuracy, 4) == summary["final_accuracy"]
    # its last level is the run's largest sub-model: the full model, or the one density a
    # fixed-density run (P5's Fig. 2 cells, `submodel.ladder: [0.2]`) trains throughout
    ladder = (yaml.safe_load((run / "config.yaml").read_text()).get("submodel") or {}).get("ladder") or [1.0]
    assert len(ev.levels) == len(ev.level_accuracy) > 0 and abs(ev.levels[-1] - max(ladder)) < 1e-3, ev.levels
