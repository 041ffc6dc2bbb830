"""docs/protocol_results.md reads FedGMR's Fashion-MNIST High non-IID models at R1 per class
from reruns of the protocol cells stopped at 2,000 s (`measured/protocol_fashion_r1`, which
keeps their saved evaluations): each rerun must be its protocol cell, record for record, and
its saved evaluation the model its last record measured."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import page_section
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


def _saved(root: Path, method: str, seed: int):
    name = _name(seed).replace("method=fedgmr", f"method={method}")
    return load_evaluation(root / name)


def _pct(value: float) -> float:
    return round(100 * value, 1)


#: the per-class numbers the page quotes by hand: (root, method, seed, level index or None for the
#: full model, class, the quoted %)
QUOTED = [
    (CELLS, "fjord_ims", 1, None, 3, 15.6), (CELLS, "fjord_ims", 1, None, 9, 12.8),
    (CELLS, "fiarse_ims", 1, None, 3, 8.6), (CELLS, "fiarse_ims", 1, None, 9, 0.6),
    (CELLS, "fjord_ims", 1, 0, 3, 85.4), (CELLS, "fjord_ims", 1, 0, 9, 93.3),
    (CELLS, "fiarse_ims", 1, 0, 3, 85.4), (CELLS, "fiarse_ims", 1, 0, 9, 94.8),
    (CELLS, "fjord_ims", 0, None, 8, 61.6), (CELLS, "fjord_ims", 0, None, 9, 64.2),
    (CELLS, "fjord_ims", 0, 0, 8, 97.1), (CELLS, "fjord_ims", 0, 0, 9, 96.4),
    (CELLS, "fiarse_ims", 0, None, 8, 49.6), (CELLS, "fiarse_ims", 0, None, 9, 72.5),
    (CELLS, "fiarse_ims", 0, 0, 8, 96.0), (CELLS, "fiarse_ims", 0, 0, 9, 95.4),
    (CELLS, "fjord_ims", 1, None, 0, 93.1), (CELLS, "fjord_ims", 1, 0, 0, 81.7),
    (CELLS, "fiarse_ims", 1, None, 0, 92.9), (CELLS, "fiarse_ims", 1, 0, 0, 70.2),
    (CELLS, "fiarse_ims", 1, None, 6, 8.9),
    (CELLS, "fjord_ims", 2, None, 3, 70.8), (CELLS, "fjord_ims", 2, None, 5, 87.6),
    (CELLS, "fjord_ims", 2, 0, 3, 85.4), (CELLS, "fjord_ims", 2, 0, 5, 94.0),
    (CELLS, "fedgmr", 1, None, 3, 78.0), (CELLS, "fedgmr", 1, None, 9, 92.5),
    (RERUNS, "fedgmr", 1, None, 3, 3.2), (RERUNS, "fedgmr", 1, None, 9, 0.4),
    (RERUNS, "fedgmr", 1, 3, 3, 89.0), (RERUNS, "fedgmr", 1, 3, 9, 95.6),
]


@pytest.mark.parametrize("root, method, seed, level, cls, quoted", QUOTED)
def test_a_quoted_per_class_accuracy_is_what_the_kept_evaluation_holds(root: Path, method: str, seed: int,
                                                                        level: int | None, cls: int, quoted: float):
    ev = _saved(root, method, seed)
    values = ev.class_accuracy if level is None else ev.level_class_accuracy[level]
    assert _pct(values[cls]) == quoted
    assert re.search(rf"(?<![\d.]){quoted:.1f}(?![\d])", _section()), f"the page no longer quotes {quoted}"


PAGE = REPO / "docs" / "protocol_results.md"
HEADING = "## Fashion-MNIST, High heterogeneity, non-IID, three seeds: Table 1 against FedGMR (7 December 2026)"


def _section() -> str:
    """The page's Fashion-MNIST High non-IID section, its pasted tables left out (prose only)."""
    section = page_section(HEADING, PAGE)
    return re.sub(r"^```\w*\n.*?^```\n", "", section, flags=re.M | re.S)


def test_at_r1_the_half_level_beats_the_full_model_in_every_seed():
    """The page: at 2,000 s FedGMR's 0.5 level is better than its full model in every seed."""
    for seed in SEEDS:
        ev = load_evaluation(RERUNS / _name(seed))
        assert ev.levels[3] == 0.5 and ev.level_accuracy[3] > ev.accuracy, seed
