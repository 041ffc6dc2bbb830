"""One FedAvg workload on bare PyTorch, Flower's simulation and the fedgmr simulator, side by side.

The workload: a 215 k-parameter CNN (conv 1->16 5x5, conv 16->32 5x5, FC 1568->128->10:
fedgmr's `conv2` with channels [16, 32] and 128 hidden units), FedAvg with every client in
every round, 10 clients x 5 local SGD steps of batch 20 on 28x28 inputs (scikit-learn's
digits resampled, so it runs offline), `--warmup` rounds then `--rounds` measured rounds,
one torch thread in every process.

Runtimes, each in its own process, interleaved (bare, flower, serial, process, bare, ...)
`--repeats` times so that machine noise hits them alike:

- `bare`: a plain loop: load the global weights, train, average the state dicts.
- `bare_parallel`: the same loop with each round's clients split across `--workers` forked
  processes (a `multiprocessing` pool that keeps each worker's model and data): the
  parallel speed-up of a plain `multiprocessing.Pool` (state dicts pickled each way) with no
  framework around it. With long jobs (`--local-steps 100`) it is the parallelism the
  machine has to give, against which the process pool's speed-up is read; with short jobs
  its per-job pickling shows what the process pool's shared-memory handles save.
- `flower`: Flower's simulation runtime (`flwr.simulation.run_simulation`), the Message
  API's `FedAvg` strategy, a ClientApp that trains like the bare loop, `--actors` Ray
  actors of one CPU each. Needs `pip install 'fedgmr[flower]'`.
- `serial`, `process`: the fedgmr simulator (`method: fedavg`, equal links) with the serial
  executor and with a process pool of `--workers` workers.

Prints, per runtime: seconds per measured round (median over repeats, and each repeat's),
the start-up (process start to the first round's start: imports, data, Ray), the peak
PSS of the runtime's whole process tree (sampled every 0.5 s from /proc by a thread at nice 19,
so Linux only;
PSS counts pages shared between the processes once), and the ratio of its s/round to the
bare loop's.

    python benchmarks/vs_flower.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

RUNTIMES = ("bare", "bare_parallel", "flower", "serial", "process")
T_START = time.time()  # the child's process start, as near as Python gets


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=20, help="measured rounds per run")
    ap.add_argument("--warmup", type=int, default=2, help="rounds run before the measured ones")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--local-steps", type=int, default=5)
    ap.add_argument("--runtimes", nargs="+", choices=RUNTIMES, default=list(RUNTIMES))
    ap.add_argument("--workers", type=int, default=2, help="fedgmr process-pool workers")
    ap.add_argument("--actors", type=int, default=2, help="Ray actors of Flower's simulation (one CPU each)")
    ap.add_argument("--child", choices=RUNTIMES, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    return ap


# ------------------------------------------------------------------------------------------ the workload
def workload_config(clients: int, local_steps: int, max_steps: int, eval_every: int = 10**9,
                    **run: Any) -> dict[str, Any]:
    """The FedGMR config of the workload (FedAvg on the 215 k-parameter CNN, 28x28 digits,
    batch 20, one torch thread); ``run`` adds run keys (executor, workers). Also
    benchmarks/flower_deployment.py's."""
    return {
        "method": "fedavg", "seed": 0,
        "data": {"name": "digits", "partition": "iid", "options": {"image_size": 28}},
        "model": {"name": "conv2", "options": {"channels": [16, 32], "hidden": 128}},
        "clients": {"num_clients": clients, "heterogeneity": "none"},
        "training": {"lr": 0.05, "local_steps": local_steps, "batch_size": 20},
        "run": {"max_steps": max_steps, "eval_every": eval_every, "torch_threads": 1, **run},
    }


def raw_config(args: argparse.Namespace, executor: str = "serial") -> dict[str, Any]:
    return workload_config(args.clients, args.local_steps, args.warmup + args.rounds, executor=executor,
                           workers=args.workers)


def build(args: argparse.Namespace, executor: str = "serial") -> Any:
    from fedgmr.experiment.build import build_experiment
    from fedgmr.methods import resolve_config

    return build_experiment(resolve_config(raw_config(args, executor)))


def local_train(model: Any, state: dict, x: Any, y: Any, steps: int, seed: int) -> tuple[dict, int]:
    """Load ``state``, ``steps`` SGD steps of batch 20 (lr 0.05), return the new state dict."""
    import torch
    import torch.nn.functional as F

    model.load_state_dict(state)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(seed)
    perm, pos = torch.randperm(len(y), generator=gen), 0
    model.train()
    for _ in range(steps):
        if pos + 20 > len(y):
            perm, pos = torch.randperm(len(y), generator=gen), 0
        idx = perm[pos:pos + 20]
        pos += 20
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, len(y)


