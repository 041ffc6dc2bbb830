"""Simulator overhead: the same number of local SGD steps through the virtual-clock
simulator (serial executor) and as a bare PyTorch loop in the same process.

Prints throughput (local steps / wall second) of both and the ratio
simulator / bare; medians over repeats run side by side (alternating), so machine noise
hits both alike. Target: ratio >= 0.95 (FedGMR with masks, docs/benchmarks.md).

    python benchmarks/sim_overhead.py [--repeats 5] [--steps 300] [--method fedgmr_wo_gmr]
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


def config(method: str, steps: int, local_steps: int, model: str) -> dict:
    model_cfg, data_options = MODELS[model]
    return {
        "method": method, "seed": 0,
        "data": {"name": "digits", "partition": "iid", "options": data_options},
        "model": model_cfg,
        "clients": {"num_clients": 10, "heterogeneity": "high"},
        "training": {"lr": 0.05, "local_steps": local_steps, "batch_size": 20},
        # no evaluation inside the timed loop: we measure the simulator, not the test set
        "restoration": {"trigger": "none"},
        "coordination": {"trigger": "k", "k": 3},
        "run": {"max_steps": steps, "eval_every": 10**9, "torch_threads": 1},
    }


def time_simulator(raw: dict) -> tuple[float, int]:
    cfg = resolve_config(raw)
    exp = build_experiment(cfg)
    sim = exp.simulator
    sim.start()  # warm-up outside the timed loop: first dispatch wave (lazy torch imports)
    t0 = time.perf_counter()
    sim.run(max_steps=cfg.run.max_steps)
    wall = time.perf_counter() - t0
    # the serial executor trains every job at dispatch; the warm-up wave was not timed
    jobs = sum(sim.dispatches) - cfg.clients.num_clients
    return wall, jobs * cfg.training.local_steps


def time_bare(raw: dict, total_steps: int) -> float:
    """A plain loop: one model, SGD, batches of 20 from one client's shard."""
    cfg = resolve_config(raw)
    exp = build_experiment(cfg)
    x, y = exp.simulator.executor.workload.client_data[0]
    model = exp.simulator.executor.workload.model
    opt = torch.optim.SGD(model.parameters(), lr=cfg.training.lr)
    gen = torch.Generator().manual_seed(0)
    bs = cfg.training.batch_size
    task_loss(model(x[:bs]), y[:bs], "classification").backward()  # warm-up
    opt.step()
    t0 = time.perf_counter()
    perm, pos = torch.randperm(len(y), generator=gen), 0
    model.train()
    for _ in range(total_steps):
        if pos + bs > len(y):
            perm, pos = torch.randperm(len(y), generator=gen), 0
        idx = perm[pos:pos + bs]
        pos += bs
        opt.zero_grad()
        loss = task_loss(model(x[idx]), y[idx], "classification")
        loss.backward()
        opt.step()
    return time.perf_counter() - t0


def parser() -> argparse.ArgumentParser:
    """The command line (tests parse the documented commands with it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200, help="server steps per simulator run")
    ap.add_argument("--local-steps", type=int, default=5)
    ap.add_argument("--model", choices=sorted(MODELS), nargs="+", default=["conv2", "cnn215k", "cnn"])
    ap.add_argument("--method", default="fedgmr_wo_gmr")
    return ap


def main() -> None:
    args = parser().parse_args()
    torch.set_num_threads(1)
    for model in args.model:
        raw = config(args.method, args.steps, args.local_steps, model)
        sim_tp, bare_tp = [], []
        for _ in range(args.repeats):
            wall, steps = time_simulator(raw)
            sim_tp.append(steps / wall)
            bare_tp.append(steps / time_bare(raw, steps))
        s, b = statistics.median(sim_tp), statistics.median(bare_tp)
        ratios = ", ".join(f"{x / y:.3f}" for x, y in zip(sim_tp, bare_tp))
        print(f"[{model}] method={args.method} local_steps={args.local_steps} server_steps={args.steps} "
              f"repeats={args.repeats} torch_threads=1")
        print(f"  simulator: {s:8.1f} local steps/s (median)   bare loop: {b:8.1f} local steps/s (median)")
        print(f"  ratio simulator/bare = {s / b:.3f}   (per repeat: {ratios})")


if __name__ == "__main__":
    main()
