"""The evaluation protocol (SPEC 9): Acc@t*, MRI and time-to-accuracy."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from fedgmr.errors import FedGMRError


def acc_at_t(times: Sequence[float], accs: Sequence[float], t_star: float, half_window: int = 10,
             interval: float | None = None, span: float | None = None) -> tuple[float, float]:
    """Acc@t*: mean and (population) std of the evaluations in a window around ``t_star``.

    On a virtual-time grid (``interval`` = the grid step Δ, SPEC 9) the window is the time
    span ``[t* - 10Δ, t* + 10Δ)``: 20 grid evaluations, the same span of time for every
    method. ``span`` sets the half-width in seconds directly (for runs evaluated off a
    grid). With neither, the authors' index window: the evaluations ``[i-10, i+10)``
    around the first evaluation ``i`` past ``t_star``. Windows are clipped to the run;
    NaN when the run never passes ``t_star`` (or its window holds no evaluation)."""
    idx = next((i for i, t in enumerate(times) if t > t_star), None)
    if idx is None:
        return math.nan, math.nan
    if span is None and interval is not None:
        span = half_window * interval
    if span is not None:
        lo, hi = t_star - span, t_star + span
        window = np.asarray([a for t, a in zip(times, accs) if lo <= t < hi], dtype=float)
        if window.size == 0:
            return math.nan, math.nan
    else:
        window = np.asarray(accs[max(0, idx - half_window): idx + half_window], dtype=float)
    return float(window.mean()), float(window.std())


def mri(acc_method: float, acc_baselines: Sequence[float]) -> float:
    """Mean relative improvement, in percent: ``100/|B| * sum_b (A(M) - A(b)) / A(b)``."""
    if not acc_baselines:
        return math.nan
    return 100.0 / len(acc_baselines) * sum((acc_method - b) / b for b in acc_baselines)


def time_to_accuracy(times: Sequence[float], accs: Sequence[float], target: float) -> float:
    """First virtual time at which accuracy reaches ``target`` (NaN if never)."""
    return next((t for t, a in zip(times, accs) if a >= target), math.nan)


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Read a run directory's ``metrics.jsonl``."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FedGMRError(f"{run_dir} has no metrics.jsonl (is it a fedgmr run directory?)")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise FedGMRError(f"{path}:{n} is not valid JSON") from None
    return rows


def run_eval_interval(run_dir: str | Path) -> float | None:
    """The evaluation grid step of a run directory (None: evaluated on a step cadence)."""
    summary_path = Path(run_dir) / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        if "eval_interval" in summary:
            return summary["eval_interval"]
    config_path = Path(run_dir) / "config.yaml"
    if config_path.exists():
        import yaml

        cfg = yaml.safe_load(config_path.read_text()) or {}
        return (cfg.get("run") or {}).get("eval_interval")
    return None


def compare_runs(run_dirs: Sequence[str | Path], t_star: float, target: float | None = None,
                 span: float | None = None) -> dict[str, Any]:
    """Acc@t* per run, MRI of the first run over the others, time-to-accuracy.

    Each run's Acc@t* window is ``t* ± 10Δ`` with Δ its evaluation grid step (the index
    window for step-cadence runs), or ``t* ± span`` seconds for every run when ``span`` is
    given. ``target`` defaults to 90 % of the lowest best accuracy among the runs, so
    every run reaches it.
    """
    runs = []
    for d in run_dirs:
        rows = read_metrics(d)
        summary_path = Path(d) / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        times = [r["time"] for r in rows]
        accs = [r["accuracy"] for r in rows]
        runs.append({"dir": str(d), "method": summary.get("method", Path(d).name), "times": times, "accs": accs,
                     "final_accuracy": accs[-1] if accs else math.nan, "end_time": times[-1] if times else 0.0,
                     "interval": run_eval_interval(d)})
    if target is None:
        target = 0.9 * min(max(r["accs"]) for r in runs)
    table = []
    for r in runs:
        mean, std = acc_at_t(r["times"], r["accs"], t_star, interval=r["interval"], span=span)
        table.append({"run": r["dir"], "method": r["method"], "acc_at_t": mean, "std": std,
                      "final_accuracy": r["final_accuracy"], "end_time": r["end_time"],
                      "window": (span if span is not None else 10 * r["interval"] if r["interval"] else None),
                      "time_to_target": time_to_accuracy(r["times"], r["accs"], target)})
    first = table[0]["acc_at_t"]
    others = [row["acc_at_t"] for row in table[1:]]
    value = mri(first, others) if others and not any(math.isnan(v) for v in [first, *others]) else math.nan
    return {"t_star": t_star, "target": target, "runs": table, "mri": value,
            "mri_of": table[0]["method"], "over": [row["method"] for row in table[1:]]}
