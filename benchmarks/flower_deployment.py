"""Server steps per minute of a real Flower deployment on loopback, per ClientApp launcher, against the simulator.

One FedAvg workload (`vs_flower.py`'s: the 215 k-parameter CNN, 28x28 digits, `--local-steps`
SGD steps of batch 20, one torch thread per process) with `--nodes` clients, run as

- `subprocess`: Flower 1.42's default deployment. A `flower-superlink` and `--nodes`
  `flower-supernode`s (`--isolation subprocess`); every message starts a `flwr-clientapp`
  process. Flower's SuperExec polls for tasks every second.
- `subprocess-fastpoll`: the same, with `FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.2` (Flower's
  own knob, the warm SuperExec's default) in the SuperNodes' environment: what remains is
  the per-message process.
- `warm`: `flower-supernode --isolation process` beside `fedgmr flower superexec
  --warm-config CONFIG` (polls every 0.2 s): each message runs in a fork of a process that
  has torch, Flower, FedGMR and the node's data loaded.
- `simulator`: the same config in the fedgmr simulator (serial executor, in this process):
  the compute alone, without processes or messages.

Each deployment runs `--warmup` + `--steps` server steps through `flwr run`; the rate is
measured between the evaluations (`eval_every: 1`) after the warm-up step and at the last
step, from the run's metrics.jsonl. Modes are interleaved `--repeats` times; medians are
printed with each repeat's value and the ratio to the simulator. Needs `pip install
'fedgmr[flower]'`; all processes listen on 127.0.0.1 only.

    python benchmarks/flower_deployment.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

MODES = ("subprocess", "subprocess-fastpoll", "warm", "simulator")
BIN = Path(sys.executable).parent
if str(Path(__file__).resolve().parent) not in sys.path:  # as when run as a script: vs_flower is a sibling
    sys.path.insert(0, str(Path(__file__).resolve().parent))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=5, help="SuperNodes (= clients, one partition each)")
    ap.add_argument("--steps", type=int, default=10, help="measured server steps")
    ap.add_argument("--warmup", type=int, default=2, help="server steps before the measured ones")
    ap.add_argument("--local-steps", type=int, default=5)
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--warm-poll", type=float, help="the warm SuperExec's --poll-interval (default: its own)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds a deployment may take")
    ap.add_argument("--keep", help="keep every deployment's logs and run directory under this folder")
    return ap


def raw_config(args: argparse.Namespace) -> dict[str, Any]:
    from vs_flower import workload_config  # this folder is on sys.path (above)

    return workload_config(args.nodes, args.local_steps, args.warmup + args.steps, eval_every=1)


def steps_per_minute(records: list[dict[str, Any]], warmup: int, clock: str) -> float:
    """Server steps per minute between the evaluation at step ``warmup`` and the last one."""
    first = next(r for r in records if r["step"] == warmup)
    last = records[-1]
    return 60.0 * (last["step"] - first["step"]) / (last[clock] - first[clock])


# ------------------------------------------------------------------------------------------ the simulator
def run_simulator(args: argparse.Namespace, cfg_path: Path) -> float:
    import torch

    from fedgmr.config import read_config_file
    from fedgmr.experiment.build import build_experiment
    from fedgmr.methods import resolve_config

    torch.set_num_threads(1)
    exp = build_experiment(resolve_config(read_config_file(cfg_path)))
    stamps: list[tuple[int, float]] = [(0, time.perf_counter())]
    try:
        exp.simulator.run(max_steps=args.warmup + args.steps,
                          on_step=lambda s: stamps.append((len(stamps), time.perf_counter())))
    finally:
        exp.executor.close()
    # a step's stamp includes any test evaluation it triggers (digits' test split: milliseconds)
    return steps_per_minute([{"step": s, "t": t} for s, t in stamps], args.warmup, "t")


# ------------------------------------------------------------------------------------------ a deployment
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited early (status {proc.returncode})")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise SystemExit(f"{what} did not listen on port {port} within {timeout} s")


def run_deployment(args: argparse.Namespace, mode: str, cfg_path: Path, root: Path) -> float:
    from fedgmr.flower.project import write_app, write_flower_config

    root.mkdir(parents=True)
    env = {**os.environ, "FLWR_HOME": str(root / "flwr-home"), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_TELEMETRY_ENABLED": "0", "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1", "FEDGMR_PROGRESS": "0"}
    if mode == "subprocess-fastpoll":
        env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = "0.2"
    procs: list[subprocess.Popen] = []

    def start(name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(root / f"{name}.log", "w")
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=root)
        procs.append(p)
        return p

    out = root / "run"
    steps = args.warmup + args.steps
    app = write_app(root / "app", {"config": str(cfg_path), "out-dir": str(out), "num-server-steps": steps,
                                   "reply-timeout": 300.0, "step-timeout": 300.0, "max-wall": args.timeout,
                                   "node-wait": 120.0})
    port = _free_port()
    write_flower_config(env["FLWR_HOME"], {"loop": {"address": f"127.0.0.1:{port}", "insecure": True}})
    try:
        link = start("superlink", [str(BIN / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port",
                                   str(port), "--database", str(root / "state.db"),
                                   "--disable-runtime-dependency-installation"])
        _wait_port(port, link, "flower-superlink")
        for i in range(args.nodes):
            api = _free_port()
            node = [str(BIN / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{port}", "--host",
                    "127.0.0.1", "--port", str(api), "--node-config", f"partition-id={i} num-partitions={args.nodes}"]
            if mode == "warm":
                node += ["--isolation", "process"]
            p = start(f"supernode{i}", node)
            if mode == "warm":
                _wait_port(api, p, f"flower-supernode {i}")
                start(f"superexec{i}", [str(BIN / "fedgmr"), "flower", "superexec", "--runtime-api-address",
                                        f"127.0.0.1:{api}", "--insecure", "--warm-config", str(cfg_path)]
                      + (["--poll-interval", str(args.warm_poll)] if args.warm_poll else []))
        run = start("flwr-run", [str(BIN / "flwr"), "run", str(app), "loop", "--stream"])
        deadline = time.monotonic() + args.timeout
        while not (out / "summary.json").exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"{mode}: no summary within {args.timeout} s (logs in {root})")
            if run.poll() not in (None, 0):
                raise SystemExit(f"{mode}: flwr run failed (logs in {root})")
            time.sleep(0.5)
        summary = json.loads((out / "summary.json").read_text())
        if summary.get("steps") != steps:
            raise SystemExit(f"{mode}: the run made {summary.get('steps')} of {steps} steps (logs in {root})")
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return steps_per_minute(records, args.warmup, "wall_time")
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def main() -> None:
    args = parser().parse_args()
    if any(m != "simulator" for m in args.modes):
        try:
            import flwr  # noqa: F401
        except ImportError:
            raise SystemExit("the deployments need Flower: pip install 'fedgmr[flower]'")
    keep = Path(args.keep) if args.keep else None
    with tempfile.TemporaryDirectory() as tmp:
        base = keep or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        cfg_path = base / "fedgmr.yaml"
        cfg_path.write_text(yaml.safe_dump(raw_config(args)))
        print(f"workload: conv2 [16, 32] / 128 hidden, FedAvg, {args.nodes} nodes x {args.local_steps} local steps "
              f"of batch 20, 28x28 digits, eval every step; {args.warmup} warm-up + {args.steps} measured server "
              f"steps; {args.repeats} repeats, interleaved", flush=True)
        rates: dict[str, list[float]] = {m: [] for m in args.modes}
        for rep in range(args.repeats):
            for mode in args.modes:
                if mode == "simulator":
                    rates[mode].append(run_simulator(args, cfg_path))
                else:
                    rates[mode].append(run_deployment(args, mode, cfg_path, base / f"{mode}-{rep}"))
                print(f"  repeat {rep}: {mode}: {rates[mode][-1]:.1f} steps/min", flush=True)
    med = {m: statistics.median(v) for m, v in rates.items()}
    labels = {"subprocess": "Flower deployment, flwr-clientapp per message",
              "subprocess-fastpoll": "  the same, SuperExec polling every 0.2 s",
              "warm": "Flower deployment, fedgmr flower superexec",
              "simulator": "fedgmr simulator, serial"}
    print(f"{'runtime':48s} {'steps/min':>9s}  {'per repeat':24s} vs simulator")
    for m, v in rates.items():
        each = " ".join(f"{x:.1f}" for x in v)
        ratio = f"{med[m] / med['simulator']:.2f}x" if "simulator" in med else "-"
        print(f"{labels[m]:48s} {med[m]:9.1f}  {each:24s} {ratio}")
    if "warm" in med and "subprocess" in med:
        print(f"warm SuperExec / Flower's default: {med['warm'] / med['subprocess']:.2f}x the server steps per minute")


if __name__ == "__main__":
    main()
