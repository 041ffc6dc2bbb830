"""``fedgmr plot``: the x axes (time, step, MB up, MB up + down, wall clock), the metrics,
seed bands (mean ± sample std on a common grid), per-level and per-client accuracy. The
data preparation is checked with exact numbers; the command runs in a subprocess on
small run directories written here and on one real tiny run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from conftest import tiny_config
from fedgmr.cli import app
from fedgmr.errors import ConfigError, RunDirError
from fedgmr.experiment.curves import (axis_values, class_curves, client_spread, coverage_shares, expand_runs,
                                      group_labels, group_seeds, last_per_x, level_curves, metric_values, seed_band)
from fedgmr.experiment.plots import metric_curves
from fedgmr.experiment.runner import run_experiment
from fedgmr.methods import resolve_config

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "FEDGMR_PROGRESS": "0"}


def fedgmr(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedgmr", *args], capture_output=True, text=True, env=ENV,
                          cwd=cwd, timeout=600)


def make_run(path: Path, rows: list[dict[str, Any]], seed: int = 0, method: str = "fedgmr",
             **cfg: Any) -> Path:
    """A run directory: a config (name, method, seed and ``cfg``) and ``rows``."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"name": "t", "method": method, "seed": seed, **cfg}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rec(t: float, acc: float, up: float = 0.0, down: float = 0.0, **extra: Any) -> dict[str, Any]:
    return {"time": t, "step": int(t), "accuracy": acc, "loss": 2.0 - acc, "avg_density": 0.5,
            "bytes_up": up, "bytes_down": down, "min_coverage": 1, **extra}


# ---------------------------------------------------------------------------- x axes and metrics
ROWS = [rec(0.0, 0.1, 0.0, 0.0, wall_time=0.5), rec(10.0, 0.2, 1.5e6, 4e6, wall_time=3.25),
        rec(20.0, 0.4, 3e6, 8.5e6, wall_time=7.0)]


@pytest.mark.parametrize("axis, expected", [
    ("time", [0.0, 10.0, 20.0]), ("step", [0, 10, 20]), ("bytes_up", [0.0, 1.5, 3.0]),
    ("bytes_total", [0.0, 5.5, 11.5]), ("wall", [0.5, 3.25, 7.0])])
def test_x_axis_values(axis: str, expected: list[float]):
    assert axis_values(ROWS, axis, "m").tolist() == expected


@pytest.mark.parametrize("metric, expected", [
    ("accuracy", [10.0, 20.0, 40.0]), ("loss", [1.9, 1.8, 1.6]), ("avg_density", [0.5] * 3),
    ("min_coverage", [1.0] * 3)])
def test_metric_values(metric: str, expected: list[float]):
    assert metric_values(ROWS, metric, "m").tolist() == pytest.approx(expected, abs=1e-12)


def test_wall_clock_of_a_simulator_run_is_one_clear_error():
    with pytest.raises(RunDirError) as err:
        axis_values([rec(0.0, 0.1)], "wall", "runs/a/metrics.jsonl")
    assert str(err.value) == ("runs/a/metrics.jsonl: record 1 has no 'wall_time' field, which --x wall needs "
                              "(a simulator run records virtual time only: use --x time)")


def test_bad_axis_or_metric_names_the_option_and_choices():
    with pytest.raises(ConfigError, match=r"'--x': 'bytes' is not one of bytes_total, bytes_up, step, time, wall"):
        axis_values(ROWS, "bytes", "m")
    with pytest.raises(ConfigError, match=r"'--metric': 'f1' is not one of accuracy, avg_density, core_accuracy, "
                                          r"coverage_min, coverage_never, loss, min_coverage, "
                                          r"pruned_energy_mean, window_coverage_none$"):
        metric_values(ROWS, "f1", "m")


def test_an_axis_that_goes_back_is_refused():
    with pytest.raises(RunDirError, match="record 2 goes back along --x bytes_up"):
        axis_values([rec(0, 0.1, up=5e6), rec(1, 0.1, up=4e6)], "bytes_up", "m")


# ---------------------------------------------------------------------------- seed bands
def test_records_sharing_an_x_value_keep_the_last():
    x, y = last_per_x(np.array([0.0, 1.0, 1.0, 1.0, 2.0]), np.array([5.0, 6.0, 7.0, 8.0, 9.0]))
    assert x.tolist() == [0.0, 1.0, 2.0] and y.tolist() == [5.0, 8.0, 9.0]


