"""Paper-style tables over many runs: ``fedgmr table DIR... --t-star T``.

Runs are grouped by every config key except the seed (and keys that only say *how* a run
was executed, such as the executor or the data path); a cell shows the mean ± sample
standard deviation, across seeds, of each seed's Acc@t*. Rows and columns are chosen
config keys (default: rows by method, columns by whatever else varies); the best mean
of each column is bold, and an MRI row compares one method with a set of baselines on
the cell means.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Literal, Mapping, Sequence

import numpy as np
import yaml

from pydantic import ValidationError

from fedgmr.errors import ConfigError, FedGMRError, RunDirError
from fedgmr.experiment.rundir import read_run_text
from fedgmr.experiment.stats import (ALPHA, CONFIDENCE, PairedDiff, Stabilisation, adjusted_verdict, paired_difference,
                                     stabilisation_time)
from fedgmr.experiment.stats import holm as holm_adjust
from fedgmr.experiment.metrics import (EXECUTION_KEYS, TABLE_METRICS, acc_at_times, finite_number,
                                      flatten_config, metric_at_t, metric_series, metric_value, mri,
                                      read_run_metrics, read_summary, run_clock, run_eval_interval, time_to_accuracy,
                                      window_half_width)

#: the paper's six baselines: the default set an MRI row is computed over
PAPER_BASELINES = ("fedavg", "fedasync", "heterofl", "fedrolex", "fjord", "fiarse")
#: preferred column keys, in this order, when --cols is not given
PREFERRED_COLS = ("name", "clients.heterogeneity", "data.partition")
#: marks a cell some of whose runs rejected client updates (NaN, wrong shape, outside the mask)
REJECTED_MARK = "†"
#: short names users type for the usual keys
ALIASES = {"preset": "name", "task": "name"}

Format = Literal["md", "latex", "csv"]
#: what a cell shows: Acc@t*, the final accuracy, or the virtual time at the run's end
Value = Literal["acc", "final", "time"]
_VALUE_TITLES = {"acc": "Acc@t* (%) at t* = {t:,.0f} s", "final": "final accuracy (%)",
                 "time": "virtual time at the end of the run (s)"}


@dataclass
class RunData:
    """One run directory, read for a table."""

    path: Path
    config: dict[str, Any]
    times: list[float]
    accs: list[float]
    bytes_up: list[float]
    bytes_down: list[float]
    interval: float | None
    metric: str = "accuracy"  # what ``accs`` holds (metrics.ACCURACY_METRICS)
    rejected: int = 0  # client updates the server rejected over the run

    @property
    def seed(self) -> Any:
        return self.config.get("seed")


def _hashable(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value


def find_runs(dirs: Sequence[str | Path]) -> list[Path]:
    """Every run directory (one holding config.yaml and metrics.jsonl) at or under ``dirs``."""
    found: list[Path] = []
    for d in map(Path, dirs):
        if not d.is_dir():
            raise FedGMRError(f"{d} is not a directory")
        if (d / "config.yaml").is_file() and (d / "metrics.jsonl").is_file():
            found.append(d)
            continue
        hits = sorted(p.parent for p in d.rglob("metrics.jsonl")
                      if (p.parent / "config.yaml").is_file()
                      and not any(part.startswith(".") for part in p.relative_to(d).parts))
        if not hits:
            raise FedGMRError(f"{d} holds no run directory (none with config.yaml and metrics.jsonl)")
        found.extend(sorted(hits, key=_sweep_rank(d)))
    return list(dict.fromkeys(found))


def _sweep_rank(root: Path) -> Any:
    """Sort key putting the cells of a sweep directory in the order of its sweep file's grid
    (so a table's columns read high, medium, low as the file lists them); other runs after
    them, by path."""
    order: dict[str, int] = {}
    try:
        index = json.loads(read_run_text(root / "sweep.json"))
        order = {str(c["name"]): i for i, c in enumerate(index["cells"])}
    except (OSError, ValueError, KeyError, TypeError, FedGMRError):  # no index, or a FIFO/device: path order
        pass
    return lambda p: (order.get(str(p.relative_to(root)), len(order)), str(p))


@functools.lru_cache(maxsize=32)
def _sweep_grid_points(directory: str, mtime_ns: int) -> dict[str, dict[str, Any]]:
    """Cell name -> the cell's point in its sweep's grid (every axis: ``preset``, the case
    axes, the grid's keys), from ``directory/sweep.json`` (read once per directory and
    version of the file, not once per run). Indexes written before cells recorded their
    point are expanded again from the sweep spec they keep."""
    from fedgmr.experiment.sweep import SweepSpec, expand

    index = json.loads(read_run_text(Path(directory) / "sweep.json"))
    cells = index["cells"]
    if all("point" in c for c in cells):
        points = {str(c["name"]): c["point"] for c in cells}
    else:
        points = {c.name: c.point for c in expand(SweepSpec.model_validate(index["spec"]), Path(directory))}
    return {name: point if isinstance(point, dict) else {} for name, point in points.items()}


@functools.lru_cache(maxsize=32)
def _sweep_points(directory: str, mtime_ns: int) -> dict[str, dict[str, Any]]:
    """Cell name -> the cell's values on its sweep's case axes (``case``, or the names of a
    ``cases:`` mapping)."""
    from fedgmr.experiment.sweep import is_case_axis

    return {name: {a: v for a, v in point.items() if is_case_axis(a)}
            for name, point in _sweep_grid_points(directory, mtime_ns).items()}


def _points_beside(directory: Path, case_axes_only: bool = False) -> dict[str, dict[str, Any]]:
    """The cell points of the sweep whose ``sweep.json`` is in ``directory`` (its case axes
    only, with ``case_axes_only``); empty where there is no readable index."""
    try:
        mtime_ns = (directory / "sweep.json").stat().st_mtime_ns
        return (_sweep_points if case_axes_only else _sweep_grid_points)(str(directory), mtime_ns)
    except (OSError, ValueError, KeyError, TypeError, FedGMRError, ValidationError):
        return {}


def is_sweep_cell(path: Path) -> bool:
    """Whether ``path`` is a cell of the sweep whose ``sweep.json`` sits beside it."""
    path = Path(path)
    return path.name in _points_beside(path.parent)


def grid_axes(paths: Iterable[Path]) -> set[str]:
    """The config keys that the sweeps holding these run directories varied (their grids'
    axes, as each ``sweep.json`` records them); empty for runs outside a sweep. A cell's
    name spells these axes short (``patience=1`` for ``restoration.patience``), so a short
    name that matches several config keys means the one the grid varied."""
    return {axis for parent in {Path(p).parent for p in paths}
            for point in _points_beside(parent).values() for axis in point}


def sweep_cases(path: Path) -> dict[str, str]:
    """The labels of the sweep cases (``cases:`` of a sweep file) that made the run at
    ``path``, by case axis (``{"case": "wo_buff_ims"}``, or ``{"tier": ..., "policy": ...}``
    for named axes), read from its sweep's ``sweep.json``; empty for a run outside a sweep
    or a sweep without cases."""
    point = _points_beside(path.parent, case_axes_only=True).get(path.name, {})
    return {axis: str(label) for axis, label in point.items() if label is not None}


def sweep_case(path: Path) -> str | None:
    """The label on the plain ``case`` axis of the run's sweep (None: no such axis)."""
    return sweep_cases(path).get("case")


@functools.lru_cache(maxsize=1)
def _schema_defaults() -> dict[str, Any]:
    """Every config key with its default, flattened: what a run made before a key was
    added ran with (a new key's default keeps the old behaviour), so a table can put old
    runs beside new ones that set it (``--rows method,prune_output``)."""
    from fedgmr.config import ExperimentConfig

    return flatten_config(ExperimentConfig().model_dump(mode="json"))


#: ``yaml.safe_load``'s loader with libyaml's parser where PyYAML has it: the same
#: constructors and resolvers (the same values), the scanning in C, seven times faster;
#: a table reads the config of every run it tabulates (hundreds for the measured tables)
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_run(path: Path, metric: str = "accuracy") -> RunData:
    """A run's config and its evaluation series of ``metric`` (the global test accuracy,
    or a personalised one); one-line errors for a damaged run."""
    flat = read_run_config(path)
    rows = read_run_metrics(path)  # at least one record, each with a finite time and an accuracy
    times, accs = metric_series(rows, metric, path / "metrics.jsonl")
    rejected = _rejected(path, rows)
    if metric != "accuracy":  # bytes at the records that carry the metric
        rows = [r for r in rows if finite_number(metric_value(r, metric))]
    interval = run_eval_interval(path)  # the summary's (a Flower run: none), else the config's
    return RunData(path, flat, times, accs, [float(r.get("bytes_up", math.nan)) for r in rows],
                   [float(r.get("bytes_down", math.nan)) for r in rows], interval, metric, rejected)


def read_run_config(path: Path) -> dict[str, Any]:
    """A run's config flattened to dotted keys as the tables read it: with a sweep's case
    axes and the run's clock (``virtual`` or ``wall``); one-line errors for a damaged run."""
    try:
        config = yaml.load(read_run_text(path / "config.yaml"), Loader=_SAFE_LOADER)
    except RunDirError:  # a FIFO, a device, a file above the bound: one line, never a hang
        raise
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise FedGMRError(f"{path / 'config.yaml'} is unreadable: {str(exc).splitlines()[0]}") from None
    if not isinstance(config, dict):
        raise FedGMRError(f"{path / 'config.yaml'} is not a fedgmr config")
    flat = flatten_config(config)
    for axis, label in sweep_cases(path).items():  # a sweep's case axis is a column like any key
        flat.setdefault(axis, label)                # (`--rows case`, `--cols tier`)
    # a Flower run's times are wall-clock seconds: never one cell with a simulation's
    flat["clock"] = run_clock(path)
    return flat


def _rejected(path: Path, rows: Sequence[dict[str, Any]]) -> int:
    """The run's rejected client updates: the summary's total, else the last record's."""
    value = read_summary(path).get("rejected_updates", rows[-1].get("rejected") if rows else None)
    return int(value) if finite_number(value) else 0


def _resolve_key(name: str, keys: Iterable[str], axes: Collection[str] = ()) -> str:
    """A full dotted key from a short name (``heterogeneity`` -> ``clients.heterogeneity``).
    A short name that ends several keys means the one among ``axes`` (the runs' sweep
    grids, :func:`grid_axes`) where exactly one is: ``patience`` is
    ``restoration.patience`` in a sweep over it, as its cells' names spell it."""
    name = ALIASES.get(name, name)
    keys = list(keys)
    if name in keys:
        return name
    matches = [k for k in keys if k.endswith("." + name)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ConfigError(f"no config key '{name}' in these runs")
    on_grid = [k for k in matches if k in axes]
    if len(on_grid) == 1:
        return on_grid[0]
    raise ConfigError(f"'{name}' is ambiguous: {', '.join(matches)} (name one in full)")


def select_runs(runs: Sequence[RunData], only: dict[str, list[str]],
                exclude: dict[str, list[str]] | Sequence[dict[str, list[str]]] | None = None,
                exclude_flags: Sequence[str] | None = None) -> list[RunData]:
    """The runs whose value of each named key is one of the listed values: ``--only`` of
    ``fedgmr table`` (``{"heterogeneity": ["high"], "method": ["fjord", "fjord_aux"]}``),
    less those that match every key of ``exclude`` (``--exclude``: ``{"heterogeneity":
    ["medium"], "partition": ["iid"]}`` leaves out one column, Medium IID, and keeps Medium
    non-IID). ``exclude`` may be a list of such groups (``--drop``, one per flag): a run
    matching all keys of any one of them is left out; ``exclude_flags`` names each group's
    option in errors (default ``--exclude``). Keys are short or dotted config
    keys, or a sweep's case axis, as for ``--rows``; values as they are written in a
    sweep's cell names (``high``, ``0.05+0.1``). A run without the key ran with its
    default. ConfigError naming the values there are, for a key or a value that matches
    nothing."""
    groups = [exclude] if isinstance(exclude, dict) else list(exclude or [])
    flags = list(exclude_flags or ["--exclude"] * len(groups))
    if len(flags) != len(groups):
        raise ValueError("exclude_flags names each group of exclude")
    flags, groups = [f for f, g in zip(flags, groups) if g], [g for g in groups if g]
    if not only and not groups:
        return list(runs)
    from fedgmr.experiment.sweep import _label

    defaults = _schema_defaults()
    keys = sorted({k for r in runs for k in r.config} | set(defaults))
    axes = grid_axes(r.path for r in runs)

    def resolve(spec: dict[str, list[str]], flag: str) -> list[tuple[str, set[str]]]:
        chosen: list[tuple[str, set[str]]] = []
        for name, values in spec.items():
            try:
                key = _resolve_key(name, keys, axes)
            except ConfigError as exc:
                raise ConfigError(f"{flag} {name}: {exc}") from None
            present = list(dict.fromkeys(_label(r.config.get(key, defaults.get(key))) for r in runs))
            unknown = [v for v in values if v not in present]
            if unknown:
                raise ConfigError(f"{flag} {name}: no run has {', '.join(unknown)} (values: {', '.join(present)})")
            chosen.append((key, set(values)))
        return chosen

    def matches(run: RunData, chosen: list[tuple[str, set[str]]]) -> bool:
        return all(_label(run.config.get(k, defaults.get(k))) in vs for k, vs in chosen)

    kept_by = resolve(only, "--only")
    dropped_by = [resolve(g, f) for g, f in zip(groups, flags)]
    return [r for r in runs if matches(r, kept_by) and not any(matches(r, g) for g in dropped_by)]


def _determined(key: str, by: Sequence[str], runs: Sequence[RunData]) -> bool:
    """True when the values of ``by`` fix the value of ``key`` in every run."""
    seen: dict[tuple, Any] = {}
    for r in runs:
        ident = tuple(_hashable(r.config.get(k)) for k in by)
        value = _hashable(r.config.get(key))
        if seen.setdefault(ident, value) != value:
            return False
    return True


@dataclass
class Table:
    """A computed table: per (row, column) group, the per-seed figures and their stats."""

    t_star: float
    row_keys: list[str]
    col_keys: list[str]
    rows: list[tuple]
    cols: list[tuple]
    cells: dict[tuple[tuple, tuple], dict[str, Any]]
    mri_of: str | None
    mri_over: list[str]
    mri: dict[tuple, float]
    target: float | None
    value: Value = "acc"
    metric: str = "accuracy"
    #: the per-t* tables a several-t* table was joined from (:func:`join_t_stars`)
    parts: list["Table"] | None = None
    #: why a requested MRI row is missing, for the caption (None when there is one or none was asked)
    mri_note: str | None = None
    #: the row every other row is paired against (``--paired-against``); its cells' ``paired``
    #: entries hold :class:`~fedgmr.experiment.stats.PairedDiff` of ``reference - row``
    paired_ref: tuple | None = None
    #: how an automatic t* was found (``--t-star auto``), for the caption and the column label
    auto: Stabilisation | None = None
    #: ``--holm``: the paired cells' ``holm`` entries hold (Holm-adjusted p, family size m)
    holm: bool = False

    @property
    def seeds_per_cell(self) -> int:
        counts = [c["n"] for c in self.cells.values()]
        return max(set(counts), key=counts.count) if counts else 0


@dataclass
class Grouping:
    """Runs grouped into a table's cells: each (row, column) key with its runs, in the
    order the runs came; what :func:`build_table` computes its statistics on."""

    row_keys: list[str]
    col_keys: list[str]
    groups: dict[tuple[tuple, tuple], list[RunData]]
    metric: str  # the one metric every run was read for


def group_runs(runs: Sequence[RunData], rows: Sequence[str] = ("method",),
               cols: Sequence[str] | None = None) -> Grouping:
    """Group ``runs`` by the row and column keys (default columns: whatever else varies
    and the rows do not fix). ConfigError when runs of one cell differ in another key or
    share a seed; FedGMRError for no runs, or runs read for different metrics."""
    if not runs:
        raise FedGMRError("no runs to tabulate")
    metrics = sorted({r.metric for r in runs})
    if len(metrics) > 1:  # global and personalised accuracy never share a table
        raise FedGMRError(f"runs read for different metrics ({', '.join(metrics)}): one table shows one")
    keys = sorted({k for r in runs for k in r.config})
    defaults = _schema_defaults()
    for r in runs:  # a key added since a run was made: that run ran as its default
        for k in defaults.keys() & set(keys) - r.config.keys():
            r.config[k] = defaults[k]
    varying = [k for k in keys if k not in EXECUTION_KEYS
               and len({_hashable(r.config.get(k)) for r in runs}) > 1]
    axes = grid_axes(r.path for r in runs)
    row_keys = [_resolve_key(k, keys, axes) for k in rows]
    if cols is None:
        col_keys: list[str] = []
        ordered = [k for k in PREFERRED_COLS if k in varying] + [k for k in varying if k not in PREFERRED_COLS]
        for k in ordered:
            if k not in row_keys and not _determined(k, row_keys + col_keys, runs):
                col_keys.append(k)
    else:
        col_keys = [_resolve_key(k, keys, axes) for k in cols]
    group_keys = row_keys + col_keys
    for k in varying:
        if k not in group_keys and not _determined(k, group_keys, runs):
            raise ConfigError(f"runs in one cell also differ in '{k}': add it to --rows or --cols")
    groups: dict[tuple[tuple, tuple], list[RunData]] = {}
    for r in runs:
        rk = tuple(_hashable(r.config.get(k)) for k in row_keys)
        ck = tuple(_hashable(r.config.get(k)) for k in col_keys)
        groups.setdefault((rk, ck), []).append(r)
    for members in groups.values():
        seeds = [m.seed for m in members]
        if len(set(seeds)) != len(seeds):
            dup = next(s for s in seeds if seeds.count(s) > 1)
            paths = [str(m.path) for m in members if m.seed == dup]
            raise ConfigError(f"two runs of one cell share seed {dup}: {', '.join(paths)}")
    return Grouping(row_keys, col_keys, groups, metrics[0])


def build_table(runs: Sequence[RunData], t_star: float, rows: Sequence[str] = ("method",),
                cols: Sequence[str] | None = None, target: float | None = None, span: float | None = None,
                mri_of: str | None = "fedgmr", baselines: Sequence[str] = PAPER_BASELINES,
                value: Value = "acc", paired_against: str | None = None, holm: bool = False) -> Table:
    """Group ``runs`` by every key but the seed and compute each cell's statistics of
    ``value`` (Acc@t*, the final accuracy, or the end time).

    ``paired_against``: a method (or a row label as the table prints it, ``fedgmr / True``)
    whose row every other row is compared with, seed by seed, in each column
    (:func:`~fedgmr.experiment.stats.paired_difference`). ``holm``: also adjust each
    column's p-values as one family (:func:`column_holm`). Refusals: :func:`group_runs`'s, and
    ``target`` on a metric that is not an accuracy."""
    metrics = sorted({r.metric for r in runs})  # several: group_runs refuses them (none: no runs)
    if len(metrics) == 1 and target is not None and not TABLE_METRICS[metrics[0]].accuracy:
        raise ConfigError(f"--target is an accuracy to reach; {metrics[0]!r} is not an accuracy")
    grouping = group_runs(runs, rows, cols)
    row_keys, col_keys, groups = grouping.row_keys, grouping.col_keys, grouping.groups
    group_keys = row_keys + col_keys
    cells: dict[tuple[tuple, tuple], dict[str, Any]] = {}
    for key, members in groups.items():
        seeds = [m.seed for m in members]
        if value == "acc":
            accs = [metric_at_t(metrics[0], m.times, m.accs, t_star, interval=m.interval, span=span)
                    for m in members]
        elif value == "final":
            accs = [m.accs[-1] for m in members]
        else:
            accs = [m.times[-1] for m in members]
        cell: dict[str, Any] = {"seeds": seeds, "acc": accs, "n": len(members),
                                "rejected": [m.rejected for m in members],
                                "mean": float(np.mean(accs)),
                                "std": float(np.std(accs, ddof=1)) if len(accs) > 1 else math.nan}
        if target is not None:
            ttas, ups, downs = [], [], []
            for m in members:
                t = time_to_accuracy(m.times, m.accs, target)
                ttas.append(t)
                i = next((j for j, a in enumerate(m.accs) if a >= target), None)
                ups.append(m.bytes_up[i] if i is not None else math.nan)
                downs.append(m.bytes_down[i] if i is not None else math.nan)
            cell.update(tta=ttas, up=ups, down=downs)
        cells[key] = cell
    # values in the order the runs came (a sweep's grid order: see find_runs), per key
    rank: dict[str, dict[Any, int]] = {}
    for r in runs:
        for k in group_keys:
            rank.setdefault(k, {}).setdefault(_hashable(r.config.get(k)), len(rank[k]))

    def order_of(keys: Sequence[str]) -> Any:
        return lambda v: [rank[k][x] for k, x in zip(keys, v)]

    row_vals = sorted({k[0] for k in cells}, key=order_of(row_keys))
    col_vals = sorted({k[1] for k in cells}, key=order_of(col_keys))
    if "method" in row_keys:  # the MRI method first, then its baselines; a stable sort keeps the rest
        at = row_keys.index("method")
        order = {m: i for i, m in enumerate((mri_of, *baselines))}
        row_vals.sort(key=lambda v: order.get(v[at], len(order)))
    mri_row: dict[tuple, float] = {}
    over: list[str] = []
    mri_note: str | None = None
    if value != "time" and TABLE_METRICS[metrics[0]].accuracy and mri_of is not None and "method" in row_keys:
        at = row_keys.index("method")
        rows_of: dict[Any, list[tuple]] = {}
        for r in row_vals:
            rows_of.setdefault(r[at], []).append(r)
        if mri_of in rows_of:
            wanted = [mri_of, *(b for b in baselines if b in rows_of and b != mri_of)]
            several = [m for m in wanted if len(rows_of[m]) > 1]
            if several:  # which of its rows would be "the" method is not for the table to guess
                others = " / ".join(k for k in row_keys if k != "method")
                mri_note = (f"No MRI row: {', '.join(several)} {'has' if len(several) == 1 else 'have'} several rows "
                            f"(by {others}); keep one with --only to get it.")
            else:
                over = wanted[1:]
                row = {m: rows_of[m][0] for m in wanted}
                for c in col_vals:
                    mine = cells.get((row[mri_of], c))
                    base = [cells[(row[b], c)]["mean"] for b in over if (row[b], c) in cells]
                    ok = mine is not None and base and len(base) == len(over) \
                        and not any(math.isnan(x) or x <= 0 for x in base) and not math.isnan(mine["mean"])
                    mri_row[c] = mri(mine["mean"], base) if ok else math.nan  # type: ignore[index]
    ref_row = None
    if paired_against is not None:
        ref_row = _reference_row(paired_against, row_keys, row_vals)
        for c in col_vals:
            ref = cells.get((ref_row, c))
            if ref is None:
                continue
            mine = dict(zip(ref["seeds"], ref["acc"]))
            for r in row_vals:
                if r != ref_row and (r, c) in cells:
                    other = cells[(r, c)]
                    other["paired"] = paired_difference(mine, dict(zip(other["seeds"], other["acc"])))
            if holm:
                column_holm(cells, [r for r in row_vals if r != ref_row], c)
    elif holm:
        raise ConfigError("--holm adjusts the p-values of --paired-against: name the reference row with it")
    return Table(t_star, row_keys, col_keys, row_vals, col_vals, cells, mri_of if over else None, over, mri_row,
                 target, value, metrics[0], mri_note=mri_note, paired_ref=ref_row, holm=holm)


def same_values(cells: Mapping[tuple[tuple, tuple], dict[str, Any]], rows: Sequence[tuple],
                cols: Sequence[tuple]) -> list[list[tuple]]:
    """The rows grouped by what their cells in ``cols`` hold: rows whose every cell has the
    same seeds with the same values, to the last digit, share a group (almost surely one
    training under two names, as ``heterofl_aux`` is ``heterofl_ims`` in Table 1). Only
    values that are numbers count (a window with no evaluation, NaN, says nothing of the
    training); a row with no such cell there is left out; groups in the order of their
    first row."""
    groups: dict[tuple, list[tuple]] = {}
    for row in rows:
        key = tuple((col, tuple(cells[(row, col)]["seeds"]), tuple(cells[(row, col)]["acc"]))
                    for col in cols if (row, col) in cells
                    and all(math.isfinite(a) for a in cells[(row, col)]["acc"]))
        if key:
            groups.setdefault(key, []).append(row)
    return list(groups.values())


def column_holm(cells: dict[tuple[tuple, tuple], dict[str, Any]], rows: Sequence[tuple], col: tuple) -> None:
    """Holm's adjustment over one column's comparisons with the reference (``rows``: the
    others), one family per column and t*: sets each paired cell's ``holm`` to (adjusted p,
    m). Rows of one training (:func:`same_values`) are one test of the family, not two, so
    ``m`` counts distinct comparisons."""
    tested = [r for r in rows if (r, col) in cells and "paired" in cells[(r, col)]
              and cells[(r, col)]["paired"].n >= 2 and not math.isnan(cells[(r, col)]["paired"].p)]
    family = same_values(cells, tested, [col])
    adjusted = holm_adjust([cells[(same[0], col)]["paired"].p for same in family])
    for same, p in zip(family, adjusted):
        for r in same:
            cells[(r, col)]["holm"] = (p, len(family))


def _reference_row(name: str, row_keys: Sequence[str], row_vals: Sequence[tuple]) -> tuple:
    """The row ``--paired-against`` names: a row label as printed (``fedgmr / True``), or a
    method whose rows are one. ConfigError listing the rows otherwise."""
    labelled = [r for r in row_vals if _label(r) == name]
    if labelled:
        return labelled[0]
    if "method" in row_keys:
        at = row_keys.index("method")
        hits = [r for r in row_vals if str(r[at]) == name]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise ConfigError(f"--paired-against {name}: {len(hits)} rows hold it "
                              f"({'; '.join(_label(r) for r in hits)}); name one row as printed, or keep one "
                              "with --only")
    raise ConfigError(f"--paired-against {name}: no such row (rows: {'; '.join(_label(r) for r in row_vals)})")


def auto_t_star(runs: Sequence[RunData], rows: Sequence[str] = ("method",), cols: Sequence[str] | None = None,
                tolerance: float = 0.01, horizon: float | None = None, start: float | None = None,
                span: float | None = None) -> Stabilisation:
    """The paper's t* rule made operational (``--t-star auto``): the first grid time from
    which most cells of the table (row x column, each the mean across seeds of Acc@t) stay
    within ``tolerance`` of their value at the horizon (:func:`stabilisation_time`).

    Every run must share one evaluation grid. The scan covers the grid times at which every
    run's Acc@t window is whole: from its first evaluation plus the half-window (or
    ``start``, if later) to ``horizon`` (default: the latest such time every run reaches).
    Raises FedGMRError when the runs cannot be read this way."""
    if not runs:
        raise FedGMRError("no runs to find t* on")
    metric = runs[0].metric
    if not TABLE_METRICS[metric].accuracy:
        raise ConfigError(f"--t-star auto reads an accuracy's stabilisation; {metric!r} is not an accuracy")
    intervals = {r.interval for r in runs}
    if None in intervals or len(intervals) != 1:
        raise ConfigError("--t-star auto needs runs on one evaluation grid (run.eval_interval); these have "
                          f"{', '.join(sorted(str(i) for i in intervals))}")
    step = float(intervals.pop())  # type: ignore[arg-type]
    width = window_half_width(step, span)
    assert width is not None
    eps = 1e-9 * step
    lo = max(r.times[0] for r in runs) + width
    if start is not None:
        lo = max(lo, start)
    lo = math.ceil(lo / step - 1e-9) * step
    reach = min(r.times[-1] for r in runs) + step - width  # the latest t whose window every run fills
    if horizon is None:
        hi = math.floor(reach / step + 1e-9) * step
    else:
        if horizon > reach + eps:
            raise ConfigError(f"--horizon {horizon:,g}: some runs end before its window does (every run's window "
                              f"is whole up to t = {reach:,g} s); run them longer or choose an earlier horizon")
        hi = horizon
    if hi < lo - eps:
        raise ConfigError(f"--t-star auto: no grid time has a whole Acc@t window in every run (earliest "
                          f"{lo:,g} s, latest {hi:,g} s); the runs start evaluating too late (run.eval_from) or "
                          "end too early")
    grid = [lo + i * step for i in range(int(round((hi - lo) / step)) + 1)]
    if grid[-1] != hi:
        grid.append(hi)
    # each cell's mean Acc@t across its seeds at every grid time, as build_table computes
    # it at one t* (the same floats), with the runs grouped once for the whole scan
    grouping = group_runs(runs, rows, cols)
    curves: dict[tuple, list[float]] = {}
    for key, members in grouping.groups.items():
        if TABLE_METRICS[metric].at_t_star:
            per_run = [[metric_at_t(metric, m.times, m.accs, t, interval=m.interval, span=span) for t in grid]
                       for m in members]
        else:
            per_run = [acc_at_times(m.times, m.accs, grid, interval=m.interval, span=span) for m in members]
        curves[key] = [float(np.mean(at_t)) for at_t in zip(*per_run)]
    return stabilisation_time(grid, curves, tolerance)


def auto_note(stab: Stabilisation, percent: bool = True) -> str:
    """How ``--t-star auto`` found its t*, in one sentence."""
    tol = f"{100 * stab.tolerance:.2f} point{'s' if stab.tolerance != 0.01 else ''}" if percent \
        else f"{stab.tolerance:g}"
    return (f"t* = auto: {stab.t_star:,.0f} s, the first grid time from which {stab.stable} of {stab.total} "
            f"cells (most) stay within {tol} of their value at the horizon, {stab.horizon:,.0f} s "
            f"(scanned from {stab.start:,.0f} s).")


def t_star_label(t: float, auto: bool = False) -> str:
    """A t* column's label in a several-t* table (``(auto)``: found by ``--t-star auto``)."""
    return f"t* = {t:,.0f} s" + (" (auto)" if auto else "")


def join_t_stars(tables: Sequence[Table]) -> Table:
    """One table from Acc@t* tables of the same runs at several t*: each column becomes one
    column per t* (its label ends with the t*), with its own bold best and MRI."""
    if len(tables) == 1:
        return tables[0]
    first = tables[0]
    if first.value != "acc" or first.target is not None:
        raise ConfigError("several --t-star values make a table of Acc@t* only (no --value final/time, no --target)")
    cols = [(*c, t_star_label(t.t_star, t.auto is not None)) for c in first.cols for t in tables]
    cells, mri_row = {}, {}
    for t in tables:
        tag = t_star_label(t.t_star, t.auto is not None)
        for (r, c), cell in t.cells.items():
            cells[(r, (*c, tag))] = cell
        for c, v in t.mri.items():
            mri_row[(*c, tag)] = v
    return Table(first.t_star, first.row_keys, [*first.col_keys, "t*"], first.rows, cols, cells, first.mri_of,
                 first.mri_over, mri_row, None, first.value, first.metric, parts=list(tables), mri_note=first.mri_note,
                 paired_ref=first.paired_ref, holm=first.holm)


# ---------------------------------------------------------------------- rendering
def _label(values: tuple) -> str:
    return " / ".join(str(v) for v in values) if values else "all"


def _latex_escape(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("_", r"\_"), ("%", r"\%"), ("&", r"\&"), ("#", r"\#"),
                 ("$", r"\$"), ("{", r"\{"), ("}", r"\}")):
        text = text.replace(a, b)
    return text


def _frame(table: Table, fmt: Format) -> Any:
    """The Acc@t* table as a pandas DataFrame of display strings."""
    import pandas as pd

    def bold(text: str) -> str:
        return f"**{text}**" if fmt == "md" else rf"\textbf{{{text}}}"

    esc = _latex_escape if fmt == "latex" else (lambda s: s)
    mark = r"\textsuperscript{\dag}" if fmt == "latex" else REJECTED_MARK
    modal = table.seeds_per_cell
    spec = TABLE_METRICS[table.metric]
    pick, scale, digits = ((min, 1.0, 0) if table.value == "time"
                           else (max if spec.higher_is_better else min, 100.0 if spec.percent else 1.0, spec.digits))
    best = {c: pick((table.cells[(r, c)]["mean"] for r in table.rows if (r, c) in table.cells
                     and not math.isnan(table.cells[(r, c)]["mean"])), default=math.nan)
            if spec.ranked or table.value == "time" else math.nan for c in table.cols}
    data = []
    for r in table.rows:
        line = []
        for c in table.cols:
            cell = table.cells.get((r, c))
            if cell is None or math.isnan(cell["mean"]):
                line.append("–" if cell is None else "n/a")
                continue
            text = f"{scale * cell['mean']:,.{digits}f}" + (
                "" if math.isnan(cell["std"]) else f" ± {scale * cell['std']:,.{digits}f}")
            if cell["n"] != modal:
                text += f" (n={cell['n']})"
            text = bold(text) if cell["mean"] == best[c] else text
            line.append(text + (f" {mark}" if sum(cell["rejected"]) else ""))
        data.append(line)
    index = [esc(_label(r)) for r in table.rows]
    if table.mri_of is not None:
        data.append(["n/a" if math.isnan(table.mri[c]) else f"{table.mri[c]:+.2f}" for c in table.cols])
        index.append(esc(f"MRI of {table.mri_of} (%)"))
    frame = pd.DataFrame(data, index=index, columns=[esc(_label(c)) for c in table.cols])
    frame.index.name = esc(" / ".join(table.row_keys))
    return frame


def _scale_digits(table: Table) -> tuple[float, int]:
    spec = TABLE_METRICS[table.metric]
    return (1.0, 0) if table.value == "time" else (100.0 if spec.percent else 1.0, spec.digits)


def format_p(p: float) -> str:
    """A p-value as the tables print it."""
    return "n/a" if math.isnan(p) else ("p<0.001" if p < 0.001 else f"p={p:.3f}")


def paired_text(d: PairedDiff, scale: float = 100.0, digits: int = 2) -> str:
    """One paired cell: ``+1.39 [+0.51, +2.27] p=0.019 ahead``."""
    if d.n == 0:
        return "no common seed"
    if d.n == 1:
        return f"{scale * d.mean:+,.{digits}f} (1 pair: no interval)"
    return (f"{scale * d.mean:+,.{digits}f} [{scale * d.lo:+,.{digits}f}, {scale * d.hi:+,.{digits}f}] "
            f"{format_p(d.p)} {d.verdict}")


def _against_reference_frame(table: Table, fmt: Format, text: Callable[[tuple, tuple], str]) -> Any:
    """One cell per (row, column) for every row but the reference (``--paired-against``):
    ``text(row, col)``, escaped for ``fmt``."""
    import pandas as pd

    esc = _latex_escape if fmt == "latex" else (lambda s: s)
    rows = [r for r in table.rows if r != table.paired_ref]
    data = [[esc(text(r, c)) for c in table.cols] for r in rows]
    frame = pd.DataFrame(data, index=[esc(_label(r)) for r in rows], columns=[esc(_label(c)) for c in table.cols])
    frame.index.name = esc(" / ".join(table.row_keys))
    return frame


def _paired_frame(table: Table, fmt: Format) -> Any:
    """The seed-paired differences against the reference row, one cell per (row, column)."""
    scale, digits = _scale_digits(table)

    def text(r: tuple, c: tuple) -> str:
        cell = table.cells.get((r, c))
        return "–" if cell is None or "paired" not in cell else paired_text(cell["paired"], scale, digits)

    return _against_reference_frame(table, fmt, text)


def _holm_frame(table: Table, fmt: Format) -> Any:
    """The Holm-adjusted p-value and its verdict of each paired cell (``--holm``)."""
    def text(r: tuple, c: tuple) -> str:
        cell = table.cells.get((r, c))
        if cell is None or "holm" not in cell:
            return "–"
        p, m = cell["holm"]
        return f"{format_p(p)} {adjusted_verdict(cell['paired'].mean, p)} (m={m})"

    return _against_reference_frame(table, fmt, text)


def holm_title(table: Table) -> str:
    """What the Holm table's cells are, in one paragraph."""
    ref = _label(table.paired_ref or ())
    return (f"Holm-adjusted p-values of the differences above: one family per column, its m distinct "
            f"comparisons with {ref} (rows with the same value in every seed count once); verdict for {ref}: "
            f"ahead or behind where the adjusted p is below {ALPHA:g}, level otherwise. The "
            "family-wise error of each column is then at most 5 %; the verdicts above are each at 5 %.")


def paired_title(table: Table) -> str:
    """What the paired table's cells are, in one paragraph."""
    ref = _label(table.paired_ref or ())
    unit = "points" if TABLE_METRICS[table.metric].percent and table.value != "time" else "units of the table"
    return (f"Seed-paired differences against {ref}: Δ = {ref} − row, in {unit}; mean of the per-seed "
            f"differences over the seeds both cells hold, [{100 * CONFIDENCE:.0f} % interval] (Student t, "
            f"n − 1 degrees of freedom), two-sided p-value of Δ = 0. Verdict for {ref}: ahead where the "
            "interval lies above 0, behind where below, level where it holds 0.")


def _target_frames(table: Table, fmt: Format) -> list[tuple[str, Any]]:
    import pandas as pd

    esc = _latex_escape if fmt == "latex" else (lambda s: s)

    def mean_or_never(values: list[float], scale: float, digits: int) -> str:
        reached = [v for v in values if not math.isnan(v)]
        if not reached:
            return "never"
        text = f"{np.mean(reached) / scale:,.{digits}f}"
        return text if len(reached) == len(values) else f"{text} ({len(reached)}/{len(values)} seeds)"

    out = []
    for title, key, scale, digits in (("time to target (s)", "tta", 1.0, 0), ("MB up to target", "up", 1e6, 1),
                                      ("MB down to target", "down", 1e6, 1)):
        data = [[mean_or_never(table.cells[(r, c)][key], scale, digits) if (r, c) in table.cells else "–"
                 for c in table.cols] for r in table.rows]
        frame = pd.DataFrame(data, index=[esc(_label(r)) for r in table.rows],
                             columns=[esc(_label(c)) for c in table.cols])
        frame.index.name = esc(" / ".join(table.row_keys))
        out.append((title, frame))
    return out


def first_to_target(ref: dict[str, Any], row: dict[str, Any]) -> tuple[int, int, int, int]:
    """Seed by seed, who reaches the target first: ``(reference first, row first, tie, n)``
    over the seeds both cells hold (their ``seeds`` and ``tta``, NaN for never). A seed
    where one reaches it and the other never does counts for the one; the same time, or
    neither reaching it, is a tie. Counts, not a test: time to accuracy has no interval."""
    ref_t = dict(zip(ref["seeds"], ref["tta"]))
    row_t = dict(zip(row["seeds"], row["tta"]))
    first = later = tie = 0
    shared = [s for s in ref_t if s in row_t]
    for seed in shared:
        a, b = ref_t[seed], row_t[seed]
        a, b = (math.inf if math.isnan(a) else a), (math.inf if math.isnan(b) else b)
        first += a < b
        later += b < a
        tie += a == b
    return first, later, tie, len(shared)


FIRST_TITLE = ("first to the target, seed by seed, against {ref}: of the seeds both cells hold, those where "
               "{ref} reaches it strictly before the row; then the row first and the ties (the same time, or "
               "neither), when any (counts, not a test)")


def _first_frame(table: Table, fmt: Format) -> Any:
    """:func:`first_to_target` of the reference against each other row, per column."""
    def text(r: tuple, c: tuple) -> str:
        ref, cell = table.cells.get((table.paired_ref, c)), table.cells.get((r, c))  # type: ignore[arg-type]
        first, later, tie, n = first_to_target(ref, cell) if ref and cell else (0, 0, 0, 0)
        if not n:
            return "–"
        return f"{first} of {n}" + (f"; row {later}" if later else "") + (f"; tie {tie}" if tie else "")

    return _against_reference_frame(table, fmt, text)


def caption(table: Table) -> str:
    """What the numbers are, in one paragraph."""
    n = table.seeds_per_cell
    title = _VALUE_TITLES[table.value].format(t=table.t_star)
    if table.parts:
        ts = [f"{t.t_star:,.0f}" for t in table.parts]
        title = f"Acc@t* (%) at t* = {', '.join(ts[:-1])} and {ts[-1]} s (one column each)"
    if table.auto is not None and not table.parts:
        title = title.replace(f"t* = {table.t_star:,.0f} s", f"t* = {table.t_star:,.0f} s (auto)")
    if not TABLE_METRICS[table.metric].percent:
        title = title.replace(" (%)", "")
    if table.metric != "accuracy" and table.value != "time":  # e.g. "coverage_never (%) at t* = 2,000 s"
        title = title.replace("Acc@t*", table.metric, 1).replace("final accuracy", f"final {table.metric}")
    text = (f"{title}: mean ± sample std (ddof = 1) across seeds of each seed's value, "
            f"{n} seed{'s' if n != 1 else ''} per cell")
    others = sorted({c["n"] for c in table.cells.values()} - {n})
    if others:  # a mixed grid (e.g. one column with five seeds): say which cells differ
        text += f" except those marked (n={'/'.join(map(str, others))})"
    text += " (no ± with one seed)." if n == 1 else "."
    text += f" Rows: {' / '.join(table.row_keys)}; columns: {' / '.join(table.col_keys) or 'all runs'}."
    spec = TABLE_METRICS[table.metric]
    if table.value == "acc" and spec.at_t_star:
        text += " Each seed's value: its last record at or before t*."
    elif table.value == "acc" and not spec.accuracy and not spec.ranked:
        text += " Each seed's value: the mean of its records in the Acc@t* window."
    lowest = table.value == "time" or not spec.higher_is_better
    if spec.ranked or table.value == "time":
        text += f" Bold: {'lowest' if lowest else 'best'} mean in its column."
    else:
        text += " Nothing bold: it describes the runs, it does not rank them."
    if table.mri_of is not None:
        text += f" MRI of {table.mri_of}: on the cell means, over {', '.join(table.mri_over)}."
    elif table.mri_note:
        text += f" {table.mri_note}"
    for part in (table.parts or [table]):
        if part.auto is not None:
            text += " " + auto_note(part.auto, TABLE_METRICS[table.metric].percent)
    marked = [(r, c, cell) for (r, c), cell in table.cells.items() if sum(cell["rejected"])]
    if marked:
        runs = sum(1 for *_, cell in marked for k in cell["rejected"] if k)
        total = sum(sum(cell["rejected"]) for *_, cell in marked)
        text += (f" {REJECTED_MARK}: the server rejected client updates in {runs} run{'s' if runs != 1 else ''} "
                 f"of the marked cell{'s' if len(marked) != 1 else ''} ({total:,} updates in all; the runs' logs "
                 "say why): such a figure may not be the method's.")
    return text


def _target_words(table: Table) -> str:
    """The words "target accuracy 90.0 %", naming the table's metric instead when it is not
    the global model's accuracy (``--metric core_accuracy --target 0.9`` times that metric)."""
    what = "accuracy" if table.metric == "accuracy" else table.metric
    return f"target {what} {100 * table.target:.1f} %"


def render(table: Table, fmt: Format = "md") -> str:
    """The table as Markdown, LaTeX or CSV (CSV: one line per cell, raw numbers)."""
    if fmt == "csv":
        if table.parts:  # one line per cell and t*, with the t* as a number
            return "".join(_csv(t) if i == 0 else _csv(t).split("\n", 1)[1] for i, t in enumerate(table.parts))
        return _csv(table)
    frame = _frame(table, fmt)
    if fmt == "md":
        parts = [caption(table), "", frame.to_markdown()]
        if table.paired_ref is not None:
            parts += ["", paired_title(table), "", _paired_frame(table, fmt).to_markdown()]
            if table.holm:
                parts += ["", holm_title(table), "", _holm_frame(table, fmt).to_markdown()]
        if table.target is not None:
            for title, f in _target_frames(table, fmt):
                parts += ["", f"{title}, {_target_words(table)}: mean over the seeds "
                              "that reached it", "", f.to_markdown()]
            if table.paired_ref is not None:
                parts += ["", FIRST_TITLE.format(ref=_label(table.paired_ref)) + f", {_target_words(table)}", "",
                          _first_frame(table, fmt).to_markdown()]
        return "\n".join(parts) + "\n"
    parts = [f"% {caption(table)}", frame.to_latex(escape=False)]
    if table.paired_ref is not None:
        parts += [f"% {paired_title(table)}", _paired_frame(table, fmt).to_latex(escape=False)]
        if table.holm:
            parts += [f"% {holm_title(table)}", _holm_frame(table, fmt).to_latex(escape=False)]
    if table.target is not None:
        for title, f in _target_frames(table, fmt):
            parts += [f"% {title}, {_target_words(table)}", f.to_latex(escape=False)]
        if table.paired_ref is not None:
            parts += [f"% {FIRST_TITLE.format(ref=_label(table.paired_ref))}, {_target_words(table)}",
                      _first_frame(table, fmt).to_latex(escape=False)]
    return "\n".join(parts)


def _csv(table: Table) -> str:
    import pandas as pd

    records = []
    for (r, c), cell in table.cells.items():
        rec = {**dict(zip(table.row_keys, r)), **dict(zip(table.col_keys, c)), "t_star": table.t_star,
               "value": table.value, "n_seeds": cell["n"], "mean": cell["mean"], "std": cell["std"],
               "seeds": " ".join(str(s) for s in cell["seeds"]),
               "per_seed": " ".join(f"{a:.6f}" for a in cell["acc"]),
               "rejected_updates": " ".join(str(k) for k in cell["rejected"])}
        if table.paired_ref is not None:
            d = cell.get("paired")
            rec.update(paired_against=_label(table.paired_ref),
                       diff_mean=d.mean if d else math.nan, diff_lo=d.lo if d else math.nan,
                       diff_hi=d.hi if d else math.nan, p_value=d.p if d else math.nan,
                       n_pairs=d.n if d else 0, verdict=d.verdict if d else "")
            if table.holm:
                p, m = cell.get("holm", (math.nan, 0))
                rec.update(p_holm=p, holm_m=m, verdict_holm=adjusted_verdict(d.mean, p) if d and m else "")
        if table.target is not None:
            rec.update(target=table.target, time_to_target_mean=float(np.nanmean(cell["tta"]))
                       if not all(math.isnan(t) for t in cell["tta"]) else math.nan,
                       seeds_reaching_target=sum(not math.isnan(t) for t in cell["tta"]))
            ref = table.cells.get((table.paired_ref, c)) if table.paired_ref is not None else None
            if ref is not None and r != table.paired_ref:
                first, later, tie, n = first_to_target(ref, cell)
                rec.update(ref_first=first, row_first=later, first_tie=tie)
        records.append(rec)
    frame = pd.DataFrame(records)
    for counts in ("ref_first", "row_first", "first_tie"):  # counts, empty on the reference's own line
        if counts in frame:
            frame[counts] = frame[counts].astype("Int64")
    return frame.to_csv(index=False)


def clipped_windows(runs: Sequence[RunData], t_star: float, span: float | None = None,
                    half_window: int = 10) -> list[Path]:
    """The runs whose evaluations stop inside Acc@t*'s window ``[t* - w, t* + w)`` (``w``:
    ``span``, else ``half_window`` grid steps), with room left in it for another grid
    evaluation: their value averages fewer evaluations than the same config run longer
    would, so the two differ. Runs without a grid (no interval) are not judged."""
    clipped = []
    for run in runs:
        step = run.interval
        width = window_half_width(step, span, half_window)
        if not step or not width or not run.times:
            continue
        last = max(run.times)
        if t_star < last and last + step < t_star + width - 1e-9 * step:
            clipped.append(run.path)
    return clipped


__all__ = ["Value", "PAPER_BASELINES", "REJECTED_MARK", "RunData", "Table", "find_runs", "read_run", "build_table", "join_t_stars",
           "render", "caption", "clipped_windows", "auto_t_star", "auto_note", "paired_text", "format_p"]
