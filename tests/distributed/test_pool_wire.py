"""The process pool's wire: small tensors travel as bytes inside the message, large ones
through torch's shared memory; metrics stay the serial executor's (test_executors_identical)
and closing the pool never waits on a half-sent result."""

from __future__ import annotations

import pickle
import threading
import time

import torch

from conftest import tiny_config
from fedgmr.experiment.build import build_experiment
from fedgmr.methods import resolve_config
from fedgmr.sim import executors as ex
from fedgmr.sim.executor import TrainJob


def test_small_tensors_travel_inline_and_large_ones_by_handle():
    small, large = torch.randn(1000), torch.randn(ex.WIRE_INLINE_BYTES // 4 + 1)
    blob = ex.wire_dumps({"s": small, "view": large[:10]})
    assert len(blob) < 10_000  # a view sends its own elements, not its storage
    back = pickle.loads(blob)
    assert torch.equal(back["s"], small) and torch.equal(back["view"], large[:10])
    big = ex.wire_dumps(large)
    assert len(big) < 10_000  # a handle to shared memory, not the megabytes
    assert torch.equal(pickle.loads(big), large)
    assert torch.equal(pickle.loads(ex.wire_dumps(torch.ones(3, dtype=torch.bfloat16))), torch.ones(3, dtype=torch.bfloat16))


def test_close_during_large_results_does_not_hang():
    """Results of a 200 k-parameter model (780 kB each, under WIRE_INLINE_BYTES: several pipe writes) are in flight
    when the pool is closed; close() returns (it used to be able to wait forever for the
    rest of a result whose writer it had killed)."""
    cfg = resolve_config(tiny_config(model={"name": "mlp", "options": {"hidden": [1536, 64]}},
                                     training={"local_steps": 1}, run={"max_steps": 2}))
    exp = build_experiment(cfg)
    workload = exp.simulator.executor.workload
    start = exp.strategy.params.clone()
    for attempt in range(4):
        pool = ex.ProcessPoolExecutor(workload, workers=2)
        handles = [pool.submit(TrainJob(c % 10, 0, c, start, dict(exp.strategy.buffers), None)) for c in range(12)]
        handles[0].result()
        time.sleep(0.01 * attempt)
        closer = threading.Thread(target=pool.close, daemon=True)
        closer.start()
        closer.join(120)  # a liveness bound, not a timing: close() takes well under a second
        assert not closer.is_alive(), "ProcessPoolExecutor.close() hung"


def test_a_worker_killed_while_jobs_are_in_flight_is_an_error_not_a_hang():
    """A worker that dies (here: SIGKILL) may leave half a reply in the pool's pipe; the
    handles then raise BrokenProcessPool instead of waiting forever."""
    import os
    import signal
    from concurrent.futures.process import BrokenProcessPool

    import pytest

    cfg = resolve_config(tiny_config(model={"name": "mlp", "options": {"hidden": [1536, 64]}},
                                     training={"local_steps": 1}, run={"max_steps": 2}))
    exp = build_experiment(cfg)
    start = exp.strategy.params.clone()
    pool = ex.ProcessPoolExecutor(exp.simulator.executor.workload, workers=2)
    try:
        handles = [pool.submit(TrainJob(c % 10, 0, c, start, dict(exp.strategy.buffers), None)) for c in range(40)]
        handles[0].result()
        os.kill(pool.worker_pids()[0], signal.SIGKILL)
        done = threading.Event()
        errors: list[BaseException] = []

        def drain() -> None:
            try:
                for h in handles:
                    h.result()
            except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
                errors.append(exc)
            done.set()

        threading.Thread(target=drain, daemon=True).start()
        assert done.wait(120), "a handle waited forever for a dead worker's reply"
        assert errors and isinstance(errors[0], BrokenProcessPool)
    finally:
        pool.close()