def test_seed_band_interpolates_onto_the_common_grid():
    a = (np.array([0.0, 2.0, 4.0]), np.array([0.0, 20.0, 40.0]))
    b = (np.array([1.0, 3.0, 5.0]), np.array([10.0, 10.0, 30.0]))
    band = seed_band([a, b])
    # the range both cover is [1, 4]; the grid: every x of either seed in it
    assert band.x.tolist() == [1.0, 2.0, 3.0, 4.0] and band.n == 2
    # a at the grid: 10 20 30 40; b: 10 10 10 20
    assert band.mean.tolist() == [10.0, 15.0, 20.0, 30.0]
    assert band.std.tolist() == pytest.approx([0.0, 10 / np.sqrt(2), 20 / np.sqrt(2), 20 / np.sqrt(2)], abs=1e-12)


def test_seed_band_of_seeds_on_one_grid_is_the_plain_mean_and_sample_std():
    x = np.array([0.0, 5.0, 10.0])
    band = seed_band([(x, np.array([1.0, 2.0, 3.0])), (x, np.array([3.0, 4.0, 8.0])),
                      (x, np.array([5.0, 9.0, 7.0]))])
    assert band.x.tolist() == [0.0, 5.0, 10.0]
    assert band.mean.tolist() == [3.0, 5.0, 6.0]
    assert band.std.tolist() == pytest.approx([2.0, np.sqrt(13.0), np.sqrt(7.0)], abs=1e-12)


def test_seeds_without_a_common_range_are_refused():
    with pytest.raises(RunDirError, match="share no x range"):
        seed_band([(np.array([0.0, 1.0]), np.array([1.0, 2.0])), (np.array([2.0, 3.0]), np.array([1.0, 2.0]))])


def test_runs_group_as_compare_groups_them_and_bands_use_bytes_total(tmp_path: Path):
    """Two seeds of FedGMR (different traffic per evaluation) and one FedAvg run: the
    FedGMR band on the MB grid, exactly."""
    s0 = make_run(tmp_path / "sweep" / "gmr-s0", [rec(0, 0.0), rec(10, 0.2, 1e6, 1e6), rec(20, 0.4, 2e6, 2e6)])
    s1 = make_run(tmp_path / "sweep" / "gmr-s1", [rec(0, 0.1), rec(10, 0.3, 1.5e6, 1.5e6), rec(20, 0.5, 3e6, 3e6)],
                  seed=1, run={"executor": "process"})  # how it ran does not matter
    avg = make_run(tmp_path / "sweep" / "avg", [rec(0, 0.0), rec(10, 0.1, 4e6, 4e6)], method="fedavg")
    assert expand_runs([tmp_path / "sweep"]) == [avg, s0, s1]
    assert group_seeds([s0, avg, s1]) == [[s0, s1], [avg]]
    gmr, fedavg = metric_curves([s0, avg, s1], x="bytes_total")
    assert gmr.label == "fedgmr (mean ± std, 2 seeds)" and fedavg.label == "fedavg"
    # s0 in MB (up + down): 0, 2, 4 -> 0 20 40 %; s1: 0, 3, 6 -> 10 30 50 %; common range [0, 4]
    assert gmr.x.tolist() == [0.0, 2.0, 3.0, 4.0]
    # s0 at the grid: 0 20 30 40; s1: 10 (0 MB) 23.33 (2 MB) 30 (3 MB) 36.67 (4 MB)
    s1_at = [10.0, 10 + 20 * 2 / 3, 30.0, 30 + 20 / 3]
    assert gmr.y.tolist() == pytest.approx([(a + b) / 2 for a, b in zip([0, 20, 30, 40], s1_at)], abs=1e-12)
    lo, hi = gmr.band  # type: ignore[misc]
    half = [abs(a - b) / np.sqrt(2) for a, b in zip([0, 20, 30, 40], s1_at)]
    assert (gmr.y - lo).tolist() == pytest.approx(half, abs=1e-12)
    assert (hi - gmr.y).tolist() == pytest.approx(half, abs=1e-12)
    assert gmr.dashed is not None and gmr.dashed[1].tolist() == [0.5] * 4  # average density, mean of seeds
    assert fedavg.x.tolist() == [0.0, 8.0] and fedavg.y.tolist() == [0.0, 10.0] and fedavg.band is None
    # --no-bands: every run its own line, told apart by the seed
    lines = metric_curves([s0, avg, s1], x="bytes_total", bands=False)
    assert [c.label for c in lines] == ["fedgmr, seed=0", "fedavg, seed=0", "fedgmr, seed=1"]
    assert all(c.band is None for c in lines) and lines[2].x.tolist() == [0.0, 3.0, 6.0]


