"""`fedgmr tiers`: participation per bandwidth tier before and after its first restoration
(the paper's Table 12), on hand-made records and on real runs from the command line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from conftest import fedgmr_in_process, tiny_config
from fedgmr.errors import FedGMRError
from fedgmr.experiment.tiers import mean_rows, tier_participation


def _rec(t: float, step: int, dens: list[float], ups: list[int]) -> dict:
    return {"time": t, "step": step, "densities": dens, "client_uploads": ups, "accuracy": 0.5}


RECORDS = [
    _rec(0, 0, [1.0, 0.5, 0.05, 0.05], [0, 0, 0, 0]),
    _rec(20, 10, [1.0, 0.5, 0.05, 0.05], [10, 5, 2, 1]),
    _rec(40, 20, [1.0, 0.5, 0.1, 0.05], [20, 10, 4, 3]),  # tier 0.05: its first restoration shows here
    _rec(60, 30, [1.0, 0.5, 0.1, 0.1], [30, 15, 5, 4]),
]


def test_participation_per_tier_is_read_from_the_records_by_hand():
    rows = tier_participation(RECORDS, [1.0, 0.5, 0.05, 0.05], model_mb=25.98)
    assert [r.tier for r in rows] == [1.0, 0.5, 0.05] and [r.clients for r in rows] == [1, 1, 2]
    full, half, small = rows
    assert full.after is None and full.restored_at is None and full.before.uploads_per_step == 30 / 30
    assert half.before.uploads_per_step == 15 / 30 and half.before.model_mb == 0.5 * 25.98
    # before: r0 -> r2, (4 + 3) uploads by 2 clients over 20 steps; after: r2 -> r3, (1 + 1) over 10 steps
    assert small.restored_at == 40 and small.before.uploads_per_step == pytest.approx(7 / 2 / 20)
    assert small.after is not None and small.after.density == 0.1 and small.after.model_mb == pytest.approx(2.598)
    assert small.after.uploads_per_step == pytest.approx(2 / 2 / 10) and small.after.end == 60

    table = mean_rows([rows, rows])
    assert table[2]["seeds restored"] == "2/2" and table[0]["seeds restored"] == "0/2"
    assert math.isnan(table[0]["density after"]) and table[2]["MB after"] == pytest.approx(2.598)


def test_records_without_per_client_lists_are_refused():
    with pytest.raises(FedGMRError, match="lack 'client_uploads'"):
        tier_participation([{"time": 0, "step": 0, "densities": [1.0]}], [1.0], 1.0)
    with pytest.raises(FedGMRError, match="do not have the config's 2 clients"):
        tier_participation(RECORDS, [1.0, 0.5], 1.0)
    with pytest.raises(FedGMRError, match="lists of finite numbers"):
        tier_participation([_rec(0, 0, [float("nan")], [0])], [1.0], 1.0)


def test_tiers_of_a_fixed_time_run_from_the_command_line(tmp_path: Path):
    for seed in (0, 1):
        cfg = tmp_path / f"s{seed}.yaml"
        cfg.write_text(yaml.safe_dump(tiny_config(
            method="fedgmr_fixed_time", seed=seed,
            run={"max_steps": None, "max_time": 300.0, "eval_every": None, "eval_interval": 10.0})))
        proc = fedgmr_in_process("run", str(cfg), "--out", str(tmp_path / "runs" / f"s{seed}"), "-q")
        assert proc.returncode == 0, proc.stderr
    proc = fedgmr_in_process("tiers", str(tmp_path / "runs"), "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("tier,clients,density before,MB before,uploads/step before,first restoration (s)")
    assert [line.split(",")[0] for line in lines[1:]] == ["1x", "0.5x", "0.2x", "0.1x", "0.05x"]
    # the smallest tier's first restoration: the first record where one of its clients holds more
    firsts = []
    for seed in (0, 1):
        recs = [json.loads(x) for x in (tmp_path / "runs" / f"s{seed}" / "metrics.jsonl").read_text().splitlines()]
        firsts.append(next(r["time"] for r in recs if max(r["densities"][4:]) > 0.05))
    row = lines[-1].split(",")
    assert float(row[5]) == pytest.approx(sum(firsts) / 2) and row[-1] == "2/2"
    assert float(row[2]) == 0.05 and float(row[3]) == pytest.approx(0.05 * 2.0)

    md = fedgmr_in_process("tiers", str(tmp_path / "runs"))
    assert md.returncode == 0 and "mean over 2 seed(s)" in md.stdout and "| 0.05x" in md.stdout

    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(tiny_config(run={"max_steps": 4, "eval_every": 2})))
    assert fedgmr_in_process("run", str(other), "--out", str(tmp_path / "runs" / "other"), "-q").returncode == 0
    mixed = fedgmr_in_process("tiers", str(tmp_path / "runs"))
    assert mixed.returncode != 0 and "not seeds of one configuration" in mixed.stderr and "method" in mixed.stderr
    only = fedgmr_in_process("tiers", str(tmp_path / "runs"), "--only", "method=fedgmr_fixed_time")
    assert only.returncode == 0 and only.stdout == md.stdout
    rest = fedgmr_in_process("tiers", str(tmp_path / "runs"), "--exclude", "method=fedgmr")
    assert rest.returncode == 0 and rest.stdout == md.stdout  # the other run left out, as by --only
    dropped = fedgmr_in_process("tiers", str(tmp_path / "runs"), "--drop", "method=fedgmr max_steps=4")
    assert dropped.returncode == 0 and dropped.stdout == md.stdout  # one --drop group: the other run


def test_core_accuracy_is_the_global_model_under_the_first_levels_mask(tmp_path: Path):
    """One density for every client: coordinates no client holds keep their initial values
    in the global model, so its accuracy says nothing of the sub-model they train; the
    table's core_accuracy reads level_accuracy[0], the model under the clients' mask."""
    cfg = tmp_path / "core.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config(
        method="fedgmr_wo_gmr", clients={"num_clients": 10, "heterogeneity": "none"},
        submodel={"ladder": [0.3]}, coordination={"mode": "sync"},
        run={"max_steps": None, "max_time": 120.0, "eval_every": None, "eval_interval": 10.0,
             "level_eval_every": 1})))
    out = tmp_path / "runs" / "core"
    assert fedgmr_in_process("run", str(cfg), "--out", str(out), "-q").returncode == 0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["levels"] == [0.3] for r in recs)
    core = fedgmr_in_process("table", str(tmp_path / "runs"), "--t-star", "100", "--metric", "core_accuracy",
                             "--format", "csv")
    assert core.returncode == 0, core.stderr
    window = [r["level_accuracy"][0] for r in recs if 0 <= r["time"] < 200]
    header, row = core.stdout.strip().splitlines()[:2]
    cols = dict(zip(header.split(","), row.split(",")))
    mean = next(float(v) for k, v in cols.items() if k.startswith("mean") or "t* = 100" in k)
    assert mean == pytest.approx(sum(window) / len(window), abs=1e-9)
    plain = fedgmr_in_process("table", str(tmp_path / "runs"), "--t-star", "100", "--metric", "core_accuracy")
    assert plain.returncode == 0 and "core_accuracy" in plain.stdout
    missing = tmp_path / "plain"
    missing.mkdir()
    cfg2 = tmp_path / "p.yaml"
    cfg2.write_text(yaml.safe_dump(tiny_config(run={"max_steps": 4, "eval_every": 2})))
    assert fedgmr_in_process("run", str(cfg2), "--out", str(missing / "r"), "-q").returncode == 0
    none = fedgmr_in_process("table", str(missing), "--t-star", "2", "--metric", "core_accuracy")
    assert none.returncode != 0 and "run.level_eval_every" in none.stderr
