"""What a Table-1 cell costs: recorded cells of a sweep directory rerun from their own
``config.yaml``, with one or more checkouts of the code, interleaved, CPU time beside wall.

For each selected cell (default: the MNIST High non-IID seed-0 cell of every method in
``measured/table1``) and each checkout given with ``--code`` (default: this one), one
``python -m fedgmr run CELL/config.yaml`` in a fresh process per repeat, in the order
repeat -> cell -> checkout, so that a busy machine slows every checkout alike. It prints per
cell and checkout the median wall and CPU seconds (user + system of the run's process and
its children), the CPU ratio to the first checkout, and whether the rerun's
``metrics.jsonl`` equals the recorded one.

Equality is checked record by record, every field but ``client_uploads``: cells of
``measured/table1`` that were resumed from a checkpoint recorded the uploads per client
since the resume (a counting defect fixed since; the totals, ``uploads``, are exact), so
that one field cannot match a rerun from the start. Anything else that differs is printed
and fails the script (exit 1).

    python benchmarks/table1_cells.py --code ../before . --repeats 1
    python benchmarks/table1_cells.py --methods fedasync fiarse --only heterogeneity=low
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
METHODS = ("fedavg", "fedasync", "heterofl", "fedrolex", "fjord", "fedgmr", "fiarse")
#: fields of a record not compared (see the module docstring)
UNCOMPARED = ("client_uploads",)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", default=str(REPO / "measured" / "table1"), help="a sweep directory of recorded cells")
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--only", action="append", default=[], metavar="KEY=VALUE",
                    help="cell selection beside the method (repeatable; defaults: preset=mnist, "
                         "heterogeneity=high, partition=dirichlet, seed=0)")
    ap.add_argument("--code", nargs="+", default=[str(REPO)], metavar="DIR",
                    help="checkouts to run, interleaved (the first is the reference of the ratios)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--data", default=os.environ.get("FEDGMR_DATA", str(REPO.parent / "shared" / "data")),
                    help="the directory holding mnist/ (data.root is set to DATA/mnist or DATA/fashion_mnist)")
    return ap


#: the cell of each method that is rerun unless ``--only`` says otherwise
DEFAULT_ONLY = {"preset": ["mnist"], "heterogeneity": ["high"], "partition": ["dirichlet"], "seed": ["0"]}


def _selection(only: list[str]) -> dict[str, list[str]]:
    """The defaults, with each axis ``--only`` names replaced (the sweep's own parser)."""
    from fedgmr.errors import ConfigError
    from fedgmr.experiment.sweep import parse_only

    try:
        return {**DEFAULT_ONLY, **parse_only(only)}
    except ConfigError as exc:
        raise SystemExit(str(exc)) from None


def _point(cell: Path) -> dict[str, str]:
    """A cell's axis values, from its name (``preset=mnist,method=fedavg,...``)."""
    return dict(token.partition("=")[::2] for token in cell.name.split(","))


def _cells(cells: Path, methods: list[str], sel: dict[str, list[str]]) -> dict[str, Path]:
    """Per method, its one recorded cell whose name (``axis=value,...``) matches ``sel``."""
    found: dict[str, list[Path]] = {m: [] for m in methods}
    for path in sorted(p for p in cells.iterdir() if (p / "config.yaml").is_file()):
        point = _point(path)
        if point.get("method") in found and all(point.get(k) in vs for k, vs in sel.items()):
            found[point["method"]].append(path)
    for m, paths in found.items():
        if len(paths) != 1 or not (paths[0] / "metrics.jsonl").is_file():
            raise SystemExit(f"{m}: {len(paths)} recorded cells in {cells} match "
                             f"{', '.join(f'{k}={v}' for k, vs in sel.items() for v in vs)} (need one, with metrics.jsonl)")
    return {m: paths[0] for m, paths in found.items()}


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _differences(got: list[dict], want: list[dict]) -> list[str]:
    if len(got) != len(want):
        return [f"{len(got)} records against {len(want)}"]
    out = []
    for i, (a, b) in enumerate(zip(got, want)):
        for key in sorted(set(a) | set(b)):
            if key not in UNCOMPARED and a.get(key) != b.get(key):
                out.append(f"record {i} (time {b.get('time')}): {key} {a.get(key)!r} != {b.get(key)!r}")
    return out


def _run(cell: Path, code: str, data: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(code), "FEDGMR_DATA": data}
    env.pop("FEDGMR_TEST_WORKER", None)
    root = os.path.join(data, _point(cell).get("preset", ""))  # data/mnist, data/fashion_mnist
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "fedgmr", "run", str(cell / "config.yaml"), "--out", str(out),
                               "-q", "--set", f"data.root={root}"], env=env, capture_output=True, text=True,
                              cwd=os.path.abspath(code))
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"{cell.name} with {code} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        diff = _differences(_records(out / "metrics.jsonl"), _records(cell / "metrics.jsonl"))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "diff": diff}


def main() -> None:
    args = parser().parse_args()
    sel = _selection(args.only)
    cells = _cells(Path(args.cells), args.methods, sel)
    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.repeats):
        for m, cell in cells.items():
            for code in args.code:
                r = _run(cell, code, args.data)
                runs.setdefault((m, code), []).append(r)
                print(f"  {m} with {code}: wall {r['wall']:.1f} s, CPU {r['cpu']:.1f} s, "
                      f"{'identical' if not r['diff'] else 'DIFFER'}", file=sys.stderr, flush=True)
    med = statistics.median
    chosen = ", ".join(f"{k}={','.join(v)}" for k, v in sel.items())
    print(f"cells: {args.cells} ({chosen}); "
          f"{args.repeats} repeat(s), interleaved, one process per run")
    print(f"{'method':10}{'code':>24}{'wall s':>9}{'CPU s':>9}{'CPU / first':>13}  metrics")
    bad = False
    totals = {code: 0.0 for code in args.code}
    for m in args.methods:
        ref = med(r["cpu"] for r in runs[(m, args.code[0])])
        for code in args.code:
            rs = runs[(m, code)]
            cpu = med(r["cpu"] for r in rs)
            totals[code] += cpu
            diffs = [d for r in rs for d in r["diff"]]
            bad |= bool(diffs)
            label = code if len(code) <= 24 else "..." + code[-21:]
            print(f"{m:10}{label:>24}{med(r['wall'] for r in rs):9.1f}{cpu:9.1f}{cpu / ref:12.2f}x  "
                  + ("identical" if not diffs else "DIFFER: " + "; ".join(diffs[:3])))
    for code in args.code:
        print(f"sum of the cells' CPU, {code}: {totals[code]:.1f} s ({totals[code] / totals[args.code[0]]:.2f}x)")
    if bad:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