def test_group_labels_name_the_fewest_keys_that_tell_groups_apart(tmp_path: Path):
    runs = [make_run(tmp_path / f"{m}-{h}", [rec(0, 0.1)], method=m, clients={"heterogeneity": h},
                     data={"partition": "iid"}) for m in ("fedgmr", "fedavg") for h in ("high", "low")]
    groups = [[r] for r in runs]
    assert group_labels(groups, ["fedgmr", "fedgmr", "fedavg", "fedavg"]) == [
        "fedgmr, heterogeneity=high", "fedgmr, heterogeneity=low", "fedavg, heterogeneity=high",
        "fedavg, heterogeneity=low"]
    assert group_labels([[runs[0]], [runs[0]]], ["a", "a"]) == ["a [fedgmr-high]", "a [fedgmr-high]"]


def test_a_run_saved_before_a_key_existed_is_a_seed_of_the_same_experiment(tmp_path: Path):
    """A config saved by a version that predates a key (here training.lr_schedule and
    local.options) groups with a later run's that writes them at their defaults; the same
    key at another value is another experiment, labelled by it."""
    full = resolve_config(tiny_config()).model_dump(mode="json")
    older = {**full, "training": {k: v for k, v in full["training"].items() if k != "lr_schedule"},
             "local": {k: v for k, v in full["local"].items() if k != "options"}}
    stepped = {**full, "training": {**full["training"], "lr_schedule": {**full["training"]["lr_schedule"],
                                                                          "kind": "step"}}}
    runs = [make_run(tmp_path / "old-s0", [rec(0, 0.1), rec(10, 0.3)], **{k: v for k, v in older.items()
                                                                           if k not in ("name", "method", "seed")}),
            make_run(tmp_path / "new-s1", [rec(0, 0.2), rec(10, 0.5)], seed=1,
                     **{k: v for k, v in full.items() if k not in ("name", "method", "seed")}),
            make_run(tmp_path / "step-s0", [rec(0, 0.1), rec(10, 0.2)],
                     **{k: v for k, v in stepped.items() if k not in ("name", "method", "seed")})]
    assert group_seeds(runs) == [runs[:2], [runs[2]]]
    both, step = metric_curves(runs)
    assert both.label == "fedgmr, kind=constant (mean ± std, 2 seeds)" and both.y.tolist() == [15.0, 40.0]
    assert step.label == "fedgmr, kind=step"
    # a config that no longer validates (a method since removed) is completed the same way
    gone = [make_run(tmp_path / f"gone-s{s}", [rec(0, 0.1)], seed=s, method="no_such_method") for s in (0, 1)]
    assert group_seeds(gone) == [gone]


def test_loss_against_steps(tmp_path: Path):
    run = make_run(tmp_path / "r", [rec(0, 0.25), rec(5, 0.5), rec(5, 0.75)])
    (curve,) = metric_curves([run], x="step", metric="loss")
    assert curve.x.tolist() == [0.0, 5.0, 5.0] and curve.y.tolist() == [1.75, 1.5, 1.25] and curve.dashed is None


# ---------------------------------------------------------------------------- per level, per client
LEVEL_ROWS = [rec(0, 0.1, levels=[0.1, 0.5, 1.0], level_accuracy=[0.05, 0.25, 0.1]), rec(10, 0.3),
              rec(20, 0.5, levels=[0.1, 0.5, 1.0], level_accuracy=[0.15, 0.375, 0.5])]


def test_level_curves_one_per_level_from_the_records_that_have_them():
    curves = level_curves(LEVEL_ROWS, "time", "m")
    assert [(lv, x.tolist(), y.tolist()) for lv, x, y in curves] == [
        (0.1, [0.0, 20.0], [5.0, 15.0]), (0.5, [0.0, 20.0], [25.0, 37.5]), (1.0, [0.0, 20.0], [10.0, 50.0])]


