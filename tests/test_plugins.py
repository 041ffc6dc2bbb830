"""Your own code from the CLI: ``--import``, ``fedgmr.plugins`` entry points, registries
that tolerate re-registration, ``fedgmr --version``. The CLI runs in subprocesses, the way
a user runs it, on plugin files and tiny distributions written to ``tmp_path``."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import scaled, tiny_config
from fedgmr.errors import PluginError, RegistryError
from fedgmr.registry import Registry

REPO = Path(__file__).resolve().parents[1]

#: a plugin registering a small generated data set and a method
PLUGIN = '''
import torch
from fedgmr.data import DATASETS, ArrayDataset, FederatedData
from fedgmr.methods import METHODS, Method


@DATASETS.register("{name}")
def load(root=None, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(240) % 3
    x = torch.nn.functional.one_hot(y, 8).float() * 3 + torch.randn(240, 8, generator=gen)
    return FederatedData(name="{name}", train=ArrayDataset(x[:200], y[:200]), test=ArrayDataset(x[200:], y[200:]),
                         num_classes=3)


METHODS.register("{name}_ga", Method("{name}_ga", "FedGMR with GA, from a plugin", {{"aggregation.rule": "ga"}}))
'''


def _plugin(folder: Path, module: str, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{module}.py"
    path.write_text(PLUGIN.format(name=name))
    return path


def _fedgmr(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
            ) -> subprocess.CompletedProcess:
    """``python -m fedgmr ARGS`` in ``cwd`` (the repository on PYTHONPATH unless ``env`` says)."""
    env = env if env is not None else {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "fedgmr", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=scaled(timeout))


def _tiny_config(path: Path, dataset: str, **sections: Any) -> Path:
    cfg = tiny_config(data={"name": dataset}, run={"max_steps": 6, "eval_every": 3}, **sections)
    cfg["clients"] = {"num_clients": 4, "heterogeneity": "high"}
    path.write_text(yaml.safe_dump(cfg))
    return path


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


# ---------------------------------------------------------------------- registries
def test_registering_the_same_object_again_is_a_no_op_and_a_different_one_needs_replace():
    reg: Registry = Registry("widget")

    def one() -> int:
        return 1

    def two() -> int:
        return 2

    assert reg.register("w", one) is one
    assert reg.register("w", one) is one  # e.g. a module imported twice
    with pytest.raises(RegistryError, match=r"widget 'w' is already registered \(to .*one\).*replace=True"):
        reg.register("w", two)
    assert reg.get("w") is one
    assert reg.register("w", two, replace=True) is two
    assert reg.get("w") is two

    @reg.register("w", replace=True)
    def three() -> int:
        return 3

    assert reg.get("w") is three
    assert reg.unregister("w") is three and "w" not in reg


def test_a_definition_run_again_replaces_itself_as_a_rerun_notebook_cell_does():
    reg: Registry = Registry("model")
    cell = "@reg.register('net')\ndef build():\n    return {value}\n"
    namespace: dict[str, Any] = {"reg": reg, "__name__": "__main__"}
    exec(cell.format(value=1), namespace)
    exec(cell.format(value=2), namespace)  # the edited cell, run again
    assert reg.get("net")() == 2
    other: dict[str, Any] = {"reg": reg, "__name__": "someone_else"}
    with pytest.raises(RegistryError, match="replace=True"):
        exec(cell.format(value=3), other)


def _registries() -> list[tuple[str, Registry]]:
    from fedgmr.algorithm.aggregation import RULES
    from fedgmr.algorithm.policies import POLICIES
    from fedgmr.algorithm.staleness import STALENESS
    from fedgmr.data import DATASETS
    from fedgmr.experiment.build import EXECUTORS
    from fedgmr.methods import METHODS
    from fedgmr.models import MODELS

    return [("models", MODELS), ("datasets", DATASETS), ("methods", METHODS), ("rules", RULES),
            ("policies", POLICIES), ("staleness", STALENESS), ("executors", EXECUTORS)]


@pytest.mark.parametrize("kind,registry", _registries(), ids=[k for k, _ in _registries()])
def test_every_registry_keeps_a_taken_name_unless_replaced(kind: str, registry: Registry):
    name = registry.names()[0]
    existing = registry.get(name)
    assert registry.register(name, existing) is existing  # same object: no-op
    impostor = object()
    with pytest.raises(RegistryError, match="replace=True"):
        registry.register(name, impostor)
    assert registry.get(name) is existing
    try:
        registry.register(name, impostor, replace=True)
        assert registry.get(name) is impostor
    finally:
        registry.register(name, existing, replace=True)
    assert registry.get(name) is existing


def test_an_equal_method_registered_again_is_a_no_op():
    from fedgmr.methods import METHODS, Method

    try:
        first = METHODS.register("test_twice", Method("test_twice", "x", {"aggregation.rule": "ga"}))
        METHODS.register("test_twice", Method("test_twice", "x", {"aggregation.rule": "ga"}))
        assert METHODS.get("test_twice") is first
        with pytest.raises(RegistryError):
            METHODS.register("test_twice", Method("test_twice", "x", {"aggregation.rule": "fa"}))
    finally:
        METHODS.unregister("test_twice")


def test_a_file_imported_twice_registers_once(tmp_path: Path):
    from fedgmr.data import DATASETS
    from fedgmr.methods import METHODS
    from fedgmr.plugins import import_code

    path = _plugin(tmp_path, "twice_plugin", "twice_data")
    try:
        first = import_code(str(path))
        assert import_code("twice_plugin.py", base=tmp_path) is first
        assert first.__name__ == "twice_plugin"  # named after the file: what it defines pickles by name
        assert "twice_data" in DATASETS and "twice_data_ga" in METHODS
    finally:
        DATASETS.unregister("twice_data")
        METHODS.unregister("twice_data_ga")
        sys.modules.pop("twice_plugin", None)


def test_a_failing_import_is_a_plugin_error_naming_the_module_and_the_line(tmp_path: Path):
    from fedgmr.plugins import import_code

    bad = tmp_path / "bad_plugin.py"
    bad.write_text("x = 1\ny = x / 0\n")
    with pytest.raises(PluginError, match=r"cannot import '.*bad_plugin.py': ZeroDivisionError: division by zero "
                                          r"\(at .*bad_plugin.py:2\)"):
        import_code(str(bad))
    assert "bad_plugin" not in sys.modules
    with pytest.raises(PluginError, match="no module named 'no_such_module_q7'"):
        import_code("no_such_module_q7")
    assert PluginError.exit_code == 6


# ---------------------------------------------------------------------- --version
def test_version_prints_the_installed_version():
    proc = _fedgmr("--version", cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"fedgmr {importlib.metadata.version('fedgmr')}"


# ---------------------------------------------------------------------- --import
def test_run_imports_a_plugin_file_and_trains_on_its_data_set(tmp_path: Path):
    plugin = _plugin(tmp_path / "code", "blobs_plugin", "blobs")
    config = _tiny_config(tmp_path / "tiny.yaml", "blobs", method="blobs_ga")
    proc = _fedgmr("run", str(config), "--out", "run", "-q", "--import", "code/blobs_plugin.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["data"]["name"] == "blobs" and saved["method"] == "blobs_ga"
    assert saved["aggregation"]["rule"] == "ga"  # the plugin's method applied its settings
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["final_accuracy"] > 1 / 3  # better than chance on 3 classes
    # without the import the names are unknown: exit code 2, naming the key
    again = _fedgmr("run", str(config), "--out", "run2", "-q", cwd=tmp_path)
    assert again.returncode == 2 and "unknown method 'blobs_ga'" in again.stderr
    assert plugin.exists()


def test_import_by_module_name_from_the_current_directory(tmp_path: Path):
    _plugin(tmp_path, "sensors_mod", "mod_sensors")
    script = Path(sys.executable).with_name("fedgmr")
    # the console script, as a user types it: the current directory is not on sys.path by itself
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "fedgmr"]
    proc = subprocess.run([*cmd, "methods", "--import", "sensors_mod"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=scaled(300))
    assert proc.returncode == 0, proc.stderr
    assert any(line.split()[0] == "mod_sensors_ga" for line in proc.stdout.splitlines())
    conf = subprocess.run([*cmd, "config", "quickstart", "--import", "sensors_mod", "--set", "data.name=mod_sensors",
                           "--set", "data.options={}"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=scaled(300))
    assert conf.returncode == 0, conf.stderr
    assert yaml.safe_load(conf.stdout)["data"]["name"] == "mod_sensors"


@pytest.mark.parametrize("spec,expected", [
    ("no_such_module_q7", "cannot import 'no_such_module_q7': no module named 'no_such_module_q7'"),
    ("missing/plugin.py", "cannot import 'missing/plugin.py': no such file"),
    ("bad.py", "cannot import 'bad.py': ZeroDivisionError: division by zero (at bad.py:2)"),
    ("syntax.py", "cannot import 'syntax.py': SyntaxError: "),
    ("needs_dep.py", "cannot import 'needs_dep.py': ModuleNotFoundError: No module named 'absent_dep_q7' "
                     "(at needs_dep.py:1)"),
])
def test_a_failing_import_exits_6_with_one_line(tmp_path: Path, spec: str, expected: str):
    (tmp_path / "bad.py").write_text("import os\nvalue = 1 / 0\n")
    (tmp_path / "syntax.py").write_text("def broken(:\n")
    (tmp_path / "needs_dep.py").write_text("import absent_dep_q7\n")
    proc = _fedgmr("run", "quickstart", "--out", "run", "--import", spec, cwd=tmp_path)
    assert proc.returncode == 6
    lines = _error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: " + expected), proc.stderr
    assert not (tmp_path / "run").exists()


def test_the_example_plugin_runs_the_quickstart_on_its_data_set(tmp_path: Path):
    proc = _fedgmr("run", "quickstart", "--out", str(tmp_path / "r"), "--import", "examples/my_plugin.py",
                   "--set", "data.name=my_sensors", "--set", "model.name=sensor_net", "--set", "run.max_time=20",
                   "--set", "run.t_star=10", "-q", cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr
    saved = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
    assert saved["data"]["name"] == "my_sensors" and saved["model"]["name"] == "sensor_net"
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["time"] == pytest.approx(20.0)


# ---------------------------------------------------------------------- entry points
def _distribution(site: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    """A tiny installed distribution: ``*.dist-info`` with METADATA and entry_points.txt."""
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[fedgmr.plugins]\n" + "".join(f"{name} = {value}\n" for name, value in entry_points.items()))
    for module, source in modules.items():
        (site / f"{module}.py").write_text(textwrap.dedent(source))


def _env(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}


def test_an_installed_plugin_registers_for_every_command(tmp_path: Path):
    site = tmp_path / "site"
    _distribution(site, "tinyplug", {"tiny_data": "tinyplug_data", "tiny_methods": "tinyplug_methods:register"},
                  {"tinyplug_data": PLUGIN.format(name="ep_sensors"),
                   "tinyplug_methods": '''
                       from fedgmr.methods import METHODS, Method

                       def register():
                           METHODS.register("ep_method", Method("ep_method", "from an entry point function",
                                                                {"aggregation.rule": "fa"}))
                   '''})
    env = _env(site)
    conf = _fedgmr("config", "quickstart", "--set", "data.name=ep_sensors", "--set", "data.options={}",
                   "--set", "method=ep_method", cwd=tmp_path, env=env)
    assert conf.returncode == 0, conf.stderr
    assert conf.stderr == ""
    resolved = yaml.safe_load(conf.stdout)
    assert resolved["data"]["name"] == "ep_sensors" and resolved["aggregation"]["rule"] == "fa"
    run = _fedgmr("run", str(_tiny_config(tmp_path / "tiny.yaml", "ep_sensors")), "--out", "run", "-q",
                  cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "run" / "summary.json").exists()


def test_a_broken_plugin_warns_in_one_line_and_the_others_still_load(tmp_path: Path):
    site = tmp_path / "site"
    _distribution(site, "mixedplug", {"good": "goodplug", "broken": "brokenplug", "gone": "not_installed_q7"},
                  {"goodplug": '''
                       from fedgmr.methods import METHODS, Method
                       METHODS.register("good_method", Method("good_method", "from a good plugin"))
                   ''', "brokenplug": '''
                       raise RuntimeError("boom: the plugin is broken")
                   '''})
    proc = _fedgmr("methods", cwd=tmp_path, env=_env(site))
    assert proc.returncode == 0, proc.stderr
    assert any(line.split()[0] == "good_method" for line in proc.stdout.splitlines())
    warnings = _error_lines(proc.stderr)
    assert len(warnings) == 2, proc.stderr
    broken = next(w for w in warnings if "'broken = brokenplug'" in w)
    assert broken.startswith("warning: fedgmr plugin 'broken = brokenplug' failed to load and is skipped: "
                             "RuntimeError: boom: the plugin is broken (at ")
    assert any("'gone = not_installed_q7'" in w and "ModuleNotFoundError" in w for w in warnings)


# ---------------------------------------------------------------------- sweeps
@pytest.mark.slow
def test_a_sweep_file_s_imports_reach_every_cell(tmp_path: Path):
    project = tmp_path / "project"
    _plugin(project / "code", "sweep_plugin", "sweep_data")
    _tiny_config(project / "tiny.yaml", "sweep_data")
    (project / "sweep.yaml").write_text(yaml.safe_dump({
        "name": "plugged", "base": "tiny.yaml", "imports": ["code/sweep_plugin.py"],  # relative to the sweep file
        "grid": {"method": ["fedgmr", "sweep_data_ga"]}}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = _fedgmr("sweep", str(project / "sweep.yaml"), "--out", "out", "--jobs", "2", "-q", cwd=elsewhere,
                   timeout=600)
    assert proc.returncode == 0, proc.stderr + "".join(p.read_text() for p in (elsewhere / "out").glob("logs/*"))
    index = json.loads((elsewhere / "out" / "sweep.json").read_text())
    assert [c["status"] for c in index["cells"]] == ["done", "done"]
    assert index["spec"]["imports"] == [str((project / "code" / "sweep_plugin.py").resolve())]
    for method in ("fedgmr", "sweep_data_ga"):
        saved = yaml.safe_load((elsewhere / "out" / f"method={method}" / "config.yaml").read_text())
        assert saved["data"]["name"] == "sweep_data" and saved["method"] == method
    # a rerun imports the code again and finds both cells done
    rerun = _fedgmr("sweep", str(project / "sweep.yaml"), "--out", "out", "--dry-run", cwd=elsewhere)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.count("done") == 2


def test_sweep_import_option_and_a_failing_sweep_import(tmp_path: Path):
    _plugin(tmp_path, "opt_plugin", "opt_data")
    _tiny_config(tmp_path / "tiny.yaml", "opt_data")
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({"base": "tiny.yaml", "grid": {"seed": [0, 1]}}))
    without = _fedgmr("sweep", "sweep.yaml", "--out", "out", "--dry-run", cwd=tmp_path)
    assert without.returncode == 2 and "unknown dataset 'opt_data'" in without.stderr
    with_option = _fedgmr("sweep", "sweep.yaml", "--out", "out", "--dry-run", "--import", "opt_plugin", cwd=tmp_path)
    assert with_option.returncode == 0, with_option.stderr
    assert with_option.stdout.count("new") == 2
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump({"base": "tiny.yaml", "imports": ["nope_q7.py"]}))
    broken = _fedgmr("sweep", "broken.yaml", "--out", "out2", cwd=tmp_path)
    assert broken.returncode == 6
    assert len(_error_lines(broken.stderr)) == 1 and "nope_q7.py" in broken.stderr
    assert not (tmp_path / "out2").exists()


def test_two_lambdas_of_one_module_are_different_definitions():
    from fedgmr.algorithm.staleness import STALENESS

    constant, polynomial = STALENESS.get("constant"), STALENESS.get("polynomial")
    with pytest.raises(RegistryError, match="staleness function 'constant' is already registered"):
        STALENESS.register("constant", polynomial)
    assert STALENESS.get("constant") is constant


def test_cells_get_the_imports_also_when_resumed_and_ray_cells_the_module_path(tmp_path: Path):
    from fedgmr.experiment.sweep import Cell, _module_path, _ray_cell, cell_command

    cell = Cell("seed=0", "quickstart", {"seed": 0})
    for state in ("new", "restart", "resume"):
        cmd = cell_command(cell, tmp_path, state, ["/abs/plugin.py", "my_module"])
        assert cmd[cmd.index("--import") + 1] == "/abs/plugin.py" and cmd.count("--import") == 2
    assert _module_path(["/abs/plugin.py"]) == [] and _module_path(["my_module"]) == [os.getcwd()]
    # a Ray cell runs its command with the sweep's folders on PYTHONPATH (called here without Ray)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "ray_cell_mod_q7.py").write_text("")
    rc, error = _ray_cell([sys.executable, "-c", "import ray_cell_mod_q7"], str(tmp_path / "log"),
                          [str(tmp_path / "code")])
    assert (rc, error) == (0, None)
    rc, error = _ray_cell([sys.executable, "-c", "import ray_cell_mod_q7"], str(tmp_path / "log"))
    assert rc == 1 and "ray_cell_mod_q7" in (error or "")
