"""Every baseline method name runs end to end through the CLI on a tiny digits config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import fedgmr_in_process, tiny_config
from fedgmr.methods import METHODS, resolve_config

BASES = ["heterofl", "fedrolex", "fjord", "fiarse"]
NAMES = [f"{b}{suffix}" for b in BASES for suffix in ("", "_aux", "_aux_gmr")]


def test_every_baseline_form_is_registered_with_its_fixed_settings():
    for name in NAMES:
        assert name in METHODS
    raw = tiny_config()
    for b in BASES:
        sync = resolve_config({**raw, "method": b})
        assert sync.coordination.mode == "sync" and not sync.aggregation.buffer
        assert sync.restoration.trigger == "none" and not sync.network.ims
        aux = resolve_config({**raw, "method": f"{b}_aux"})
        assert aux.coordination.mode == "semi_async" and aux.network.ims and aux.restoration.trigger == "none"
        gmr = resolve_config({**raw, "method": f"{b}_aux_gmr"})
        assert gmr.restoration.trigger == "early_stopping" and gmr.submodel.policy == sync.submodel.policy
    assert resolve_config({**raw, "method": "heterofl"}).aggregation.weighting == "equal"
    assert resolve_config({**raw, "method": "fjord"}).aggregation.weighting == "samples"
    assert resolve_config({**raw, "method": "fiarse"}).aggregation.rule == "fiarse"


@pytest.mark.parametrize("method", NAMES)
def test_cli_runs_the_method(tmp_path: Path, method: str):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config(run={"max_steps": 8, "eval_every": 2})))
    out = tmp_path / "run"
    # in-process (tests/test_cli.py and tests/test_packaging.py run the installed command itself)
    proc = fedgmr_in_process("run", str(cfg), "--out", str(out), "-q", "--set", f"method={method}")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == method and summary["steps"] == 8
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["bytes_up"] > 0 and 0 < rows[-1]["avg_density"] < 1
    assert yaml.safe_load((out / "config.yaml").read_text())["submodel"]["policy"] == method.split("_")[0]
