"""Seed-paired statistics and the stabilisation t* behind the protocol's verdicts
(docs/protocol.md): hand-computed values, then `fedgmr table --paired-against` and
`--t-star auto` on run directories written here.

With two degrees of freedom Student's t has a closed form, F(t) = 1/2 + t / (2 sqrt(t² + 2)),
so the 3-seed figures below are computed by hand, not by the library under test."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from fedgmr.cli import app
from fedgmr.errors import ConfigError
from fedgmr.experiment.metrics import acc_at_t, acc_at_times
from fedgmr.experiment.stats import adjusted_verdict, holm, paired_difference, stabilisation_time, stable_from
from fedgmr.experiment.table import auto_t_star, build_table, find_runs, read_run, render

#: the two-sided 95 % quantile of t with 2 degrees of freedom: q / sqrt(q² + 2) = 0.95
Q2 = math.sqrt(2 * 0.95 ** 2 / (1 - 0.95 ** 2))


def test_paired_difference_three_seeds_by_hand():
    d = paired_difference({0: 0.90, 1: 0.92, 2: 0.94}, {0: 0.88, 1: 0.91, 2: 0.90})
    # differences 0.02, 0.01, 0.04: mean 0.07/3, sample sd sqrt(0.00046667/2)
    mean = 0.07 / 3
    sd = math.sqrt(((0.02 - mean) ** 2 + (0.01 - mean) ** 2 + (0.04 - mean) ** 2) / 2)
    se = sd / math.sqrt(3)
    t = mean / se  # t² = 7 exactly
    assert t ** 2 == pytest.approx(7.0)
    assert d.n == 3 and d.seeds == (0, 1, 2)
    assert d.mean == pytest.approx(mean)
    assert d.lo == pytest.approx(mean - Q2 * se) and d.hi == pytest.approx(mean + Q2 * se)
    assert Q2 == pytest.approx(4.302653, abs=1e-6)
    assert d.p == pytest.approx(1 - t / math.sqrt(t ** 2 + 2))  # = 1 - sqrt(7)/3 = 0.118...
    assert d.p == pytest.approx(0.118083, abs=1e-6)
    assert d.verdict == "level"  # the interval [-0.0146, +0.0613] holds 0


def test_paired_difference_verdicts_follow_the_interval():
    ahead = paired_difference({0: 0.9, 1: 0.91, 2: 0.92}, {0: 0.8, 1: 0.805, 2: 0.82})
    assert ahead.lo > 0 and ahead.verdict == "ahead" and ahead.p < 0.05
    behind = paired_difference({0: 0.8, 1: 0.805, 2: 0.82}, {0: 0.9, 1: 0.91, 2: 0.92})
    assert behind.hi < 0 and behind.verdict == "behind"
    assert behind.mean == pytest.approx(-ahead.mean) and behind.p == pytest.approx(ahead.p)


def test_paired_difference_pairs_only_common_seeds_and_degenerate_cases():
    d = paired_difference({0: 0.5, 1: 0.6, 3: 0.9}, {0: 0.4, 1: 0.4, 2: 0.1})
    assert d.n == 2 and d.seeds == (0, 1) and d.mean == pytest.approx(0.15)
    # with one degree of freedom: q = tan(pi * 0.475), p = 1 - 2 atan(t) / pi
    se = math.sqrt(((0.1 - 0.15) ** 2 + (0.2 - 0.15) ** 2)) / math.sqrt(2)
    assert d.hi - d.mean == pytest.approx(math.tan(math.pi * 0.475) * se)
    assert d.p == pytest.approx(1 - 2 * math.atan(0.15 / se) / math.pi)
    one = paired_difference({0: 0.5}, {0: 0.4, 1: 0.3})
    assert one.n == 1 and one.mean == pytest.approx(0.1) and math.isnan(one.lo) and one.verdict == "n/a"
    none = paired_difference({0: 0.5}, {1: 0.4})
    assert none.n == 0 and math.isnan(none.mean) and none.verdict == "n/a"
    same = paired_difference({0: 0.5, 1: 0.6}, {0: 0.4, 1: 0.5})  # every pair differs by 0.1
    assert same.lo == same.hi == pytest.approx(0.1) and same.p == 0.0 and same.verdict == "ahead"
    tie = paired_difference({0: 0.5, 1: 0.6}, {0: 0.5, 1: 0.6})
    assert tie.p == 1.0 and tie.verdict == "level"
    nan = paired_difference({0: 0.5, 1: math.nan, 2: 0.7}, {0: 0.4, 1: 0.5, 2: 0.6})
    assert nan.n == 2 and nan.seeds == (0, 2)


def test_stable_from_and_stabilisation_time_by_hand():
    assert stable_from([0.5, 0.8, 0.9, 0.91, 0.9], 0.02) == 2
    assert stable_from([0.9, 0.9, 0.5, 0.9, 0.9], 0.02) == 3  # a dip resets it
    assert stable_from([0.1, 0.2, 0.3, 0.4, 0.9], 0.02) == 5  # only the horizon itself: never
    assert stable_from([0.1, 0.2, 0.3, 0.89, 0.9], 0.02) == 3
    assert stable_from([0.9, math.nan, 0.9, 0.9], 0.02) == 2  # a NaN breaks the run
    assert stable_from([0.9, 0.9, math.nan], 0.02) == 3  # no value at the horizon: never
    grid = [0.0, 100.0, 200.0, 300.0, 400.0]
    curves = {"a": [0.5, 0.8, 0.9, 0.91, 0.9], "b": [0.9, 0.9, 0.5, 0.9, 0.9], "c": [0.1, 0.2, 0.3, 0.4, 0.9]}
    s = stabilisation_time(grid, curves, 0.02)
    # stable from index 2, 3 and never: the second of three (a majority) at index 3
    assert s.t_star == 300.0 and s.stable == 2 and s.total == 3 and s.horizon == 400.0 and s.start == 0.0
    looser = stabilisation_time(grid, curves, 0.5)  # 0.5 of 0.9: a from 0, b from 0, c from 3
    assert looser.t_star == 0.0 and looser.stable == 2
    never = stabilisation_time(grid, {"a": [0.1, 0.2, 0.3, 0.4, math.nan], "b": [0.0] * 4 + [math.nan],
                                      "c": [0.9] * 5}, 0.01)
    assert never.t_star is None and never.stable == 1
    with pytest.raises(ValueError):
        stabilisation_time(grid, {"a": [0.1]}, 0.01)


# ------------------------------------------------------------------ on run directories
def _run(root: Path, method: str, seed: int, accs: list[float], het: str = "high") -> Path:
    """A run evaluated every 10 s from 0 s, with accuracy ``accs[i]`` at time 10 i."""
    d = root / f"{method}-{het}-{seed}"
    d.mkdir(parents=True)
    cfg = {"name": "t", "method": method, "seed": seed, "clients": {"heterogeneity": het},
           "run": {"eval_interval": 10.0}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    rows = [{"time": 10.0 * i, "step": i, "accuracy": a} for i, a in enumerate(accs)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"method": method, "eval_interval": 10.0}))
    return d


@pytest.fixture
def paired_runs(tmp_path: Path) -> Path:
    # constant accuracies: Acc@t* is the value itself at every t*
    for seed, (g, a, b) in enumerate(((0.90, 0.88, 0.80), (0.92, 0.91, 0.805), (0.94, 0.90, 0.82))):
        _run(tmp_path, "fedgmr", seed, [g] * 60)
        _run(tmp_path, "fedasync", seed, [a] * 60)
        _run(tmp_path, "fedavg", seed, [b] * 60)
    return tmp_path


def test_table_pairs_each_row_with_the_reference_by_seed(paired_runs: Path):
    runs = [read_run(p) for p in find_runs([paired_runs])]
    t = build_table(runs, 300.0, paired_against="fedgmr")
    assert t.paired_ref == ("fedgmr",)
    ref = t.cells[(("fedgmr",), ())]
    assert "paired" not in ref
    d = t.cells[(("fedasync",), ())]["paired"]
    assert d.mean == pytest.approx(0.07 / 3) and d.p == pytest.approx(1 - math.sqrt(7) / 3)
    text = render(t, "md")
    assert "Seed-paired differences against fedgmr: Δ = fedgmr − row, in points" in text
    line = next(ln for ln in text.splitlines()[text.splitlines().index(""):] if ln.startswith("| fedasync")
                and "[" in ln)
    assert "+2.33 [-1.46, +6.13] p=0.118 level" in line
    avg = next(ln for ln in text.splitlines() if ln.startswith("| fedavg") and "[" in ln)
    assert "ahead" in avg
    csv = render(t, "csv")
    assert "paired_against" in csv.splitlines()[0] and ",level" in csv and ",ahead" in csv


def test_holm_adjusts_step_down_by_hand():
    # sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04, raised to 0.06 (monotone)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    out = holm([0.2, math.nan, 0.01, 0.6])  # NaN is not a test: m = 3
    assert out[0] == pytest.approx(0.4) and math.isnan(out[1]) and out[2] == pytest.approx(0.03)
    assert out[3] == pytest.approx(0.6) and holm([0.9, 0.8]) == [1.0, 1.0] and holm([]) == []  # capped at 1
    assert [adjusted_verdict(m, p) for m, p in ((0.1, 0.049), (-0.1, 0.01), (0.1, 0.05), (0.1, math.nan))] == \
        ["ahead", "behind", "level", "n/a"]


def test_holm_counts_one_training_under_two_names_once_per_column(paired_runs: Path):
    """``--holm``: each column's comparisons with the reference are one family; a row that
    repeats another row's values in every seed (fedavg_ims = fedavg here) is not a second
    test, so m is 2, not 3; the adjusted p and its verdict are printed and written to CSV."""
    for seed, b in enumerate((0.80, 0.805, 0.82)):
        _run(paired_runs, "fedavg_ims", seed, [b] * 60)
    runs = [read_run(p) for p in find_runs([paired_runs])]
    t = build_table(runs, 300.0, paired_against="fedgmr", holm=True)
    cell = lambda m: t.cells[((m,), ())]  # noqa: E731
    raw = {m: cell(m)["paired"].p for m in ("fedasync", "fedavg")}
    assert raw["fedavg"] < raw["fedasync"]
    assert cell("fedavg")["holm"] == cell("fedavg_ims")["holm"] == (pytest.approx(2 * raw["fedavg"]), 2)
    assert cell("fedasync")["holm"] == (pytest.approx(max(raw["fedasync"], 2 * raw["fedavg"])), 2)
    text = render(t, "md")
    assert "Holm-adjusted p-values of the differences above: one family per column" in text
    holm_part = text.split("Holm-adjusted", 1)[1]
    line = next(ln for ln in holm_part.splitlines() if ln.startswith("| fedasync"))
    assert f"p={raw['fedasync']:.3f} level (m=2)" in line
    csv = render(t, "csv")
    assert csv.splitlines()[0].endswith("p_holm,holm_m,verdict_holm") and ",2,level" in csv
    with pytest.raises(ConfigError, match="--holm adjusts the p-values of --paired-against"):
        build_table(runs, 300.0, holm=True)
    both = CliRunner().invoke(app, ["table", str(paired_runs), "--t-star", "100,300", "--paired-against", "fedgmr",
                                    "--holm"])
    assert both.exit_code == 0 and both.stdout.count("(m=2)") == 6, both.output  # 3 rows x 2 t*


def test_paired_against_names_a_row_or_refuses_with_the_rows(paired_runs: Path):
    runs = [read_run(p) for p in find_runs([paired_runs])]
    with pytest.raises(ConfigError, match="no such row .*fedgmr; fedavg; fedasync"):
        build_table(runs, 300.0, paired_against="fjord")


def test_cli_paired_against_and_auto_t_star(tmp_path: Path):
    # fedgmr climbs until 200 s and then holds; fedasync is flat; fedavg still climbs to the end:
    # two of three cells are stable within 1 point from 200 s (fedgmr) and from the start (fedasync)
    for seed in range(3):
        _run(tmp_path, "fedgmr", seed, [min(0.5 + 0.02 * i, 0.9) + 0.01 * seed for i in range(60)])
        _run(tmp_path, "fedasync", seed, [0.85 + 0.005 * seed] * 60)
        _run(tmp_path, "fedavg", seed, [0.2 + 0.01 * i for i in range(60)])
    runs = [read_run(p) for p in find_runs([tmp_path])]
    found = auto_t_star(runs, tolerance=0.01)
    # every window is whole from 0 + 10 x 10 s = 100 s to 590 + 10 - 100 = 500 s
    assert found.start == 100.0 and found.horizon == 500.0
    # fedgmr's Acc@t is the mean of 0.5 + 0.02 i (capped at 0.9) over the 20 grid points of
    # [t - 100, t + 100), plus its seed's offset; recomputed here from that definition
    fedgmr_curve = [sum(min(0.5 + 0.02 * i, 0.9) for i in range(int(t / 10) - 10, int(t / 10) + 10)) / 20
                    for t in range(100, 510, 10)]
    first = next(k for k in range(len(fedgmr_curve)) if all(abs(v - fedgmr_curve[-1]) <= 0.01 + 1e-12
                                                             for v in fedgmr_curve[k:]))
    assert found.t_star == 100.0 + 10 * first and found.stable == 2 and found.total == 3
    result = CliRunner().invoke(app, ["table", str(tmp_path), "--t-star", "100,auto", "--paired-against",
                                      "fedgmr"])
    assert result.exit_code == 0, result.output
    assert f"t* = {found.t_star:,.0f} s (auto)" in result.output
    assert f"t* = auto: {found.t_star:,.0f} s, the first grid time from which 2 of 3 cells" in result.output
    assert "Seed-paired differences against fedgmr" in result.output
    bad = CliRunner().invoke(app, ["table", str(tmp_path), "--t-star", "auto", "--horizon", "900"])
    assert bad.exit_code != 0 and "--horizon 900" in bad.output
    never = CliRunner().invoke(app, ["table", str(tmp_path), "--t-star", "auto", "--stable-tol", "0",
                                     "--scan-from", "400", "--only", "method=fedavg"])
    assert never.exit_code != 0 and "never stay within 0" in never.output
    stray = CliRunner().invoke(app, ["table", str(tmp_path), "--t-star", "100", "--horizon", "300"])
    assert stray.exit_code != 0 and "belong to --t-star auto" in stray.output


def test_acc_at_times_is_acc_at_t_at_every_t_to_the_last_bit():
    """The t* scan's windowed means (one binary search per t) are acc_at_t's, float for
    float: on an irregular series with repeated times and a gap, for the grid window, a
    window in seconds and the index window, at times before the start, inside, on a
    record, inside the gap (an empty window: NaN) and past the end (NaN)."""
    rng = np.random.default_rng(3)
    times = sorted([0.0, 10.0, 10.0, 20.0, 30.0, 30.0, 30.0] + list(rng.uniform(40, 300, 60))
                   + list(rng.uniform(900, 1000, 25)))
    accs = list(rng.uniform(0.1, 0.99, len(times)))
    # window edges on repeated records: t - 37.5 = 10 and t + 37.5 = 30; t - 100 = 10 and t + 100 = 30
    ts = [-50.0, -7.5, 47.5, -70.0, 110.0, 0.0, 5.0, 10.0, 30.0, 123.4, 299.0, 600.0, 950.0, max(times) - 1e-9,
          max(times), 5000.0]
    for kw in ({"interval": 10.0}, {"span": 37.5}, {}, {"interval": 10.0, "half_window": 3}):
        new = acc_at_times(times, accs, ts, **kw)
        old = [acc_at_t(times, accs, t, **kw)[0] for t in ts]
        assert len(new) == len(ts)
        for a, b in zip(new, old):
            assert a == b or (math.isnan(a) and math.isnan(b)), (kw, a, b)
        assert math.isnan(new[-1]) and math.isnan(new[-2])  # nothing past the last record
    assert math.isnan(acc_at_times(times, accs, [600.0], interval=10.0)[0])  # inside the gap
    assert math.isnan(acc_at_times([], [], [1.0])[0])
    with pytest.raises(ValueError, match="never decrease"):
        acc_at_times([0.0, 20.0, 10.0], [0.1, 0.2, 0.3], [5.0])
    with pytest.raises(ValueError, match="3 times but 2 values"):
        acc_at_times([0.0, 10.0, 20.0], [0.1, 0.2], [5.0])


def test_auto_t_star_equals_a_table_built_at_every_grid_time(tmp_path: Path):
    """The scan groups the runs once; its curves are what build_table gives cell by cell
    at each grid time (the old scan), so the t* and the counts are the same: three
    methods over two columns, seeds that differ in length and shape."""
    rng = np.random.default_rng(0)
    for het in ("high", "low"):
        for method, rate in (("fedgmr", 0.03), ("fedavg", 0.01), ("fedasync", 0.05)):
            for seed in range(3):
                _run(tmp_path, method, seed, [min(0.95, 0.3 + rate * i) + rng.normal(0, 0.004)
                                              for i in range(70 + 5 * seed)], het=het)
    runs = [read_run(p) for p in find_runs([tmp_path])]
    found = auto_t_star(runs, cols=["heterogeneity"], tolerance=0.01)
    grid = [found.start + 10.0 * i for i in range(int(round((found.horizon - found.start) / 10.0)) + 1)]
    curves: dict = {}
    for t in grid:
        for key, cell in build_table(runs, t, cols=["heterogeneity"], mri_of=None).cells.items():
            curves.setdefault(key, []).append(cell["mean"])
    assert len(curves) == 6 and stabilisation_time(grid, curves, 0.01) == found
    assert found.t_star is not None and found.start < found.t_star < found.horizon


def test_auto_t_star_needs_a_whole_window_somewhere(tmp_path: Path):
    for seed in range(2):
        _run(tmp_path, "fedgmr", seed, [0.9] * 15)  # 0..140 s: no t has 100 s of records each side
    runs = [read_run(p) for p in find_runs([tmp_path])]
    with pytest.raises(ConfigError, match="no grid time has a whole Acc@t window"):
        auto_t_star(runs)


def test_wide_seed_spread_is_named_on_stderr(tmp_path: Path):
    for seed, a in enumerate((0.80, 0.86, 0.83)):  # std 3 points with 3 seeds
        _run(tmp_path, "fedgmr", seed, [a] * 40)
    result = CliRunner().invoke(app, ["table", str(tmp_path), "--t-star", "200"])
    assert result.exit_code == 0
    assert "1 cell(s) have a seed std above 2 points with fewer than 5 seeds" in result.output


def test_every_wide_cell_is_named_with_its_std(tmp_path: Path):
    """Four methods, three with a seed std above 2 points at both of two t*: all six cells
    are named (none cut off), each with its std and seed count; the narrow method is not."""
    spreads = {"fedavg": (0.80, 0.86, 0.83), "fjord": (0.70, 0.75, 0.72), "fiarse": (0.60, 0.66, 0.62),
               "fedgmr": (0.90, 0.905, 0.91)}
    for method, accs in spreads.items():
        for seed, a in enumerate(accs):
            _run(tmp_path, method, seed, [a] * 60)
    result = CliRunner().invoke(app, ["table", str(tmp_path), "--t-star", "200,300"])
    assert result.exit_code == 0, result.output
    note = result.stderr.split("asks for 5 there):\n", 1)[1].splitlines()
    named = [ln for ln in note if ln.startswith("  ")]
    assert len(named) == 6 and "6 cell(s)" in result.stderr
    assert "  fedavg at t* = 200 s: std 3.00 points, 3 seeds" in named
    assert "  fiarse at t* = 300 s: std 3.06 points, 3 seeds" in named
    assert not any(ln.startswith("  fedgmr") for ln in named)


def test_rows_that_are_one_computation_are_named_on_stderr(tmp_path: Path):
    """Two rows equal in every seed of every column (as heterofl_aux is heterofl_ims in the
    protocol's Table 1) are named together; a row equal in one column only is not."""
    for seed in range(3):
        curve = [0.3 + 0.005 * i + 0.02 * seed for i in range(60)]
        _run(tmp_path, "heterofl_ims", seed, curve)
        _run(tmp_path, "heterofl_aux", seed, curve)
        _run(tmp_path, "fjord", seed, curve[:30] + [a + 0.01 for a in curve[30:]])  # differs after 300 s
    one = CliRunner().invoke(app, ["table", str(tmp_path), "--t-star", "150,450"])
    assert one.exit_code == 0, one.output
    notes = [ln for ln in one.stderr.splitlines() if "probably the same training" in ln]
    assert len(notes) == 1 and notes[0].split("evidence): ")[1] in ("heterofl_ims = heterofl_aux",
                                                                   "heterofl_aux = heterofl_ims"), one.stderr
    assert "fjord" not in notes[0] and "probably the same training" not in one.stdout
    # at 150 s alone fjord is the same run as well: all three named as one group
    early = CliRunner().invoke(app, ["table", str(tmp_path), "--t-star", "150"])
    assert sorted(early.stderr.split("evidence): ")[1].strip().split(" = ")) == ["fjord", "heterofl_aux",
                                                                                   "heterofl_ims"]


def test_first_to_target_counts_seed_by_seed(tmp_path: Path):
    """--target with --paired-against: per seed, who reaches the target first. By hand, the
    runs evaluated every 10 s and reaching 0.9 at: fedgmr 50, 30, 80 s and never in seed 3;
    fjord 60, 30 (tie), 40 s and never (tie: neither); fedavg never in seeds 0-2 and 10 s in
    seed 3 (fedavg has no seed 4, fedgmr's seed 4 is not counted against it)."""
    def climb(at: float | None) -> list[float]:
        return [0.95 if at is not None and 10 * i >= at else 0.5 for i in range(30)]

    for seed, (g, f, a) in enumerate(((50, 60, None), (30, 30, None), (80, 40, None), (None, None, 10))):
        _run(tmp_path, "fedgmr", seed, climb(g))
        _run(tmp_path, "fjord", seed, climb(f))
        _run(tmp_path, "fedavg", seed, climb(a))
    _run(tmp_path, "fedgmr", 4, climb(20))
    runs = [read_run(p) for p in find_runs([tmp_path])]
    t = build_table(runs, 100.0, target=0.9, paired_against="fedgmr")
    from fedgmr.experiment.table import first_to_target
    ref = t.cells[(("fedgmr",), ())]
    assert first_to_target(ref, t.cells[(("fjord",), ())]) == (1, 1, 2, 4)
    assert first_to_target(ref, t.cells[(("fedavg",), ())]) == (3, 1, 0, 4)
    text = render(t, "md")
    block = text.split("first to the target, seed by seed, against fedgmr")[1]
    assert "| fjord    | 1 of 4; row 1; tie 2" in block and "| fedavg   | 3 of 4; row 1" in block
    csv = render(t, "csv").splitlines()
    head = csv[0].split(",")
    fjord = dict(zip(head, next(line for line in csv if line.startswith("fjord")).split(",")))
    assert (fjord["ref_first"], fjord["row_first"], fjord["first_tie"]) == ("1", "1", "2")
    assert "first to the target" not in render(build_table(runs, 100.0, target=0.9), "md")  # needs a reference


def test_cells_with_no_value_name_no_rows_as_one_training_and_an_empty_window_is_refused(tmp_path: Path):
    """A t* past every run's end gives every cell NaN: that is no evidence that two rows are
    one training, so no row is named (all were, NaN tuples comparing equal). ``--window 0``
    (a window that holds no evaluation) is refused in one line, as ``fedgmr compare`` does."""
    for seed in range(3):
        _run(tmp_path, "fedgmr", seed, [0.5 + 0.01 * seed] * 60)
        _run(tmp_path, "fjord", seed, [0.4 + 0.02 * seed] * 60)
    late = CliRunner().invoke(app, ["table", str(tmp_path), "--t-star", "5000"])
    assert late.exit_code == 0, late.output
    assert "n/a" in late.stdout and "probably the same training" not in late.stderr, late.stderr
    zero = CliRunner().invoke(app, ["table", str(tmp_path), "--t-star", "100", "--window", "0"])
    assert zero.exit_code == 2 and zero.stderr.count("\n") == 1, zero.stderr
    assert "invalid value for '--window': must be a finite number of seconds > 0 (got 0.0" in zero.stderr
    half = CliRunner().invoke(app, ["table", str(tmp_path), "--t-star", "100", "--window", "5"])
    assert half.exit_code == 0 and "| fjord             | 42.00 ± 2.00     |" in half.stdout, half.stdout
