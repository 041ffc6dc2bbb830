"""Wall-clock speed-up of the process-pool and Ray executors over the serial one.

The configuration (printed) is a small CNN on scikit-learn digits, 10 clients, FedGMR
semi-asynchronous with K = 3, and enough local steps that client training dominates the
server's work. Executors are timed side by side, in rounds (serial, process, ray, serial,
...), and the medians of the repeats are reported. Each run also checks that the
metrics are identical to the serial run's.

    python benchmarks/executor_speedup.py [--repeats 3] [--workers 2] [--steps 30] [--local-steps 40]
        [--method fedgmr|fedavg] [--executors serial process ray]
    python benchmarks/executor_speedup.py --pool-machinery [--repeats 3] [--workers 2] [--method fedavg]

Beside each wall time it prints the CPU seconds the run used (this process and the
pool's workers): on a busy machine the CPU time shows what the pool costs, and the
wall-time speed-up what the machine had free to give.

``--pool-machinery`` measures the process pool's own cost per job, without training: the
serial run's jobs are sent through the pool in waves of 10 and each worker hands back the
serial run's result for the job (the same bytes cross each way as in a real run); it prints
the CPU milliseconds per job in this process (all its threads) and in the workers (their
whole life, reaped at close). Needs the ``fork`` start method (the workers inherit the
replacement).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import time
from typing import Any

import torch

from fedgmr.experiment.build import build_experiment
from fedgmr.methods import resolve_config


def config(executor: str, workers: int, steps: int, local_steps: int, method: str = "fedgmr") -> dict[str, Any]:
    """The benchmark's run: FedGMR semi-asynchronous with K = 3, or ``method`` with its own
    coordination (FedAvg: synchronous rounds of every client)."""
    raw = _config(executor, workers, steps, local_steps, method)
    if method != "fedgmr":
        del raw["coordination"]
    return raw


def _config(executor: str, workers: int, steps: int, local_steps: int, method: str) -> dict[str, Any]:
    return {
        "name": "executor-speedup", "method": method, "seed": 0,
        "data": {"name": "digits", "partition": "dirichlet", "alpha": 0.5},
        "model": {"name": "cnn"},
        "clients": {"num_clients": 10, "heterogeneity": "high"},
        "training": {"lr": 0.05, "batch_size": 32, "local_steps": local_steps},
        "coordination": {"mode": "semi_async", "trigger": "k", "k": 3},
        "network": {"model_size_mb": 10.0},
        "run": {"max_steps": steps, "eval_every": 10, "executor": executor, "workers": workers,
                "torch_threads": 1},
    }


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed_run(executor: str, workers: int, steps: int, local_steps: int,
              method: str = "fedgmr") -> tuple[float, float, float, list[dict]]:
    """(start-up seconds, simulation seconds, CPU seconds of the simulation, metrics records).

    The CPU seconds are this process's during the simulation plus those of the pool's
    workers over their life (reaped at close; Ray's actors are not counted)."""
    records: list[dict] = []
    cfg = resolve_config(config(executor, workers, steps, local_steps, method))
    t0 = time.perf_counter()
    exp = build_experiment(cfg, on_record=records.append)
    t1 = time.perf_counter()
    cpu0, child0 = time.process_time(), _children_cpu()
    try:
        exp.simulator.run(steps)
        exp.simulator.finish()
    finally:
        t2 = time.perf_counter()
        cpu = time.process_time() - cpu0
        exp.executor.close()
    return t1 - t0, t2 - t1, cpu + _children_cpu() - child0, records


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
    ap.add_argument("--method", default="fedgmr", help="fedgmr (semi-async, K = 3) or e.g. fedavg (synchronous)")
    ap.add_argument("--executors", nargs="+", choices=("serial", "process", "ray"),
                    help="default: serial, process and (if installed) ray")
    ap.add_argument("--pool-machinery", action="store_true",
                    help="the process pool's CPU per job with training replaced by the serial results")
    return ap


def pool_machinery(workers: int, steps: int, local_steps: int, method: str, repeats: int) -> None:
    """The process pool's CPU per job, no training (see the module's docstring)."""
    from fedgmr.sim.executor import ClientWorkload
    from fedgmr.sim.executors import ProcessPoolExecutor

    jobs: list[Any] = []
    results: dict[Any, Any] = {}
    exp = build_experiment(resolve_config(config("serial", workers, steps, local_steps, method)))
    train = ClientWorkload.run

    def record(self: ClientWorkload, job: Any) -> Any:
        result = train(self, job)
        jobs.append(job)
        results[job.client_id, job.seed] = result
        return result

    ClientWorkload.run = record  # type: ignore[method-assign]
    try:
        exp.simulator.run(steps)
        exp.simulator.finish()
        ClientWorkload.run = lambda self, job: results[job.client_id, job.seed]  # type: ignore[method-assign]
        workload = exp.executor.workload
        print(f"{len(jobs)} jobs of the serial run ({method}, {local_steps} local steps), no training, "
              f"{workers} workers, waves of 10")
        for rep in range(repeats):
            pool = ProcessPoolExecutor(workload, workers, threads=1, start_method="fork")
            pool.submit(jobs[0]).result()  # the workers are up
            cpu0, child0, t0 = time.process_time(), _children_cpu(), time.perf_counter()
            for i in range(0, len(jobs), 10):
                for handle in [pool.submit(job) for job in jobs[i:i + 10]]:
                    handle.result()
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
            pool.close()
            child = _children_cpu() - child0
            n = len(jobs)
            print(f"  repeat {rep + 1}: CPU per job {1e3 * cpu / n:.2f} ms here + {1e3 * child / n:.2f} ms in the "
                  f"workers = {1e3 * (cpu + child) / n:.2f} ms; wall {1e3 * wall / n:.2f} ms per job")
    finally:
        ClientWorkload.run = train  # type: ignore[method-assign]


def main() -> None:
    args = parser().parse_args()
    torch.set_num_threads(1)
    if args.pool_machinery:
        pool_machinery(args.workers, args.steps, args.local_steps, args.method, args.repeats)
        return
    executors = args.executors or ["serial", "process"] + (["ray"] if importlib.util.find_spec("ray") else [])
    if executors[0] != "serial":
        executors = ["serial"] + [e for e in executors if e != "serial"]  # the reference and the baseline
    what = "FedGMR K=3" if args.method == "fedgmr" else args.method
    print(f"machine: {os.cpu_count()} CPUs, torch {torch.__version__}; config: cnn on digits, 10 clients, "
          f"high heterogeneity, {what}, {args.steps} server steps, {args.local_steps} local steps "
          f"(batch 32), {args.workers} workers, 1 torch thread each")
    startup: dict[str, list[float]] = {e: [] for e in executors}
    wall: dict[str, list[float]] = {e: [] for e in executors}
    cpu: dict[str, list[float]] = {e: [] for e in executors}
    reference: list[dict] | None = None
    for rep in range(args.repeats):
        for ex in executors:
            t_start, t_run, t_cpu, recs = timed_run(ex, args.workers, args.steps, args.local_steps, args.method)
            if reference is None:
                reference = recs
            same = recs == reference
            startup[ex].append(t_start)
            wall[ex].append(t_run)
            cpu[ex].append(t_cpu)
            print(f"  repeat {rep + 1} {ex:8s} start-up {t_start:6.2f} s  run {t_run:6.2f} s  CPU {t_cpu:6.2f} s  "
                  f"metrics identical to serial: {same}")
            if not same:
                raise SystemExit(f"{ex} executor gave different metrics")
    print(f"\nfree-core check (pure Python, {args.workers} processes vs one): "
          f"{free_core_check(args.workers):.2f}x  (~{args.workers}x on an idle machine)")
    base = statistics.median(wall["serial"])
    print(f"\nmedian of {args.repeats} (run = simulation only; start-up = building the experiment and executor; "
          f"CPU = the run's CPU seconds in this process and the pool's workers, not Ray's actors)")
    print(f"{'executor':10s}{'start-up s':>12s}{'run s':>10s}{'CPU s':>8s}{'speed-up':>10s}{'incl. start-up':>16s}"
          f"{'CPU / serial':>14s}")
    base_total = base + statistics.median(startup["serial"])
    base_cpu = statistics.median(cpu["serial"])
    for ex in executors:
        s, r, c = statistics.median(startup[ex]), statistics.median(wall[ex]), statistics.median(cpu[ex])
        print(f"{ex:10s}{s:12.2f}{r:10.2f}{c:8.2f}{base / r:9.2f}x{base_total / (s + r):15.2f}x{c / base_cpu:13.2f}x")


if __name__ == "__main__":
    main()
