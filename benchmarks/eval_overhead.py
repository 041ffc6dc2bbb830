"""What test evaluation costs a run, and what evaluating in a worker process gives back.

One cell (a preset and method, shortened with ``--max-time``) run three ways, each in a
fresh process, interleaved over the repeats:

* ``inproc``: test evaluation on the virtual-time grid in the simulator's process (the
  default);
* ``worker``: the same grid evaluated in a forked worker while the simulation goes on
  (``FEDGMR_TEST_WORKER=1``, fedgmr/sim/evalworker.py; ``--worker-processes N``: N of
  them, taking the published models in turn); its metrics must equal ``inproc``'s, which
  the script checks;
* ``off``: test evaluation switched off (``run.eval_interval`` beyond the run: the
  initial and the final model only).

It prints wall time and process CPU time (the worker's included: ``os.times()`` of the
children once it has exited), medians over the repeats, and the ratios to ``off``.
``--profile VARIANT`` prints a cProfile of one run instead (top 15 by cumulative time).

    python benchmarks/eval_overhead.py [--preset quickstart] [--method fedasync] [--max-time 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = ("inproc", "worker", "off")


def _config(args: argparse.Namespace, variant: str):
    from fedgmr.methods import resolve_config
    from fedgmr.presets import load_preset

    raw = load_preset(args.preset)
    raw["method"] = args.method
    raw.setdefault("run", {})
    raw["run"] = {**raw["run"], "max_time": args.max_time, "t_star": None}
    if args.data_root:
        raw["data"] = {**raw.get("data", {}), "root": args.data_root}
    if variant == "off":
        raw["run"]["eval_interval"] = 10 * args.max_time
    return resolve_config(raw)


def child(args: argparse.Namespace, variant: str) -> None:
    os.environ["FEDGMR_TEST_WORKER"] = str(args.worker_processes) if variant == "worker" else "0"
    from fedgmr.experiment.build import build_experiment

    cfg = _config(args, variant)
    records: list[dict] = []
    exp = build_experiment(cfg, on_record=records.append)
    sim = exp.simulator
    if variant == "worker" and sim.test_worker is None:
        raise SystemExit("the test worker is not available here")
    c0, w0, k0 = time.process_time(), time.perf_counter(), os.times()
    try:
        if args.profile:
            import cProfile
            import pstats

            prof = cProfile.Profile(time.process_time)  # CPU time: holds on a busy machine
            prof.enable()
        sim.run(max_time=cfg.run.max_time)
        sim.finish()  # closes the worker: its CPU time is in os.times()' children from here
        if args.profile:
            prof.disable()
    finally:
        exp.executor.close()
    k1 = os.times()
    if args.profile:
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        print(f"{args.preset} / {args.method}, max_time {args.max_time:g} s, test evaluation {variant}: "
              f"{sim.step} server steps, {len(records)} records; wall {wall:.2f} s, CPU {cpu:.2f} s "
              f"(+ worker {(k1.children_user + k1.children_system) - (k0.children_user + k0.children_system):.2f} s)")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(15)
        return
    out = {"variant": variant, "wall": time.perf_counter() - w0, "cpu": time.process_time() - c0,
           "child_cpu": (k1.children_user + k1.children_system) - (k0.children_user + k0.children_system),
           "steps": sim.step, "records": len(records), "metrics": records if variant != "off" else None}
    print(json.dumps(out))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="quickstart")
    ap.add_argument("--method", default="fedasync")
    ap.add_argument("--max-time", type=float, default=300.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data-root", default=None, help="data.root (e.g. /path/to/shared/data/mnist)")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--worker-processes", type=int, default=1,
                    help="evaluation processes of the worker variant (FEDGMR_TEST_WORKER=N)")
    ap.add_argument("--profile", choices=VARIANTS, help="cProfile one run of this variant (top 15 by cumulative CPU time)")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.child or args.profile:
        child(args, args.child or args.profile)
        return
    base = [sys.executable, __file__, "--preset", args.preset, "--method", args.method,
            "--max-time", str(args.max_time), "--worker-processes", str(args.worker_processes)]
    base += ["--data-root", args.data_root] if args.data_root else []
    results: dict[str, list[dict]] = {v: [] for v in args.variants}
    for _ in range(args.repeats):
        for v in args.variants:
            proc = subprocess.run(base + ["--child", v], check=True, capture_output=True, text=True)
            results[v].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    med = statistics.median
    first = results[args.variants[0]][0]
    print(f"{args.preset} / {args.method}, max_time {args.max_time:g} s: {first['steps']} server steps; "
          f"{args.repeats} repeats, interleaved, one process per run")
    print(f"{'variant':10}{'records':>8}{'wall s':>9}{'CPU s':>9}{'  (main + worker)':18}  per repeat wall s")
    for v in args.variants:
        rs = results[v]
        cpu = [r["cpu"] + r["child_cpu"] for r in rs]
        print(f"{v:10}{rs[0]['records']:8d}{med(r['wall'] for r in rs):9.2f}{med(cpu):9.2f}"
              f"  ({med(r['cpu'] for r in rs):.2f} + {med(r['child_cpu'] for r in rs):.2f})"
              "  " + " ".join(f"{r['wall']:.2f}" for r in rs))
    if "inproc" in results and "worker" in results:
        same = all(r["metrics"] == results["inproc"][0]["metrics"] for v in ("inproc", "worker") for r in results[v])
        print(f"worker metrics identical to in-process: {same}")
        if not same:
            raise SystemExit(1)
    if "off" in results:
        off_w = med(r["wall"] for r in results["off"])
        off_c = med(r["cpu"] + r["child_cpu"] for r in results["off"])
        for v in args.variants:
            if v != "off":
                rs = results[v]
                print(f"{v} / off: wall {med(r['wall'] for r in rs) / off_w:.2f}x, "
                      f"CPU {med(r['cpu'] + r['child_cpu'] for r in rs) / off_c:.2f}x")


if __name__ == "__main__":
    main()
