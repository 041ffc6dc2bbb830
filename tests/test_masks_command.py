"""``fedgmr masks``: each ladder level's mask at initialisation, layer by layer, as the run
builds it; and the warning when a density is below the smallest mask the per-layer floor
allows (every prunable layer then holds just its floor)."""

from __future__ import annotations

import io
import logging
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from conftest import tiny_config
from fedgmr.algorithm.masks import floor_count, floor_sets_size, prefix_length
from fedgmr.cli import app
from fedgmr.experiment.build import build_experiment
from fedgmr.experiment.mask_report import layer_rows
from fedgmr.methods import resolve_config

#: the digits CNN, densities counted over its prunable weights (its always-kept coordinates are
#: 23 % of it): ladder [0.01, 0.1, 0.5, 1.0], the first below the 2 % per-layer floor
RAW = tiny_config(model={"name": "cnn", "options": {}},
                  submodel={"ladder": [0.01, 0.1, 0.5, 1.0], "density_basis": "prunable"})
LEVELS = (0.01, 0.1, 0.5, 1.0)


def test_the_table_is_each_levels_mask_as_the_run_builds_it(tmp_path: Path):
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(RAW))
    result = CliRunner().invoke(app, ["masks", str(cfg_path), "--format", "csv"])
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(io.StringIO(result.stdout))
    exp = build_experiment(resolve_config(RAW))
    space, policy = exp.space, exp.strategy.policy
    layers = space.prunable_layers
    assert list(frame.columns) == ["level", "layer", "shape", "kept", "of", "kept_pct"]
    assert len(frame) == 4 * (len(layers) + 2)
    for i, level in enumerate(LEVELS):
        rows = frame[frame.level == level]
        mask = policy.mask(i)
        assert rows.layer.tolist() == [p.name for p in layers] + ["(not pruned)", "(model)"]
        assert rows.kept.tolist()[:-2] == [int(mask[p.slice].sum()) for p in layers]
        assert rows.of.tolist() == [p.numel for p in layers] + [space.numel - space.num_prunable, space.numel]
        # the (model) row is the mask's size: the floor-bound prefix plus the always-kept coordinates
        assert rows.kept.iloc[-1] == int(mask.sum()) == prefix_length(space, level, 0.02, "prunable") + (
            space.numel - space.num_prunable)
        assert rows.kept.iloc[-2] == space.numel - space.num_prunable  # nothing prunes those
        assert all(k >= math.ceil(0.02 * p.numel) for k, p in zip(rows.kept, layers))  # the per-layer floor
        assert rows.kept_pct.tolist() == pytest.approx([100 * k / o for k, o in zip(rows.kept, rows.of)])
    md = CliRunner().invoke(app, ["masks", str(cfg_path)])
    assert md.exit_code == 0 and "| level   | layer" in md.stdout and "layer_floor 0.02" in md.stdout, md.output


def test_a_density_below_the_floors_minimum_holds_just_the_floors_and_says_so(caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.WARNING, logger="fedgmr.algorithm.policies"):
        exp = build_experiment(resolve_config(RAW))
    space = exp.space
    smallest = floor_count(space, 0.02) / space.num_prunable  # over the prunable weights
    assert 0.01 < smallest < 0.1
    assert floor_sets_size(space, 0.01, 0.02, "prunable") and not floor_sets_size(space, 0.1, 0.02, "prunable")
    assert floor_sets_size(space, smallest * 0.98, 0.02, "prunable")
    assert not floor_sets_size(space, smallest * 1.02, 0.02, "prunable")
    assert not floor_sets_size(space, 1.0, 0.02, "prunable") and floor_sets_size(space, 0.1, 0.02, "model")
    rows = [r for r in layer_rows(space, [exp.strategy.policy.mask(0)], [0.01]) if not r["layer"].startswith("(")]
    assert [r["kept"] for r in rows] == [max(1, math.ceil(0.02 * p.numel)) for p in space.prunable_layers]
    floored = [r.getMessage() for r in caplog.records if "hold more than asked for" in r.getMessage()]
    assert len(floored) == 1 and floored[0].startswith(f"density level(s) 0.01 hold more than asked for "
                                                       f"({smallest:.4f} of the prunable weights)"), floored
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedgmr.algorithm.policies"):
        build_experiment(resolve_config({**RAW, "submodel": {"ladder": [0.1, 1.0], "density_basis": "prunable"}}))
    assert not any("hold more than asked for" in r.getMessage() for r in caplog.records)


def test_a_bad_format_or_config_key_is_a_one_line_error(tmp_path: Path):
    bad = CliRunner().invoke(app, ["masks", "quickstart", "--format", "json"])
    assert bad.exit_code == 2 and "must be md or csv" in bad.stderr and bad.stderr.count("\n") == 1
    typo = CliRunner().invoke(app, ["masks", "quickstart", "--set", "submodel.ladderr=[0.5]"])
    assert typo.exit_code == 2 and "ladderr" in typo.stderr and typo.stderr.count("\n") == 1, typo.stderr
