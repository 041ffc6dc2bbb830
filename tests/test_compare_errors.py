"""`fedgmr compare` and `fedgmr plot` on bad run directories and outputs: one line on
stderr naming the file, a documented exit code (3: missing or damaged run directory,
1: an output that cannot be written, 2: a bad option value), never a traceback."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conftest import as_an_ordinary_user
from fedgmr.cli import app

RUNNER = CliRunner()


def record(t: float, acc: float, **extra: Any) -> dict[str, Any]:
    """One evaluation record as the runner writes it (the fields compare and plot read)."""
    return {"time": t, "step": int(t), "accuracy": acc, "loss": 1.0, "avg_density": 0.5, **extra}


def make_run(path: Path, method: str, accs: list[float], interval: float = 10.0) -> Path:
    """A run directory with one record every ``interval`` virtual seconds."""
    path.mkdir(parents=True)
    lines = [json.dumps(record(interval * (i + 1), a)) for i, a in enumerate(accs)]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (path / "summary.json").write_text(json.dumps({"method": method, "eval_interval": interval}))
    return path


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return make_run(tmp_path / "good", "fedgmr", [0.5, 0.6, 0.7, 0.8, 0.85, 0.9])


def fails(args: list[str], code: int, *needles: str) -> str:
    """``args`` exit with ``code`` and one ``error:`` line on stderr holding every needle."""
    result = RUNNER.invoke(app, args)
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)  # not a crash
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# a broken run directory: (how to break it, file the message names, text it holds)
def _empty(run: Path) -> None:
    (run / "metrics.jsonl").write_text("")


def _blank_lines(run: Path) -> None:
    (run / "metrics.jsonl").write_text("\n\n  \n")


def _no_accuracy(run: Path) -> None:
    row = record(10, 0.5)
    del row["accuracy"]
    (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")


def _no_time(run: Path) -> None:
    row = record(10, 0.5)
    del row["time"]
    (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")


def _text_accuracy(run: Path) -> None:
    (run / "metrics.jsonl").write_text(json.dumps(record(10, "high")) + "\n")  # type: ignore[arg-type]


def _nan_accuracy(run: Path) -> None:
    (run / "metrics.jsonl").write_text('{"time": 10, "accuracy": NaN, "avg_density": 0.5}\n')


def _bool_accuracy(run: Path) -> None:
    (run / "metrics.jsonl").write_text('{"time": 10, "accuracy": true, "avg_density": 0.5}\n')


def _percent_accuracy(run: Path) -> None:
    (run / "metrics.jsonl").write_text(json.dumps(record(10, 85.0)) + "\n")


def _not_json(run: Path) -> None:  # e.g. a run killed mid-write: the third line is cut
    rows = [json.dumps(record(10, 0.5)), json.dumps(record(20, 0.6)), '{"time": 30, "accur']
    (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")


def _not_object(run: Path) -> None:
    (run / "metrics.jsonl").write_text("[10, 0.5]\n")


def _time_goes_back(run: Path) -> None:
    rows = [record(10, 0.5), record(20, 0.6), record(5, 0.7)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _binary(run: Path) -> None:
    (run / "metrics.jsonl").write_bytes(b"\xff\xfe\x00garbage")


def _no_metrics(run: Path) -> None:
    (run / "metrics.jsonl").unlink()


def _bad_summary(run: Path) -> None:
    (run / "summary.json").write_text("{truncated")


def _summary_list(run: Path) -> None:
    (run / "summary.json").write_text("[1, 2]")


def _bad_config(run: Path) -> None:
    (run / "summary.json").write_text(json.dumps({"method": "fedavg"}))  # no eval_interval: config.yaml is read
    (run / "config.yaml").write_text("run: [unclosed\n")


def _bad_interval(run: Path) -> None:
    (run / "summary.json").write_text(json.dumps({"method": "fedavg", "eval_interval": "often"}))


BREAKAGES = [
    (_empty, "metrics.jsonl", "no evaluation record"),
    (_blank_lines, "metrics.jsonl", "no evaluation record"),
    (_no_accuracy, "metrics.jsonl", "'accuracy'"),
    (_no_time, "metrics.jsonl", "'time'"),
    (_text_accuracy, "metrics.jsonl", "'accuracy'"),
    (_nan_accuracy, "metrics.jsonl", "'accuracy'"),
    (_bool_accuracy, "metrics.jsonl", "'accuracy'"),
    (_percent_accuracy, "metrics.jsonl", "[0, 1]"),
    (_not_json, "metrics.jsonl:3", "not valid JSON"),
    (_not_object, "metrics.jsonl:1", "not a JSON object"),
    (_time_goes_back, "metrics.jsonl", "time order"),
    (_binary, "metrics.jsonl", "UTF-8"),
    (_no_metrics, "bad", "no metrics.jsonl"),
    (_bad_summary, "summary.json", "not valid JSON"),
    (_summary_list, "summary.json", "not a JSON object"),
    (_bad_config, "config.yaml", "damaged"),
    (_bad_interval, "summary.json", "eval_interval"),
]
IDS = [b[0].__name__.strip("_") for b in BREAKAGES]


@pytest.mark.parametrize("breakage, file, text", BREAKAGES, ids=IDS)
def test_compare_reports_a_damaged_run_in_one_line(tmp_path: Path, good: Path, breakage, file: str,
                                                   text: str) -> None:
    bad = make_run(tmp_path / "bad", "fedavg", [0.4, 0.5, 0.6, 0.6, 0.7, 0.7])
    breakage(bad)
    fails(["compare", str(good), str(bad), "--t-star", "30"], 3, file, text)
    fails(["compare", str(bad), str(good), "--t-star", "30", "--json"], 3, file, text)


@pytest.mark.parametrize("breakage, file, text", [b for b in BREAKAGES if b[0] not in (_bad_config, _bad_interval)],
                         ids=[i for b, i in zip(BREAKAGES, IDS) if b[0] not in (_bad_config, _bad_interval)])
def test_plot_reports_a_damaged_run_in_one_line(tmp_path: Path, good: Path, breakage, file: str, text: str) -> None:
    bad = make_run(tmp_path / "bad", "fedavg", [0.4, 0.5, 0.6])
    breakage(bad)
    out = tmp_path / "curves.png"
    fails(["plot", str(good), str(bad), "--out", str(out)], 3, file, text)
    assert not out.exists()


def test_plot_needs_the_density_field(tmp_path: Path, good: Path) -> None:
    bad = make_run(tmp_path / "bad", "fedavg", [0.4])
    row = record(10, 0.4)
    del row["avg_density"]
    (bad / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    out = tmp_path / "curves.png"
    fails(["plot", str(good), str(bad), "--out", str(out)], 3, "metrics.jsonl", "'avg_density'")
    fails(["compare", str(good), str(bad), "--t-star", "5", "--plot", str(out)], 3, "'avg_density'")
    assert not out.exists()
    # compare alone needs only time and accuracy
    assert RUNNER.invoke(app, ["compare", str(good), str(bad), "--t-star", "5"]).exit_code == 0


@pytest.mark.parametrize("command", ["compare", "plot"])
def test_a_missing_run_directory_is_named(tmp_path: Path, good: Path, command: str) -> None:
    missing = tmp_path / "no-such-run"
    args = [command, str(good), str(missing)] + (["--t-star", "30"] if command == "compare" else
                                                 ["--out", str(tmp_path / "p.png")])
    fails(args, 3, str(missing), "does not exist")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("hello")
    args[2] = str(a_file)
    fails(args, 3, str(a_file), "not a run directory")


def test_a_baseline_at_zero_accuracy_makes_mri_undefined(tmp_path: Path, good: Path) -> None:
    zero = make_run(tmp_path / "zero", "fedavg", [0.0] * 6)
    result = RUNNER.invoke(app, ["compare", str(good), str(zero), "--t-star", "30"])
    assert result.exit_code == 0, result.stderr
    assert "MRI of fedgmr over fedavg: n/a (undefined: Acc@t* of fedavg is 0" in result.stdout
    result = RUNNER.invoke(app, ["compare", str(good), str(zero), "--t-star", "30", "--json"])
    assert result.exit_code == 0, result.stderr

    def no_nan(token: str) -> float:
        raise AssertionError(f"--json printed {token}, which is not JSON")

    data = json.loads(result.stdout, parse_constant=no_nan)
    assert data["mri"] is None and "is 0" in data["mri_note"]
    assert data["runs"][1]["acc_at_t"] == 0.0


def test_a_run_that_never_reaches_t_star_has_no_acc_and_json_stays_valid(tmp_path: Path, good: Path) -> None:
    short = make_run(tmp_path / "short", "fedavg", [0.5, 0.6])  # ends at t = 20 s
    result = RUNNER.invoke(app, ["compare", str(good), str(short), "--t-star", "30", "--json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout, parse_constant=lambda t: (_ for _ in ()).throw(AssertionError(t)))
    assert data["mri"] is None and data["runs"][1]["acc_at_t"] is None and "fedavg" in data["mri_note"]
    table = RUNNER.invoke(app, ["compare", str(good), str(short), "--t-star", "30"]).stdout
    assert "n/a" in table


def test_good_runs_still_compare_and_plot(tmp_path: Path, good: Path) -> None:
    base = make_run(tmp_path / "base", "fedavg", [0.4, 0.5, 0.6, 0.6, 0.7, 0.7])
    result = RUNNER.invoke(app, ["compare", str(good), str(base), "--t-star", "30", "--json",
                                 "--plot", str(tmp_path / "cmp.png")])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert math.isfinite(data["mri"]) and data["mri"] > 0 and data["mri_note"] is None
    assert (tmp_path / "cmp.png").read_bytes()[:4] == b"\x89PNG"
    result = RUNNER.invoke(app, ["plot", str(good), str(base), "--out", str(tmp_path / "p.png")])
    assert result.exit_code == 0 and (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def _outputs(tmp_path: Path) -> list[tuple[Path, int, str]]:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    a_dir = tmp_path / "a-dir.png"
    a_dir.mkdir()
    return [
        (tmp_path / "missing" / "p.png", 1, "does not exist"),
        (a_file / "p.png", 1, "is a file, not a folder"),
        (a_dir, 1, "is a directory"),
        (tmp_path / "p.unknownformat", 2, "image format"),
        (tmp_path / "no_suffix", 2, "image format"),
    ]


@pytest.mark.parametrize("index", range(5))
def test_an_unwritable_output_is_one_line(tmp_path: Path, good: Path, index: int) -> None:
    out, code, text = _outputs(tmp_path)[index]
    fails(["plot", str(good), "--out", str(out)], code, str(out), text)
    fails(["compare", str(good), "--t-star", "30", "--plot", str(out)], code, str(out), text)
    assert not out.is_file()


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
def test_a_read_only_folder_is_one_line(tmp_path: Path) -> None:
    def body(where: Path) -> None:  # as root (CI): in a child that dropped to an ordinary user
        good = make_run(where / "good", "fedgmr", [0.5, 0.6, 0.7, 0.8, 0.85, 0.9])
        folder = where / "ro"
        folder.mkdir()
        folder.chmod(0o500)
        try:
            fails(["plot", str(good), "--out", str(folder / "p.png")], 1, "permission denied")
            assert not (folder / "p.png").exists()
        finally:
            folder.chmod(0o700)

    as_an_ordinary_user(body, tmp_path)


@pytest.mark.parametrize("options, text", [
    (["--t-star", "nan"], "--t-star"),
    (["--t-star", "inf"], "--t-star"),
    (["--t-star", "-5"], "--t-star"),
    (["--t-star", "30", "--window", "0"], "--window"),
    (["--t-star", "30", "--window", "nan"], "--window"),
    (["--t-star", "30", "--target", "1.5"], "--target"),
    (["--t-star", "30", "--target", "0"], "--target"),
])
def test_bad_compare_options_exit_2(good: Path, options: list[str], text: str) -> None:
    fails(["compare", str(good), *options], 2, text)


def test_bad_plot_t_star_exits_2(tmp_path: Path, good: Path) -> None:
    fails(["plot", str(good), "--out", str(tmp_path / "p.png"), "--t-star", "inf"], 2, "--t-star")
    assert not (tmp_path / "p.png").exists()
