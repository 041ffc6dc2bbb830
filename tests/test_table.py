"""`fedgmr table`: seeds grouped, mean ± sample std, best bold, MRI on the means.
Hand-computed figures on run directories written here."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from conftest import scaled
from fedgmr.cli import app
from fedgmr.errors import ConfigError
from fedgmr.experiment.table import build_table, find_runs, read_run, render, select_runs

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "FEDGMR_PROGRESS": "0"}


def _run(root: Path, method: str, seed: int, het: str, acc: float, extra: dict | None = None,
         finished: bool = True) -> Path:
    """A run directory whose accuracy is ``acc`` at every evaluation (grid Δ = 1 s)."""
    d = root / f"{method}-{het}-{seed}"
    d.mkdir(parents=True)
    cfg = {"name": "t", "method": method, "seed": seed, "clients": {"heterogeneity": het},
           "training": {"lr": 0.1}, "run": {"eval_interval": 1.0, "executor": "serial"}}
    for key, value in (extra or {}).items():
        section, leaf = key.split(".")
        cfg.setdefault(section, {})[leaf] = value
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    rows = [{"time": float(t), "step": t, "accuracy": acc, "bytes_up": 1e6 * t, "bytes_down": 2e6 * t}
            for t in range(0, 31)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        (d / "summary.json").write_text(json.dumps({"method": method}))
    return d


@pytest.fixture
def grid(tmp_path: Path) -> Path:
    for het, shift in (("high", 0.0), ("low", 0.05)):
        for seed, acc in enumerate((0.80, 0.82, 0.84)):
            _run(tmp_path, "fedgmr", seed, het, acc + shift)
        for seed, acc in enumerate((0.70, 0.70, 0.73)):
            # a method's fixed settings vary with the method: not a grouping key
            _run(tmp_path, "fedavg", seed, het, acc + 2 * shift, extra={"coordination.mode": "sync"})
    return tmp_path


def _table(root: Path, **kw):
    return build_table([read_run(p) for p in find_runs([root])], t_star=10.0, **kw)


def test_cells_are_mean_and_sample_std_across_seeds(grid: Path):
    t = _table(grid)
    assert t.row_keys == ["method"] and t.col_keys == ["clients.heterogeneity"]
    gmr, avg = t.cells[(("fedgmr",), ("high",))], t.cells[(("fedavg",), ("high",))]
    assert gmr["n"] == 3 and gmr["seeds"] == [0, 1, 2]
    assert gmr["mean"] == pytest.approx(0.82) and gmr["std"] == pytest.approx(0.02)
    assert avg["mean"] == pytest.approx(0.71) and avg["std"] == pytest.approx(math.sqrt(0.0003))
    # MRI on the means: 100 * (0.82 - 0.71) / 0.71 on high; 100 * (0.87 - 0.81) / 0.81 on low
    assert t.mri[("high",)] == pytest.approx(100 * 0.11 / 0.71)
    assert t.mri[("low",)] == pytest.approx(100 * 0.06 / 0.81)
    assert t.mri_over == ["fedavg"]


def test_markdown_bolds_the_best_of_each_column_and_says_what_the_std_is(grid: Path):
    text = render(_table(grid), "md")
    assert "Acc@t* (%) at t* = 10 s: mean ± sample std (ddof = 1) across seeds" in text
    assert "3 seeds per cell" in text
    lines = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]] for ln in text.splitlines()
             if ln.startswith("| ") and not ln.startswith("| method")}
    assert lines["fedgmr"] == ["**82.00 ± 2.00**", "**87.00 ± 2.00**"]
    assert lines["fedavg"] == ["71.00 ± 1.73", "81.00 ± 1.73"]
    assert lines["MRI of fedgmr (%)"] == ["+15.49", "+7.41"]


def test_a_mixed_grid_says_in_its_caption_which_cells_have_another_number_of_seeds(grid: Path):
    assert "3 seeds per cell. Rows:" in render(_table(grid), "md")  # a uniform grid: nothing excepted
    for seed, acc in ((3, 0.86), (4, 0.88)):  # fedgmr on high gets seeds 3 and 4: five seeds there
        _run(grid, "fedgmr", seed, "high", acc)
    shutil.rmtree(grid / "fedavg-low-2")  # and fedavg on low only two
    text = render(_table(grid), "md")
    assert "3 seeds per cell except those marked (n=2/5). Rows:" in text
    cells = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]] for ln in text.splitlines()
             if ln.startswith("| fed")}
    assert cells == {"fedgmr": ["**84.00 ± 3.16 (n=5)**", "**87.00 ± 2.00**"],
                     "fedavg": ["71.00 ± 1.73", "80.00 ± 0.00 (n=2)"]}


def test_latex_escapes_and_bolds(tmp_path: Path):
    for seed in (0, 1):
        _run(tmp_path, "fedgmr_wo_gmr", seed, "high", 0.5)
        _run(tmp_path, "fedasync", seed, "high", 0.6)
    text = render(_table(tmp_path, mri_of="fedgmr_wo_gmr", baselines=["fedasync"]), "latex")
    assert r"fedgmr\_wo\_gmr & 50.00 ± 0.00 \\" in text
    assert r"fedasync & \textbf{60.00 ± 0.00} \\" in text
    assert r"MRI of fedgmr\_wo\_gmr (\%) & -16.67 \\" in text


def test_csv_has_the_raw_numbers_per_cell(grid: Path):
    frame = pd.read_csv(io.StringIO(render(_table(grid, target=0.85), "csv")))
    row = frame[(frame.method == "fedgmr") & (frame["clients.heterogeneity"] == "low")].iloc[0]
    assert row.n_seeds == 3 and row["mean"] == pytest.approx(0.87) and row["std"] == pytest.approx(0.02)
    assert row.per_seed == "0.850000 0.870000 0.890000" and row.value == "acc"
    assert row.seeds_reaching_target == 3 and row.time_to_target_mean == 0.0
    assert frame[(frame.method == "fedgmr") & (frame["clients.heterogeneity"] == "high")].iloc[0].seeds_reaching_target == 0


def test_time_and_bytes_to_target(grid: Path):
    text = render(_table(grid, target=0.83), "md")
    # on high only seed 2 of fedgmr (0.84) reaches 0.83, at t = 0, having sent 0 bytes
    assert "time to target (s), target accuracy 83.0 %" in text
    assert "0 (1/3 seeds)" in text and "never" in text


def test_runs_that_differ_in_another_key_within_a_cell_are_refused(grid: Path):
    _run(grid, "fedgmr", 5, "high", 0.9, extra={"training.lr": 0.5})
    with pytest.raises(ConfigError, match="differ in 'training.lr': add it to --rows or --cols"):
        _table(grid, cols=["heterogeneity"])
    t = _table(grid, cols=["heterogeneity", "lr"])  # as a column it is fine
    assert t.cells[(("fedgmr",), ("high", 0.5))]["mean"] == pytest.approx(0.9)


def test_two_runs_of_one_cell_with_one_seed_are_refused(grid: Path):
    _run(grid / "again", "fedgmr", 0, "high", 0.5)
    with pytest.raises(ConfigError, match="share seed 0"):
        _table(grid)


def test_cli_table_leaves_unfinished_runs_out_and_reports_bad_dirs(grid: Path, tmp_path: Path):
    _run(grid, "fedgmr", 7, "high", 0.1, finished=False)
    proc = subprocess.run([sys.executable, "-m", "fedgmr", "table", str(grid), "--t-star", "10"],
                          capture_output=True, text=True, env=ENV, timeout=scaled(300))
    assert proc.returncode == 0, proc.stderr
    assert "1 unfinished run(s) left out" in proc.stderr and "**82.00 ± 2.00**" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "fedgmr", "table", str(tmp_path / "nope"), "--t-star", "10"],
                         capture_output=True, text=True, env=ENV, timeout=scaled(300))
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "nope" in bad.stderr


def test_cli_table_names_only_the_unfinished_runs_its_selection_would_tabulate(grid: Path):
    """Another column's cells still running beside a finished one (a sweep under way) are not
    named when --only/--exclude/--drop leave them out; one inside the selection, or one whose
    config cannot be read, is."""
    _run(grid, "fedgmr", 7, "medium", 0.1, finished=False)
    runner = CliRunner()
    args = ["table", str(grid), "--t-star", "10"]
    for flags, named in ((["--only", "heterogeneity=high"], 0), (["--only", "method=fedgmr", "--only", "seed=0,1,2"], 0),
                         (["--exclude", "heterogeneity=low"], 1), (["--drop", "heterogeneity=low"], 1),
                         (["--only", "method=fedgmr"], 1), ([], 1)):
        res = runner.invoke(app, args + flags)
        assert res.exit_code == 0, res.output
        assert ("1 unfinished run(s) left out" in res.stderr) == bool(named), (flags, res.stderr)
        assert "**82.00 ± 2.00**" in res.stdout
    (grid / "fedgmr-medium-7" / "config.yaml").write_text("method: [")  # unreadable: cannot tell, so named
    res = runner.invoke(app, args + ["--only", "heterogeneity=high"])
    assert res.exit_code == 0 and "1 unfinished run(s) left out" in res.stderr and "fedgmr-medium-7" in res.stderr


def test_end_time_table_bolds_the_lowest_and_has_no_mri(tmp_path: Path):
    for seed in (0, 1):
        _run(tmp_path, "fedgmr", seed, "high", 0.5)
        d = _run(tmp_path, "fedgmr_wo_ims", seed, "high", 0.5)
        lines = (d / "metrics.jsonl").read_text().splitlines()[:-10 - seed]  # ends at t = 20 or 19
        (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    t = _table(tmp_path, value="time")
    assert t.mri_of is None and t.cells[(("fedgmr_wo_ims",), ())]["mean"] == 19.5
    text = render(t, "md")
    assert "virtual time at the end of the run (s)" in text and "lowest mean" in text
    assert "| fedgmr_wo_ims | **20 ± 1** |" in text  # 19.5 ± 0.71 s, rounded to seconds
    assert "| fedgmr        | 30 ± 0     |" in text


def test_compare_groups_seeds_into_one_row_and_the_mri_is_over_other_methods(grid: Path):
    from fedgmr.experiment.metrics import compare_runs

    dirs = [grid / "fedgmr-high-0", grid / "fedgmr-high-1", grid / "fedavg-high-0", grid / "fedavg-high-1",
            grid / "fedavg-high-2"]
    result = compare_runs(dirs, t_star=10.0)
    gmr, avg = result["runs"]
    assert (gmr["method"], gmr["n"], gmr["seeds"], gmr["std_kind"]) == ("fedgmr", 2, [0, 1], "seeds")
    assert gmr["acc_at_t"] == pytest.approx(0.81) and gmr["std"] == pytest.approx(math.sqrt(0.0002))
    assert avg["n"] == 3 and avg["acc_at_t"] == pytest.approx(0.71)
    assert result["over"] == ["fedavg"]  # the second FedGMR seed is not a baseline
    assert result["mri"] == pytest.approx(100 * (0.81 - 0.71) / 0.71)
    # one run per experiment: the ± is the spread inside its window, and says so
    single = compare_runs([grid / "fedgmr-high-0", grid / "fedavg-high-0"], t_star=10.0)
    assert [r["std_kind"] for r in single["runs"]] == ["window", "window"] and single["runs"][0]["std"] == pytest.approx(0.0, abs=1e-12)
    proc = subprocess.run([sys.executable, "-m", "fedgmr", "compare", *map(str, dirs), "--t-star", "10"],
                          capture_output=True, text=True, env=ENV, timeout=scaled(300))
    assert proc.returncode == 0, proc.stderr
    assert "2 seeds (0, 1)" in proc.stdout and "across seeds" in proc.stdout and "+14.08%" in proc.stdout


def test_a_sweep_directory_tabulates_in_its_grid_order_not_alphabetically(tmp_path: Path):
    # a sweep file listing heterogeneity as high, medium, low (alphabetically: high, low, medium)
    names = []
    for het, acc in (("high", 0.80), ("medium", 0.85), ("low", 0.90)):
        for method in ("fedgmr", "fedavg"):
            names.append(_run(tmp_path, method, 0, het, acc).name)
    (tmp_path / "sweep.json").write_text(json.dumps({"cells": [{"name": n} for n in names]}))
    t = _table(tmp_path)
    assert t.cols == [("high",), ("medium",), ("low",)]
    assert t.rows == [("fedgmr",), ("fedavg",)]
    header = next(ln for ln in render(t, "md").splitlines() if ln.startswith("| method"))
    assert [c.strip() for c in header.split("|")[2:-1]] == ["high", "medium", "low"]
    # without the index the runs come by path and the first seen value leads
    (tmp_path / "sweep.json").unlink()
    assert _table(tmp_path).cols == [("high",), ("low",), ("medium",)]


def test_a_spread_metric_bolds_the_lowest_and_a_count_is_not_a_percentage(tmp_path: Path):
    for seed in (0, 1):
        for method, std, gamma in (("fedavg", 0.10, 3.0), ("ditto", 0.06, 5.0)):
            d = _run(tmp_path, method, seed, "high", 0.5)
            rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
            for r in rows:
                r.update(personal_std=std + 0.01 * seed, coverage_min=gamma + seed)
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = find_runs([tmp_path])
    spread = build_table([read_run(p, "personal_std") for p in runs], t_star=10.0, mri_of="ditto")
    text = render(spread, "md")
    assert spread.mri_of is None and "MRI" not in text  # a spread has no relative improvement
    assert "personal_std (%) at t*" in text and "Bold: lowest mean" in text
    assert "| ditto    | **6.50 ± 0.71** |" in text and "| fedavg   | 10.50 ± 0.71    |" in text
    count = render(build_table([read_run(p, "coverage_min") for p in runs], t_star=10.0), "md")
    assert "coverage_min at t*" in count and "Bold: best mean" in count
    assert "**5.50 ± 0.71**" in count and "3.50 ± 0.71" in count  # Gamma* as a count, not x100
    with pytest.raises(ConfigError, match="not an accuracy"):
        build_table([read_run(p, "coverage_min") for p in runs], t_star=10.0, target=0.5)
    with pytest.raises(ConfigError, match="takes an accuracy"):
        from fedgmr.experiment.metrics import compare_runs
        compare_runs([str(p) for p in runs], t_star=10.0, metric="personal_std")


def test_cli_table_of_a_metric_leaves_out_the_runs_that_do_not_log_it(tmp_path: Path):
    """cluster_purity over a clustered method and FedAvg: FedAvg clusters nothing, so its
    runs are left out with a note; with no run logging it at all, a one-line error."""
    for seed in (0, 1):
        d = _run(tmp_path, "ifca", seed, "high", 0.5)
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        (d / "metrics.jsonl").write_text("".join(json.dumps({**r, "cluster_purity": 0.75}) + "\n" for r in rows))
        _run(tmp_path, "fedavg", seed, "high", 0.6)
    cmd = [sys.executable, "-m", "fedgmr", "table", str(tmp_path), "--t-star", "10", "--metric", "cluster_purity"]
    got = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    assert got.returncode == 0, got.stderr
    assert "note: 2 run(s) without 'cluster_purity' left out" in got.stderr
    assert "| ifca     | **75.00 ± 0.00** |" in got.stdout and "fedavg" not in got.stdout
    only_fedavg = [sys.executable, "-m", "fedgmr", "table", *(str(p) for p in sorted(tmp_path.glob("fedavg-*"))),
                   "--t-star", "10", "--metric", "cluster_purity"]
    bad = subprocess.run(only_fedavg, capture_output=True, text=True, env=ENV)
    assert bad.returncode != 0 and "no run logs 'cluster_purity'" in bad.stderr


def _rising(root: Path, method: str, seed: int, base: float, slope: float) -> None:
    """A run whose accuracy is ``base + slope * t`` at every t = 0..30 (grid Δ = 1 s):
    its Acc@t* (the 20 grid points from t* - 10 s on) is ``base + slope * (t* - 0.5)``."""
    d = _run(root, method, seed, "high", 0.0)
    rows = [{"time": float(t), "step": t, "accuracy": base + slope * t, "bytes_up": 0.0, "bytes_down": 0.0}
            for t in range(0, 31)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_several_t_stars_give_each_column_once_per_t_star(tmp_path: Path):
    from fedgmr.experiment.table import join_t_stars

    for seed in (0, 1):
        _rising(tmp_path, "fedgmr", seed, 0.60 + 0.02 * seed, 0.001)  # 0.6095 / 0.6295 at t* = 10
        _rising(tmp_path, "fedavg", seed, 0.50, 0.010)  # 0.595 at t* = 10, 0.695 at t* = 20
    runs = [read_run(p) for p in find_runs([tmp_path])]
    t = join_t_stars([build_table(runs, t_star=x, cols=["heterogeneity"]) for x in (10.0, 20.0)])
    assert t.col_keys == ["clients.heterogeneity", "t*"]
    assert t.cols == [("high", "t* = 10 s"), ("high", "t* = 20 s")]
    assert t.cells[(("fedgmr",), ("high", "t* = 10 s"))]["mean"] == pytest.approx(0.6195)
    assert t.cells[(("fedgmr",), ("high", "t* = 20 s"))]["mean"] == pytest.approx(0.6295)
    assert t.cells[(("fedavg",), ("high", "t* = 20 s"))]["mean"] == pytest.approx(0.695)
    assert t.mri[("high", "t* = 10 s")] == pytest.approx(100 * (0.6195 - 0.595) / 0.595)
    assert t.mri[("high", "t* = 20 s")] == pytest.approx(100 * (0.6295 - 0.695) / 0.695)
    text = render(t, "md")
    assert "Acc@t* (%) at t* = 10 and 20 s (one column each)" in text
    lines = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]] for ln in text.splitlines()
             if ln.startswith("| ") and not ln.startswith("| method")}
    assert lines["fedgmr"] == ["**61.95 ± 1.41**", "62.95 ± 1.41"]  # the best differs per t*
    assert lines["fedavg"] == ["59.50 ± 0.00", "**69.50 ± 0.00**"]
    frame = pd.read_csv(io.StringIO(render(t, "csv")))
    assert sorted(frame.t_star.unique()) == [10.0, 20.0] and len(frame) == 4
    assert frame[(frame.method == "fedavg") & (frame.t_star == 20.0)].iloc[0]["mean"] == pytest.approx(0.695)


def test_cli_table_takes_several_t_stars_and_refuses_them_with_another_value(tmp_path: Path):
    for seed in (0, 1):
        _rising(tmp_path, "fedgmr", seed, 0.60, 0.001)
    ok = subprocess.run([sys.executable, "-m", "fedgmr", "table", str(tmp_path), "--t-star", "10,20"],
                        capture_output=True, text=True, env=ENV, timeout=scaled(300))
    assert ok.returncode == 0, ok.stderr
    assert "| t* = 10 s " in ok.stdout and "| t* = 20 s " in ok.stdout and "**60.95 ± 0.00**" in ok.stdout
    for extra, match in ((["--t-star", "10,20", "--value", "final"], "Acc@t* only"),
                         (["--t-star", "10,x"], "comma-separated"), (["--t-star", "10,10"], "distinct")):
        bad = subprocess.run([sys.executable, "-m", "fedgmr", "table", str(tmp_path), *extra],
                             capture_output=True, text=True, env=ENV, timeout=scaled(300))
        assert bad.returncode == 2 and match in bad.stderr and bad.stderr.count("\n") == 1, (extra, bad.stderr)


def _run_with(tmp_path: Path, method: str, seed: int, extra) -> Path:
    """A High run of ``method`` whose record ``i`` also carries ``extra(i)``."""
    d = _run(tmp_path, method, seed, "high", 0.5)
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    (d / "metrics.jsonl").write_text("".join(json.dumps({**r, **extra(i)}) + "\n" for i, r in enumerate(rows)))
    return d


def test_coverage_none_is_the_uncovered_share_of_each_histogram_and_lowest_is_bold(tmp_path: Path):
    """coverage_hist [h0, h1, ...]: coverage_none = h0 / sum. Nested masks with no dense
    client leave 6 of 10 coordinates uncovered (0.6); random ones 1 of 10 (0.1)."""
    for seed in (0, 1):
        for method, hist in (("fedgmr_nested", [6, 3, 1]), ("fedgmr_random", [1, 5, 4])):
            # the first record has no histogram: left out of the window
            _run_with(tmp_path, method, seed, lambda i: {"coverage_hist": hist} if i else {})
    t = build_table([read_run(p, "coverage_none") for p in find_runs([tmp_path])], t_star=10.0, mri_of=None)
    assert t.cells[(("fedgmr_nested",), ())]["mean"] == pytest.approx(0.6)
    assert t.cells[(("fedgmr_random",), ())]["mean"] == pytest.approx(0.1)
    text = render(t, "md")
    assert "Bold: lowest mean" in text and "**10.00 ± 0.00**" in text and "60.00 ± 0.00" in text


def test_pruned_energy_is_shown_as_logged_and_lowest_is_bold(tmp_path: Path):
    """pruned_energy_mean (EPM's pruning noise): the windowed mean of the logged values,
    not a percentage, lowest bold: magnitude masks leave out less weight than random ones."""
    for seed in (0, 1):
        for method, energy in (("fedgmr_nested", 8.0 + seed), ("fedgmr_random", 290.0 + 2 * seed)):
            _run_with(tmp_path, method, seed, lambda i: {"pruned_energy_mean": energy})
    t = build_table([read_run(p, "pruned_energy_mean") for p in find_runs([tmp_path])], t_star=10.0, mri_of=None)
    assert t.cells[(("fedgmr_nested",), ())]["mean"] == pytest.approx(8.5)
    assert t.cells[(("fedgmr_random",), ())]["mean"] == pytest.approx(291.0)
    text = render(t, "md")
    assert "Bold: lowest mean" in text and "**8.50 ± 0.71**" in text and "291.00 ± 1.41" in text


def test_a_key_added_after_a_run_was_made_reads_as_its_default(tmp_path: Path):
    """Runs made before ``submodel.prune_output`` existed ran as its default (False): a table
    puts them beside new runs that set it, instead of refusing the key."""
    for seed in (0, 1):
        _run(tmp_path / "old", "fedgmr", seed, "high", 0.80)
        _run(tmp_path / "new", "fedgmr", seed, "high", 0.90, extra={"submodel.prune_output": True})
    runs = [read_run(p) for p in find_runs([tmp_path / "old", tmp_path / "new"])]
    assert sorted(str(r.config.get("submodel.prune_output")) for r in runs) == ["None", "None", "True", "True"]
    t = build_table(runs, t_star=10.0, rows=["prune_output"])
    assert sorted(r.config["submodel.prune_output"] for r in runs) == [False, False, True, True]
    means = {row: t.cells[(row, col)]["mean"] for (row, col) in t.cells}
    assert means == {(False,): pytest.approx(0.80), (True,): pytest.approx(0.90)}


def test_only_tabulates_the_runs_with_the_listed_values_and_names_what_is_there(grid: Path):
    """``--only`` keeps the runs whose key takes one of the listed values: a short or dotted
    key, a default for runs made before the key existed; a value or key that matches
    nothing is a one-line error naming what there is."""
    runs = [read_run(p) for p in find_runs([grid])]
    assert len(select_runs(runs, {})) == 12
    high = select_runs(runs, {"heterogeneity": ["high"]})
    assert sorted((r.config["method"], r.seed) for r in high) == \
        [("fedavg", 0), ("fedavg", 1), ("fedavg", 2), ("fedgmr", 0), ("fedgmr", 1), ("fedgmr", 2)]
    some = select_runs(runs, {"clients.heterogeneity": ["low"], "seed": ["0", "2"], "method": ["fedgmr"]})
    assert sorted(r.seed for r in some) == [0, 2] and {r.config["clients.heterogeneity"] for r in some} == {"low"}
    # a key none of these runs wrote: each ran with its default (prune_output False)
    assert len(select_runs(runs, {"prune_output": ["False"]})) == 12
    with pytest.raises(ConfigError, match=r"no run has True \(values: False\)"):
        select_runs(runs, {"prune_output": ["True"]})
    with pytest.raises(ConfigError, match=r"--only heterogeneity: no run has hi \(values: high, low\)"):
        select_runs(runs, {"heterogeneity": ["hi"]})
    with pytest.raises(ConfigError, match="--only nokey: no config key 'nokey'"):
        select_runs(runs, {"nokey": ["1"]})


def test_a_short_name_of_several_keys_means_the_one_its_sweep_varied(tmp_path: Path):
    """``patience`` ends ``restoration.patience`` and ``distill.patience``: outside a sweep
    it is refused, naming both; in a sweep over ``restoration.patience`` (whose cells are
    named ``patience=1``, ``patience=3``) it is that axis, for ``--only`` and ``--rows``."""
    loose = tmp_path / "loose"
    for p, acc in ((1, 0.5), (3, 0.7)):
        _run(loose, f"fedgmr{p}", 0, "high", acc, {"restoration.patience": p})
    runs = [read_run(d) for d in find_runs([loose])]
    with pytest.raises(ConfigError, match=r"--only patience: 'patience' is ambiguous: "
                                          r"distill.patience, restoration.patience \(name one in full\)"):
        select_runs(runs, {"patience": ["1"]})
    swept = tmp_path / "swept"
    names = []
    for p, acc in ((1, 0.5), (3, 0.7)):
        for seed in (0, 1):
            d = _run(swept, "fedgmr", seed, "high", acc + seed / 100, {"restoration.patience": p})
            d = d.rename(swept / f"patience={p},seed={seed}")  # as a sweep names its cells
            names.append((d.name, {"restoration.patience": p, "seed": seed}))
    (swept / "sweep.json").write_text(json.dumps({"cells": [{"name": n, "point": pt} for n, pt in names]}))
    runs = [read_run(d) for d in find_runs([swept])]
    kept = select_runs(runs, {"patience": ["3"]})
    assert sorted(r.seed for r in kept) == [0, 1] and {r.config["restoration.patience"] for r in kept} == {3}
    table = build_table(runs, 10.0, rows=["patience"], mri_of=None)
    assert table.row_keys == ["restoration.patience"]
    assert table.rows == [(1,), (3,)]
    assert table.cells[((1,), ())]["mean"] == pytest.approx(0.505)
    assert table.cells[((3,), ())]["mean"] == pytest.approx(0.705)


def test_exclude_leaves_out_the_runs_that_match_all_its_keys(grid: Path):
    """``exclude``: the runs matching every key of it are left out, after ``only``: one
    key and value drops those runs; two keys drop their intersection (one column of a
    grid), two values of one key drop either; a value nothing has is an error naming
    ``--exclude`` and the values there are."""
    runs = [read_run(p) for p in find_runs([grid])]
    assert len(runs) == 12  # fedgmr, fedavg x high, low x seeds 0-2

    def kept(only: dict, exclude: dict) -> list[tuple[str, str, int]]:
        return sorted((r.config["method"], r.config["clients.heterogeneity"], r.seed)
                      for r in select_runs(runs, only, exclude))

    assert kept({}, {"heterogeneity": ["low"]}) == kept({"heterogeneity": ["high"]}, {})
    one_cell = kept({}, {"heterogeneity": ["low"], "method": ["fedavg"]})
    assert len(one_cell) == 9 and not [k for k in one_cell if k[:2] == ("fedavg", "low")]
    assert [k for k in one_cell if k[:2] == ("fedgmr", "low")] == [("fedgmr", "low", s) for s in (0, 1, 2)]
    assert kept({"method": ["fedgmr"]}, {"seed": ["0", "2"]}) == [("fedgmr", "high", 1), ("fedgmr", "low", 1)]
    assert kept({}, {"method": ["fedgmr", "fedavg"]}) == []
    with pytest.raises(ConfigError, match=r"--exclude heterogeneity: no run has medium \(values: high, low\)"):
        select_runs(runs, {}, {"heterogeneity": ["medium"]})


def test_cli_table_exclude_drops_one_column_of_the_grid(grid: Path):
    """``fedgmr table --exclude K=V --exclude K2=V2`` tabulates everything but the runs with
    both values; leaving nothing is a one-line error naming both options."""
    result = CliRunner().invoke(app, ["table", str(grid), "--t-star", "10", "--format", "csv",
                                      "--exclude", "heterogeneity=low", "--exclude", "method=fedavg"])
    assert result.exit_code == 0, result.stderr
    frame = pd.read_csv(io.StringIO(result.stdout))
    assert sorted(zip(frame["method"], frame["clients.heterogeneity"])) == \
        [("fedavg", "high"), ("fedgmr", "high"), ("fedgmr", "low")]
    assert set(frame["n_seeds"]) == {3}
    none = CliRunner().invoke(app, ["table", str(grid), "--t-star", "10", "--only", "heterogeneity=low",
                                    "--exclude", "heterogeneity=low"])
    assert none.exit_code == 2
    assert "no run is left by --only heterogeneity=low --exclude heterogeneity=low" in none.stderr
    bad = CliRunner().invoke(app, ["table", str(grid), "--t-star", "10", "--exclude", "heterogeneity"])
    assert bad.exit_code == 2 and "--exclude expects axis=value" in bad.stderr


def test_exclude_groups_leave_out_the_runs_matching_any_one_group(grid: Path):
    """``exclude`` as a list of groups (``--drop``, one per flag): a run is left out when it
    matches every key of any one group, and kept otherwise; each group's values are checked
    against every run and an error names the group's own flag."""
    runs = [read_run(p) for p in find_runs([grid])]

    def kept(groups: list, flags: list | None = None) -> list[tuple[str, str, int]]:
        return sorted((r.config["method"], r.config["clients.heterogeneity"], r.seed)
                      for r in select_runs(runs, {}, groups, flags))

    both = kept([{"heterogeneity": ["low"], "method": ["fedavg"]}, {"method": ["fedgmr"], "seed": ["1", "2"]}])
    assert both == [("fedavg", "high", 0), ("fedavg", "high", 1), ("fedavg", "high", 2),
                    ("fedgmr", "high", 0), ("fedgmr", "low", 0)]
    # one group is --exclude as it always was; an empty group drops nothing
    assert kept([{"heterogeneity": ["low"], "method": ["fedavg"]}]) == \
        sorted((r.config["method"], r.config["clients.heterogeneity"], r.seed)
               for r in select_runs(runs, {}, {"heterogeneity": ["low"], "method": ["fedavg"]}))
    assert len(kept([{}, {}])) == 12
    with pytest.raises(ConfigError, match=r"--drop seed: no run has 7 \(values: 0, 1, 2\)"):
        kept([{"method": ["fedavg"]}, {"seed": ["7"]}], ["--exclude", "--drop"])


def test_cli_drop_leaves_out_two_groups_that_one_exclude_cannot_say(grid: Path):
    """``--drop 'K=V K2=V2'`` (repeatable) on ``fedgmr table`` (``plot``, ``evaluate`` and
    ``tiers``: their own tests): each flag is one group; with ``--exclude`` its flags are one more. Low's
    FedAvg and FedGMR's seeds 1-2 together leave FedAvg Low out and FedGMR with seed 0
    only; a malformed group is a one-line error."""
    result = CliRunner().invoke(app, ["table", str(grid), "--t-star", "10", "--format", "csv",
                                      "--exclude", "heterogeneity=low", "--exclude", "method=fedavg",
                                      "--drop", "method=fedgmr seed=1,2"])
    assert result.exit_code == 0, result.stderr
    frame = pd.read_csv(io.StringIO(result.stdout))
    assert sorted(zip(frame["method"], frame["clients.heterogeneity"], frame["n_seeds"])) == \
        [("fedavg", "high", 3), ("fedgmr", "high", 1), ("fedgmr", "low", 1)]
    same = CliRunner().invoke(app, ["table", str(grid), "--t-star", "10", "--format", "csv",
                                    "--drop", "heterogeneity=low method=fedavg", "--drop", "method=fedgmr seed=1,2"])
    assert same.exit_code == 0 and same.stdout == result.stdout
    bad = CliRunner().invoke(app, ["table", str(grid), "--t-star", "10", "--drop", "seed"])
    assert bad.exit_code == 2 and "--drop expects axis=value" in bad.stderr
    none = CliRunner().invoke(app, ["table", str(grid), "--t-star", "10", "--only", "method=fedavg",
                                    "--drop", "method=fedavg heterogeneity=high", "--drop", "heterogeneity=low"])
    assert none.exit_code == 2
    assert ("no run is left by --only method=fedavg --drop 'method=fedavg heterogeneity=high' "
            "--drop 'heterogeneity=low'") in none.stderr


def test_cli_table_only_gives_the_table_of_the_chosen_runs(grid: Path):
    proc = subprocess.run([sys.executable, "-m", "fedgmr", "table", str(grid), "--t-star", "10",
                           "--only", "heterogeneity=low", "--only", "method=fedgmr,fedavg", "--format", "csv"],
                          capture_output=True, text=True, env=ENV, timeout=scaled(300))
    assert proc.returncode == 0, proc.stderr
    frame = pd.read_csv(io.StringIO(proc.stdout))
    assert sorted(frame["method"]) == ["fedavg", "fedgmr"]  # one cell each: the Low runs
    means = frame.set_index("method")["mean"]
    assert means["fedgmr"] == pytest.approx(0.87) and means["fedavg"] == pytest.approx(0.81)
    bad = subprocess.run([sys.executable, "-m", "fedgmr", "table", str(grid), "--t-star", "10",
                          "--only", "heterogeneity"], capture_output=True, text=True, env=ENV, timeout=scaled(300))
    assert bad.returncode != 0 and "--only expects" in bad.stderr and bad.stderr.count("\n") == 1


def test_the_mri_row_stays_when_a_second_row_key_splits_no_method(grid: Path):
    """``--rows method,KEY`` where KEY is one value per method: the MRI is the one-key table's."""
    t = _table(grid, rows=("method", "coordination.mode"), cols=("heterogeneity",))
    assert sorted(t.rows) == [("fedavg", "sync"), ("fedgmr", "semi_async")]
    assert t.mri_of == "fedgmr" and t.mri_over == ["fedavg"]
    assert t.mri[("high",)] == pytest.approx(100 * 0.11 / 0.71)
    assert t.mri[("low",)] == pytest.approx(100 * 0.06 / 0.81)
    assert "MRI of fedgmr (%)" in render(t, "md")


def test_with_two_row_keys_the_mri_method_comes_first_and_the_second_key_keeps_its_order(grid: Path):
    """The runs come fedavg first (directory order); the table lists fedgmr, the MRI method, first."""
    assert [read_run(p).config["method"] for p in find_runs([grid])][0] == "fedavg"
    t = _table(grid, rows=("method", "coordination.mode"), cols=("heterogeneity",))
    assert t.rows == [("fedgmr", "semi_async"), ("fedavg", "sync")]
    t = _table(grid, rows=("heterogeneity", "method"), cols=())
    assert t.rows == [("high", "fedgmr"), ("low", "fedgmr"), ("high", "fedavg"), ("low", "fedavg")]
    _run(grid, "aaa_mine", 0, "high", 0.5)  # not a baseline: after the MRI method and its baselines
    t = _table(grid, rows=("method", "coordination.mode"), cols=("heterogeneity",))
    assert [r[0] for r in t.rows] == ["fedgmr", "fedavg", "aaa_mine"]
    t = _table(grid, rows=("method", "coordination.mode"), cols=("heterogeneity",), mri_of=None)
    assert [r[0] for r in t.rows] == ["fedavg", "aaa_mine", "fedgmr"]  # no MRI method: baselines first


def test_a_method_split_over_several_rows_gets_no_mri_row_and_the_caption_says_why(grid: Path):
    t = _table(grid, rows=("method", "heterogeneity"), cols=())
    assert t.mri_of is None and not t.mri
    text = render(t, "md")
    assert "MRI of" not in text
    assert ("No MRI row: fedgmr, fedavg have several rows (by clients.heterogeneity); keep one with --only "
            "to get it.") in text
    one = render(_table(grid, rows=("method", "heterogeneity"), cols=(), mri_of=None), "md")
    assert "No MRI row" not in one  # none was asked for


def _mechanism_runs(root: Path) -> None:
    """Two methods x two seeds with hand-set mechanism series (grid Δ = 1 s, t = 0..30):
    fedgmr: step = 2t + seed, uploads = 5t, density 0.25 up to t = 9 and 0.5 from t = 10;
    fedavg: step = t, uploads = 10t, density 1. Seed 1 of fedavg ends at t = 9."""
    for seed in (0, 1):
        for method in ("fedgmr", "fedavg"):
            d = _run(root, method, seed, "high", 0.5)
            rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
            for r in rows:
                t = int(r["time"])
                if method == "fedgmr":
                    r.update(step=2 * t + seed, uploads=5 * t, avg_density=0.25 if t < 10 else 0.5)
                else:
                    r.update(step=t, uploads=10 * t, avg_density=1.0)
            if method == "fedavg" and seed == 1:
                rows = rows[:10]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_counter_is_read_at_t_star_and_a_mechanism_figure_is_not_ranked(tmp_path: Path):
    """steps, uploads and megabytes are each seed's last record at or before t*; a run that
    ends before t* has no value; avg_density is the mean over the Acc@t* window; none of
    them is bold, none has an MRI row."""
    _mechanism_runs(tmp_path)
    runs = find_runs([tmp_path])

    def cell(metric: str, method: str, t_star: float = 12.5) -> dict:
        table = build_table([read_run(p, metric) for p in runs], t_star=t_star)
        assert table.mri_of is None
        return table.cells[((method,), ())]

    # t* = 12.5: the last records at or before it are t = 12 (seed 0: step 24, seed 1: 25)
    steps = cell("steps", "fedgmr")
    assert steps["acc"] == [24.0, 25.0] and steps["mean"] == 24.5
    assert cell("uploads", "fedgmr")["acc"] == [60.0, 60.0]
    assert cell("mb_up", "fedgmr")["acc"] == [12.0, 12.0]     # bytes_up = 1e6 t
    assert cell("mb_down", "fedgmr")["acc"] == [24.0, 24.0]   # bytes_down = 2e6 t
    fedavg = cell("steps", "fedavg")
    assert fedavg["acc"][0] == 12.0 and math.isnan(fedavg["acc"][1])  # seed 1 ended at t = 9
    # the window of t* = 12.5 is [2.5, 22.5): t = 3..22, 7 records at 0.25 and 13 at 0.5
    density = cell("avg_density", "fedgmr")
    assert density["acc"] == [pytest.approx((7 * 0.25 + 13 * 0.5) / 20)] * 2
    text = render(build_table([read_run(p, "steps") for p in runs if "fedgmr" in p.name], t_star=12.5), "md")
    assert "steps at t* = 12 s" in text or "steps at t* = 13 s" in text  # the title rounds t*
    assert "Each seed's value: its last record at or before t*." in text
    assert "Nothing bold" in text and "**" not in text and "(%)" not in text
    assert "| fedgmr   | 24.5 ± 0.7 |" in text  # a count: one decimal (a mean over seeds), not x100
    dens = render(build_table([read_run(p, "avg_density") for p in runs], t_star=12.5), "md")
    assert "the mean of its records in the Acc@t* window" in dens and "**" not in dens
    assert "| fedgmr   | 0.41 ± 0.00 |" in dens and "| fedavg   | 1.00 (n=1) |" not in dens
    with pytest.raises(ConfigError, match="not an accuracy"):
        build_table([read_run(p, "steps") for p in runs], t_star=12.5, target=0.5)


def test_cli_table_metric_steps_as_csv_and_every_metric_in_the_help(tmp_path: Path):
    from fedgmr.experiment.metrics import TABLE_METRICS

    _mechanism_runs(tmp_path)
    got = subprocess.run([sys.executable, "-m", "fedgmr", "table", str(tmp_path), "--t-star", "20",
                          "--metric", "uploads", "--format", "csv", "--only", "method=fedgmr"],
                         capture_output=True, text=True, env=ENV)
    assert got.returncode == 0, got.stderr
    frame = pd.read_csv(io.StringIO(got.stdout))
    assert frame["mean"].tolist() == [100.0] and frame["per_seed"].tolist() == ["100.000000 100.000000"]
    bad = subprocess.run([sys.executable, "-m", "fedgmr", "table", str(tmp_path), "--t-star", "20",
                          "--metric", "stepz"], capture_output=True, text=True, env=ENV)
    assert bad.returncode != 0 and "must be one of" in bad.stderr and "steps" in bad.stderr
    helped = subprocess.run([sys.executable, "-m", "fedgmr", "table", "--help"], capture_output=True, text=True,
                            env={**ENV, "COLUMNS": "2000", "TERM": "dumb"})
    text = " ".join(helped.stdout.split())
    assert [m for m in TABLE_METRICS if m not in text] == []


def test_test_loss_is_windowed_and_the_lowest_is_bold(tmp_path: Path):
    for seed in (0, 1):
        for method, loss in (("fedgmr", 0.40), ("fedavg", 0.90)):
            d = _run(tmp_path, method, seed, "high", 0.5)
            rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
            # the window of t* = 10 is [0, 20): the records from t = 20 on must not count
            for r in rows:
                r["loss"] = loss + 0.02 * seed if r["time"] < 20 else 9.0
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = build_table([read_run(p, "loss") for p in find_runs([tmp_path])], t_star=10.0)
    assert table.cells[(("fedgmr",), ())]["acc"] == [pytest.approx(0.40), pytest.approx(0.42)]
    text = render(table, "md")
    assert "loss at t* = 10 s" in text and "Bold: lowest mean" in text and "MRI" not in text
    assert "| fedgmr   | **0.4100 ± 0.0141** |" in text and "| fedavg   | 0.9100 ± 0.0141     |" in text


def test_runs_that_end_inside_the_window_are_named_and_full_windows_are_not(tmp_path: Path):
    """Runs evaluated every 1 s up to 30 s: t* = 21's window [11, 31) holds all 20 grid points
    (the last is 30), t* = 22's [12, 32) would need 31 too: those runs average 19."""
    from fedgmr.experiment.table import clipped_windows

    paths = [_run(tmp_path, "fedgmr", seed, "high", 0.8) for seed in (0, 1)]
    runs = [read_run(p) for p in paths]
    assert clipped_windows(runs, 20.0) == [] and clipped_windows(runs, 21.0) == []
    assert clipped_windows(runs, 22.0) == paths and clipped_windows(runs, 29.0) == paths
    assert clipped_windows(runs, 30.0) == []  # never past t*: no value at all, not a short one
    assert clipped_windows(runs, 25.0, span=5.0) == []  # [20, 30) is whole
    proc = subprocess.run([sys.executable, "-m", "fedgmr", "table", str(tmp_path), "--t-star", "20,25"],
                          capture_output=True, text=True, env=ENV, timeout=scaled(300))
    assert proc.returncode == 0, proc.stderr
    notes = [ln for ln in proc.stderr.splitlines() if "end inside the window" in ln]
    assert len(notes) == 1 and "2 run(s)" in notes[0] and "t* = 25 s" in notes[0], proc.stderr
    counter = subprocess.run([sys.executable, "-m", "fedgmr", "table", str(tmp_path), "--t-star", "25",
                              "--metric", "steps"], capture_output=True, text=True, env=ENV, timeout=scaled(300))
    assert counter.returncode == 0 and "end inside the window" not in counter.stderr, counter.stderr


def test_time_to_target_of_another_metric_times_that_metric_and_says_so(tmp_path: Path):
    """``--metric core_accuracy --target 0.5``: the time at which the first level's accuracy
    (not the global model's) first reaches 50 %, and the caption names the metric; with
    the default metric the caption keeps its words."""
    for seed, start in enumerate((10, 14)):
        d = tmp_path / f"r{seed}"
        d.mkdir()
        (d / "config.yaml").write_text(yaml.safe_dump({
            "name": "t", "method": "fedgmr_wo_gmr", "seed": seed, "submodel": {"ladder": [0.2]},
            "run": {"eval_interval": 1.0, "level_eval_every": 1}}))
        # the global model stays at 10 %; the first level climbs 5 points a second from ``start``
        rows = [{"time": float(t), "step": t, "accuracy": 0.1, "bytes_up": 0.0, "bytes_down": 0.0,
                 "levels": [0.2], "level_accuracy": [min(1.0, max(0.1, 0.05 * (t - start)))]} for t in range(31)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "summary.json").write_text(json.dumps({"method": "fedgmr_wo_gmr"}))
    result = CliRunner().invoke(app, ["table", str(tmp_path), "--t-star", "20", "--rows", "submodel.ladder",
                                      "--metric", "core_accuracy", "--target", "0.5"])
    assert result.exit_code == 0, result.stderr
    # 50 % at t = start + 10: 20 s and 24 s, mean 22
    assert "time to target (s), target core_accuracy 50.0 %: mean over the seeds that reached it" in result.stdout
    ttt = result.stdout.split("time to target (s)")[1].split("MB up")[0]
    assert ttt.splitlines()[-2].split("|")[1:3] == [" [0.2]             ", "    22 "], ttt
    plain = CliRunner().invoke(app, ["table", str(tmp_path), "--t-star", "20", "--rows", "submodel.ladder",
                                     "--target", "0.5"])
    assert "time to target (s), target accuracy 50.0 %" in plain.stdout and "| never " in plain.stdout
