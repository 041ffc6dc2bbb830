"""Hostile config values through the real command line: each is refused with exit code 2,
one line on stderr naming the key (or file), and no run directory left behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import as_an_ordinary_user
from fedgmr.cli import app
from fedgmr.presets import preset_names

RUNNER = CliRunner()
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "FEDGMR_PROGRESS": "0"}

TEN = [1.0, 0.5, 0.2, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05]


def tiers_with(value: str) -> str:
    """A 10-client density list (YAML) whose third density is ``value``."""
    items = [str(v) for v in TEN]
    items[2] = value
    return "clients.heterogeneity=[" + ", ".join(items) + "]"


def speeds_with(value: str) -> str:
    """Ten compute speeds (YAML) whose fourth is ``value``, with the FLOPs compute model."""
    items = ["1.0"] * 10
    items[3] = value
    return "network.compute.speeds=[" + ", ".join(items) + "]"


def refused(args: list[str], out: Path, needle: str) -> None:
    """``args`` exit with code 2, one ``error:`` line on stderr holding ``needle``, no traceback,
    and ``out`` is not created."""
    result = RUNNER.invoke(app, args)
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr, result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)  # not a crash
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    assert not out.exists(), f"{out} was created"


# (--set values, text the error line must hold: the key)
CASES: list[tuple[list[str], str]] = [
    # initial densities must lie in (0, 1], one per client
    ([tiers_with("-1")], "clients.heterogeneity"),
    ([tiers_with("-0.1")], "clients.heterogeneity"),
    ([tiers_with(".nan")], "clients.heterogeneity"),
    ([tiers_with("5")], "clients.heterogeneity"),
    ([tiers_with("1.5")], "clients.heterogeneity"),
    ([tiers_with("0")], "clients.heterogeneity"),
    ([tiers_with("true")], "clients.heterogeneity"),
    (["clients.heterogeneity=[1.0, 0.5, 0.2]"], "clients.heterogeneity"),
    (["clients.heterogeneity=[]"], "clients.heterogeneity"),
    (["clients.heterogeneity=extreme"], "clients.heterogeneity"),
    # floats that must be finite
    (["training.lr=.inf"], "training.lr"),
    (["training.lr=.nan"], "training.lr"),
    (["training.weight_decay=.inf"], "training.weight_decay"),
    (["network.up_per_tier=.inf"], "network.up_per_tier"),
    (["network.server_down=.nan"], "network.server_down"),
    (["network.model_size_mb=.inf"], "network.model_size_mb"),
    (["network.jitter_sigma=.inf"], "network.jitter_sigma"),
    (["coordination.server_time=.inf"], "coordination.server_time"),
    (["coordination.deadline_slack=.nan"], "coordination.deadline_slack"),
    (["network.compute.seconds_per_round=.inf"], "network.compute.seconds_per_round"),
    (["run.t_star=.inf"], "run.t_star"),
    (["run.eval_interval=.nan"], "run.eval_interval"),
    (["submodel.ladder=[0.05, .nan, 1.0]"], "submodel.ladder"),
    # a run with no end
    (["run.max_time=.inf"], "run.max_time"),
    # seeds feed numpy's SeedSequence, which takes non-negative integers only
    (["seed=-1"], "seed"),
    (["seed=1.5"], "seed"),
    # compute speeds: finite, > 0, one per client
    (["network.compute.kind=flops", speeds_with("0")], "network.compute.speeds"),
    (["network.compute.kind=flops", speeds_with("-1")], "network.compute.speeds"),
    (["network.compute.kind=flops", speeds_with(".inf")], "network.compute.speeds"),
    (["network.compute.speeds=[1.0, 2.0]"], "network.compute.speeds"),
    # fixed-time restoration fractions: strictly increasing in (0, 1]
    (["restoration.fractions=[0.9, 0.1]"], "restoration.fractions"),
    (["restoration.fractions=[-1, .nan, 5]"], "restoration.fractions"),
    (["restoration.fractions=[0.5, 1.5]"], "restoration.fractions"),
    (["restoration.fractions=[0.5, 0.5]"], "restoration.fractions"),
    (["restoration.fractions=[]"], "restoration.fractions"),
    # booleans are not integers
    (["clients.num_clients=true"], "clients.num_clients"),
    (["training.batch_size=false"], "training.batch_size"),
    (["training.lr=true"], "training.lr"),
    (["run.torch_threads=true"], "run.torch_threads"),
    # torch's thread pool crashes the process at ~100k threads
    (["run.torch_threads=100000"], "run.torch_threads"),
    # a section replaced by a non-mapping
    (["coordination=5"], "coordination"),
    (["method=fedavg", "coordination=5"], "coordination"),
    (["network.compute=3"], "network.compute"),
    (["aggregation.staleness=[1, 2]"], "aggregation.staleness"),
    (["data=null"], "data"),
    # data and model names and options, checked before anything is built
    (["data.options={foo: 1}"], "'foo'"),
    (["model.options={foo: 1}"], "'foo'"),
    (["model.options={width: 0.5}"], "model.options.width"),
    (["data.name=nosuch"], "data.name"),
    (["model.name=nosuch"], "model.name"),
    (["data.options={image_size: 0}"], "data.options.image_size"),
    (["data.options={image_size: true}"], "data.options.image_size"),
    (["data.options={test_fraction: .nan}"], "data.options.test_fraction"),
    (["data.options={seed: -3}"], "data.options.seed"),
    (["model.options={channels: [0, 64]}"], "model.options.channels"),
    (["model.options={channels: [32]}"], "model.options.channels"),
    (["model.options={batch_norm: 3}"], "model.options.batch_norm"),
    (["model.name=mlp", "model.options={hidden: [-5]}"], "model.options.hidden"),
    (["model.name=transformer_lm", "model.options={dropout: 1.5}"], "model.options.dropout"),
    (["model.name=char_lstm", "model.options={}"], "model.name"),  # a sequence model on images
    # a method whose clients keep their own models has no global model to distil into
    (["method=local_only", "distill.server=true", "distill.proxy.name=digits"], "distill.server"),
    (["method=standalone", "distill.server=true", "distill.proxy.name=digits"], "distill.server"),
    (["method=fedmrl", "distill.server=true", "distill.proxy.name=digits"], "distill.server"),
]


@pytest.mark.parametrize("sets, needle", CASES, ids=[" ".join(s) for s, _ in CASES])
def test_run_refuses_a_bad_value(tmp_path: Path, sets: list[str], needle: str) -> None:
    out = tmp_path / "out"
    args = ["run", "quickstart", "--out", str(out), "-q"]
    for item in sets:
        args += ["--set", item]
    refused(args, out, needle)


#: every case but option values, which the builders check (``config`` builds nothing)
CONFIG_CASES = [(s, n) for s, n in CASES if not n.startswith(("data.options.", "model.options.")) and
                "model.name=char_lstm" not in s]


@pytest.mark.parametrize("sets, needle", CONFIG_CASES, ids=[" ".join(s) for s, _ in CONFIG_CASES])
def test_config_command_refuses_the_same_values(tmp_path: Path, sets: list[str], needle: str) -> None:
    args = ["config", "quickstart"]
    for item in sets:
        args += ["--set", item]
    refused(args, tmp_path / "never", needle)


@pytest.mark.parametrize("content, needle", [
    (b"- data\n- model\n", "top level"),
    (b"42\n", "top level"),
    (b"just a string\n", "top level"),
    (b"name: caf\xe9\nseed: 1\n", "UTF-8"),
    (b"data: [unclosed\n", "cannot parse"),
])
def test_a_malformed_config_file_is_one_line(tmp_path: Path, content: bytes, needle: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    out = tmp_path / "out"
    refused(["run", str(path), "--out", str(out)], out, needle)
    refused(["config", str(path)], out, str(path))


def test_a_config_that_is_a_directory_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "conf.yaml"
    folder.mkdir()
    out = tmp_path / "out"
    refused(["run", str(folder), "--out", str(out)], out, str(folder))


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
def test_an_unreadable_config_file_is_one_line(tmp_path: Path) -> None:
    def body(where: Path) -> None:  # as root (CI): in a child that dropped to an ordinary user
        path = where / "secret.yaml"
        path.write_text("seed: 1\n")
        path.chmod(0)
        out = where / "out"
        refused(["run", str(path), "--out", str(out)], out, str(path))

    as_an_ordinary_user(body, tmp_path)


def test_a_section_written_empty_in_a_file_names_it(tmp_path: Path) -> None:
    raw = {"name": "x", "coordination": None, "run": {"max_steps": 2}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    refused(["config", str(tmp_path / "c.yaml")], tmp_path / "out", "coordination")


@pytest.mark.parametrize("item, needle", [
    (tiers_with(".nan"), "clients.heterogeneity"),
    ("run.torch_threads=100000", "run.torch_threads"),
    ("clients.num_clients=true", "clients.num_clients"),
    ("data.options={image_size: 0}", "data.options.image_size"),
])
def test_the_installed_command_prints_one_line(tmp_path: Path, item: str, needle: str) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "fedgmr", "run", "quickstart", "--out", str(out), "-q", "--set",
                           item], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_still_validates(name: str) -> None:
    result = RUNNER.invoke(app, ["config", name])
    assert result.exit_code == 0, result.stderr
    assert yaml.safe_load(result.stdout)["name"]


@pytest.mark.parametrize("item", [
    "clients.heterogeneity=[1.0, 0.5, 0.2, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05]",
    "restoration.fractions=[0.25, 0.5, 1.0]",
    "restoration.fractions=[0.5]",
    "network.compute.speeds=[1, 2, 0.5, 1, 1, 1, 1, 1, 1, 1]",
    "seed=0",
    "run.torch_threads=4",
    "model.options={channels: [8, 16], batch_norm: false}",
    "data.options={image_size: 12, test_fraction: 0.25, seed: 3}",
])
def test_legitimate_values_still_resolve(item: str) -> None:
    result = RUNNER.invoke(app, ["config", "quickstart", "--set", item])
    assert result.exit_code == 0, result.stderr


def test_batchnorm_statistics_that_no_client_would_ever_aggregate_are_refused():
    """bn_stats 'full' takes BatchNorm statistics from full-density clients only: with every
    client on a 0.6 sub-model and no restoration the global model would keep its initial
    statistics and score at chance, silently; the run is refused in one line. With
    bn_stats 'all', or a ladder that restoration climbs to 1.0, it runs."""
    import pytest as _pytest

    from conftest import simulate, tiny_config
    from fedgmr.errors import ConfigError

    cnn = {"name": "cnn", "options": {}}
    base = dict(method="fedgmr_wo_gmr", model=cnn, clients={"num_clients": 10, "heterogeneity": "none"},
                submodel={"ladder": [0.6]}, run={"max_steps": 1, "device": "cpu"})
    with _pytest.raises(ConfigError, match="no client of this run ever trains the full model"):
        simulate(tiny_config(**base))
    simulate(tiny_config(**{**base, "aggregation": {"bn_stats": "all"}}))
    simulate(tiny_config(**{**base, "method": "fedgmr", "submodel": {"ladder": [0.6, 1.0]}}))  # restored to 1.0
    simulate(tiny_config(**{**base, "model": {"name": "mlp", "options": {"hidden": [8]}}}))  # no BatchNorm