def average(states: list[tuple[dict, int]]) -> dict:
    total = sum(n for _, n in states)
    return {k: sum(s[k] * (n / total) for s, n in states) for k in states[0][0]}


# ------------------------------------------------------------------------------------------ the runtimes
def run_bare(args: argparse.Namespace) -> list[float]:
    exp = build(args)
    work = exp.simulator.executor.workload
    model = work.model
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    stamps = []
    for r in range(args.warmup + args.rounds):
        stamps.append(time.perf_counter())
        state = average([local_train(model, state, x, y, args.local_steps, 1000 * r + c)
                         for c, (x, y) in enumerate(work.client_data)])
    stamps.append(time.perf_counter())
    return stamps


_WORK: Any = None


def _bare_worker_init(work: Any) -> None:
    import torch

    global _WORK
    torch.set_num_threads(1)
    _WORK = work


def _bare_worker_train(state: dict, c: int, steps: int, seed: int) -> tuple[dict, int]:
    x, y = _WORK.client_data[c]
    return local_train(_WORK.model, state, x, y, steps, seed)


def run_bare_parallel(args: argparse.Namespace) -> list[float]:
    import multiprocessing as mp

    exp = build(args)
    work = exp.simulator.executor.workload
    state = {k: v.detach().clone() for k, v in work.model.state_dict().items()}
    stamps = []
    with mp.get_context("fork").Pool(args.workers, initializer=_bare_worker_init, initargs=(work,)) as pool:
        for r in range(args.warmup + args.rounds):
            stamps.append(time.perf_counter())
            jobs = [(state, c, args.local_steps, 1000 * r + c) for c in range(len(work.client_data))]
            state = average(pool.starmap(_bare_worker_train, jobs, chunksize=1))
        stamps.append(time.perf_counter())
    return stamps


def run_fedgmr(args: argparse.Namespace, executor: str) -> list[float]:
    exp = build(args, executor)
    sim = exp.simulator
    stamps = [time.perf_counter()]
    try:
        sim.run(max_steps=args.warmup + args.rounds, on_step=lambda s: stamps.append(time.perf_counter()))
    finally:
        exp.executor.close()
    return stamps


_CACHE: dict[str, Any] = {}


def _flower_apps(args: argparse.Namespace, stamps: list[float]) -> tuple[Any, Any]:
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    client_app, server_app = ClientApp(), ServerApp()

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        import torch

        if "work" not in _CACHE:  # once per Ray actor: its own copy of the data and a model
            torch.set_num_threads(1)
            _CACHE["work"] = build(args).simulator.executor.workload
        work = _CACHE["work"]
        c = int(context.node_config["partition-id"])
        x, y = work.client_data[c]
        rnd = int(msg.content["config"]["server-round"])
        state, n = local_train(work.model, msg.content["arrays"].to_torch_state_dict(), x, y,
                               args.local_steps, 1000 * (rnd - 1) + c)
        content = RecordDict({"arrays": ArrayRecord(state), "metrics": MetricRecord({"num-examples": n})})
        return Message(content=content, reply_to=msg)

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        model = build(args).simulator.executor.workload.model
        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=args.clients,
                          min_available_nodes=args.clients)

        def stamp(server_round: int, arrays: ArrayRecord) -> None:
            stamps.append(time.perf_counter())  # round 0: before the first round; then after each
            return None

        strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                       num_rounds=args.warmup + args.rounds, evaluate_fn=stamp)

    return server_app, client_app


def run_flower(args: argparse.Namespace) -> list[float]:
    from flwr.simulation import run_simulation

    stamps: list[float] = []
    server_app, client_app = _flower_apps(args, stamps)
    run_simulation(server_app, client_app, num_supernodes=args.clients,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": args.actors, "include_dashboard": False}})
    return stamps


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    runner = {"bare": run_bare, "bare_parallel": run_bare_parallel, "flower": run_flower}.get(args.child)
    stamps = runner(args) if runner else run_fedgmr(args, args.child)
    start = time.time() - (time.perf_counter() - stamps[0]) if stamps else None  # wall clock of stamp 0
    measured = stamps[args.warmup:]
    if len(measured) != args.rounds + 1:
        raise SystemExit(f"{args.child}: {len(stamps) - 1} rounds timed, expected {args.warmup + args.rounds}")
    Path(args.result).write_text(json.dumps({
        "s_per_round": (measured[-1] - measured[0]) / args.rounds,
        "startup_s": None if start is None else start - T_START,
    }))


# ------------------------------------------------------------------------------------------ measuring
def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(d))
    return kids


