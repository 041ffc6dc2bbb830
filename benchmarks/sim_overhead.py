"""Simulator overhead: the same number of local SGD steps through the virtual-clock
simulator (serial executor) and as a bare PyTorch loop in the same process.

Prints throughput (local steps per second of process CPU time, and per wall second) of
both and the ratios simulator / bare; medians over repeats run side by side (alternating),
so machine noise hits both alike. CPU time is the figure that holds on a busy machine;
wall time is printed beside it. Target: CPU-time ratio >= 0.95 for FedGMR with masks and
restoration on (the default: validation checks and mask refreshes every
``--check-interval`` server steps, inside the timed loop; docs/benchmarks.md).

    python benchmarks/sim_overhead.py [--repeats 5] [--steps 50] [--method fedgmr] [--check-interval 25]

The reading before issue 39 (FedGMR without restoration: no validation checks, no mask
refresh) is ``--method fedgmr_wo_gmr --no-restoration``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedgmr.experiment.build import build_experiment
from fedgmr.methods import resolve_config
from fedgmr.training.losses import task_loss


MODELS = {
    # the paper's FEMNIST model on 28x28 inputs (digits resampled), and a tiny CNN on 8x8
    "conv2": ({"name": "conv2"}, {"image_size": 28}),
    "cnn": ({"name": "cnn", "options": {"channels": [32, 64]}}, {}),
    # benchmarks/vs_flower.py's 215 k-parameter CNN (conv 1->16 5x5, conv 16->32 5x5, FC 1568->128->10)
    "cnn215k": ({"name": "conv2", "options": {"channels": [16, 32], "hidden": 128}}, {"image_size": 28}),
}


def config(method: str, steps: int, local_steps: int, model: str, restoration: bool = True,
           check_interval: int = 25) -> dict:
    model_cfg, data_options = MODELS[model]
    return {
        "method": method, "seed": 0,
        "data": {"name": "digits", "partition": "iid", "options": data_options},
        "model": model_cfg,
        "clients": {"num_clients": 10, "heterogeneity": "high"},
        "training": {"lr": 0.05, "local_steps": local_steps, "batch_size": 20},
        # restoration on: the validation checks and mask refreshes run inside the timed loop
        # (the method's trigger, every check_interval server steps); off: neither runs
        "restoration": {"check_interval": check_interval} if restoration else {"trigger": "none"},
        "coordination": {"trigger": "k", "k": 3},
        # no test evaluation inside the timed loop: we measure the simulator, not the test set
        "run": {"max_steps": steps, "eval_every": 10**9, "torch_threads": 1},
    }


def time_simulator(raw: dict) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, local steps) of one simulator run after its first wave."""
    cfg = resolve_config(raw)
    exp = build_experiment(cfg)
    sim = exp.simulator
    sim.start()  # warm-up outside the timed loop: first dispatch wave (lazy torch imports)
    before = sum(sim.dispatches)
    c0, t0 = time.process_time(), time.perf_counter()
    sim.run(max_steps=cfg.run.max_steps)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    # the serial executor trains every job at dispatch; the warm-up wave was not timed
    jobs = sum(sim.dispatches) - before
    exp.executor.close()
    return cpu, wall, jobs * cfg.training.local_steps


def time_bare(raw: dict, total_steps: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of a plain loop: one model, SGD, batches of 20 from one
    client's shard."""
    cfg = resolve_config(raw)
    exp = build_experiment(cfg)
    x, y = exp.simulator.executor.workload.client_data[0]
    model = exp.simulator.executor.workload.model
    return bare_sgd(model, x, y, cfg.training.lr, cfg.training.batch_size, total_steps)


def bare_sgd(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float, batch_size: int,
             steps: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of ``steps`` plain SGD steps on ``model`` over shuffled
    batches of ``(x, y)``, after one untimed warm-up step: the bare loop every overhead
    benchmark compares against (also benchmarks/job_overhead.py)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(0)
    bs = min(batch_size, len(y))
    model.train()
    task_loss(model(x[:bs]), y[:bs], "classification").backward()  # warm-up
    opt.step()
    c0, t0 = time.process_time(), time.perf_counter()
    perm, pos = torch.randperm(len(y), generator=gen), 0
    for _ in range(steps):
        if pos + bs > len(y):
            perm, pos = torch.randperm(len(y), generator=gen), 0
        idx = perm[pos:pos + bs]
        pos += bs
        opt.zero_grad()
        loss = task_loss(model(x[idx]), y[idx], "classification")
        loss.backward()
        opt.step()
    return time.process_time() - c0, time.perf_counter() - t0


def parser() -> argparse.ArgumentParser:
    """The command line (tests parse the documented commands with it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=50, help="server steps per simulator run")
    ap.add_argument("--local-steps", type=int, default=5)
    ap.add_argument("--model", choices=sorted(MODELS), nargs="+", default=["conv2", "cnn215k", "cnn"])
    ap.add_argument("--method", default="fedgmr")
    ap.add_argument("--check-interval", type=int, default=25,
                    help="server steps between validation checks and mask refreshes (the library default)")
    ap.add_argument("--no-restoration", dest="restoration", action="store_false",
                    help="restoration.trigger none: no validation checks, no mask refresh (the pre-issue-39 reading)")
    return ap


def main() -> None:
    args = parser().parse_args()
    torch.set_num_threads(1)
    for model in args.model:
        raw = config(args.method, args.steps, args.local_steps, model, args.restoration, args.check_interval)
        cpu_r, wall_r, sim_cpu, bare_cpu, sim_wall, bare_wall = [], [], [], [], [], []
        for _ in range(args.repeats):  # interleaved: simulator, bare, simulator, bare, ...
            c, w, steps = time_simulator(raw)
            bc, bw = time_bare(raw, steps)
            sim_cpu.append(steps / c)
            bare_cpu.append(steps / bc)
            sim_wall.append(steps / w)
            bare_wall.append(steps / bw)
            cpu_r.append(bc / c)
            wall_r.append(bw / w)
        restoration = (f"restoration on (checks and mask refreshes every {args.check_interval} steps)"
                       if args.restoration else "restoration off")
        print(f"[{model}] method={args.method} {restoration} local_steps={args.local_steps} "
              f"server_steps={args.steps} repeats={args.repeats} (interleaved) torch_threads=1")
        print(f"  CPU time:  simulator {statistics.median(sim_cpu):8.1f} local steps/s   "
              f"bare loop {statistics.median(bare_cpu):8.1f} local steps/s   "
              f"ratio simulator/bare = {statistics.median(cpu_r):.3f}   (per repeat: {' '.join(f'{x:.3f}' for x in cpu_r)})")
        print(f"  wall time: simulator {statistics.median(sim_wall):8.1f} local steps/s   "
              f"bare loop {statistics.median(bare_wall):8.1f} local steps/s   "
              f"ratio simulator/bare = {statistics.median(wall_r):.3f}   (per repeat: {' '.join(f'{x:.3f}' for x in wall_r)})")


if __name__ == "__main__":
    main()
