"""``run.device``: the config checks a device string's form, building a run refuses a
device the machine lacks (one line, exit code 2), ``cpu`` is exactly the default on a
machine without a GPU, and a run on a GPU keeps every tensor it combines on the GPU.

The last is checked on the CPU with a stand-in CUDA device (tests/fake_cuda.py): no
operation may mix devices, the metrics must be the CPU run's bit for bit (the numbers
are computed on the CPU either way), and checkpoints must resume across devices. The
real GPU runs are in tests/gpu.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import uuid
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Mapping

import pytest
import torch
import yaml
from typer.testing import CliRunner

from conftest import simulate, tiny_config
from fake_cuda import fake_cuda
from fedgmr.cli import app
from fedgmr.config import parse_config
from fedgmr.device import resolve_device
from fedgmr.errors import ConfigError
from fedgmr.experiment.build import build_experiment
from fedgmr.experiment.runner import run_experiment, saved_config
from fedgmr.methods import resolve_config
from fedgmr.sim.executor import JobResult, TrainJob

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "FEDGMR_PROGRESS": "0"}
CUDA0 = torch.device("cuda", 0)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def _raw(method: str = "fedgmr", device: str | None = "cpu", steps: int = 6, **sections: Any) -> dict[str, Any]:
    raw = tiny_config(method=method, **sections)
    raw["run"].update({"max_steps": steps, "eval_every": 2})
    if device is None:
        raw["run"].pop("device", None)
    else:
        raw["run"]["device"] = device
    return raw


# ---------------------------------------------------------------------------- the config
@pytest.mark.parametrize("bad", ["gpu", "GPU", "CUDA", "cuda:", "cuda:x", "cuda0", "cuda:-1", "cuda:0:1",
                                 "cpu:0", "mps:0", "tpu", " cpu", ""])
def test_a_malformed_device_is_refused_by_the_config_naming_the_forms(bad: str):
    with pytest.raises(ConfigError) as err:
        parse_config(_raw(device=bad))
    assert str(err.value) == (f"invalid value for 'run.device': must be auto, cpu, cuda, cuda:N (N = 0, 1, ...) "
                              f"or mps (got {bad!r})")


@pytest.mark.parametrize("good", ["auto", "cpu", "cuda", "cuda:0", "cuda:7", "mps"])
def test_a_well_formed_device_passes_the_config_on_any_machine(no_gpu, good: str):
    assert parse_config(_raw(device=good)).run.device == good


def test_the_default_device_is_auto():
    assert parse_config(_raw(device=None)).run.device == "auto"


# ---------------------------------------------------------------------------- resolving
def test_auto_is_the_gpu_when_there_is_one_else_the_cpu(no_gpu, monkeypatch: pytest.MonkeyPatch):
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cpu")  # MPS only when asked for by name
    with fake_cuda():
        assert resolve_device("auto") == CUDA0
        assert resolve_device("cuda") == CUDA0  # indexed, as tensors report their device


@pytest.mark.parametrize("spec, missing", [
    ("cuda", "torch.cuda.is_available() is False"),
    ("cuda:1", "torch.cuda.is_available() is False"),
    ("mps", "torch.backends.mps.is_available() is False"),
])
def test_a_device_the_machine_lacks_is_one_config_error(no_gpu, spec: str, missing: str):
    with pytest.raises(ConfigError) as err:
        resolve_device(spec)
    assert f"run.device '{spec}' is not available: {missing}" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_gpu_index_beyond_the_machines_gpus_is_refused():
    with fake_cuda():
        assert resolve_device("cuda:0") == CUDA0
        with pytest.raises(ConfigError, match=r"this machine has 1 cuda device \(cuda:0 to cuda:0\)"):
            resolve_device("cuda:1")


def test_building_a_run_on_a_missing_gpu_fails_before_loading_data(no_gpu, monkeypatch: pytest.MonkeyPatch):
    import fedgmr.experiment.build as build

    def no_data(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the data was loaded")

    monkeypatch.setattr(build, "load_dataset", no_data)
    with pytest.raises(ConfigError, match="run.device 'cuda' is not available"):
        build_experiment(resolve_config(_raw(device="cuda")))


def test_cli_run_on_cuda_without_a_gpu_exits_2_with_one_line(tmp_path: Path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "fedgmr", "run", "quickstart", "--out", str(out),
                           "--set", "run.device=cuda"], capture_output=True, text=True, timeout=600,
                          env={**ENV, "CUDA_VISIBLE_DEVICES": ""})  # no GPU, whatever the machine has
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("error: run.device 'cuda' is not available: torch.cuda.is_available() is False")
    assert not out.exists()  # no half-made run directory


def test_cli_refuses_a_malformed_device_in_one_line():
    result = CliRunner().invoke(app, ["run", "quickstart", "--out", "unused", "--set", "run.device=gpu"])
    assert result.exit_code == 2
    assert "invalid value for 'run.device': must be auto, cpu, cuda" in result.stderr


# ---------------------------------------------------------------------------- cpu == default
def test_device_cpu_writes_exactly_the_default_metrics(no_gpu, tmp_path: Path):
    run_experiment(resolve_config(_raw(device=None, steps=8)), tmp_path / "default")
    run_experiment(resolve_config(_raw(device="cpu", steps=8)), tmp_path / "cpu")
    default = (tmp_path / "default" / "metrics.jsonl").read_bytes()
    assert default.count(b"\n") >= 4
    assert (tmp_path / "cpu" / "metrics.jsonl").read_bytes() == default


# ---------------------------------------------------------------------------- on a (fake) GPU
CASES = {
    "fedgmr": ("fedgmr", {}),
    # BatchNorm, norm bounds (fixed and adaptive), deltas applied once
    "fedgmr-delta-bounded": ("fedgmr", {"model": {"name": "cnn", "options": {}},
                                        "aggregation": {"rule": "ga_delta", "buffer": False, "max_update_norm": 1.0,
                                                        "update_norm_multiple": 2.0}}),
    "fedgmr-server-bn": ("fedgmr", {"model": {"name": "cnn", "options": {}}, "aggregation": {"bn_stats": "server"}}),
    "fedasync": ("fedasync", {}),
    # label split and static BatchNorm
    "heterofl": ("heterofl", {"model": {"name": "cnn", "options": {}}}),
    "fedrolex": ("fedrolex", {"model": {"name": "cnn", "options": {}}}),
    # per-width BatchNorm statistics
    "fjord": ("fjord", {"model": {"name": "cnn", "options": {}}}),
    "fiarse": ("fiarse", {}),
}


def _simulate(raw: dict[str, Any]) -> tuple[list[dict[str, Any]], torch.Tensor]:
    records, exp = simulate(raw)
    return records, exp.strategy.params


@pytest.mark.parametrize("case", list(CASES))
def test_a_run_on_the_gpu_mixes_no_devices_and_computes_what_the_cpu_does(case: str):
    method, sections = CASES[case]
    cpu_records, cpu_params = _simulate(_raw(method, "cpu", **sections))
    with fake_cuda() as gpu:
        records, params = _simulate(_raw(method, "cuda", **sections))
        assert params.device == CUDA0
    assert gpu.violations == []
    assert records == cpu_records
    assert torch.equal(params, cpu_params)


def _on(device: str) -> Any:
    """The fake GPU for ``cuda``, nothing for the CPU."""
    return fake_cuda() if device == "cuda" else nullcontext()


@pytest.mark.parametrize("method", ["fedgmr", "heterofl"])
def test_a_checkpoint_resumes_on_the_other_device_to_the_uninterrupted_metrics(tmp_path: Path, method: str):
    raw = _raw(method, "cpu", steps=8, model={"name": "cnn", "options": {}})
    raw["run"]["checkpoint_every"] = 1
    run_experiment(resolve_config(raw), tmp_path / "reference")
    reference = (tmp_path / "reference" / "metrics.jsonl").read_bytes()
    for device in ("cpu", "cuda"):  # the same run, interrupted on each device
        raw["run"]["device"] = device
        with _on(device) as gpu:
            run_experiment(resolve_config(raw), tmp_path / device, stop_after_steps=3)
        assert gpu is None or gpu.violations == []
    checkpoint = "checkpoint/state.safetensors"
    assert (tmp_path / "cuda" / checkpoint).read_bytes() == (tmp_path / "cpu" / checkpoint).read_bytes()
    for first, then in (("cuda", "cpu"), ("cpu", "cuda")):
        cfg = saved_config(tmp_path / first)
        cfg.run.device = then
        with _on(then) as gpu:
            run_experiment(cfg, tmp_path / first, resume=True)
        assert gpu is None or gpu.violations == []
        assert (tmp_path / first / "metrics.jsonl").read_bytes() == reference, f"{first} -> {then}"


def test_cli_resume_may_move_a_run_to_another_device_and_nothing_else(no_gpu, tmp_path: Path):
    raw = _raw(steps=8)
    raw["run"]["checkpoint_every"] = 1
    run_experiment(resolve_config(raw), tmp_path / "reference")
    raw["run"]["device"] = "auto"
    run_experiment(resolve_config(raw), tmp_path / "run", stop_after_steps=3)
    runner = CliRunner()
    refused = runner.invoke(app, ["run", "--resume", str(tmp_path / "run"), "--set", "run.device=cuda"])
    assert refused.exit_code == 2 and "run.device 'cuda' is not available" in refused.stderr
    refused = runner.invoke(app, ["run", "--resume", str(tmp_path / "run"), "--set", "run.device=cpu",
                                  "--set", "training.lr=0.2"])
    assert refused.exit_code == 2 and "--set" in refused.stderr
    done = runner.invoke(app, ["run", "--resume", str(tmp_path / "run"), "--set", "run.device=cpu", "-q"])
    assert done.exit_code == 0, done.stderr
    assert (tmp_path / "run" / "metrics.jsonl").read_bytes() == (tmp_path / "reference" / "metrics.jsonl").read_bytes()
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["run"]["device"] == "auto"  # as started


class _Link:
    """Flower's grid as the server loop sees it: each push trains at once through the
    real ClientApp handler (the clients' own workloads, on the config's device)."""

    def __init__(self, run_config: Mapping[str, Any]) -> None:
        self.run_config = run_config
        self.replies: dict[str, Any] = {}

    def push(self, node_id: int, fields: Mapping[str, Any], ttl: float, group: str) -> str:
        from fedgmr.flower.client import train_handler

        msg_id = uuid.uuid4().hex
        out = train_handler(fields, self.run_config, {"partition-id": node_id}, node_id)
        self.replies[msg_id] = type("Arrived", (), {"instruction_id": msg_id, "node_id": node_id, "fields": out,
                                                    "error": None, "nbytes": 0})()
        return msg_id

    def pull(self, ids: list[str]) -> list[Any]:
        return [self.replies.pop(i) for i in ids if i in self.replies]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_flower_server_and_clients_take_the_device_from_the_config(tmp_path: Path, device: str):
    from fedgmr.flower import client
    from fedgmr.flower.client import load_run_config
    from fedgmr.flower.loop import BufferedServerLoop, LoopSettings

    raw = _raw(clients={"num_clients": 4, "heterogeneity": "high"}, device=device)
    (tmp_path / "fedgmr.yaml").write_text(yaml.safe_dump(raw))
    run_config = {"config": str(tmp_path / "fedgmr.yaml")}
    client._WORKLOADS.clear()
    with _on(device) as gpu:
        cfg = load_run_config(run_config)
        exp = build_experiment(cfg)
        exp.executor.close()
        settings = LoopSettings(max_steps=4, k=2, reply_timeout=30.0, step_timeout=30.0, max_wall=300.0,
                                eval_every=2, check_interval=2, poll_interval=0.01)
        loop = BufferedServerLoop(exp.strategy, _Link(run_config), list(range(4)), exp.simulator.evaluator,
                                  settings, exp.simulator.executor.workload.settings, cfg.seed)
        records = loop.run()
        assert exp.strategy.params.device.type == device
        assert [w.device.type for w in client._WORKLOADS.values()] == [device]
    client._WORKLOADS.clear()
    assert gpu is None or gpu.violations == []
    assert loop.strategy.version == 4 and loop.strategy.rejected == 0 and len(records) >= 2


# ---------------------------------------------------------------------------- what leaves a process
def test_jobs_and_results_move_between_devices_only_when_they_must():
    job = TrainJob(0, 0, 1, torch.zeros(4), {"b": torch.ones(2)}, torch.ones(4, dtype=torch.bool))
    result = JobResult(0, 0, torch.zeros(3), {"b": torch.ones(2)}, 10, 0.5, None)
    assert job.to("cpu") is job and result.to("cpu") is result  # nothing to copy on the CPU
    with fake_cuda() as gpu:
        on_gpu = job.to("cuda")
        assert on_gpu.start.device == on_gpu.mask.device == on_gpu.buffers["b"].device == CUDA0
        assert on_gpu.to("cuda") is on_gpu
        back = result.to("cuda").to("cpu")
        assert back.values.device.type == "cpu" and back.buffers["b"].device.type == "cpu"
        assert torch.equal(back.values, result.values)
    assert gpu.violations == []


def test_a_process_pool_for_a_gpu_spawns_its_workers():
    from fedgmr.sim.executors import ProcessPoolExecutor

    exp = build_experiment(resolve_config(_raw()))
    exp.executor.close()
    workload = exp.simulator.executor.workload
    with fake_cuda():
        pool = ProcessPoolExecutor(workload, workers=1, device="cuda")  # workers start at the first job
        try:
            assert pool._pool._mp_context.get_start_method() == "spawn"  # CUDA does not survive fork
        finally:
            pool.close()
    pool = ProcessPoolExecutor(workload, workers=1, device="cpu")
    try:
        assert pool._pool._mp_context.get_start_method() == ("fork" if "fork" in mp.get_all_start_methods()
                                                              else "spawn")
    finally:
        pool.close()
