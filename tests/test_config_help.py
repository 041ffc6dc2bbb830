"""`fedgmr config --explain KEY`: per-key help read from the config schema itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli
from fedgmr.config import ExperimentConfig
from fedgmr.config_help import explain
from fedgmr.errors import ConfigError
from fedgmr.experiment.metrics import flatten_config


def test_a_key_has_its_type_default_range_and_meaning():
    text = explain("aggregation.trim")
    assert text.startswith("aggregation.trim: float, default 0.1, >= 0, < 0.5")
    assert "floor(trim * k)" in text  # the section docstring's line for it
    assert explain("aggregation.weighting").startswith(
        "aggregation.weighting: 'samples' | 'processed' | 'equal', default 'samples'")


def test_a_section_lists_every_key_and_its_subsections():
    text = explain("training")
    for name in ExperimentConfig.model_fields["training"].annotation.model_fields:
        assert f"training.{name}" in text
    assert "training.lr_schedule (section: fedgmr config --explain training.lr_schedule)" in text


def test_every_key_of_the_schema_can_be_explained():
    for key in flatten_config(ExperimentConfig().model_dump(mode="json")):
        if key.endswith(".options") or key == "options":
            continue
        assert explain(key).startswith(key + ":"), key


def test_unknown_keys_are_one_line_with_the_keys_there_are():
    with pytest.raises(ConfigError, match=r"no config key 'aggregation.nope' \(keys of aggregation: rule, "):
        explain("aggregation.nope")
    with pytest.raises(ConfigError, match="is a value, not a section"):
        explain("seed.x")


def test_the_cli_explains_keys_instead_of_printing_the_config(tmp_path: Path):
    proc = run_cli(["config", "--explain", "aggregation.krum_select", "--explain", "coordination.k"], tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.startswith("aggregation.krum_select: int | None, default None, >= 1")
    assert "\n\ncoordination.k: int, default 3, >= 1" in proc.stdout and "method:" not in proc.stdout
    bad = run_cli(["config", "--explain", "nope"], tmp_path)
    assert bad.returncode == 2 and "no config key 'nope'" in bad.stderr
