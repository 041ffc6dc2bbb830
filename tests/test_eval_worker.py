"""Test evaluation in a worker process (``FEDGMR_TEST_WORKER=1``): the same records, in
the same order, as an evaluation in the simulator's process; the scores of a checkpoint's
records are out before its state; one evaluation per model version."""

from __future__ import annotations

import json
import os

import pytest
import torch

from conftest import tiny_config
from fedgmr.experiment.build import build_experiment
from fedgmr.methods import resolve_config
from fedgmr.sim import evalworker
from fedgmr.sim.evalworker import EvalWorker

pytestmark = pytest.mark.skipif(not evalworker.available(), reason="the test worker needs fork")


def _run(raw: dict, worker: bool, monkeypatch, stop_at: int | None = None,
         processes: int = 1) -> tuple[list[dict], object]:
    monkeypatch.setenv(evalworker.ENV_SWITCH, str(processes) if worker else "0")
    records: list[dict] = []
    cfg = resolve_config(raw)
    exp = build_experiment(cfg, on_record=records.append)
    try:
        assert (exp.simulator.test_worker is not None) == worker
        if worker:
            assert len(exp.simulator.test_worker.pids) == processes
        sim = exp.simulator
        if stop_at is not None:
            sim.run(max_steps=stop_at)
            assert not sim._unscored  # run() returns with every record out
            sim.state_dict()
        sim.run(cfg.run.max_steps, cfg.run.max_time)
        sim.finish()
        assert sim.test_worker is None  # finish() closes it
    finally:
        exp.simulator.close_test_worker()
        exp.executor.close()
    return records, exp


def _same(a: list[dict], b: list[dict]) -> None:
    assert [json.dumps(r) for r in a] == [json.dumps(r) for r in b]  # values and key order


@pytest.mark.parametrize("method, section", [
    ("fedasync", {"run": {"max_time": 60, "max_steps": None, "eval_interval": 2, "eval_every": None}}),
    ("fedgmr", {"run": {"max_time": 60, "max_steps": None, "eval_interval": 3, "eval_every": None}}),
    ("fedavg", {"run": {"max_steps": 6, "eval_every": 1}}),
])
def test_worker_writes_the_records_of_an_evaluation_in_process(method: str, section: dict, monkeypatch):
    raw = tiny_config(method=method, **section)
    here, _ = _run(raw, False, monkeypatch)
    there, _ = _run(raw, True, monkeypatch)
    assert len(here) > 5
    _same(here, there)


def test_several_worker_processes_write_the_same_records(monkeypatch):
    raw = tiny_config(method="fedasync", run={"max_time": 60, "max_steps": None, "eval_interval": 1,
                                               "eval_every": None})
    here, _ = _run(raw, False, monkeypatch)
    there, _ = _run(raw, True, monkeypatch, stop_at=15, processes=3)
    _same(here, there)


def test_worker_records_are_out_before_a_run_returns_and_before_a_checkpoint(monkeypatch):
    raw = tiny_config(method="fedasync", run={"max_time": 40, "max_steps": None, "eval_interval": 1,
                                               "eval_every": None})
    here, _ = _run(raw, False, monkeypatch)
    there, _ = _run(raw, True, monkeypatch, stop_at=10)
    _same(here, there)


def test_each_model_version_is_evaluated_once(monkeypatch):
    raw = tiny_config(method="fedavg", run={"max_time": 120, "max_steps": None, "eval_interval": 1,
                                            "eval_every": None})
    monkeypatch.setenv(evalworker.ENV_SWITCH, "1")
    cfg = resolve_config(raw)
    records: list[dict] = []
    exp = build_experiment(cfg, on_record=records.append)
    submitted = []
    worker = exp.simulator.test_worker
    real_submit = worker.submit
    worker.submit = lambda p, b: submitted.append(1) or real_submit(p, b)
    try:
        exp.simulator.run(max_time=cfg.run.max_time)
        exp.simulator.finish()
    finally:
        exp.simulator.close_test_worker()
        exp.executor.close()
    versions = {r["step"] for r in records}
    assert len(records) > len(versions)  # synchronous FedAvg: several grid points per version
    assert len(submitted) == len(versions)


def test_worker_scores_equal_the_function_and_errors_come_back():
    torch.manual_seed(0)
    w = torch.randn(5)

    def score(flat: torch.Tensor, bufs: dict[str, torch.Tensor]) -> tuple[float, float]:
        if float(flat[0]) == 123.0:
            raise ValueError("bad snapshot")
        return float((flat * w).sum()), float(bufs["b"].sum())

    for processes in (1, 2):
        worker = EvalWorker(score, max_pending=2, processes=processes)
        try:
            snaps = [(torch.randn(5), {"b": torch.randn(3)}) for _ in range(7)]
            handles = [worker.submit(p, b) for p, b in snaps]  # more than max_pending: submit waits
            for h, (p, b) in reversed(list(zip(handles, snaps))):  # asked for out of order
                assert h.result() == score(p, b)
                assert h.done() and h.result() == score(p, b)  # a handle keeps its score
            bad = worker.submit(torch.tensor([123.0, 0, 0, 0, 0]), {"b": torch.zeros(1)})
            with pytest.raises(RuntimeError, match="bad snapshot"):
                bad.result()
        finally:
            worker.close()
        assert not any(p.is_alive() for p in worker._procs)
        with pytest.raises(RuntimeError, match="closed"):
            worker.submit(torch.zeros(5), {})


def test_switch_is_off_by_default_and_refused_where_fork_cannot_serve(monkeypatch):
    cfg = resolve_config(tiny_config())
    monkeypatch.delenv(evalworker.ENV_SWITCH, raising=False)
    assert evalworker.test_worker_for(cfg, torch.device("cpu"), lambda f, b: (0.0, 0.0)) is None
    monkeypatch.setenv(evalworker.ENV_SWITCH, "1")
    assert evalworker.test_worker_for(cfg, torch.device("meta"), lambda f, b: (0.0, 0.0)) is None
    w = evalworker.test_worker_for(cfg, torch.device("cpu"), lambda f, b: (0.0, 0.0))
    assert w is not None and w.pid != os.getpid() and len(w.pids) == 1
    w.close()
    monkeypatch.setenv(evalworker.ENV_SWITCH, "2")
    w = evalworker.test_worker_for(cfg, torch.device("cpu"), lambda f, b: (0.0, 0.0))
    assert w is not None and len(set(w.pids)) == 2
    w.close()
    monkeypatch.setenv(evalworker.ENV_SWITCH, "off")
    assert evalworker.test_worker_for(cfg, torch.device("cpu"), lambda f, b: (0.0, 0.0)) is None


def test_worker_takes_buffers_of_any_dtype():
    def score(flat: torch.Tensor, bufs: dict[str, torch.Tensor]) -> tuple[float, float]:
        return float(flat.sum()), float(sum(v.float().sum() for v in bufs.values()))

    worker = EvalWorker(score)
    try:
        bufs = {"bf16": torch.ones(4, dtype=torch.bfloat16), "count": torch.tensor(7), "f": torch.arange(3.0)}
        assert worker.submit(torch.ones(3), bufs).result() == (3.0, 14.0)
    finally:
        worker.close()
