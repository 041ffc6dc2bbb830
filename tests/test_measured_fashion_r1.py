"""docs/protocol_results.md reads FedGMR's Fashion-MNIST High non-IID models at R1 per class
from reruns of the protocol cells stopped at 2,000 s (`measured/protocol_fashion_r1`, which
keeps their saved evaluations): each rerun must be its protocol cell, record for record, and
its saved evaluation the model its last record measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedgmr.experiment.evaluate_run import load_evaluation
from fedgmr.experiment.metrics import read_metrics

REPO = Path(__file__).resolve().parents[1]
CELLS = REPO / "measured" / "protocol_table1"
RERUNS = REPO / "measured" / "protocol_fashion_r1"
SEEDS = [0, 1, 2]


def _name(seed: int) -> str:
    return f"preset=fashion_mnist,method=fedgmr,heterogeneity=high,partition=dirichlet,seed={seed}"


@pytest.mark.parametrize("seed", SEEDS)
def test_a_rerun_is_its_protocol_cell_up_to_2000_s(seed: int):
    cell, rerun = read_metrics(CELLS / _name(seed)), read_metrics(RERUNS / _name(seed))
    assert rerun[-1]["time"] == 2000.0 and len(rerun) < len(cell)
    assert rerun == cell[:len(rerun)]  # every record, every key, to the bit
    ev = load_evaluation(RERUNS / _name(seed))
    assert ev.final and ev.time == 2000.0 and ev.step == rerun[-1]["step"]
    assert round(ev.accuracy, 4) == round(rerun[-1]["accuracy"], 4)
    assert len(ev.class_accuracy) == 10 and len(ev.level_class_accuracy) == len(ev.levels) == 5
    summary = json.loads((RERUNS / _name(seed) / "summary.json").read_text())
    assert summary["steps"] == ev.step
