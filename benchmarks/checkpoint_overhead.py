"""Checkpoint overhead: the quickstart with the default checkpoints against the same run
with checkpoints off (``run.checkpoint_every=null``, ``run.checkpoint_seconds=null``).

Runs the two side by side (alternating, so machine noise hits both alike), ``--repeats``
times each, and prints the median wall time of each and their ratio. It also times the
checkpoints themselves inside the default runs (state snapshot + writing + fsync), which
gives the overhead without the run-to-run noise of a shared machine. Target: < 2 %.
The metrics of every run are compared too: checkpoints must not change them.

    python benchmarks/checkpoint_overhead.py [--repeats 3] [--preset quickstart] [--set run.max_time=600]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import fedgmr.experiment.runner as runner
from fedgmr.cli import resolve
from fedgmr.sim.simulator import Simulator
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy

OFF = ["run.checkpoint_every=null", "run.checkpoint_seconds=null"]


class _Timer:
    """Wraps the functions a checkpoint calls and adds up their wall time."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.count = 0

    def wrap(self, fn: Callable[..., Any], counts: bool = False) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
                self.count += counts
        return timed


def one_run(preset: str, overrides: list[str], out: Path) -> tuple[float, _Timer, bytes]:
    """Wall seconds of one run, the time its checkpoints took, and its metrics file."""
    cfg = resolve(preset, overrides)
    timer = _Timer()
    saved = (runner.save_checkpoint, Simulator.state_dict, MaskedBufferedStrategy.state_dict)
    runner.save_checkpoint = timer.wrap(saved[0], counts=True)
    Simulator.state_dict = timer.wrap(saved[1])  # type: ignore[method-assign]
    MaskedBufferedStrategy.state_dict = timer.wrap(saved[2])  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        runner.run_experiment(cfg, out)
        wall = time.perf_counter() - t0
    finally:
        runner.save_checkpoint, Simulator.state_dict, MaskedBufferedStrategy.state_dict = saved  # type: ignore
    return wall, timer, (out / "metrics.jsonl").read_bytes()


def parser() -> argparse.ArgumentParser:
    """The command line (tests parse the documented commands with it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--preset", default="quickstart")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="override a key (both runs)")
    return ap


def main() -> None:
    args = parser().parse_args()
    walls: dict[str, list[float]] = {"default": [], "off": []}
    inside: list[float] = []
    counts: list[int] = []
    metrics: set[bytes] = set()
    with tempfile.TemporaryDirectory() as tmp:
        # warm-up, not timed: data set cache, lazy imports, allocator
        one_run(args.preset, [*args.overrides, *OFF, "run.max_time=20", "run.max_steps=null"], Path(tmp) / "warm")
        for i in range(args.repeats):
            order = ("default", "off") if i % 2 == 0 else ("off", "default")
            for name in order:
                extra = OFF if name == "off" else []
                wall, timer, rows = one_run(args.preset, [*args.overrides, *extra], Path(tmp) / f"{name}{i}")
                walls[name].append(wall)
                metrics.add(rows)
                if name == "default":
                    inside.append(timer.seconds / wall)
                    counts.append(timer.count)
                print(f"  run {i + 1} {name:8s} {wall:7.1f} s" +
                      (f"  ({timer.count} checkpoints, {timer.seconds:.2f} s in them)" if name == "default" else ""),
                      flush=True)
    med = {k: statistics.median(v) for k, v in walls.items()}
    print(f"median wall time: default checkpoints {med['default']:.1f} s, checkpoints off {med['off']:.1f} s, "
          f"ratio {med['default'] / med['off']:.4f} ({100 * (med['default'] / med['off'] - 1):+.2f} %)")
    print(f"time inside checkpoints: median {100 * statistics.median(inside):.2f} % of the run's wall time "
          f"({statistics.median(counts):.0f} checkpoints per run)")
    print(f"metrics identical with and without checkpoints: {len(metrics) == 1}")


if __name__ == "__main__":
    main()