def test_a_run_without_level_accuracy_says_how_to_get_it():
    with pytest.raises(RunDirError, match=r"no per-level accuracy \('level_accuracy'\): run with "
                                          r"--set run.level_eval_every=N"):
        level_curves([rec(0, 0.1)], "time", "m")


def test_core_accuracy_curves_are_the_first_levels_accuracy_with_seed_bands_per_ladder(tmp_path: Path):
    """``--metric core_accuracy`` (Fig. 2's reading): the first level's accuracy from the
    records that hold it, the value ``fedgmr table --metric core_accuracy`` reads, seeds of
    one ladder as one band, one curve per ladder, labelled by it; no density axis."""
    from fedgmr.experiment.metrics import metric_value

    def core(t: float, acc: float) -> dict[str, Any]:
        return rec(t, 0.1, levels=[0.2], level_accuracy=[acc])

    runs = []
    for rho, accs in ((0.2, ((0.5, 0.25, 0.75), (0.7, 0.45, 0.75))), (1.0, ((0.125, 0.5, 0.875), (0.125, 0.5, 0.625)))):
        for seed, (a0, a1, a2) in enumerate(accs):
            rows = [core(0, a0), rec(5, 0.1), core(10, a1), core(20, a2)]
            runs.append(make_run(tmp_path / f"rho{rho}-{seed}", rows, seed=seed, method="fedgmr_wo_gmr",
                                 submodel={"ladder": [rho]}))
    assert metric_values([core(0, 0.5)], "core_accuracy", "m").tolist() == [
        100 * metric_value(core(0, 0.5), "core_accuracy")] == [50.0]
    curves = metric_curves(runs, x="step", metric="core_accuracy")
    assert [c.label for c in curves] == ["fedgmr_wo_gmr, ladder=[0.2] (mean ± std, 2 seeds)",
                                         "fedgmr_wo_gmr, ladder=[1.0] (mean ± std, 2 seeds)"]
    assert curves[0].x.tolist() == [0.0, 10.0, 20.0]  # the record at step 5 holds no level accuracy
    assert curves[0].y.tolist() == pytest.approx([60.0, 35.0, 75.0], abs=1e-12)
    assert curves[1].y.tolist() == pytest.approx([12.5, 50.0, 75.0], abs=1e-12)
    assert curves[1].band[1].tolist() == pytest.approx([12.5, 50.0, 75.0 + 12.5 * np.sqrt(2)], abs=1e-12)
    assert all(c.dashed is None for c in curves)
    with pytest.raises(RunDirError, match=r"has no 'level_accuracy' records, which --metric core_accuracy needs: "
                                          r"run with --set run.level_eval_every=N"):
        metric_curves([make_run(tmp_path / "plain", [rec(0, 0.1), rec(5, 0.2)])], metric="core_accuracy")


def test_class_curves_one_per_class_and_an_absent_class_has_no_points():
    rows = [rec(0, 0.1, class_accuracy=[0.5, None, 0.25]), rec(10, 0.3),
            rec(20, 0.5, class_accuracy=[0.75, 0.5, None])]
    assert [(c, x.tolist(), y.tolist()) for c, x, y in class_curves(rows, "time", "m")] == [
        (0, [0.0, 20.0], [50.0, 75.0]), (1, [20.0], [50.0]), (2, [0.0], [25.0])]
    with pytest.raises(RunDirError, match=r"no per-class accuracy \('class_accuracy'\): run with "
                                          r"--set run.class_eval_every=N"):
        class_curves([rec(0, 0.1)], "time", "m")


def test_coverage_shares_per_count_with_the_top_counts_pooled():
    # 10 coordinates: before any aggregation all are covered by none (K = 0); then
    # counts 0..5 hold 1, 2, 3, 1, 2, 1 coordinates: the last three pool into "4 or more"
    rows = [rec(0, 0.1, coverage_hist=[10]), rec(10, 0.2), rec(20, 0.3, coverage_hist=[1, 2, 3, 1, 2, 1])]
    x, shares, labels = coverage_shares(rows, "time", "m", top=4)
    assert x.tolist() == [0.0, 20.0]
    assert shares.ravel().tolist() == pytest.approx([1.0, 0.1, 0.0, 0.2, 0.0, 0.3, 0.0, 0.1, 0.0, 0.3])
    assert labels == ["covered by none", "covered by 1 update", "covered by 2 updates", "covered by 3 updates",
                      "by 4 or more"]
    with pytest.raises(RunDirError, match=r"no coverage histogram \('coverage_hist'\): run with "
                                          r"--set run.coverage_eval_every=N"):
        coverage_shares([rec(0, 0.1)], "time", "m")
    with pytest.raises(RunDirError, match="record 1 has a 'coverage_hist' that is not a list of counts"):
        coverage_shares([rec(0, 0.1, coverage_hist=[1, -2])], "time", "m")


