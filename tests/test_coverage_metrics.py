"""Coverage metrics of one aggregation (docs/methods/epm.md): exact hand-derived vectors
for the pure functions, then whole tiny runs: the records carry them, turning them on
changes no other key, and ``fedgmr plot --metric`` draws them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from conftest import simulate, tiny_config
from fedgmr.algorithm.coverage import (CoverageWindow, aggregation_coverage, coverage_histogram,
                                       group_min_coverage, level_energy, pruned_energy, union_min_coverage)
from fedgmr.experiment.curves import metric_values
from fedgmr.experiment.plots import metric_curves

T, F = True, False
# three updates over 6 coordinates: a level-0.5 mask, a level-0.5 client on a reported
# subset, and a level-0.25 mask; coordinate 5 is held by nobody
M_A = torch.tensor([T, T, T, F, F, F])
M_B = torch.tensor([T, F, T, T, F, F])
M_C = torch.tensor([T, F, F, F, T, F])
COV = torch.tensor([3, 1, 2, 1, 1, 0], dtype=torch.int32)


def test_histogram_counts_every_coverage_value_from_zero_to_k():
    assert coverage_histogram(COV, 3) == [1, 3, 1, 1]
    assert coverage_histogram(torch.zeros(4, dtype=torch.int32), 0) == [4]
    with pytest.raises(ValueError, match="covered 3 times by 2 updates"):
        coverage_histogram(COV, 2)


def test_gamma_star_is_taken_over_the_union_of_the_aggregated_masks():
    assert union_min_coverage(COV) == 1  # coordinate 5 (nobody) is outside the union
    assert union_min_coverage(torch.tensor([0, 2, 4])) == 2
    assert union_min_coverage(torch.zeros(3, dtype=torch.int32)) == 0


def test_group_minimum_coverage_over_each_groups_retained_set():
    # group 0.5 = {A, B}: S = {0,1,2,3} -> min(3,1,2,1) = 1; group 0.25 = {C}: S = {0,4} -> min(3,1) = 1
    assert group_min_coverage(COV, [[M_A, M_B], [M_C]]) == [1, 1]
    # A alone: S = {0,1,2} -> 1; C's coordinate 4 alone covered once, 0 -> 3
    cov = torch.tensor([3, 2, 2, 1, 1, 0])
    assert group_min_coverage(cov, [[M_A], [M_C], [torch.zeros(6, dtype=torch.bool)]]) == [2, 1, 0]


def test_aggregation_record_groups_by_dispatch_density():
    rec = aggregation_coverage([M_A, M_B, M_C], [0.5, 0.5, 0.25], numel=6)
    assert rec == {"coverage_hist": [1, 3, 1, 1], "coverage_min": 1, "coverage_groups": [0.25, 0.5],
                   "coverage_group_min": [1, 1]}
    nested = aggregation_coverage([M_A, M_A, M_C], [0.5, 0.5, 0.25], numel=6)
    # Γ = [3,2,2,0,1,0]: group 0.5 holds {0,1,2} -> 2, group 0.25 holds {0,4} -> 1
    assert nested == {"coverage_hist": [2, 1, 2, 1], "coverage_min": 1, "coverage_groups": [0.25, 0.5],
                      "coverage_group_min": [1, 2]}
    assert aggregation_coverage([], [], numel=4) == {"coverage_hist": [4], "coverage_min": 0,
                                                     "coverage_groups": [], "coverage_group_min": []}


def test_pruned_energy_sums_the_squares_the_mask_leaves_out():
    theta = torch.tensor([1.0, -2.0, 3.0, 0.5, -1.5, 4.0])
    assert pruned_energy(theta, M_A) == 0.25 + 2.25 + 16.0
    assert pruned_energy(theta, torch.ones(6, dtype=torch.bool)) == 0.0
    rec = level_energy(theta, [M_C, M_A, torch.ones(6, dtype=torch.bool)], client_levels=[0, 0, 1, 2])
    assert rec == {"pruned_energy": [4 + 9 + 0.25 + 16, 18.5, 0.0],
                   "pruned_energy_mean": (29.25 + 29.25 + 18.5 + 0.0) / 4}


def test_window_sums_the_last_aggregations_and_remembers_what_was_ever_covered():
    win = CoverageWindow(6, 2)
    assert win.stats() == {"coverage_window": 0, "window_coverage_min": 0, "window_coverage_none": 1.0,
                           "coverage_never": 1.0}
    win.add([M_A, M_B])  # Γ = [2, 1, 2, 1, 0, 0]
    assert win.stats() == {"coverage_window": 1, "window_coverage_min": 0, "window_coverage_none": 2 / 6,
                           "coverage_never": 2 / 6}
    win.add([M_C])  # Γ = [1, 0, 0, 0, 1, 0]; together [3, 1, 2, 1, 1, 0]
    assert win.total.tolist() == [3, 1, 2, 1, 1, 0]
    assert win.stats() == {"coverage_window": 2, "window_coverage_min": 0, "window_coverage_none": 1 / 6,
                           "coverage_never": 1 / 6}
    win.add([])  # the first aggregation leaves the window: [1, 0, 0, 0, 1, 0] + 0
    assert win.total.tolist() == [1, 0, 0, 0, 1, 0]
    assert win.stats()["window_coverage_none"] == 4 / 6 and win.stats()["coverage_never"] == 1 / 6
    everything = torch.ones(6, dtype=torch.bool)
    win.add([everything, M_A])  # window: [] and [2, 2, 2, 1, 1, 1]
    assert win.stats() == {"coverage_window": 2, "window_coverage_min": 1, "window_coverage_none": 0.0,
                           "coverage_never": 0.0}
    state, tensors = win.state_dict()
    back = CoverageWindow(6, 2)
    back.load_state_dict(state, tensors)
    assert back.total.tolist() == win.total.tolist() and back.stats() == win.stats()
    back.add([M_C])
    win.add([M_C])
    assert back.total.tolist() == win.total.tolist() == [3, 2, 2, 1, 2, 1]
    with pytest.raises(ValueError, match="over 2 aggregations, this run over 3"):
        CoverageWindow(6, 3).load_state_dict(state, tensors)


def test_nested_masks_without_a_dense_client_never_train_the_rest_and_per_client_masks_do():
    """EPM's mechanism on a whole run: no client above density 0.5, no refresh. Nested
    magnitude masks leave exactly the coordinates outside the largest mask untrained;
    per-client random masks of the same sizes reach every coordinate."""
    tiers = [0.5, 0.5, 0.2, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05]
    common = dict(method="fedgmr_wo_gmr", clients={"num_clients": 10, "heterogeneity": tiers},
                  network={"model_size_mb": 2.0, "ims": False},
                  run={"max_steps": 12, "eval_every": 2, "coverage_eval_every": 1, "coverage_window": 4})
    nested, exp = simulate(tiny_config(submodel={"refresh_every": None}, **common))
    largest = exp.strategy.policy.mask(exp.strategy.ladder.levels[0])
    outside = 1 - int(largest.sum()) / exp.space.numel
    assert nested[-1]["coverage_never"] == pytest.approx(outside, abs=0) and outside > 0.4
    assert nested[-1]["window_coverage_none"] == pytest.approx(outside, abs=0)
    assert nested[-1]["window_coverage_min"] == 0
    spread, _ = simulate(tiny_config(submodel={"policy": "random", "per_client": True}, **common))
    assert spread[-1]["coverage_never"] == 0.0
    assert spread[-1]["window_coverage_none"] < outside / 4
    never = [r["coverage_never"] for r in spread if "coverage_never" in r]
    assert never == sorted(never, reverse=True)  # what was covered once stays covered


def _raw(**run) -> dict:
    return tiny_config(run={"max_steps": 6, "eval_every": 1, **run})


def test_runs_log_the_coverage_of_the_updates_aggregated():
    records, exp = simulate(_raw(coverage_eval_every=1))
    strat = exp.strategy
    n = exp.space.numel
    for r in records:
        assert sum(r["coverage_hist"]) == n
        hist = r["coverage_hist"]
        assert r["coverage_min"] == next((c for c in range(1, len(hist)) if hist[c]), 0)
        assert len(r["coverage_groups"]) == len(r["coverage_group_min"])
        assert all(r["coverage_min"] <= c for c in r["coverage_group_min"])
        if r["coverage_group_min"]:
            assert min(r["coverage_group_min"]) == r["coverage_min"]  # the groups partition the union
        assert len(r["pruned_energy"]) == len(strat.ladder.ladder) and r["pruned_energy"][-1] == 0.0
    assert records[0]["coverage_hist"] == [n]  # before any aggregation
    last = records[-1]
    assert len(last["coverage_hist"]) - 1 == len(strat._last_used_masks)
    assert last == {**last, **strat.coverage_stats()}
    energy = level_energy(strat.params, [strat.policy.mask(lv) for lv in range(len(strat.ladder.ladder))],
                          strat.ladder.levels)
    assert last["pruned_energy"] == energy["pruned_energy"]
    assert math.isclose(last["pruned_energy_mean"], energy["pruned_energy_mean"], rel_tol=0, abs_tol=0)


def test_coverage_metrics_off_change_no_other_key():
    on, _ = simulate(_raw(coverage_eval_every=1))
    off, _ = simulate(_raw())
    new = {"coverage_hist", "coverage_min", "coverage_groups", "coverage_group_min", "pruned_energy",
           "pruned_energy_mean", "coverage_window", "window_coverage_min", "window_coverage_none", "coverage_never"}
    assert all(new <= set(r) for r in on) and not any(new & set(r) for r in off)
    assert [{k: v for k, v in r.items() if k not in new} for r in on] == off


@pytest.mark.slow
def test_plot_draws_coverage_metrics_of_a_real_tiny_run(tmp_path: Path):
    from typer.testing import CliRunner

    from fedgmr.cli import app
    from fedgmr.experiment.runner import run_experiment
    from fedgmr.methods import resolve_config

    run_experiment(resolve_config(_raw(coverage_eval_every=1)), tmp_path / "r")
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert metric_values(rows, "coverage_min", "m").tolist() == [float(r["coverage_min"]) for r in rows]
    (curve,) = metric_curves([tmp_path / "r"], metric="pruned_energy_mean", bands=False)
    assert curve.y.tolist()[-1] == rows[-1]["pruned_energy_mean"]
    for metric in ("coverage_min", "pruned_energy_mean"):
        out = tmp_path / f"{metric}.png"
        result = CliRunner().invoke(app, ["plot", str(tmp_path / "r"), "--metric", metric, "--out", str(out)])
        assert result.exit_code == 0 and out.read_bytes()[:4] == b"\x89PNG", result.output
