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
- `warm-fastpoll`: the same, each SuperNode run as `fedgmr flower supernode --poll-interval
  S -- ...` (`--node-poll`, default 0.2 s): Flower's own `flower-supernode` with its fixed
  waits (3 s between asks for work when idle, 0.5 s between looks for a reply, 1-10 s
  back-off on a message's objects) cut to S; and the back-off of the ClientApps (the warm
  SuperExecs' `--pull-backoff`) and of the ServerApp (the run config's `pull-backoff`) on
  objects not there yet cut to `--pull-backoff` (default 0.2 s).
- `simulator`: the same config in the fedgmr simulator (serial executor, in this process):
  the compute alone, without processes or messages.

Each deployment runs `--warmup` + `--steps` server steps through `flwr run`; the rate is
measured between the evaluations (`eval_every: 1`) after the warm-up step and at the last
step, from the run's metrics.jsonl. Beside it, the CPU time per measured server step: for a
deployment, of every process it started (SuperLink, ServerApp, SuperNodes, SuperExecs and
the ClientApps they reaped; /proc's utime + stime + cutime + cstime of each process in
their sessions, read when the warm-up step's record appears and when the run's summary
does), for the simulator this process's. Modes are interleaved `--repeats` times; medians
are printed with each repeat's value and the ratio to the simulator, and the machine's
load average before and after. Needs `pip install
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

MODES = ("subprocess", "subprocess-fastpoll", "warm", "warm-fastpoll", "simulator")
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
    ap.add_argument("--node-poll", type=float, default=0.2,
                    help="warm-fastpoll: the SuperNodes' `fedgmr flower supernode --poll-interval`")
    ap.add_argument("--pull-backoff", type=float, default=0.2,
                    help="warm-fastpoll: the SuperExecs' `--pull-backoff` and the run config's `pull-backoff` "
                    "(the ServerApp's); 0: Flower's, 1 s doubling to 10 s")
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


def cpu_per_step(cpu: tuple[float, float], steps: int) -> float:
    """CPU seconds per server step between two readings of a CPU clock."""
    return (cpu[1] - cpu[0]) / steps


# ------------------------------------------------------------------------------------------ the simulator
def run_simulator(args: argparse.Namespace, cfg_path: Path) -> tuple[float, float]:
    import torch

    from fedgmr.config import read_config_file
    from fedgmr.experiment.build import build_experiment
    from fedgmr.methods import resolve_config

    torch.set_num_threads(1)
    exp = build_experiment(resolve_config(read_config_file(cfg_path)))
    stamps: list[tuple[int, float, float]] = [(0, time.perf_counter(), time.process_time())]
    try:
        exp.simulator.run(max_steps=args.warmup + args.steps,
                          on_step=lambda s: stamps.append((len(stamps), time.perf_counter(), time.process_time())))
    finally:
        exp.executor.close()
    # a step's stamp includes any test evaluation it triggers (digits' test split: milliseconds)
    rate = steps_per_minute([{"step": s, "t": t} for s, t, _ in stamps], args.warmup, "t")
    return rate, cpu_per_step((stamps[args.warmup][2], stamps[-1][2]), args.steps)


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


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def sessions_cpu(sessions: set[int]) -> dict[int, float]:
    """CPU seconds (user + system, with reaped children's) of the live and zombie processes
    in each of ``sessions`` (each process started here leads its own), by session."""
    total = dict.fromkeys(sessions, 0)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is fields[0]
        if int(fields[3]) in sessions:  # session id
            total[int(fields[3])] += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return {sid: ticks / _TICK for sid, ticks in total.items()}


#: what each started process (and what it starts) is counted as, by its name's prefix
ROLES = {"superlink": "SuperLink+ServerApp", "supernode": "SuperNodes", "superexec": "SuperExecs+ClientApps",
         "flwr-run": "flwr run"}


def role_cpu(names: dict[int, str], before: dict[int, float], after: dict[int, float], steps: int) -> dict[str, float]:
    """CPU seconds per server step of each role between two readings of ``sessions_cpu``."""
    out: dict[str, float] = {}
    for sid, name in names.items():
        role = next(r for prefix, r in ROLES.items() if name.startswith(prefix))
        out[role] = out.get(role, 0.0) + (after.get(sid, 0.0) - before.get(sid, 0.0)) / steps
    return out


def run_deployment(args: argparse.Namespace, mode: str, cfg_path: Path,
                   root: Path) -> tuple[float, float, dict[str, float]]:
    from fedgmr.flower.project import write_app, write_flower_config

    root.mkdir(parents=True)
    env = {**os.environ, "FLWR_HOME": str(root / "flwr-home"), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_TELEMETRY_ENABLED": "0", "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1", "FEDGMR_PROGRESS": "0"}
    if mode == "subprocess-fastpoll":
        env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = "0.2"
    procs: list[subprocess.Popen] = []
    names: dict[int, str] = {}

    def start(name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(root / f"{name}.log", "w")
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=root)
        procs.append(p)
        names[p.pid] = name
        return p

    out = root / "run"
    steps = args.warmup + args.steps
    run_config = {"config": str(cfg_path), "out-dir": str(out), "num-server-steps": steps, "reply-timeout": 300.0,
                  "step-timeout": 300.0, "max-wall": args.timeout, "node-wait": 120.0}
    if mode == "warm-fastpoll" and args.pull_backoff:
        run_config["pull-backoff"] = args.pull_backoff  # the ServerApp's pulls of the replies' objects
    app = write_app(root / "app", run_config)
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
            if mode in ("warm", "warm-fastpoll"):
                node += ["--isolation", "process"]
            if mode == "warm-fastpoll":  # Flower's own flower-supernode, its fixed sleeps capped
                node = [str(BIN / "fedgmr"), "flower", "supernode", "--poll-interval", str(args.node_poll), "--",
                        *node[1:]]
            p = start(f"supernode{i}", node)
            if mode in ("warm", "warm-fastpoll"):
                _wait_port(api, p, f"flower-supernode {i}")
                start(f"superexec{i}", [str(BIN / "fedgmr"), "flower", "superexec", "--runtime-api-address",
                                        f"127.0.0.1:{api}", "--insecure", "--warm-config", str(cfg_path)]
                      + (["--poll-interval", str(args.warm_poll)] if args.warm_poll else [])
                      + (["--pull-backoff", str(args.pull_backoff)]
                         if mode == "warm-fastpoll" and args.pull_backoff else []))
        run = start("flwr-run", [str(BIN / "flwr"), "run", str(app), "loop", "--stream"])
        deadline = time.monotonic() + args.timeout
        sessions = set(names)
        cpu: list[dict[int, float]] = []
        metrics = out / "metrics.jsonl"
        while not (out / "summary.json").exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"{mode}: no summary within {args.timeout} s (logs in {root})")
            if run.poll() not in (None, 0):
                raise SystemExit(f"{mode}: flwr run failed (logs in {root})")
            if not cpu and metrics.exists() and _records_through(metrics, args.warmup):
                cpu.append(sessions_cpu(sessions))  # the warm-up step's record is out
            time.sleep(0.05)
        cpu.append(sessions_cpu(sessions))
        summary = json.loads((out / "summary.json").read_text())
        if summary.get("steps") != steps:
            raise SystemExit(f"{mode}: the run made {summary.get('steps')} of {steps} steps (logs in {root})")
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
        if len(cpu) < 2:
            raise SystemExit(f"{mode}: the warm-up step's record never appeared before the summary (logs in {root})")
        roles = role_cpu(names, cpu[0], cpu[1], args.steps)
        return steps_per_minute(records, args.warmup, "wall_time"), sum(roles.values()), roles
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


def _records_through(metrics: Path, step: int) -> bool:
    """Whether metrics.jsonl holds a complete record of ``step`` (or a later one)."""
    for line in reversed(metrics.read_text().splitlines()):
        try:
            return json.loads(line)["step"] >= step
        except (ValueError, KeyError):
            continue
    return False


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
        print("load average before: " + " ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
        rates: dict[str, list[float]] = {m: [] for m in args.modes}
        cpus: dict[str, list[float]] = {m: [] for m in args.modes}
        for rep in range(args.repeats):
            for mode in args.modes:
                roles: dict[str, float] = {}
                if mode == "simulator":
                    rate, cpu = run_simulator(args, cfg_path)
                else:
                    rate, cpu, roles = run_deployment(args, mode, cfg_path, base / f"{mode}-{rep}")
                rates[mode].append(rate)
                cpus[mode].append(cpu)
                split = ", ".join(f"{r} {c:.2f}" for r, c in roles.items())
                print(f"  repeat {rep}: {mode}: {rate:.1f} steps/min, {cpu:.2f} CPU s/step"
                      + (f" ({split})" if split else ""), flush=True)
        print("load average after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    med = {m: statistics.median(v) for m, v in rates.items()}
    cpu_med = {m: statistics.median(v) for m, v in cpus.items()}
    labels = {"subprocess": "Flower deployment, flwr-clientapp per message",
              "subprocess-fastpoll": "  the same, SuperExec polling every 0.2 s",
              "warm": "Flower deployment, fedgmr flower superexec",
              "warm-fastpoll": f"  the same, fedgmr flower supernode ({args.node_poll:g} s)",
              "simulator": "fedgmr simulator, serial"}
    print(f"{'runtime':48s} {'steps/min':>9s} {'CPU s/step':>10s}  {'per repeat':24s} vs simulator")
    for m, v in rates.items():
        each = " ".join(f"{x:.1f}" for x in v)
        ratio = f"{med[m] / med['simulator']:.2f}x" if "simulator" in med else "-"
        print(f"{labels[m]:48s} {med[m]:9.1f} {cpu_med[m]:10.2f}  {each:24s} {ratio}")
    if "warm" in med and "subprocess" in med:
        print(f"warm SuperExec / Flower's default: {med['warm'] / med['subprocess']:.2f}x the server steps per minute")
    if "warm-fastpoll" in med and "warm" in med:
        print(f"fast-polling SuperNodes / warm SuperExec alone: {med['warm-fastpoll'] / med['warm']:.2f}x the server "
              "steps per minute")


if __name__ == "__main__":
    main()
