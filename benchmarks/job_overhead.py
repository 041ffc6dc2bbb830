"""Per-job overhead: what the simulator spends per client job and per server step beyond
the arithmetic, by process CPU time (issue 39, target 4).

Two workloads, each measured in the same process against bare PyTorch, repeats
interleaved (simulator, bare, simulator, bare, ...), medians printed:

* ``cnn``: the quickstart preset (FedGMR, the 21.6 k-parameter CNN on 16x16 digits, 10
  clients, K = 3, 5 local steps of batch 20, masks and restoration on; no test
  evaluation inside the timed loop). Prints the CPU time per job of the whole simulator
  (server steps, validation checks and mask refreshes included) and of the client job
  path alone (``ClientWorkload.run``), against 5 steps of a bare SGD loop on the same
  architecture. Target: simulator per job <= 1.3x the bare 5 steps.
* ``mlp``: 10,000 clients with the small MLP (hidden [64, 64], 6.9 k parameters,
  synthetic data, 50 clients training at once, 2 local steps, buffered updates dropped
  after 20 steps). Prints the CPU time per server step against the arithmetic it does:
  the jobs' local SGD steps (as a bare loop) plus the mask-aware average of the updates
  the step used (as bare ``index_add_`` kernels on precomputed indices). Target: a server
  step <= 10x that arithmetic.

    python benchmarks/job_overhead.py [--case cnn mlp] [--repeats 5] [--cnn-steps 60] [--mlp-steps 60]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from fedgmr.experiment.build import build_experiment, model_factory
from fedgmr.methods import resolve_config
from fedgmr.presets import load_preset

cpu = time.process_time


def cnn_config(steps: int) -> dict[str, Any]:
    raw = load_preset("quickstart")
    # the preset's run section is virtual time with a test-evaluation grid: count server
    # steps instead and keep the test set out of the timed loop (validation checks stay)
    raw["run"] = {"max_steps": steps, "eval_every": 10**9, "torch_threads": 1}
    return raw


def mlp_config(steps: int, clients: int = 10_000) -> dict[str, Any]:
    return {"method": "fedgmr", "seed": 0,
            "data": {"name": "synthetic", "partition": "iid", "options": {"num_samples": 40 * clients + 4000}},
            "model": {"name": "mlp", "options": {"hidden": [64, 64]}},
            "clients": {"num_clients": clients, "heterogeneity": "high", "concurrency": 50},
            "training": {"local_steps": 2},
            "aggregation": {"max_staleness": 20},
            "restoration": {"check_interval": 10, "patience": 2},
            "run": {"max_steps": steps, "eval_every": 10**9, "torch_threads": 1}}


def run_simulator(raw: dict[str, Any]) -> dict[str, Any]:
    """One simulator run after its first dispatch wave: CPU and wall seconds, jobs trained,
    CPU inside the client job path, updates aggregated, and the experiment."""
    exp = build_experiment(resolve_config(raw))
    sim = exp.simulator
    workload = sim.executor.workload
    sim.start()  # warm-up outside the timed loop: the first dispatch wave
    before = sum(sim.dispatches)
    job_cpu = [0.0]
    run_job = workload.run

    def timed_run(job: Any) -> Any:
        t = cpu()
        try:
            return run_job(job)
        finally:
            job_cpu[0] += cpu() - t

    workload.run = timed_run  # the serial executor calls it at dispatch
    used = [0]
    aggregate = exp.strategy.aggregate

    def counted() -> Any:
        report = aggregate()
        used[0] += len(report.used)
        return report

    exp.strategy.aggregate = counted
    c0, w0 = cpu(), time.perf_counter()
    sim.run(max_steps=exp.config.run.max_steps)
    c, w = cpu() - c0, time.perf_counter() - w0
    exp.executor.close()
    return {"cpu": c, "wall": w, "jobs": sum(sim.dispatches) - before, "job_cpu": job_cpu[0],
            "steps": sim.step, "used": used[0], "exp": exp}


def bare_steps(exp: Any, steps: int) -> float:
    """CPU seconds of ``steps`` plain SGD steps (batch of the config, one client's shard)
    on a fresh model of the run's architecture."""
    from sim_overhead import bare_sgd  # the one bare loop of the benchmarks (this script's folder is on sys.path)

    cfg = exp.config
    model = model_factory(cfg, exp.data)()
    x, y = exp.simulator.executor.workload.client_data[0]
    return bare_sgd(model, x, y, cfg.training.lr, cfg.training.batch_size, steps)[0]


def bare_aggregation(exp: Any, repeats: int = 5) -> tuple[float, int]:
    """CPU seconds of one mask-aware average of the updates buffered at the end of the run,
    as bare kernels (indices precomputed, no checks), and how many updates it averages."""
    strategy = exp.strategy
    entries = list(strategy._buffer.values())
    params = strategy.params
    idx = {id(e.mask): torch.nonzero(e.mask).squeeze(1) for e in entries}
    vals = [(idx[id(e.mask)], e.values, float(e.num_samples)) for e in entries]
    per_mask: dict[int, float] = {}  # the coverage: one pass per distinct mask, as the rule does
    for e in entries:
        per_mask[id(e.mask)] = per_mask.get(id(e.mask), 0.0) + float(e.num_samples)
    cover = [(idx[k], w) for k, w in per_mask.items()]
    best = float("inf")
    for _ in range(repeats):
        c0 = cpu()
        acc = torch.zeros(params.shape, dtype=torch.float64)
        den = torch.zeros(params.shape, dtype=torch.float64)
        for i, v, w in vals:
            acc.index_add_(0, i, v.double(), alpha=w)
        for i, w in cover:
            den.index_add_(0, i, torch.full((i.numel(),), w, dtype=torch.float64))
        torch.where(den > 0, acc / den.clamp_min(1e-30), params.double()).float()
        best = min(best, cpu() - c0)
    return best, len(vals)


def measure_cnn(args: argparse.Namespace) -> None:
    raw = cnn_config(args.cnn_steps)
    local_steps = resolve_config(raw).training.local_steps
    rows = []
    for _ in range(args.repeats):
        r = run_simulator(raw)
        bare = bare_steps(r["exp"], r["jobs"] * local_steps)
        rows.append((r["cpu"] / r["jobs"], r["job_cpu"] / r["jobs"], bare / r["jobs"], r["wall"] / r["jobs"], r["jobs"]))
    sim, job, bare, wall = (statistics.median(x[i] for x in rows) for i in range(4))
    print(f"[cnn] quickstart preset (FedGMR, masks + restoration, K=3), {args.cnn_steps} server steps, "
          f"{rows[0][4]} jobs of {local_steps} local steps; {args.repeats} repeats interleaved, torch_threads=1")
    print(f"  CPU ms per job: simulator {1e3 * sim:.2f}   client job path {1e3 * job:.2f}   "
          f"bare loop {local_steps} steps {1e3 * bare:.2f}   (simulator wall ms per job {1e3 * wall:.2f})")
    print(f"  simulator / bare = {sim / bare:.3f} (per repeat: {' '.join(f'{x[0] / x[2]:.3f}' for x in rows)})   "
          f"job path / bare = {job / bare:.3f} (per repeat: {' '.join(f'{x[1] / x[2]:.3f}' for x in rows)})   "
          f"target: simulator / bare <= 1.3")


def measure_mlp(args: argparse.Namespace) -> None:
    raw = mlp_config(args.mlp_steps, args.clients)
    local_steps = resolve_config(raw).training.local_steps
    rows = []
    for _ in range(args.repeats):
        r = run_simulator(raw)
        steps = max(r["steps"], 1)
        train = bare_steps(r["exp"], r["jobs"] * local_steps) / steps
        agg, n = bare_aggregation(r["exp"])
        agg *= (r["used"] / steps) / max(n, 1)  # per step: the updates it used on average
        arith = train + agg
        rows.append((r["cpu"] / steps, arith, train, agg, r["job_cpu"] / steps, r["wall"] / steps,
                     r["jobs"] / steps, r["used"] / steps))
    med = [statistics.median(x[i] for x in rows) for i in range(8)]
    step, arith, train, agg, job, wall, jobs, used = med
    print(f"[mlp] {args.clients} clients, MLP [64, 64] ({rows and r['exp'].space.numel} parameters), FedGMR, "
          f"concurrency 50, {local_steps} local steps, max_staleness 20; {args.mlp_steps} server steps, "
          f"{jobs:.1f} jobs and {used:.1f} updates aggregated per step; {args.repeats} repeats interleaved")
    print(f"  CPU ms per server step: simulator {1e3 * step:.2f} (of which client jobs {1e3 * job:.2f})   "
          f"arithmetic {1e3 * arith:.2f} (bare SGD {1e3 * train:.2f} + bare average {1e3 * agg:.2f})   "
          f"(simulator wall ms per step {1e3 * wall:.2f})")
    print(f"  server step / arithmetic = {step / arith:.2f}x (per repeat: {' '.join(f'{x[0] / x[1]:.2f}' for x in rows)})"
          f"   target: <= 10x")


def parser() -> argparse.ArgumentParser:
    """The command line (tests parse the documented commands with it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=["cnn", "mlp"], nargs="+", default=["cnn", "mlp"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cnn-steps", type=int, default=60, help="server steps of the quickstart CNN run")
    ap.add_argument("--mlp-steps", type=int, default=60, help="server steps of the 10,000-client MLP run")
    ap.add_argument("--clients", type=int, default=10_000, help="clients of the MLP run")
    return ap


def main() -> None:
    args = parser().parse_args()
    torch.set_num_threads(1)
    if "cnn" in args.case:
        measure_cnn(args)
    if "mlp" in args.case:
        measure_mlp(args)


if __name__ == "__main__":
    main()
