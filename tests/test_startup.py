"""`import fedgmr` is lazy (PEP 562): the package's public names import their modules on
first use, so the commands that read results (`fedgmr table`, `compare`, `methods`,
`presets`) start without loading PyTorch or matplotlib, and a run loads matplotlib only
to draw its plot at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "FEDGMR_PROGRESS": "0"}
HEAVY = ("torch", "matplotlib")

# runs the fedgmr CLI in-process and reports on stderr, at exit, which heavy modules it loaded
PROBE = """
import atexit, sys
atexit.register(lambda: sys.stderr.write("\\nLOADED=" + ",".join(m for m in %r if m in sys.modules) + "\\n"))
from fedgmr.cli import app
app(sys.argv[1:], prog_name="fedgmr")
""" % (HEAVY,)


def _loaded(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=ENV,
                          cwd=cwd, timeout=300)
    line = [x for x in proc.stderr.splitlines() if x.startswith("LOADED=")][-1]
    return proc, [m for m in line.removeprefix("LOADED=").split(",") if m]


def _run_dir(root: Path, method: str, seed: int, acc: float) -> Path:
    """A finished run directory whose accuracy is ``acc`` at every evaluation."""
    d = root / f"{method}-{seed}"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"name": "t", "method": method, "seed": seed,
                                                   "run": {"eval_interval": 1.0}}))
    rows = [{"time": float(t), "step": t, "accuracy": acc, "bytes_up": 1e6 * t, "bytes_down": 1e6 * t}
            for t in range(0, 21)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"method": method}))
    return d


def test_import_fedgmr_loads_neither_torch_nor_matplotlib_and_every_public_name_resolves():
    code = ("import sys, fedgmr\n"
            "assert not [m for m in %r if m in sys.modules], sorted(m for m in %r if m in sys.modules)\n"
            "names = {n: getattr(fedgmr, n) for n in fedgmr.__all__}\n"
            "assert set(fedgmr.__all__) <= set(dir(fedgmr))\n"
            "assert names['resolve_config'].__module__ == 'fedgmr.methods'\n"
            "assert 'torch' in sys.modules\n"  # build_model and the data sets need it, once asked for
            "try:\n    fedgmr.no_such_name\nexcept AttributeError as e:\n    print('AttributeError', e)\n"
            % (HEAVY, HEAVY))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "AttributeError module 'fedgmr' has no attribute 'no_such_name'"


def test_the_public_api_is_what_the_package_documents():
    import fedgmr
    from fedgmr.experiment.build import build_experiment
    from fedgmr.methods import METHODS

    assert fedgmr.build_experiment is build_experiment and fedgmr.METHODS is METHODS
    assert sorted(fedgmr.__all__) == sorted([
        "ExperimentConfig", "parse_config", "resolve_config", "METHODS", "Method",
        "build_experiment", "run_experiment", "Experiment", "EXECUTORS",
        "DATASETS", "FederatedData", "load_dataset", "MODELS", "build_model",
        "acc_at_t", "mri", "time_to_accuracy", "compare_runs",
        "FedGMRError", "ConfigError", "DatasetFormatError", "InvalidUpdateError"])
    with pytest.raises(AttributeError):
        fedgmr.Simulator  # noqa: B018 - not public: fedgmr.sim.Simulator


def test_table_compare_methods_and_presets_start_without_torch_or_matplotlib(tmp_path: Path):
    for seed, acc in enumerate((0.80, 0.84)):
        _run_dir(tmp_path / "runs", "fedgmr", seed, acc)
        _run_dir(tmp_path / "runs", "fedavg", seed, acc - 0.1)
    proc, loaded = _loaded("table", "runs", "--t-star", "10", "--mri-of", "fedgmr", "--baselines", "fedavg",
                           cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "82.00 ± 2.83" in proc.stdout and loaded == [], (proc.stdout, loaded)
    proc, loaded = _loaded("compare", "runs/fedgmr-0", "runs/fedavg-0", "--t-star", "10", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "MRI of fedgmr over fedavg" in proc.stdout and loaded == [], (proc.stdout, loaded)
    for command in (["methods"], ["presets"], ["--version"]):
        proc, loaded = _loaded(*command, cwd=tmp_path)
        assert proc.returncode == 0 and proc.stdout and loaded == [], (command, proc.stderr, loaded)


def test_a_run_loads_matplotlib_only_to_draw_its_plot(tmp_path: Path):
    from conftest import tiny_config

    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config(run={"max_steps": 4, "eval_every": 2})))
    proc, loaded = _loaded("config", str(cfg), cwd=tmp_path)  # resolving a config draws nothing
    assert proc.returncode == 0 and "matplotlib" not in loaded, (proc.stderr, loaded)
    proc, loaded = _loaded("run", str(cfg), "--out", "run", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert loaded == ["torch", "matplotlib"]
    assert (tmp_path / "run" / "accuracy_density.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args, code, message", [
    (["run", "quickstart"], 2, "error: give --out DIR for the run directory"),
    (["run", "nope", "--out", "x"], 2, "error: 'nope' is neither a config file nor a preset"),
    (["run", "quickstart", "--out", "x", "--set", "nope.key=1"], 2, "error: unknown config key 'nope'"),
    (["config", "quickstart", "--set", "training.lr=-1"], 2, "error: invalid value for 'training.lr'"),
    (["run", "quickstart", "--out", "x", "--import", "missing.py"], 6, "error: cannot import 'missing.py'"),
    (["run", "quickstart", "--out", "x", "--set", "model.name=cnnn"], 2, "unknown model 'cnnn' (known: "),
    (["run", "quickstart", "--out", "x", "--set", "model.options.foo=1"], 2, "unknown option 'foo' for model 'cnn'"),
    (["run", "quickstart", "--out", "x", "--set", "data.options.bar=1"], 2, "unknown option 'bar' for dataset"),
])
def test_usage_and_config_mistakes_are_reported_without_loading_torch(tmp_path: Path, args, code, message):
    proc, loaded = _loaded(*args, cwd=tmp_path)
    lines = [x for x in proc.stderr.splitlines() if x.strip() and not x.startswith("LOADED=")]
    assert proc.returncode == code and len(lines) == 1 and message in lines[0], (proc.returncode, proc.stderr)
    assert "torch" not in loaded, loaded
    assert not (tmp_path / "x").exists()


def test_a_valid_config_is_printed_without_loading_torch(tmp_path: Path):
    proc, loaded = _loaded("config", "quickstart", cwd=tmp_path)
    assert proc.returncode == 0 and "name: quickstart" in proc.stdout, proc.stderr
    assert loaded == [], loaded


def test_builtin_names_read_from_the_source_match_the_live_registries():
    from fedgmr.builtin_names import builtin_builders
    from fedgmr.data import DATASETS
    from fedgmr.models import MODELS
    from fedgmr.options import accepted_options

    for package, registry in (("data", DATASETS), ("models", MODELS)):
        static = builtin_builders(package)
        live = {name: accepted_options(registry.get(name), ()) for name in registry.names()}
        # plugins registered by other tests are not built-in: compare the built-in ones
        live = {k: v for k, v in live.items() if registry.get(k).__module__.startswith(f"fedgmr.{package}.")}
        assert static == live


def test_cuda_asked_of_a_cpu_only_torch_is_refused_without_loading_torch(tmp_path: Path):
    from fedgmr.cli import _torch_build_is_cpu_only

    import torch

    assert _torch_build_is_cpu_only() == (torch.version.cuda is None and torch.version.hip is None)
    if not _torch_build_is_cpu_only():
        pytest.skip("this torch has CUDA or ROCm: it is asked (tests/test_device.py)")
    proc, loaded = _loaded("run", "quickstart", "--out", "x", "--set", "run.device=cuda", cwd=tmp_path)
    assert proc.returncode == 2 and "error: run.device 'cuda' is not available: torch.cuda.is_available() is " \
        "False here (a CPU-only torch build" in proc.stderr, proc.stderr
    assert "torch" not in loaded and not (tmp_path / "x").exists()
