"""End-to-end runs on a real CUDA GPU (skipped without one): FedGMR and HeteroFL through
the serial and process-pool executors, checkpoints crossing devices, and results close
to the CPU's (close, not equal: a GPU sums in another order).

The device plumbing itself is also checked without a GPU, on a stand-in device
(tests/test_device.py); these tests are the real thing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import simulate, tiny_config
from fedgmr.device import resolve_device
from fedgmr.errors import ConfigError
from fedgmr.experiment.metrics import read_metrics
from fedgmr.experiment.runner import run_experiment, saved_config
from fedgmr.methods import resolve_config

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
#: how far a GPU run's accuracy may drift from the CPU's in these few steps
ACCURACY_TOLERANCE = 0.05


def _raw(method: str, device: str, steps: int = 8, **run: Any) -> dict[str, Any]:
    return tiny_config(method=method, model={"name": "cnn", "options": {}},
                       run={"max_steps": steps, "eval_every": 2, "device": device, "workers": 2, **run})


def _simulate(raw: dict[str, Any]) -> tuple[list[dict[str, Any]], torch.Tensor, Any]:
    records, exp = simulate(raw)
    return records, exp.strategy.params, exp.strategy


def _assert_close_runs(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        assert abs(ra["accuracy"] - rb["accuracy"]) <= ACCURACY_TOLERANCE, (ra, rb)


def _relative_gap(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.detach().cpu().double(), y.detach().cpu().double()
    return float((x - y).norm() / y.norm())


@needs_cuda
def test_resolving_picks_the_gpu_and_refuses_an_index_beyond_it():
    assert resolve_device("auto").type == "cuda"
    assert resolve_device("cuda") == torch.device("cuda", torch.cuda.current_device())
    with pytest.raises(ConfigError, match="is not available: this machine has"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")


@needs_cuda
@pytest.mark.parametrize("method", ["fedgmr", "heterofl"])
def test_a_serial_run_on_the_gpu_stays_there_and_is_close_to_the_cpu(method: str):
    cpu_records, cpu_params, _ = _simulate(_raw(method, "cpu"))
    records, params, strategy = _simulate(_raw(method, "cuda"))
    assert params.device.type == "cuda"
    assert all(b.device.type == "cuda" for b in strategy.buffers.values())
    assert all(strategy.policy.mask(level).device.type == "cuda" for level in range(len(strategy.ladder.ladder)))
    assert all(isinstance(r["accuracy"], float) for r in records)
    _assert_close_runs(records, cpu_records)
    assert _relative_gap(params, cpu_params) < 1e-2


@needs_cuda
@pytest.mark.parametrize("method", ["fedgmr", "heterofl"])
def test_process_pool_workers_train_on_the_gpu_like_the_serial_executor(method: str):
    serial, serial_params, _ = _simulate(_raw(method, "cuda", steps=6))
    pooled, pooled_params, _ = _simulate(_raw(method, "cuda", steps=6, executor="process"))
    assert pooled_params.device.type == "cuda"
    _assert_close_runs(pooled, serial)
    assert _relative_gap(pooled_params, serial_params) < 1e-3


@needs_cuda
@pytest.mark.parametrize("first, then", [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_checkpoint_written_on_one_device_resumes_on_the_other(tmp_path: Path, first: str, then: str):
    raw = _raw("fedgmr", "cpu", checkpoint_every=1)
    run_experiment(resolve_config(raw), tmp_path / "reference")
    raw["run"]["device"] = first
    run_experiment(resolve_config(raw), tmp_path / "run", stop_after_steps=3)
    cfg = saved_config(tmp_path / "run")
    cfg.run.device = then
    summary = run_experiment(cfg, tmp_path / "run", resume=True)
    assert summary["status"] == "completed" and summary["steps"] == 8
    _assert_close_runs(read_metrics(tmp_path / "run"), read_metrics(tmp_path / "reference"))
