"""Peak resident memory and wall time per server step of a run with 100 and with 1,000
clients, or any other sizes (tiny model).

Each size runs in its own subprocess; the script prints the peak RSS (ru_maxrss) of
each, the model size (so the growth can be compared with clients x model size) and the
wall seconds per server step (after the first dispatch wave, excluding the build), with
the ratio of the largest size to the smallest. Issue 14's scale target (10,000 clients,
1,000 server steps: peak RSS under 2 GB, per-step time within 1.2x of 1,000 clients):

    python benchmarks/memory_clients.py --clients 1000 10000 --steps 1000 --concurrency 50 --max-staleness 20
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
import torch
torch.set_num_threads(1)
from fedgmr.methods import resolve_config
from fedgmr.experiment.build import build_experiment
n, steps, hidden = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
conc = None if sys.argv[4] == "none" else int(sys.argv[4])
stale = None if sys.argv[5] == "none" else int(sys.argv[5])
raw = {"method": "fedgmr", "seed": 0,
       "data": {"name": "synthetic", "partition": "iid", "options": {"num_samples": 40 * n + 4000}},
       "model": {"name": "mlp", "options": {"hidden": [hidden, hidden]}},
       "clients": {"num_clients": n, "heterogeneity": "high", "concurrency": conc},
       "training": {"local_steps": 2},
       "aggregation": {"max_staleness": stale},
       "restoration": {"check_interval": 10, "patience": 2},
       "run": {"max_steps": steps, "eval_every": 50}}
cfg = resolve_config(raw)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
exp = build_experiment(cfg)
exp.simulator.start()  # the first dispatch wave
t = time.perf_counter()
exp.simulator.run(max_steps=steps)
wall = time.perf_counter() - t
print(json.dumps({"step_ms": 1e3 * wall / max(exp.simulator.step, 1), "steps": exp.simulator.step, "clients": n, "params": exp.space.numel, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rss_before_build_mb": base / 1024, "buffered": len(exp.strategy._buffer),
                  "in_flight": len(exp.simulator.in_flight), "wall_s": round(wall, 1)}))
"""


def parser() -> argparse.ArgumentParser:
    """The command line (tests parse the documented commands with it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--hidden", type=int, default=64, help="MLP hidden width (tiny model)")
    ap.add_argument("--concurrency", default="none", help="clients training at once (default: all)")
    ap.add_argument("--max-staleness", default="none", help="drop buffered updates older than this")
    return ap


def main() -> None:
    args = parser().parse_args()
    print(f"mlp hidden={args.hidden}, {args.steps} server steps, concurrency={args.concurrency}, "
          f"max_staleness={args.max_staleness}")
    rows = []
    for n in args.clients:
        out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(args.steps), str(args.hidden),
                              str(args.concurrency), str(args.max_staleness)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    for r in rows:
        model_mb = r["params"] * 4 / 2**20
        print(f"clients={r['clients']:5d}  params={r['params']}  ({model_mb:.3f} MB)  peak RSS {r['peak_rss_mb']:.0f} MB  "
              f"(interpreter+torch before build: {r['rss_before_build_mb']:.0f} MB)  buffered={r['buffered']}  "
              f"in flight={r['in_flight']}  {r['steps']} steps in {r['wall_s']}s: {r['step_ms']:.1f} ms per server step")
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        growth = b["peak_rss_mb"] - a["peak_rss_mb"]
        naive = (b["clients"] - a["clients"]) * b["params"] * 4 / 2**20
        print(f"growth {a['clients']} -> {b['clients']} clients: {growth:+.0f} MB; "
              f"one dense model copy per extra client would be {naive:.0f} MB")
        print(f"time per server step {b['clients']} / {a['clients']} clients: {b['step_ms'] / a['step_ms']:.2f}x")


if __name__ == "__main__":
    main()
