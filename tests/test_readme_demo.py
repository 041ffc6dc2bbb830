"""The README's demo figures re-derive from the demo's runs kept under measured/demo/:
one set computed with this machine's default CPU kernels (AVX-512), one with the pinned
stack's AVX2 limits (constraints/repro.env). The table in the README's "What the demo
prints" is what `compare_runs` gives on them, to the digit, so the spread it states is the
measured one, not a guess."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedgmr.experiment.metrics import compare_runs

REPO = Path(__file__).resolve().parents[1]
STACKS = {"AVX-512 (default kernels)": "avx512_default", "AVX2 (constraints/repro.env)": "avx2_limits"}
METHODS = ("fedgmr", "fedavg", "fedgmr_wo_gmr")


def _readme_rows() -> dict[str, list[str]]:
    """The demo table's rows of the README, by their first cell."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## What the demo prints", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in STACKS:
            rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.parametrize("stack", list(STACKS))
def test_the_readme_demo_table_is_what_the_kept_runs_give(stack: str):
    runs = [REPO / "measured" / "demo" / STACKS[stack] / m for m in METHODS]
    result = compare_runs(runs, 400.0)
    by = {r["method"]: r for r in result["runs"]}
    expected = [f"{100 * by['fedgmr']['acc_at_t']:.2f} ± {100 * by['fedgmr']['std']:.2f}",
                f"{100 * by['fedgmr_wo_gmr']['acc_at_t']:.2f} ± {100 * by['fedgmr_wo_gmr']['std']:.2f}",
                f"{100 * by['fedavg']['acc_at_t']:.2f} ± {100 * by['fedavg']['std']:.2f}",
                f"{100 * by['fedgmr']['final_accuracy']:.2f}", f"{100 * by['fedgmr_wo_gmr']['final_accuracy']:.2f}",
                f"{result['mri']:+.2f}"]
    assert _readme_rows()[stack] == expected
    # the spread the README states between the two stacks is the one these runs give
    text = (REPO / "README.md").read_text(encoding="utf-8")
    a = compare_runs([REPO / "measured/demo/avx512_default/fedgmr"], 400.0)["runs"][0]["acc_at_t"]
    b = compare_runs([REPO / "measured/demo/avx2_limits/fedgmr"], 400.0)["runs"][0]["acc_at_t"]
    assert f"{100 * abs(a - b):.2f} points" in text
