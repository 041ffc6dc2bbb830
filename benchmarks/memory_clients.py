"""Peak resident memory and wall time per server step of a run with 100 and with 1,000
clients, or any other sizes (tiny model).

Each size runs in its own subprocess; the script prints the peak RSS (ru_maxrss) of
each, the model size (so the growth can be compared with clients x model size) and the
wall seconds per server step (after the first dispatch wave, excluding the build), with
the ratio of the largest size to the smallest. Issue 14's scale target (10,000 clients,
1,000 server steps: peak RSS under 2 GB, per-step time within 1.2x of 1,000 clients):

    python benchmarks/memory_clients.py --clients 1000 10000 --steps 1000 --concurrency 50 --max-staleness 20

It also prints the tensors the process can reach once the experiment is built (every
distinct storage: the data set, the client shards, models): with each client's shard a
view of the data set's one copy, the shards add nothing to it. ``--model char_lstm``
runs a character LSTM on Shakespeare's windows (``--data-root``) instead of the MLP;
``--code DIR_A DIR_B`` runs every size with two checkouts, interleaved (before/after):

    python benchmarks/memory_clients.py --model char_lstm --hidden 32 --clients 10000 --steps 20 \
        --code ../before . --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import gc, json, os, resource, sys, time
if os.environ.get("FEDGMR_BENCH_CODE"):  # --code: that checkout's fedgmr, before the working directory's
    sys.path.insert(0, os.environ["FEDGMR_BENCH_CODE"])
import torch
torch.set_num_threads(1)
from fedgmr.methods import resolve_config
from fedgmr.experiment.build import build_experiment
n, steps, hidden = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
conc = None if sys.argv[4] == "none" else int(sys.argv[4])
stale = None if sys.argv[5] == "none" else int(sys.argv[5])
model, root = sys.argv[6], sys.argv[7]
if model == "char_lstm":  # Shakespeare's windows, 4 per 80 characters, dealt IID
    data = {"name": "shakespeare", "root": root, "partition": "iid", "options": {"seq_len": 80, "stride": 20}}
    net = {"name": "char_lstm", "options": {"embed_dim": 8, "hidden": hidden, "layers": 1}}
else:
    data = {"name": "synthetic", "partition": "iid", "options": {"num_samples": 40 * n + 4000}}
    net = {"name": "mlp", "options": {"hidden": [hidden, hidden]}}


def tensor_mb():
    # every distinct tensor storage this process can reach (data, shards, models, buffers)
    gc.collect()
    seen = {}
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor) and o.device.type == "cpu":
            st = o.untyped_storage()
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
    return sum(seen.values()) / 2**20


raw = {"method": "fedgmr", "seed": 0, "data": data, "model": net,
       "clients": {"num_clients": n, "heterogeneity": "high", "concurrency": conc},
       "training": {"local_steps": 2},
       "aggregation": {"max_staleness": stale},
       "restoration": {"check_interval": 10, "patience": 2},
       "run": {"max_steps": steps, "eval_every": 50}}
cfg = resolve_config(raw)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
def rss_mb():  # resident now (the peak, ru_maxrss, keeps the loader's transient arrays)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


exp = build_experiment(cfg)
built_mb = tensor_mb()
built_rss = rss_mb()
shards = exp.simulator.executor.workload.client_data
shard_mb = sum(x.nbytes + y.nbytes for x, y in shards) / 2**20
exp.simulator.start()  # the first dispatch wave
t = time.perf_counter()
exp.simulator.run(max_steps=steps)
wall = time.perf_counter() - t
import fedgmr
print(json.dumps({"code": os.path.dirname(os.path.dirname(os.path.abspath(fedgmr.__file__))), "step_ms": 1e3 * wall / max(exp.simulator.step, 1), "steps": exp.simulator.step, "clients": n, "params": exp.space.numel, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rss_before_build_mb": base / 1024, "buffered": len(exp.strategy._buffer),
                  "tensor_mb": built_mb, "shard_mb": shard_mb, "rss_built_mb": built_rss, "rss_end_mb": rss_mb(),
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
    ap.add_argument("--model", choices=("mlp", "char_lstm"), default="mlp",
                    help="mlp on synthetic data, or char_lstm on Shakespeare (--data-root; 4 windows per 80 chars)")
    ap.add_argument("--data-root", default=os.path.join(os.environ.get("FEDGMR_DATA", "../shared/data"), "shakespeare"),
                    help="Shakespeare's play texts (for --model char_lstm)")
    ap.add_argument("--code", nargs="+", default=[None], metavar="DIR",
                    help="run each size with the fedgmr of each DIR (PYTHONPATH), interleaved: before/after")
    ap.add_argument("--repeats", type=int, default=1, help="rounds of every (size, code) run; medians reported")
    return ap


def _child(args: argparse.Namespace, n: int, code: str | None) -> dict:
    env = dict(os.environ)
    if code is not None:
        env["FEDGMR_BENCH_CODE"] = os.path.abspath(code)
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(args.steps), str(args.hidden),
                          str(args.concurrency), str(args.max_staleness), args.model, args.data_root],
                         capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median_row(runs: list[dict]) -> dict:
    row = dict(runs[0])
    for key in ("peak_rss_mb", "step_ms", "wall_s", "tensor_mb", "shard_mb", "rss_built_mb", "rss_end_mb"):
        row[key] = statistics.median(r[key] for r in runs)
    return row


def main() -> None:
    args = parser().parse_args()
    print(f"{args.model} hidden={args.hidden}, {args.steps} server steps, concurrency={args.concurrency}, "
          f"max_staleness={args.max_staleness}" + (f", {args.repeats} repeats (medians)" if args.repeats > 1 else ""))
    runs: dict[tuple[str | None, int], list[dict]] = {}
    for _ in range(args.repeats):  # interleaved: every (size, code) once per round
        for n in args.clients:
            for code in args.code:
                runs.setdefault((code, n), []).append(_child(args, n, code))
    for code in args.code:
        if code is not None:
            print(f"code: {code} (fedgmr from {runs[(code, args.clients[0])][0]['code']})")
        rows = [_median_row(runs[(code, n)]) for n in args.clients]
        _report(rows)


def _report(rows: list[dict]) -> None:
    for r in rows:
        model_mb = r["params"] * 4 / 2**20
        print(f"clients={r['clients']:5d}  params={r['params']}  ({model_mb:.3f} MB)  peak RSS {r['peak_rss_mb']:.0f} MB  "
              f"(interpreter+torch before build: {r['rss_before_build_mb']:.0f} MB)  after the build: tensors reachable "
              f"{r['tensor_mb']:.0f} MB (client shards {r['shard_mb']:.0f} MB), RSS {r['rss_built_mb']:.0f} MB; "
              f"RSS at the end {r['rss_end_mb']:.0f} MB  buffered={r['buffered']}  "
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
