"""Simulator throughput on a device: FedAvg through the virtual-clock simulator (serial
executor, ``run.device``) against a bare PyTorch FedAvg loop on the same device.

The workload: a CNN (5x5 conv 1->16, 5x5 conv 16->32, FC 1568->128->10) on 28x28 inputs
(digits resampled), 10 clients x 5 local steps of batch 20 per round, 20 rounds timed
after 2 warm-up rounds, no evaluation in the timed part. The bare loop does the same
rounds: per client it loads the global weights, takes 5 SGD steps on batches drawn from
the client's shard (moved to the device per batch, as the simulator does) and the
server averages the client models weighted by shard size. Prints local steps per second
of both and the ratio simulator / bare (medians over repeats run side by side).

    python benchmarks/gpu_throughput.py [--device auto|cpu|cuda|cuda:N|mps] [--repeats 3] [--rounds 20]

Without a GPU it runs on the CPU (``--device auto``); ``--rounds 5 --repeats 1`` keeps that short.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedgmr.device import resolve_device
from fedgmr.experiment.build import build_experiment
from fedgmr.methods import resolve_config
from fedgmr.training.losses import task_loss

CLIENTS, LOCAL_STEPS, BATCH, WARMUP = 10, 5, 20, 2


def config(device: str, rounds: int) -> dict:
    return {
        "method": "fedavg", "seed": 0,
        "data": {"name": "digits", "partition": "iid", "options": {"image_size": 28}},
        "model": {"name": "conv2", "options": {"channels": [16, 32], "hidden": 128}},
        "clients": {"num_clients": CLIENTS, "heterogeneity": "none"},
        "training": {"lr": 0.05, "local_steps": LOCAL_STEPS, "batch_size": BATCH},
        "restoration": {"trigger": "none"},
        "run": {"max_steps": WARMUP + rounds, "eval_every": 10**9, "torch_threads": 1, "device": device,
                "checkpoint_every": None, "checkpoint_seconds": None},
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_simulator(raw: dict, device: torch.device) -> float:
    """Wall seconds of the timed rounds through the simulator."""
    exp = build_experiment(resolve_config(raw))
    try:
        exp.simulator.run(max_steps=WARMUP)
        _sync(device)
        t0 = time.perf_counter()
        exp.simulator.run(max_steps=raw["run"]["max_steps"])
        _sync(device)
        return time.perf_counter() - t0
    finally:
        exp.executor.close()


def time_bare(raw: dict, device: torch.device, rounds: int) -> float:
    """Wall seconds of the same FedAvg rounds as a plain loop over one model."""
    exp = build_experiment(resolve_config(raw))
    exp.executor.close()
    shards = exp.simulator.executor.workload.client_data
    space = exp.space
    model = exp.simulator.executor.workload.model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=raw["training"]["lr"])
    gen = torch.Generator().manual_seed(0)
    weights = torch.tensor([float(len(y)) for _, y in shards], device=device)
    weights /= weights.sum()
    global_flat = space.flatten(model)

    def one_round() -> torch.Tensor:
        acc = torch.zeros_like(global_flat)
        for (x, y), w in zip(shards, weights):
            space.load(model, global_flat)
            model.train()
            for _ in range(LOCAL_STEPS):
                idx = torch.randint(len(y), (BATCH,), generator=gen)
                opt.zero_grad(set_to_none=True)
                task_loss(model(x[idx].to(device)), y[idx].to(device), "classification").backward()
                opt.step()
            acc += w * space.flatten(model)
        return acc

    for _ in range(WARMUP):
        global_flat = one_round()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(rounds):
        global_flat = one_round()
    _sync(device)
    return time.perf_counter() - t0


def parser() -> argparse.ArgumentParser:
    """The command line (tests parse the documented commands with it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="run.device: auto, cpu, cuda, cuda:N or mps")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=20, help="timed FedAvg rounds (after 2 warm-up rounds)")
    return ap


def main() -> None:
    args = parser().parse_args()
    torch.set_num_threads(1)
    device = resolve_device(args.device)
    raw = config(args.device, args.rounds)
    steps = args.rounds * CLIENTS * LOCAL_STEPS
    sim_tp, bare_tp = [], []
    for _ in range(args.repeats):  # alternating: machine noise hits both alike
        sim_tp.append(steps / time_simulator(raw, device))
        bare_tp.append(steps / time_bare(raw, device, args.rounds))
    s, b = statistics.median(sim_tp), statistics.median(bare_tp)
    name = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    print(f"[{device}{name}] fedavg, {CLIENTS} clients x {LOCAL_STEPS} local steps of batch {BATCH}, "
          f"{args.rounds} rounds after {WARMUP} warm-up, repeats={args.repeats}, torch_threads=1")
    print(f"  simulator: {s:8.1f} local steps/s (median)   bare loop: {b:8.1f} local steps/s (median)")
    print(f"  ratio simulator/bare = {s / b:.3f}   (per repeat: "
          + ", ".join(f"{x / y:.3f}" for x, y in zip(sim_tp, bare_tp)) + ")")


if __name__ == "__main__":
    main()
