"""Wall-clock speed-up of the process-pool and Ray executors over the serial one.

The configuration (printed) is a small CNN on scikit-learn digits, 10 clients, FedGMR
semi-asynchronous with K = 3, and enough local steps that client training dominates the
server's work. Executors are timed side by side, in rounds (serial, process, ray, serial,
...), and the medians of the repeats are reported. Each run also checks that the
metrics are identical to the serial run's.

    python benchmarks/executor_speedup.py [--repeats 3] [--workers 2] [--steps 30] [--local-steps 40]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time
from typing import Any

import torch

from fedgmr.experiment.build import build_experiment
from fedgmr.methods import resolve_config


def config(executor: str, workers: int, steps: int, local_steps: int) -> dict[str, Any]:
    return {
        "name": "executor-speedup", "method": "fedgmr", "seed": 0,
        "data": {"name": "digits", "partition": "dirichlet", "alpha": 0.5},
        "model": {"name": "cnn"},
        "clients": {"num_clients": 10, "heterogeneity": "high"},
        "training": {"lr": 0.05, "batch_size": 32, "local_steps": local_steps},
        "coordination": {"mode": "semi_async", "trigger": "k", "k": 3},
        "network": {"model_size_mb": 10.0},
        "run": {"max_steps": steps, "eval_every": 10, "executor": executor, "workers": workers,
                "torch_threads": 1},
    }


def timed_run(executor: str, workers: int, steps: int, local_steps: int) -> tuple[float, float, list[dict]]:
    """(start-up seconds, simulation seconds, metrics records)."""
    records: list[dict] = []
    cfg = resolve_config(config(executor, workers, steps, local_steps))
    t0 = time.perf_counter()
    exp = build_experiment(cfg, on_record=records.append)
    t1 = time.perf_counter()
    try:
        exp.simulator.run(steps)
        exp.simulator.finish()
    finally:
        t2 = time.perf_counter()
        exp.executor.close()
    return t1 - t0, t2 - t1, records


def _burn(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def free_core_check(workers: int, n: int = 6_000_000) -> float:
    """Pure-Python work: ``workers`` chunks one after another vs in ``workers`` processes.
    About ``workers``x on an idle machine; near 1x when other jobs hold the cores, in
    which case no executor can show a speed-up either."""
    import multiprocessing as mp

    t0 = time.perf_counter()
    for _ in range(workers):
        _burn(n)
    serial = time.perf_counter() - t0
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(workers) as pool:
        t0 = time.perf_counter()
        pool.map(_burn, [n] * workers)
        parallel = time.perf_counter() - t0
    return serial / parallel


def parser() -> argparse.ArgumentParser:
    """The command line (tests parse the documented commands with it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--local-steps", type=int, default=40)
    return ap


def main() -> None:
    args = parser().parse_args()
    torch.set_num_threads(1)
    executors = ["serial", "process"] + (["ray"] if importlib.util.find_spec("ray") else [])
    print(f"machine: {os.cpu_count()} CPUs, torch {torch.__version__}; config: cnn on digits, 10 clients, "
          f"high heterogeneity, FedGMR K=3, {args.steps} server steps, {args.local_steps} local steps "
          f"(batch 32), {args.workers} workers, 1 torch thread each")
    startup: dict[str, list[float]] = {e: [] for e in executors}
    wall: dict[str, list[float]] = {e: [] for e in executors}
    reference: list[dict] | None = None
    for rep in range(args.repeats):
        for ex in executors:
            t_start, t_run, recs = timed_run(ex, args.workers, args.steps, args.local_steps)
            if reference is None:
                reference = recs
            same = recs == reference
            startup[ex].append(t_start)
            wall[ex].append(t_run)
            print(f"  repeat {rep + 1} {ex:8s} start-up {t_start:6.2f} s  run {t_run:6.2f} s  "
                  f"metrics identical to serial: {same}")
            if not same:
                raise SystemExit(f"{ex} executor gave different metrics")
    print(f"\nfree-core check (pure Python, {args.workers} processes vs one): "
          f"{free_core_check(args.workers):.2f}x  (~{args.workers}x on an idle machine)")
    base = statistics.median(wall["serial"])
    print(f"\nmedian of {args.repeats} (run = simulation only; start-up = building the experiment and executor)")
    print(f"{'executor':10s}{'start-up s':>12s}{'run s':>10s}{'speed-up':>10s}{'incl. start-up':>16s}")
    base_total = base + statistics.median(startup["serial"])
    for ex in executors:
        s, r = statistics.median(startup[ex]), statistics.median(wall[ex])
        print(f"{ex:10s}{s:12.2f}{r:10.2f}{base / r:9.2f}x{base_total / (s + r):15.2f}x")


if __name__ == "__main__":
    main()