def test_client_spread_mean_min_max_and_percentiles_over_clients_with_a_split():
    rows = [rec(0, 0.1, client_accuracy=[0.1, None, 0.5, 0.9]), rec(5, 0.2),
            rec(10, 0.3, client_accuracy=[0.2, None, 0.2, 0.8])]
    s = client_spread(rows, "time", "m")
    assert s.x.tolist() == [0.0, 10.0] and s.clients == 3
    assert s.mean.tolist() == pytest.approx([50.0, 40.0], abs=1e-12)
    assert s.lo.tolist() == pytest.approx([10.0, 20.0]) and s.hi.tolist() == pytest.approx([90.0, 80.0])
    # numpy's linear percentiles of (10, 50, 90): 18 and 82; of (20, 20, 80): 20 and 68
    assert s.p10.tolist() == pytest.approx([18.0, 20.0]) and s.p90.tolist() == pytest.approx([82.0, 68.0])


# ---------------------------------------------------------------------------- the command
def test_plot_command_draws_bands_levels_and_clients(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for seed in (0, 1):
        make_run(tmp_path / "runs" / f"s{seed}", [rec(t, 0.1 * seed + 0.01 * t, 1e5 * t, 2e5 * t, **(
            {"levels": [0.2, 1.0], "level_accuracy": [0.01 * t, 0.02 * t], "client_accuracy": [0.5, None, 0.1 * seed],
             "class_accuracy": [0.01 * t, None, 0.5], "coverage_hist": [t, 3, 2, 0, 1, 1]}
            if t % 4 == 0 else {})) for t in range(0, 21, 2)], seed=seed)
    proc = fedgmr("plot", "runs", "--x", "bytes_total", "--out", "bands.png", cwd=tmp_path)  # the installed CLI
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "bands.png" and (tmp_path / "bands.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.chdir(tmp_path)
    for args in (["runs/s0", "runs/s1", "--no-bands", "--metric", "min_coverage"],
                 ["runs/s0", "--levels", "--x", "step"], ["runs/s1", "--clients"], ["runs/s1", "--classes"],
                 ["runs/s0", "--coverage", "--x", "step"]):
        png = tmp_path / "p.png"
        png.unlink(missing_ok=True)
        result = CliRunner().invoke(app, ["plot", *args, "--out", str(png)])
        assert result.exit_code == 0, (args, result.stderr)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_one_run_figure_of_a_sweep_cell_names_the_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``--levels``/``--classes``/``--clients``/``--coverage`` draw one run: a sweep's cell is
    titled with its method and its other axes as the cell's name spells them, so the
    figures of two seeds or two α of one sweep are told apart; a lone run keeps its method."""
    import fedgmr.experiment.plots as plots

    extra = {"levels": [0.2, 1.0], "level_accuracy": [0.1, 0.2], "class_accuracy": [0.1, 0.5]}
    cell = make_run(tmp_path / "sweep" / "preset=t,method=fedgmr,alpha=0.1,seed=1",
                    [rec(0, 0.1, **extra), rec(10, 0.2, **extra)], seed=1)
    (cell / "summary.json").write_text(json.dumps({"method": "fedgmr"}))
    (tmp_path / "sweep" / "sweep.json").write_text(json.dumps({"cells": [
        {"name": cell.name, "point": {"preset": "t", "method": "fedgmr", "data.alpha": 0.1, "seed": 1}}]}))
    lone = make_run(tmp_path / "lone", [rec(0, 0.1, **extra), rec(10, 0.2, **extra)])
    (lone / "summary.json").write_text(json.dumps({"method": "fedgmr"}))
    titles: list[str] = []
    monkeypatch.setattr(plots, "draw_curves", lambda *a, title=None, **kw: titles.append(title))
    for run, flag in ((cell, "--levels"), (cell, "--classes"), (lone, "--levels")):
        result = CliRunner().invoke(app, ["plot", str(run), flag, "--out", str(tmp_path / "p.png")])
        assert result.exit_code == 0, result.stderr
    assert titles == ["fedgmr (preset=t, alpha=0.1, seed=1): accuracy under each level's mask",
                      "fedgmr (preset=t, alpha=0.1, seed=1): accuracy on each class",
                      "fedgmr: accuracy under each level's mask"]
    # a folder named like a cell but not in the sweep's index is not read as one
    stray = make_run(tmp_path / "sweep" / "method=fedgmr,seed=9", [rec(0, 0.1)])
    (stray / "summary.json").write_text(json.dumps({"method": "fedgmr"}))
    assert plots.run_title(stray, "x") == "fedgmr: x"


@pytest.mark.parametrize("args, code, needle", [
    (["runs/s0", "--x", "wall"], 3, "record 1 has no 'wall_time' field, which --x wall needs"),
    (["runs/s0", "runs/s0", "--levels"], 2, "--levels plots one run: give one run directory (got 2)"),
    (["runs/s0", "--clients", "--metric", "loss"], 2, "--clients plots accuracy: drop --metric loss"),
    (["runs/s0", "--clients"], 3, "no per-client accuracy ('client_accuracy')"),
    (["runs/s0", "--classes"], 3, "no per-class accuracy ('class_accuracy')"),
    (["runs/s0", "--classes", "--levels"], 2, "give one of --levels, --clients, --classes and --coverage (got "
                                              "--levels and --classes)"),
    (["runs/s0", "--coverage", "--metric", "loss"], 2, "--coverage plots coverage shares: drop --metric loss"),
    (["runs/s0", "--x", "bytes"], 2, "invalid value for '--x'"),
])
def test_plot_command_errors_are_one_line(tmp_path: Path, args: list[str], code: int, needle: str,
                                         monkeypatch: pytest.MonkeyPatch):
    make_run(tmp_path / "runs" / "s0", [rec(0, 0.1), rec(1, 0.2)])
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["plot", *args, "--out", "p.png"])
    assert result.exit_code == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]
    assert not (tmp_path / "p.png").exists()


@pytest.mark.slow
def test_plot_of_a_real_tiny_run_with_levels(tmp_path: Path):
    for seed in (0, 1):
        run_experiment(resolve_config(tiny_config(seed=seed, run={"max_steps": 8, "eval_every": 2,
                                                                  "level_eval_every": 2})), tmp_path / f"s{seed}")
    (curve,) = metric_curves([tmp_path / "s0", tmp_path / "s1"], x="bytes_total")
    rows = [[json.loads(line) for line in (tmp_path / f"s{s}" / "metrics.jsonl").read_text().splitlines()]
            for s in (0, 1)]
    assert curve.label == "fedgmr (mean ± std, 2 seeds)"
    assert curve.x[0] == 0.0 and curve.x[-1] == min((r[-1]["bytes_up"] + r[-1]["bytes_down"]) / 1e6 for r in rows)
    assert curve.y[0] == pytest.approx(50 * (rows[0][0]["accuracy"] + rows[1][0]["accuracy"]), abs=1e-12)
    proc = fedgmr("plot", "s0", "s1", "--x", "bytes_total", "--out", "bytes.png", cwd=tmp_path)
    assert proc.returncode == 0 and (tmp_path / "bytes.png").read_bytes()[:4] == b"\x89PNG", proc.stderr
    result = CliRunner().invoke(app, ["plot", str(tmp_path / "s0"), "--levels", "--out", str(tmp_path / "lv.png")])
    assert result.exit_code == 0 and (tmp_path / "lv.png").read_bytes()[:4] == b"\x89PNG", result.stderr
    levels = level_curves(rows[0], "time", "m")
    assert [lv for lv, _, _ in levels] == rows[0][0]["levels"]
    assert levels[-1][2].tolist() == [100 * r["level_accuracy"][-1] for r in rows[0] if "level_accuracy" in r]
    result = CliRunner().invoke(app, ["plot", str(tmp_path / "s0"), "--metric", "core_accuracy", "--x", "step",
                                      "--out", str(tmp_path / "core.png")])
    assert result.exit_code == 0 and (tmp_path / "core.png").read_bytes()[:4] == b"\x89PNG", result.stderr
    (core,) = metric_curves([tmp_path / "s0"], x="step", metric="core_accuracy")
    assert core.y.tolist() == levels[0][2].tolist() and core.x.tolist() == [r["step"] for r in rows[0]
                                                                          if "level_accuracy" in r]


def test_many_curves_get_distinct_colours():
    """A plot of every method of a protocol table (17 rows) gives no two curves one colour;
    up to the style's cycle the style's colours are kept."""
    from fedgmr.experiment.plots import curve_colors

    cycle = [f"#0000{i:02x}" for i in range(10)]
    assert curve_colors(3, cycle) == cycle and curve_colors(10, cycle) == cycle
    many = curve_colors(17, cycle)
    assert len(set(many[:17])) == 17 and len(many) == 20
    assert many[0] == "#1f77b4" and many[10] == "#aec7e8"  # tab20: the dark shades first, then the light ones


def test_a_long_title_is_wrapped_and_leaves_the_figure_its_width(tmp_path: Path):
    """Seven seed-band labels make a title wider than the axes; unwrapped, the saved figure
    (cut to its contents) grew to fit it and the axes became a strip in its middle. Wrapped,
    the figure is as wide as with a short title, and every word of the title is kept."""
    from PIL import Image

    from fedgmr.experiment.plots import Curve, default_title, draw_curves, wrap_title

    labels = [f"method_{i}_ims (mean ± std, 3 seeds)" for i in range(7)]
    title = default_title(labels)
    assert len(title) > 150
    wrapped = wrap_title(title)
    assert wrapped.split() == title.split() and all(len(line) <= 72 for line in wrapped.splitlines())
    assert wrap_title("test accuracy: fedgmr vs fedavg") == "test accuracy: fedgmr vs fedavg"
    x = np.linspace(0, 100, 11)
    curves = [Curve(label, x, x * 0.5 + i) for i, label in enumerate(labels)]
    widths = {}
    for name, t in (("short", "test accuracy"), ("long", title)):
        draw_curves(curves, tmp_path / f"{name}.png", "virtual time (s)", "test accuracy (%)", title=t)
        with Image.open(tmp_path / f"{name}.png") as img:
            widths[name] = img.size[0]
    assert widths["long"] <= widths["short"] * 1.02, widths


def test_plot_only_draws_the_runs_with_the_values_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``--only`` selects runs as ``fedgmr table --only`` does: by a config key's value,
    short names allowed, values comma-separated, several keys all required."""
    import fedgmr.experiment.plots as plots

    for method in ("fedgmr", "fjord_ims", "fedavg"):
        for seed in (0, 1):
            make_run(tmp_path / "sweep" / f"{method}-{seed}", [rec(0, 0.1), rec(10, 0.2)], seed=seed,
                     method=method, clients={"heterogeneity": "high" if seed == 0 else "low"})
    drawn: list[list[str]] = []
    monkeypatch.setattr(plots, "plot_metric", lambda dirs, out, **kw: drawn.append(sorted(d.name for d in dirs)))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["plot", "sweep", "--only", "method=fedgmr,fjord_ims", "--out", "p.png"])
    assert result.exit_code == 0, result.stderr
    result = CliRunner().invoke(app, ["plot", "sweep", "--only", "method=fedgmr,fedavg", "--only",
                                      "heterogeneity=high", "--out", "p.png"])
    assert result.exit_code == 0, result.stderr
    result = CliRunner().invoke(app, ["plot", "sweep", "--exclude", "method=fedavg", "--exclude",
                                      "heterogeneity=low", "--out", "p.png"])
    assert result.exit_code == 0, result.stderr
    result = CliRunner().invoke(app, ["plot", "sweep", "--drop", "method=fedavg heterogeneity=low", "--drop",
                                      "method=fjord_ims seed=0", "--out", "p.png"])
    assert result.exit_code == 0, result.stderr
    assert drawn == [["fedgmr-0", "fedgmr-1", "fjord_ims-0", "fjord_ims-1"], ["fedavg-0", "fedgmr-0"],
                     ["fedavg-0", "fedgmr-0", "fedgmr-1", "fjord_ims-0", "fjord_ims-1"],
                     ["fedavg-0", "fedgmr-0", "fedgmr-1", "fjord_ims-1"]]
    for args, needle in ((["--only", "method=fiarse"], "--only method: no run has fiarse (values: fedavg, "
                                                       "fedgmr, fjord_ims)"),
                         (["--only", "method=fedgmr", "--levels"], "--levels plots one run"),
                         (["--exclude", "seed=0,1"], "no run is left by --exclude seed=0,1"),
                         (["--drop", "seed=0", "--levels"],
                          "--levels plots one run: leave out --only, --exclude and --drop"),
                         (["--drop", "seed=0,1 method"], "--drop expects axis=value")):
        result = CliRunner().invoke(app, ["plot", "sweep" if "--levels" not in args else "sweep/fedgmr-0", *args,
                                          "--out", "q.png"])
        assert result.exit_code == 2 and needle in result.stderr, result.stderr
    assert not (tmp_path / "q.png").exists()


def test_a_legend_of_long_labels_takes_fewer_columns_and_leaves_the_figure_its_width(tmp_path: Path):
    """Nine seed-band labels of 50 characters in three columns made the legend wider than the
    axes, and the saved figure (cut to its contents) grew around it with the axes a strip in
    its middle (P5's plot). With one column per label that fits, the figure is as wide as
    with short labels; short labels keep three columns."""
    from PIL import Image

    from fedgmr.experiment.plots import Curve, draw_curves, legend_columns

    long = [f"fedgmr_wo_gmr, ladder=[{r}] (mean ± std, 3 seeds)" for r in (0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.6, 0.9, 1.0)]
    short = [f"method {i}" for i in range(9)]
    assert legend_columns(short) == 3 and legend_columns(short[:2]) == 2 and legend_columns(long) == 1
    assert legend_columns(["fjord_ims (mean ± std, 3 seeds)"] * 7) == 2
    x = np.linspace(0, 100, 11)
    widths = {}
    for name, labels in (("short", short), ("long", long)):
        draw_curves([Curve(label, x, x * 0.5 + i) for i, label in enumerate(labels)], tmp_path / f"{name}.png",
                    "server step", "accuracy (%)", title="t")
        with Image.open(tmp_path / f"{name}.png") as img:
            widths[name] = img.size[0]
    assert widths["long"] <= widths["short"] * 1.02, widths


def test_what_every_label_shares_is_said_once_in_the_title():
    """A sweep over one method with seed bands: the legend names only the ladder, the title
    the method and the seed count; nothing is factored out when a label would be left empty
    or two would become one, or when the curves share nothing."""
    from fedgmr.experiment.plots import shared_label_parts

    ladders = [f"fedgmr_wo_gmr, ladder=[{r}] (mean ± std, 3 seeds)" for r in (0.1, 1.0)]
    assert shared_label_parts(ladders) == ("fedgmr_wo_gmr (mean ± std, 3 seeds)", ["ladder=[0.1]", "ladder=[1.0]"])
    assert shared_label_parts(["fedgmr (mean ± std, 3 seeds)", "fjord_ims (mean ± std, 3 seeds)"]) == (
        "(mean ± std, 3 seeds)", ["fedgmr", "fjord_ims"])
    assert shared_label_parts(["fedgmr, heterogeneity=high", "fedgmr, heterogeneity=low"]) == (
        "fedgmr", ["heterogeneity=high", "heterogeneity=low"])
    for labels in (["fedgmr (mean ± std, 3 seeds)", "fjord_ims"], ["fedgmr, a=1", "fedgmr"], ["a", "b"], ["one"]):
        assert shared_label_parts(labels) == ("", labels)


def test_the_plot_command_titles_the_shared_parts_and_legends_the_rest(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    import fedgmr.experiment.plots as plots

    for rho in (0.2, 1.0):
        for seed in (0, 1):
            make_run(tmp_path / f"rho{rho}-{seed}", [rec(0, 0.1, levels=[rho], level_accuracy=[0.1]),
                                                      rec(5, 0.2, levels=[rho], level_accuracy=[0.3 + seed / 10])],
                     seed=seed, method="fedgmr_wo_gmr", submodel={"ladder": [rho]})
    drawn: dict[str, Any] = {}
    monkeypatch.setattr(plots, "draw_curves", lambda curves, path, xl, yl, **kw: drawn.update(
        labels=[c.label for c in curves], title=kw["title"]))
    plots.plot_metric([tmp_path], tmp_path / "p.png", x="step", metric="core_accuracy")
    assert drawn == {"labels": ["ladder=[0.2]", "ladder=[1.0]"],
                     "title": "accuracy under the first level's mask, fedgmr_wo_gmr (mean ± std, 2 seeds): "
                              "ladder=[0.2] vs ladder=[1.0]"}
