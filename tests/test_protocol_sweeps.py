"""docs/protocol.md's run tables name the sweep files that the protocol governs and how many
cells each holds: both must be what the shipped sweep files expand to, so the page cannot
drift from the grids that are run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedgmr.experiment.sweep import count_cells, load_sweep, shipped_sweeps

PAGE = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"
#: a run-table row: | P1 | `protocol/table1` | 612 | ...  (several files: counts joined by " + ")
ROW = re.compile(r"^\| (P\d+) \| ((?:`protocol/\w+`(?:, )?)+) \| ([\d +]+)(?: \(\+[^)]*\))? \|", re.M)


def _rows() -> list[tuple[str, list[str], list[int]]]:
    rows = []
    for m in ROW.finditer(PAGE.read_text(encoding="utf-8")):
        files = re.findall(r"`(protocol/\w+)`", m.group(2))
        counts = [int(c) for c in m.group(3).split("+")]
        rows.append((m.group(1), files, counts))
    return rows


def test_the_run_tables_are_found():
    names = [r[0] for r in _rows()]
    assert names == ["P1", "P2", "P3", "P4", "P5", "P6", "P7", "P8", "P9"]


@pytest.mark.parametrize("label,files,counts", _rows(), ids=[r[0] for r in _rows()])
def test_each_protocol_run_names_shipped_sweeps_with_their_cell_counts(label: str, files: list[str],
                                                                       counts: list[int]):
    assert all(f in shipped_sweeps() for f in files), files
    got = [count_cells(load_sweep(f)[0]) for f in files]
    if len(counts) == 1 and len(files) > 1:  # one total for several files
        got = [sum(got)]
    assert got == counts, f"{label}: docs/protocol.md says {counts} cells, the sweep files expand to {got}"
