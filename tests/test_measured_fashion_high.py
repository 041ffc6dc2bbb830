"""docs/protocol_results.md's Fashion-MNIST High sections quote numbers by hand from the
kept cells (FedGMR's ladder, the per-level means at the horizon, per-seed gaps): each must be
what those cells hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import page_section
from fedgmr.experiment.evaluate_run import load_evaluation
from fedgmr.experiment.metrics import acc_at_t, read_metrics, run_eval_interval

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "protocol_results.md"
CELLS = REPO / "measured" / "protocol_table1"
IID = "## Fashion-MNIST, High heterogeneity, IID, three seeds: Table 1 against FedGMR (8 December 2026)"
NON_IID = "## Fashion-MNIST, High heterogeneity, non-IID, three seeds: Table 1 against FedGMR (7 December 2026)"


def _section(heading: str) -> str:
    return " ".join(page_section(heading, PAGE).split())  # prose wraps anywhere: compare on single spaces


def _cell(method: str, partition: str, seed: int) -> Path:
    return CELLS / f"preset=fashion_mnist,method={method},heterogeneity=high,partition={partition},seed={seed}"


def _ladder(partition: str) -> tuple[list[float], list[float], list[float]]:
    """Per seed 0-2: FedGMR's first restoration, its full model, and its average density at R1."""
    first, full, at_r1 = [], [], []
    for seed in range(3):
        rows = read_metrics(_cell("fedgmr", partition, seed))
        first.append(next(r["time"] for r in rows if r["restorations"] > 0))
        full.append(next(r["time"] for r in rows if r["avg_density"] >= 1.0 - 1e-9))
        at_r1.append([r for r in rows if r["time"] <= 2000][-1]["avg_density"])
    return first, full, at_r1


def _seconds(values: list[float]) -> list[str]:
    return [f"{v:,.0f}" for v in values]


def test_the_iid_ladder_is_what_the_cells_record():
    first, full, at_r1 = _ladder("iid")
    a, b, c = _seconds(first)
    d, e, f = _seconds(full)
    g, h, i = (f"{v:.2f}" for v in at_r1)
    text = _section(IID)
    assert f"first restoration at {a}, {b} and {c} s in seeds 0–2" in text
    assert f"full model at {d}, {e} and {f} s; at R1 an average density of {g}, {h} and {i}" in text
    # the bullet's "its best seed at R1 is the one that restored last"
    assert max(range(3), key=lambda s: first[s]) == 0 and "(seed 0, 83.76) is the one that restored last" in text
    assert "(900–1,500 s)" in text and min(first) == 900 and max(first) == 1500
    assert "2,280–3,620 s" in text and min(full) == 2280 and max(full) == 3620


def test_the_non_iid_ladder_is_what_the_cells_record():
    first, full, at_r1 = _ladder("dirichlet")
    text = _section(NON_IID)
    assert f"climbs from its first restoration ({min(first):,.0f}–{max(first):,.0f} s)" in text
    assert f"the full model from {', '.join(_seconds(full)[:2])} and {_seconds(full)[2]} s" in text
    assert {round(v, 2) for v in at_r1} == {0.55} and "average density 0.55" in text
    # the IID section compares its ladder with this one
    assert f"({min(first):,.0f}–{max(first):,.0f} s on non-IID)" in _section(IID)


def _level_means(method: str) -> tuple[float, list[float]]:
    evals = [load_evaluation(_cell(method, "iid", s)) for s in range(3)]
    full = sum(e.accuracy for e in evals) / 3
    levels = [sum(e.level_accuracy[k] for e in evals) / 3 for k in range(len(evals[0].level_accuracy))]
    return 100 * full, [100 * v for v in levels]


def test_the_iid_per_level_means_are_what_the_kept_evaluations_hold():
    text = _section(IID)
    gmr_full, gmr_levels = _level_means("fedgmr")
    assert f"FedGMR {gmr_full:.2f} % in full ({gmr_levels[0]:.2f} % under its 5 % mask)" in text
    asy_full, _ = _level_means("fedasync_ims")
    assert f"`fedasync_ims` {asy_full:.2f} %" in text
    fj_full, fj_levels = _level_means("fjord_ims")
    assert load_evaluation(_cell("fjord_ims", "iid", 0)).levels[-1] == 1.0
    below_full = fj_levels[:-1]  # the last level is the full model
    assert f"`fjord_ims` {fj_full:.2f} % in full and {min(below_full):.2f}–{max(below_full):.2f} % at every smaller level" in text
    fi_full, fi_levels = _level_means("fiarse_ims")
    assert f"`fiarse_ims` {fi_full:.2f} % in full against **{fi_levels[0]:.2f} %** at 5 %" in text
    assert f"by {fi_levels[0] - fi_full:.1f} points" in text
    assert f"their full models are {fj_full - gmr_full:.1f} points above FedGMR's" in text
    assert round(fj_full, 2) == round(fi_full, 2)  # "their full models": the two are equal to 0.01


def _acc_at_r1(method: str, seed: int) -> float:
    cell = _cell(method, "iid", seed)
    rows = read_metrics(cell)
    mean, _ = acc_at_t([r["time"] for r in rows], [r["accuracy"] for r in rows], 2000.0,
                       interval=run_eval_interval(cell))
    return 100 * mean


def test_fjord_on_fedgmrs_transport_is_above_fedgmr_in_each_seed_by_the_quoted_gaps():
    gaps = [_acc_at_r1("fjord_ims", s) - _acc_at_r1("fedgmr", s) for s in range(3)]
    assert all(g > 0 for g in gaps)
    quoted = re.search(r"above FedGMR in each seed, by ([\d.]+), ([\d.]+) and ([\d.]+) points", _section(IID))
    assert quoted is not None
    assert [float(q) for q in quoted.groups()] == pytest.approx(gaps, abs=0.006)


def _record_at_r1(method: str, seed: int) -> dict:
    return [r for r in read_metrics(_cell(method, "iid", seed)) if r["time"] <= 2000][-1]


def test_the_update_counts_the_diagnostic_quotes_are_the_cells():
    text = _section(IID)
    gmr = [_record_at_r1("fedgmr", s) for s in range(3)]
    fj = [_record_at_r1("fjord_ims", s) for s in range(3)]
    assert {r["uploads"] for r in fj} == {2270} and {u for r in fj for u in r["client_uploads"]} == {227}
    slowest = [r["client_uploads"][4:] for r in gmr]
    assert all(len(set(s)) == 1 for s in slowest)  # the six slowest clients send alike
    assert f"its six slowest clients {slowest[0][0]}, {slowest[1][0]} and {slowest[2][0]} each" in text
    lost = [2270 - r["uploads"] for r in gmr]
    assert f"the updates lost ({lost[0]}, {lost[1]}, {lost[2]})" in text
    assert lost == sorted(lost)  # "the more a seed has restored, the fewer it sends"
