"""Amendment 5's determinism check, kept as a test: P4's patience-2 cells have the config of
P1's `fedgmr` cells at MNIST High (the preset's patience is 2), so each kept one must hold
byte for byte P1's metrics, same partition and seed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedgmr.config import parse_config, read_config_file

MEASURED = Path(__file__).resolve().parents[1] / "measured"
P4 = sorted(p for p in (MEASURED / "protocol_patience").glob("preset=mnist,patience=2,*")
            if (p / "summary.json").is_file())


def _twin(cell: Path) -> Path:
    part, seed = re.search(r"partition=(\w+),seed=(\d+)$", cell.name).groups()
    return MEASURED / "protocol_table1" / f"preset=mnist,method=fedgmr,heterogeneity=high,partition={part},seed={seed}"


def test_patience_2_cells_are_kept():
    assert P4, "no finished P4 patience-2 cell under measured/protocol_patience"


@pytest.mark.parametrize("cell", P4, ids=[p.name for p in P4])
def test_a_patience_2_cell_replays_p1s_fedgmr_cell_byte_for_byte(cell: Path):
    twin = _twin(cell)
    # the same experiment, key for key once each file's keys are resolved (P1's older cells
    # predate keys added since at their defaults: augment, lr_schedule, message costs)
    mine, theirs = (parse_config(read_config_file(d / "config.yaml")).model_dump() for d in (cell, twin))
    assert mine == theirs
    assert (cell / "metrics.jsonl").read_bytes() == (twin / "metrics.jsonl").read_bytes()
