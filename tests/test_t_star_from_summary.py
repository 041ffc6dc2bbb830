"""`fedgmr compare` and `fedgmr plot` without --t-star take t* from the runs'
summary.json (``t_star``); runs that disagree (or, for compare, none that has one) are one
line asking for --t-star, exit code 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fedgmr.cli import app

RUNNER = CliRunner()


def make_run(path: Path, method: str, t_star: float | None, accs: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8)) -> Path:
    """A run directory with a record every 10 virtual seconds."""
    path.mkdir(parents=True)
    rows = [{"time": 10.0 * (i + 1), "step": i + 1, "accuracy": a, "loss": 1.0, "avg_density": 0.5}
            for i, a in enumerate(accs)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary: dict[str, Any] = {"method": method, "eval_interval": 10.0}
    if t_star is not None:
        summary["t_star"] = t_star
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def one_line_error(args: list[str], code: int, *needles: str) -> str:
    result = RUNNER.invoke(app, args)
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_compare_uses_the_t_star_the_summaries_agree_on(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", "fedgmr", 25.0)
    b = make_run(tmp_path / "b", "fedavg", 25.0, accs=(0.4, 0.5, 0.6, 0.7))
    c = make_run(tmp_path / "c", "fedasync", None)  # no t_star: left out of the vote
    result = RUNNER.invoke(app, ["compare", str(a), str(b), str(c), "--window", "5", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["t_star"] == 25.0
    assert data["runs"][0]["acc_at_t"] == 0.6  # the window [20, 30): the record at t=20
    # an explicit --t-star wins
    result = RUNNER.invoke(app, ["compare", str(a), str(b), "--t-star", "15", "--window", "5", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["t_star"] == 15.0 and data["runs"][0]["acc_at_t"] == 0.5


@pytest.mark.parametrize("command", ["compare", "plot"])
def test_runs_that_disagree_on_t_star_ask_for_it(tmp_path: Path, command: str) -> None:
    a = make_run(tmp_path / "a", "fedgmr", 25.0)
    b = make_run(tmp_path / "b", "fedavg", 35.0)
    args = [command, str(a), str(b)] + (["--out", str(tmp_path / "p.png")] if command == "plot" else [])
    line = one_line_error(args, 2, "disagree", "--t-star", "25", "35")
    assert str(a) in line and str(b) in line
    assert not (tmp_path / "p.png").exists()
    assert RUNNER.invoke(app, args + ["--t-star", "30"]).exit_code == 0  # resolved by passing it


def test_compare_without_any_t_star_asks_for_it(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", "fedgmr", None)
    one_line_error(["compare", str(a)], 2, "--t-star", "t_star")


def test_plot_without_any_t_star_draws_no_mark(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", "fedgmr", None)
    result = RUNNER.invoke(app, ["plot", str(a), "--out", str(tmp_path / "p.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_a_damaged_t_star_is_named(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", "fedgmr", None)
    (a / "summary.json").write_text(json.dumps({"method": "fedgmr", "t_star": "soon"}))
    one_line_error(["compare", str(a)], 3, "summary.json", "t_star")


def test_plot_t_star_none_draws_no_mark_even_where_the_summaries_disagree(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`--t-star none` (as its help says) draws no mark, whatever the summaries hold; a
    number marks that time; anything else is a one-line error naming the option."""
    import fedgmr.experiment.plots as plots

    marks: list[float | None] = []
    real = plots.plot_metric
    monkeypatch.setattr(plots, "plot_metric", lambda *a, **kw: (marks.append(kw["t_star"]), real(*a, **kw))[1])
    a = make_run(tmp_path / "a", "fedgmr", 25.0)
    b = make_run(tmp_path / "b", "fedavg", 35.0)
    out = tmp_path / "p.png"
    for given in ("none", "None", "30"):
        result = RUNNER.invoke(app, ["plot", str(a), str(b), "--out", str(out), "--t-star", given])
        assert result.exit_code == 0, result.output
    assert marks == [None, None, 30.0] and out.read_bytes()[:4] == b"\x89PNG"
    assert RUNNER.invoke(app, ["plot", str(a), "--out", str(out)]).exit_code == 0 and marks[-1] == 25.0
    for bad in ("soon", "-1", "nan"):
        one_line_error(["plot", str(a), "--out", str(out), "--t-star", bad], 2, "--t-star", repr(bad))
