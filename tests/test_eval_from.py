"""`run.eval_from`: a sweep that only needs Acc@t* skips the early test evaluations;
training and every later record are exactly those of a run evaluating the whole grid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import simulate, tiny_config
from fedgmr.errors import ConfigError
from fedgmr.experiment.table import build_table, find_runs, read_run
from fedgmr.methods import resolve_config

RUN = {"max_steps": None, "max_time": 400.0, "eval_interval": 10.0, "eval_every": None, "t_star": 300.0}


@pytest.mark.parametrize("method", ["fedgmr", "fedasync"])
def test_records_from_eval_from_on_are_those_of_the_full_grid(method: str):
    full, _ = simulate(tiny_config(method=method, run=RUN))
    part, exp = simulate(tiny_config(method=method, run={**RUN, "eval_from": 200.0}))
    assert [r["time"] for r in full] == [10.0 * i for i in range(41)]
    assert [r["time"] for r in part] == [10.0 * i for i in range(20, 41)]  # nothing before 200 s
    assert part == [r for r in full if r["time"] >= 200.0]  # accuracy, bytes, densities, restorations...
    if method == "fedgmr":  # restorations fired before 200 s, and the later records count them
        assert part[0]["restorations"] > 0


def test_eval_from_is_checked_against_the_grid_and_the_acc_window():
    with pytest.raises(ConfigError, match=r"eval_from needs the time grid"):
        resolve_config(tiny_config(run={"eval_from": 10.0}))  # tiny_config evaluates every 2 steps
    with pytest.raises(ConfigError, match=r"leave out part of Acc@t\*'s window \[200, 400\]: set it at most 200"):
        resolve_config(tiny_config(run={**RUN, "eval_from": 250.0}))
    assert resolve_config(tiny_config(run={**RUN, "eval_from": 200.0})).run.eval_from == 200.0


def test_runs_with_and_without_eval_from_are_seeds_of_one_table_cell(tmp_path: Path):
    for seed, eval_from in ((0, None), (1, 200.0)):
        d = tmp_path / f"s{seed}"
        d.mkdir()
        cfg = tiny_config(seed=seed, run={**RUN, "eval_from": eval_from})
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
        start = 0 if eval_from is None else 20
        rows = [{"time": 10.0 * i, "step": i, "accuracy": 0.5 + seed / 10} for i in range(start, 41)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "summary.json").write_text(json.dumps({"eval_interval": 10.0}))
    table = build_table([read_run(p) for p in find_runs([tmp_path])], t_star=300.0)
    (cell,) = table.cells.values()
    assert cell["seeds"] == [0, 1] and cell["mean"] == pytest.approx(0.55)
