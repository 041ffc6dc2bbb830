"""What ``fedgmr plot`` draws, as numbers: x axes, metrics, seed bands, per-level and
per-client accuracy curves. Pure data preparation (no matplotlib), tested exactly.

* **x axes** (:data:`X_AXES`): ``time`` (the records' ``time``), ``step``, ``bytes_up``
  and ``bytes_total`` (``bytes_up + bytes_down``) in MB (10^6 bytes), ``wall`` (the
  records' ``wall_time``: a Flower run has it, a simulator run does not).
* **metrics** (:data:`METRICS`): ``accuracy`` (in %), ``loss``, ``avg_density``,
  ``min_coverage``, and with ``run.coverage_eval_every`` ``coverage_min``,
  ``window_coverage_none`` and ``coverage_never`` (in %) and ``pruned_energy_mean``; with
  ``run.level_eval_every`` ``core_accuracy`` (in %: the global model under the mask of the
  ladder's first level, as ``fedgmr table --metric core_accuracy`` reads it).
* **seed bands** (:func:`seed_band`): runs that are seeds of one experiment (the grouping
  of ``fedgmr compare`` and ``fedgmr table``: :func:`~fedgmr.experiment.metrics.experiment_identity`)
  become one curve, the mean over seeds with a ±1 sample std band, each seed linearly
  interpolated onto a common grid: every x value of any seed inside the range all seeds
  cover.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from fedgmr.errors import ConfigError, RunDirError
from fedgmr.experiment.metrics import (EXECUTION_KEYS, experiment_identity, finite_number, flatten_config,
                                      metric_value, read_metrics, read_run_config, with_defaults)
from fedgmr.registry import Registry

#: bytes in one MB on the plots' axes (the unit of ``network.model_size_mb``)
MB = 1e6


@dataclass(frozen=True)
class Axis:
    """An x axis: its label (with unit), the record keys it reads and the value."""

    label: str
    keys: tuple[str, ...]
    value: Callable[[dict[str, Any]], float]
    #: why a record may lack the keys (appended to the error)
    hint: str = ""


@dataclass(frozen=True)
class Metric:
    """A y value: its label (with unit), the record key and a scale (1: as recorded).

    A metric with ``every`` is derived from ``key`` (:func:`~fedgmr.experiment.metrics.metric_value`
    under its own name) and logged only every few evaluations, by the ``run.`` setting
    ``every`` names: its curves hold the records that carry it."""

    label: str
    key: str
    scale: float = 1.0
    every: str | None = None


X_AXES: Registry[Axis] = Registry("x axis")
X_AXES.register("time", Axis("virtual time (s)", ("time",), lambda r: r["time"]))
X_AXES.register("step", Axis("server step", ("step",), lambda r: r["step"]))
X_AXES.register("bytes_up", Axis("uploaded to the server (MB)", ("bytes_up",), lambda r: r["bytes_up"] / MB))
X_AXES.register("bytes_total", Axis("uploaded + downloaded (MB)", ("bytes_up", "bytes_down"),
                                    lambda r: (r["bytes_up"] + r["bytes_down"]) / MB))
X_AXES.register("wall", Axis("wall-clock time (s)", ("wall_time",), lambda r: r["wall_time"],
                             hint="a simulator run records virtual time only: use --x time"))

METRICS: Registry[Metric] = Registry("metric")
METRICS.register("accuracy", Metric("test accuracy (%)", "accuracy", 100.0))
METRICS.register("loss", Metric("test loss", "loss"))
METRICS.register("avg_density", Metric("average density", "avg_density"))
METRICS.register("min_coverage", Metric("minimum coverage Γ* (updates)", "min_coverage"))
METRICS.register("coverage_min", Metric("minimum coverage Γ* over the aggregated union (updates)", "coverage_min"))
METRICS.register("window_coverage_none", Metric("coordinates uncovered over the coverage window (%)",
                                                "window_coverage_none", 100.0))
METRICS.register("coverage_never", Metric("coordinates never covered so far (%)", "coverage_never", 100.0))
METRICS.register("pruned_energy_mean", Metric("pruned-weight energy ‖θ − θ⊙m‖², client mean", "pruned_energy_mean"))
METRICS.register("core_accuracy", Metric("accuracy under the first level's mask (%)", "level_accuracy", 100.0,
                                         every="level_eval_every"))


def choice(registry: Registry[Any], name: str, option: str) -> Any:
    """``registry[name]``, else a one-line :class:`ConfigError` naming ``option``."""
    if name not in registry:
        raise ConfigError(f"invalid value for '{option}': {name!r} is not one of {', '.join(registry.names())}")
    return registry.get(name)


def axis_values(rows: Sequence[dict[str, Any]], axis: str, where: str | Path) -> np.ndarray:
    """The x value of every record (``RunDirError`` naming ``where`` when a record lacks
    the axis' keys, holds a non-number or goes back along the axis)."""
    spec = choice(X_AXES, axis, "--x")
    out = np.empty(len(rows))
    for n, row in enumerate(rows, 1):
        for key in spec.keys:
            if key not in row:
                hint = f" ({spec.hint})" if spec.hint else ""
                raise RunDirError(f"{where}: record {n} has no '{key}' field, which --x {axis} needs{hint}")
            if not finite_number(row[key]):
                raise RunDirError(f"{where}: record {n} has '{key}' = {row[key]!r:.40}, expected a finite number")
        out[n - 1] = float(spec.value(row))
        if n > 1 and out[n - 1] < out[n - 2]:
            raise RunDirError(f"{where}: record {n} goes back along --x {axis} ({out[n - 1]:g} after "
                              f"{out[n - 2]:g}): records must be in order")
    return out


def metric_values(rows: Sequence[dict[str, Any]], metric: str, where: str | Path) -> np.ndarray:
    """The metric of every record, scaled (accuracy in %)."""
    spec = choice(METRICS, metric, "--metric")
    out = np.empty(len(rows))
    for n, row in enumerate(rows, 1):
        value = metric_value(row, metric) if spec.every else row.get(spec.key)
        if not finite_number(value):
            what = "no" if spec.key not in row else f"a non-number ({value!r:.40}) in its"
            raise RunDirError(f"{where}: record {n} has {what} '{spec.key}' field, which --metric {metric} needs")
        out[n - 1] = spec.scale * float(value)
    return out


def metric_records(rows: Sequence[dict[str, Any]], metric: str, where: str | Path) -> list[dict[str, Any]]:
    """The records that carry ``metric``: all of them, or for a metric logged every few
    evaluations (:attr:`Metric.every`) those that hold it; a one-line error naming the
    ``run.`` setting that logs it when none does."""
    spec = choice(METRICS, metric, "--metric")
    if not spec.every:
        return list(rows)
    held = [r for r in rows if r.get(spec.key) is not None]
    if not held:
        raise RunDirError(f"{where} has no '{spec.key}' records, which --metric {metric} needs: "
                          f"run with --set run.{spec.every}=N")
    return held


def last_per_x(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Records that share an x value (a step evaluated at several grid times, no traffic
    between two evaluations) collapse to the last one: the state reached at that x."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.size == 0:
        return x, y
    keep = np.append(x[1:] != x[:-1], True)
    return x[keep], y[keep]


@dataclass
class Band:
    """The mean of ``n`` seeds on a common grid, ± their sample std (0 for one seed)."""

    x: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    n: int


def seed_band(curves: Sequence[tuple[np.ndarray, np.ndarray]]) -> Band:
    """Mean and sample std (ddof=1) over seeds, each ``(x, y)`` linearly interpolated onto
    the grid of every x value of any seed inside the range that all seeds cover (no
    extrapolation). ``RunDirError`` when the seeds' ranges do not overlap."""
    if not curves:
        raise ValueError("no curves")
    dedup = [last_per_x(x, y) for x, y in curves]
    lo = max(float(x[0]) for x, _ in dedup)
    hi = min(float(x[-1]) for x, _ in dedup)
    if lo > hi:
        raise RunDirError(f"the seeds share no x range (one ends at {hi:g} before another starts at {lo:g}): "
                          f"plot them with --no-bands")
    grid = np.unique(np.concatenate([x[(x >= lo) & (x <= hi)] for x, _ in dedup]))
    ys = np.stack([np.interp(grid, x, y) for x, y in dedup])
    std = ys.std(axis=0, ddof=1) if len(dedup) > 1 else np.zeros_like(grid)
    return Band(grid, ys.mean(axis=0), std, len(dedup))


def expand_runs(dirs: Sequence[str | Path]) -> list[Path]:
    """Each argument that holds ``metrics.jsonl`` is a run; any other directory stands for
    the run directories under it (a sweep directory). One that is neither is a
    ``RunDirError`` naming it (as :func:`read_metrics` words it)."""
    found: list[Path] = []
    for d in map(Path, dirs):
        if d.is_dir() and not (d / "metrics.jsonl").exists():
            hits = sorted(p.parent for p in d.rglob("metrics.jsonl")
                          if not any(part.startswith(".") for part in p.relative_to(d).parts))
            if hits:
                found.extend(hits)
                continue
        read_metrics(d)  # raises: missing, a file, no metrics.jsonl
        found.append(d)
    return list(dict.fromkeys(found))


def group_seeds(run_dirs: Sequence[str | Path]) -> list[list[Path]]:
    """Runs grouped as ``fedgmr compare`` groups them: the same experiment but the seed
    (and how it was executed) is one group; groups in order of first appearance, a run
    without a readable config alone."""
    groups: dict[str, list[Path]] = {}
    for i, d in enumerate(map(Path, run_dirs)):
        groups.setdefault(experiment_identity(d) or f"#{i}", []).append(d)
    return list(groups.values())


def run_config(run_dir: Path) -> dict[str, Any]:
    """A run's ``config.yaml`` as dotted keys, keys its version did not write at their
    defaults ({} when it has none or it is unreadable)."""
    cfg = read_run_config(run_dir)
    return flatten_config(with_defaults(cfg)) if cfg else {}


def group_labels(groups: Sequence[Sequence[Path]], names: Sequence[str]) -> list[str]:
    """A distinct label per group: its method (``names``), then ``key=value`` for the
    fewest config keys that tell the groups apart (the last part of the dotted key; the
    seed only when nothing else does), then the folder name if they still collide."""
    configs = [run_config(g[0]) for g in groups]
    keys = sorted({k for c in configs for k in c if k not in EXECUTION_KEYS | {"method"}}) + ["seed"]  # seed last
    varying = [k for k in keys if len({json.dumps(c.get(k), sort_keys=True, default=str) for c in configs}) > 1]
    chosen: list[str] = []

    def labels() -> list[str]:
        return [name + "".join(f", {k.rsplit('.', 1)[-1]}={c.get(k)}" for k in chosen)
                for name, c in zip(names, configs)]

    while len(set(labels())) < len(groups) and varying:
        best = max(varying, key=lambda k: len(set(zip(labels(), (json.dumps(c.get(k), default=str)
                                                                 for c in configs)))))
        chosen.append(best)
        varying.remove(best)
    out = labels()
    return [f"{label} [{g[0].name}]" if out.count(label) > 1 else label for label, g in zip(out, groups)]


def _records_with(rows: Sequence[dict[str, Any]], key: str, axis: str, where: str | Path, what: str,
                  setting: str) -> tuple[list[tuple[int, dict[str, Any]]], list[float]]:
    """The records that hold ``key`` (with their 1-based numbers) and their ``axis``
    values; a one-line error naming the ``run.`` setting that logs it when none does."""
    held = [(n, r) for n, r in enumerate(rows, 1) if r.get(key) is not None]
    if not held:
        raise RunDirError(f"{where} has no {what} ('{key}'): run with --set run.{setting}=N")
    return held, axis_values([r for _, r in held], axis, where)


def _gather(points: Iterable[tuple[Any, float, float]]) -> list[tuple[Any, np.ndarray, np.ndarray]]:
    """``(key, x, accuracy %)`` curves, in key order, from ``(key, x, accuracy)`` points."""
    curves: dict[Any, tuple[list[float], list[float]]] = {}
    for key, xv, acc in points:
        xs, ys = curves.setdefault(key, ([], []))
        xs.append(float(xv))
        ys.append(100.0 * float(acc))
    return [(key, np.asarray(xs), np.asarray(ys)) for key, (xs, ys) in sorted(curves.items())]


def level_curves(rows: Sequence[dict[str, Any]], axis: str, where: str | Path
                 ) -> list[tuple[float, np.ndarray, np.ndarray]]:
    """One ``(level density, x, accuracy %)`` curve per ladder level, from the records that
    hold ``level_accuracy`` (aligned with their ``levels``), in order of density."""
    held, x = _records_with(rows, "level_accuracy", axis, where, "per-level accuracy", "level_eval_every")
    points = []
    for (n, row), xv in zip(held, x):
        levels, accs = row.get("levels"), row["level_accuracy"]
        if not isinstance(levels, list) or not isinstance(accs, list) or len(levels) != len(accs):
            raise RunDirError(f"{where}: record {n} has a 'level_accuracy' not aligned with its 'levels'")
        points += [(float(level), xv, acc) for level, acc in zip(levels, accs)
                   if finite_number(acc) and finite_number(level)]
    return _gather(points)


def class_curves(rows: Sequence[dict[str, Any]], axis: str, where: str | Path
                 ) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """One ``(class, x, accuracy %)`` curve per class, from the records that hold
    ``class_accuracy``; a class the test split lacks (null) has no points."""
    held, x = _records_with(rows, "class_accuracy", axis, where, "per-class accuracy", "class_eval_every")
    points = []
    for (n, row), xv in zip(held, x):
        accs = row["class_accuracy"]
        if not isinstance(accs, list):
            raise RunDirError(f"{where}: record {n} has a 'class_accuracy' that is not a list")
        points += [(c, xv, acc) for c, acc in enumerate(accs) if finite_number(acc)]
    return _gather(points)


def coverage_shares(rows: Sequence[dict[str, Any]], axis: str, where: str | Path, top: int = 4
                    ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The share of coordinates that each coverage count reaches in the last aggregation,
    from the records that hold ``coverage_hist``: ``(x, shares, labels)`` with one row of
    ``shares`` per count 0, 1, ..., ``top`` - 1 and a last row for ``top`` or more."""
    held, x = _records_with(rows, "coverage_hist", axis, where, "coverage histogram", "coverage_eval_every")
    shares = np.zeros((top + 1, len(held)))
    for j, (n, row) in enumerate(held):
        hist = row["coverage_hist"]
        if not isinstance(hist, list) or not hist or not all(finite_number(h) and h >= 0 for h in hist) \
                or sum(hist) <= 0:
            raise RunDirError(f"{where}: record {n} has a 'coverage_hist' that is not a list of counts")
        total = float(sum(hist))
        for c, h in enumerate(hist):
            shares[min(c, top), j] += h / total
    labels = [f"covered by {c} update{'s' if c != 1 else ''}" for c in range(top)] + [f"by {top} or more"]
    labels[0] = "covered by none"
    return np.asarray(x, dtype=float), shares, labels


@dataclass
class ClientSpread:
    """Per-client accuracy (%) over the records that hold it: mean, min, max, 10th and
    90th percentile (numpy's linear interpolation) over the clients with a value."""

    x: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    p10: np.ndarray
    p90: np.ndarray
    clients: int


def client_spread(rows: Sequence[dict[str, Any]], axis: str, where: str | Path) -> ClientSpread:
    """The spread of ``client_accuracy`` (nulls, clients without a held-out split, left
    out) at each record that holds one."""
    picked = [r for r in rows if isinstance(r.get("client_accuracy"), list)
              and any(finite_number(a) for a in r["client_accuracy"])]
    if not picked:
        raise RunDirError(f"{where} has no per-client accuracy ('client_accuracy'): run with "
                          f"--set run.client_eval_every=N --set data.client_val_fraction=0.1")
    x = axis_values(picked, axis, where)
    stats = []
    for row in picked:
        acc = 100.0 * np.asarray([a for a in row["client_accuracy"] if finite_number(a)], dtype=float)
        p10, p90 = np.percentile(acc, [10, 90])
        stats.append((acc.mean(), acc.min(), acc.max(), p10, p90))
    cols = np.asarray(stats).T
    clients = max(sum(finite_number(a) for a in r["client_accuracy"]) for r in picked)
    return ClientSpread(x, *cols, clients=clients)