def tree_pss_mb(root: int) -> float:
    """The summed PSS of ``root`` and all its descendants, in MB."""
    kids, todo, total = _children(), [root], 0
    while todo:
        pid = todo.pop()
        todo += kids.get(pid, [])
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            pass
    return total / 1024


def measure(args: argparse.Namespace, runtime: str, tmp: Path) -> dict[str, Any]:
    result = tmp / f"{runtime}.json"
    cmd = [sys.executable, __file__, "--child", runtime, "--result", str(result),
           "--rounds", str(args.rounds), "--warmup", str(args.warmup), "--clients", str(args.clients),
           "--local-steps", str(args.local_steps), "--workers", str(args.workers), "--actors", str(args.actors)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FEDGMR_PROGRESS": "0", "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak, done = [0.0], threading.Event()

    def sample() -> None:
        try:  # reading smaps costs the kernel a page-table walk: keep it off the measured cores' backs
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        while not done.is_set():
            peak[0] = max(peak[0], tree_pss_mb(proc.pid))
            done.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode != 0 or not result.exists():
        raise SystemExit(f"{runtime} failed (exit {proc.returncode}):\n{err[-3000:]}")
    return {**json.loads(result.read_text()), "peak_pss_mb": peak[0]}


def main() -> None:
    args = parser().parse_args()
    if args.child:
        child(args)
        return
    if not Path("/proc/self/smaps_rollup").exists():
        raise SystemExit("the memory sampler reads /proc/PID/smaps_rollup: Linux only")
    import tempfile

    n_params = sum(p.numel() for p in build(args).simulator.executor.workload.model.parameters())
    print(f"workload: conv2 [16, 32] / 128 hidden ({n_params:,} parameters), FedAvg, {args.clients} clients x "
          f"{args.local_steps} local steps of batch 20, 28x28 digits, {args.warmup} warm-up + {args.rounds} "
          f"measured rounds, 1 torch thread per process; {args.repeats} repeats, interleaved")
    rows: dict[str, list[dict[str, Any]]] = {r: [] for r in args.runtimes}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for runtime in args.runtimes:
                rows[runtime].append(measure(args, runtime, Path(tmp)))
    med = {r: statistics.median(x["s_per_round"] for x in v) for r, v in rows.items()}
    labels = {"bare": "bare PyTorch loop", "bare_parallel": f"bare loop, {args.workers} forked processes",
              "flower": f"Flower simulation, {args.actors} Ray actors",
              "serial": "fedgmr simulator, serial", "process": f"fedgmr simulator, process pool x{args.workers}"}
    print(f"{'runtime':40s} {'s/round':>8s}  {'per repeat':22s} {'start-up s':>10s} {'peak PSS MB':>11s}  vs bare")
    for r, v in rows.items():
        each = " ".join(f"{x['s_per_round']:.3f}" for x in v)
        start = statistics.median(x["startup_s"] for x in v)
        mem = statistics.median(x["peak_pss_mb"] for x in v)
        ratio = f"{med[r] / med['bare']:.2f}x time" if "bare" in med else "-"
        print(f"{labels[r]:40s} {med[r]:8.3f}  {each:22s} {start:10.1f} {mem:11.0f}  {ratio}")
    if "flower" in med and "serial" in med:
        print(f"fedgmr serial is {med['flower'] / med['serial']:.2f}x faster per round than Flower's simulation")
    if "process" in med and "serial" in med:
        from executor_speedup import free_core_check  # this folder is on sys.path (the script's own)

        print(f"process pool / serial speed-up: {med['serial'] / med['process']:.2f}x "
              f"(free-core check: pure Python in {args.workers} processes ran "
              f"{free_core_check(args.workers):.2f}x faster than in one)")
    if "bare_parallel" in med and "bare" in med:
        plain = med["bare"] / med["bare_parallel"]
        line = (f"bare loop in {args.workers} processes / bare loop: {plain:.2f}x (a plain multiprocessing.Pool, "
                f"state dicts pickled: with long jobs, the parallelism this machine has to give)")
        if "process" in med and "serial" in med:
            line += f"; the process pool's speed-up is {med['serial'] / med['process'] / plain:.2f}x the plain pool's"
        print(line)


if __name__ == "__main__":
    main()
