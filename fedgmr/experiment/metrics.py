"""The evaluation protocol (docs/reference.md §9): Acc@t*, MRI and time-to-accuracy.

Reading run directories for ``compare``, ``plot`` and ``table``: a missing directory, an
empty or damaged ``metrics.jsonl`` (a record that is not a JSON object, lacks ``time`` /
``accuracy``, holds a non-number, or goes back in time) or an unreadable ``summary.json`` /
``config.yaml`` is a :class:`~fedgmr.errors.RunDirError` naming the file (and line).

Every runtime writes one schema (the simulator's records and summary): the simulator and
its executors (serial, process, Ray) with ``time`` in virtual seconds (``clock: virtual``
in the summary), a Flower deployment with ``time`` in wall-clock seconds since the server
loop started (``clock: wall``; the records also keep ``wall_time``). A summary without a
``clock`` is a simulator's.
"""

from __future__ import annotations

from dataclasses import dataclass

import bisect
import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from fedgmr.errors import ConfigError, RunDirError

#: the keys every runtime writes in each ``metrics.jsonl`` record (a runtime may add more:
#: a Flower run adds ``wall_time``, ``timeouts``, ``errors``, ...)
RECORD_KEYS = ("time", "step", "accuracy", "loss", "avg_density", "bytes_up", "bytes_down", "uploads", "downloads",
               "densities", "val_accuracy", "restored", "restorations", "staleness_mean", "min_coverage", "rejected")
#: the keys every runtime writes in ``summary.json`` (``t_star``, ``acc_at_t_star`` and
#: ``acc_at_t_star_std`` too when the run has a t*)
SUMMARY_KEYS = ("name", "method", "seed", "status", "runtime", "clock", "final_accuracy", "best_accuracy", "time",
                "steps", "final_avg_density", "restorations", "bytes_up", "bytes_down", "uploads", "downloads",
                "rejected_updates", "wall_time_s", "evaluations", "eval_interval")

@dataclass(frozen=True)
class TableMetric:
    """A logged series ``compare`` and ``table`` can tabulate at t*: ``percent`` (shown
    x100 as %, else as is, with ``digits`` decimals), ``higher_is_better`` (which mean is
    bold), ``ranked`` (False: a description of the runs, not a score, so nothing is bold),
    ``accuracy`` (an accuracy: MRI and time-to-accuracy apply), ``at_t_star`` (a counter:
    each run's value is its last record at or before t*, not the mean over the window)."""

    name: str
    description: str
    percent: bool = True
    higher_is_better: bool = True
    accuracy: bool = True
    ranked: bool = True
    at_t_star: bool = False
    digits: int = 2


def _mechanism(name: str, description: str, *, counter: bool = False) -> TableMetric:
    """A figure that describes how a method ran (density, steps, bytes), not how well; a
    counter is read at t* and shown with one decimal (a mean over seeds)."""
    return TableMetric(name, description, percent=False, accuracy=False, ranked=False, at_t_star=counter,
                       digits=1 if counter else 2)


#: the series ``compare`` and ``table`` can tabulate, one per table: the global model's
#: test ``accuracy``; the personalised metrics (``run.personal_eval_every``): the mean, the
#: spread and the worst 10 % of each client's own model on its own test split; a clustered
#: method's ``cluster_purity``; the coverage figures; and the run's mechanism (density,
#: staleness, server steps, uploads, megabytes, restorations), which every run logs
TABLE_METRICS: dict[str, TableMetric] = {m.name: m for m in (
    TableMetric("accuracy", "the global model's test accuracy"),
    TableMetric("core_accuracy", "the global model under the mask of the ladder's first level (run.level_eval_every): "
                "with one density for every client, the sub-model they all train and the model they would use"),
    TableMetric("personal_accuracy", "mean over clients of each client's own model on its own test split"),
    TableMetric("personal_worst10", "mean of the worst 10 % of the clients' personal accuracies"),
    TableMetric("personal_std", "std over clients of the personal accuracies (lower is better)",
                higher_is_better=False, accuracy=False),
    TableMetric("cluster_purity", "share of clients in their cluster's most common true group (clustered methods)",
                accuracy=False),
    TableMetric("coverage_min", "minimum coverage index Gamma* of the aggregations (run.coverage_eval_every)",
                percent=False, accuracy=False),
    TableMetric("coverage_none", "share of coordinates no aggregated update covers, coverage_hist[0] / N "
                "(run.coverage_eval_every; lower is better)", higher_is_better=False, accuracy=False),
    TableMetric("window_coverage_min", "minimum over all coordinates of the coverage of the last "
                "run.coverage_window aggregations together", percent=False, accuracy=False),
    TableMetric("window_coverage_none", "share of coordinates no update of the last run.coverage_window "
                "aggregations covers (lower is better)", higher_is_better=False, accuracy=False),
    TableMetric("coverage_never", "share of coordinates no aggregated update has covered since the start "
                "(lower is better)", higher_is_better=False, accuracy=False),
    TableMetric("pruned_energy_mean", "mean over the clients of ||theta - theta * m||^2 at their levels: the "
                "weight the sub-models leave out (EPM's pruning noise; lower is better)", percent=False,
                higher_is_better=False, accuracy=False),
    TableMetric("loss", "the global model's test loss (lower is better)", percent=False, higher_is_better=False,
                accuracy=False, digits=4),
    _mechanism("avg_density", "mean over the clients of their sub-model's density (1 = the full model)"),
    _mechanism("min_coverage", "fewest buffered updates covering a coordinate of the latest aggregation (Gamma*)"),
    _mechanism("staleness_mean", "mean staleness, in server steps, of the updates the latest aggregation used"),
    _mechanism("steps", "server steps (aggregations) by t*", counter=True),
    _mechanism("uploads", "client updates received by t*", counter=True),
    _mechanism("downloads", "models sent to clients by t*", counter=True),
    _mechanism("restorations", "restorations (GMR level changes) by t*", counter=True),
    _mechanism("mb_up", "megabytes uploaded by t* (bytes_up / 1e6)", counter=True),
    _mechanism("mb_down", "megabytes downloaded by t* (bytes_down / 1e6)", counter=True),
)}
ACCURACY_METRICS = tuple(TABLE_METRICS)


def _coverage_none(row: dict[str, Any]) -> Any:
    hist = row.get("coverage_hist")
    if not isinstance(hist, list) or not hist or not all(finite_number(h) for h in hist) or sum(hist) <= 0:
        return None
    return float(hist[0]) / float(sum(hist))


def _megabytes(key: str) -> Any:
    def derive(row: dict[str, Any]) -> Any:
        value = row.get(key)
        return value / 1e6 if finite_number(value) else None
    return derive


#: table metrics computed from other record keys (the rest are read as logged; a record's
#: ``step`` is the ``steps`` series)
def _core_accuracy(row: dict[str, Any]) -> Any:
    levels = row.get("level_accuracy")
    return levels[0] if isinstance(levels, list) and levels else None


DERIVED_METRICS: dict[str, Any] = {"coverage_none": _coverage_none, "core_accuracy": _core_accuracy, "mb_up": _megabytes("bytes_up"),
                                   "mb_down": _megabytes("bytes_down"), "steps": lambda row: row.get("step")}


def metric_value(row: dict[str, Any], metric: str) -> Any:
    """A record's value of a table metric: as logged, or derived (``coverage_none``)."""
    derive = DERIVED_METRICS.get(metric)
    return derive(row) if derive is not None else row.get(metric)


class MissingMetricError(RunDirError):
    """A run logged no value of the series asked for (``fedgmr table --metric``)."""


def metric_series(rows: Sequence[dict[str, Any]], metric: str, where: str | Path) -> tuple[list[float], list[float]]:
    """(times, values) of ``metric`` over the records that carry it (a personalised metric
    is logged at its own cadence); a one-line error when none does."""
    if metric not in ACCURACY_METRICS:
        raise ConfigError(f"invalid value for '--metric': must be one of {', '.join(ACCURACY_METRICS)} "
                          f"(got {metric!r})")
    values = [(r, metric_value(r, metric)) for r in rows]
    pairs = [(float(r["time"]), float(v)) for r, v in values if finite_number(v)]
    if not pairs:
        need = ("run.level_eval_every" if metric == "core_accuracy" else
                "run.personal_eval_every and data.client_test_fraction > 0" if metric.startswith("personal") else None)
        raise MissingMetricError(f"{where}: no record holds {metric!r}" + (f" (it needs {need})" if need else ""))
    return [t for t, _ in pairs], [a for _, a in pairs]


#: the record fields ``compare`` needs; ``plot`` also needs ``avg_density``
COMPARE_FIELDS = ("time", "accuracy")
PLOT_FIELDS = ("time", "accuracy", "avg_density")


def window_half_width(interval: float | None, span: float | None = None, half_window: int = 10) -> float | None:
    """Half-width in seconds of Acc@t*'s time window: ``span``, else ``half_window`` grid
    steps of ``interval``; None when neither is known (the index window applies)."""
    if span is not None:
        return span
    return half_window * interval if interval is not None else None


def acc_at_t(times: Sequence[float], accs: Sequence[float], t_star: float, half_window: int = 10,
             interval: float | None = None, span: float | None = None) -> tuple[float, float]:
    """Acc@t*: mean and (population) std of the evaluations in a window around ``t_star``.

    On a virtual-time grid (``interval`` = the grid step Δ, docs/reference.md §9.2) the window is the time
    span ``[t* - 10Δ, t* + 10Δ)``: 20 grid evaluations, the same span of time for every
    method. ``span`` sets the half-width in seconds directly (for runs evaluated off a
    grid). With neither, the authors' index window: the evaluations ``[i-10, i+10)``
    around the first evaluation ``i`` past ``t_star``. Windows are clipped to the run;
    NaN when the run never passes ``t_star`` (or its window holds no evaluation)."""
    idx = next((i for i, t in enumerate(times) if t > t_star), None)
    if idx is None:
        return math.nan, math.nan
    span = window_half_width(interval, span, half_window)
    if span is not None:
        lo, hi = t_star - span, t_star + span
        window = np.asarray([a for t, a in zip(times, accs) if lo <= t < hi], dtype=float)
        if window.size == 0:
            return math.nan, math.nan
    else:
        window = np.asarray(accs[max(0, idx - half_window): idx + half_window], dtype=float)
    return float(window.mean()), float(window.std())


def acc_at_times(times: Sequence[float], accs: Sequence[float], t_stars: Sequence[float], half_window: int = 10,
                 interval: float | None = None, span: float | None = None) -> list[float]:
    """:func:`acc_at_t`'s mean at each of ``t_stars``, the same floats, for a series whose
    times never decrease (as :func:`read_run_metrics` checks): a binary search per t
    instead of a scan of the whole run, for a t* scan over hundreds of grid times
    (``fedgmr table --t-star auto``). ValueError if the times decrease somewhere."""
    t = np.asarray(times, dtype=float)
    a = np.asarray(accs, dtype=float)
    if t.shape != a.shape:
        raise ValueError(f"{t.size} times but {a.size} values")
    if t.size > 1 and bool(np.any(t[1:] < t[:-1])):
        raise ValueError("acc_at_times needs times that never decrease")
    width = window_half_width(interval, span, half_window)
    out: list[float] = []
    for t_star in t_stars:
        idx = int(np.searchsorted(t, t_star, side="right"))  # the first evaluation past t*
        if idx == t.size:
            out.append(math.nan)
            continue
        if width is not None:  # [t* - width, t* + width): the window acc_at_t keeps
            lo = int(np.searchsorted(t, t_star - width, side="left"))
            hi = int(np.searchsorted(t, t_star + width, side="left"))
            out.append(float(a[lo:hi].mean()) if hi > lo else math.nan)
        else:
            out.append(float(a[max(0, idx - half_window): idx + half_window].mean()))
    return out


def mri(acc_method: float, acc_baselines: Sequence[float]) -> float:
    """Mean relative improvement, in percent: ``100/|B| * sum_b (A(M) - A(b)) / A(b)``.

    Undefined (NaN) without baselines or when a baseline's accuracy is 0 (the relative
    improvement over 0 has no value)."""
    if not acc_baselines or any(b == 0 for b in acc_baselines):
        return math.nan
    return 100.0 / len(acc_baselines) * sum((acc_method - b) / b for b in acc_baselines)


def value_at_t(times: Sequence[float], values: Sequence[float], t_star: float) -> float:
    """A counter's reading at ``t_star``: the last value logged at or before it. NaN when
    the run ends before ``t_star`` or logs nothing up to it."""
    if not times or times[-1] < t_star:
        return math.nan
    idx = bisect.bisect_right(times, t_star) - 1  # times never decrease (check_records)
    return math.nan if idx < 0 else float(values[idx])


def metric_at_t(metric: str, times: Sequence[float], values: Sequence[float], t_star: float,
                interval: float | None = None, span: float | None = None) -> float:
    """One run's value of a table metric at ``t_star``: a counter's reading
    (:func:`value_at_t`), any other series' mean over the Acc@t* window (:func:`acc_at_t`)."""
    if TABLE_METRICS[metric].at_t_star:
        return value_at_t(times, values, t_star)
    return acc_at_t(times, values, t_star, interval=interval, span=span)[0]


def time_to_accuracy(times: Sequence[float], accs: Sequence[float], target: float) -> float:
    """First virtual time at which accuracy reaches ``target`` (NaN if never)."""
    return next((t for t, a in zip(times, accs) if a >= target), math.nan)


def _read_text(path: Path, limit: int | None = None) -> str:
    """A run-directory file as text, through the one safe reader
    (:func:`fedgmr.experiment.rundir.read_run_file`): a regular file of bounded size; a
    FIFO, a link to a device or a huge file is a one-line ``RunDirError``, never a hang."""
    from fedgmr.experiment.rundir import SMALL_FILE_BYTES, read_run_text

    try:
        return read_run_text(path, SMALL_FILE_BYTES if limit is None else limit)
    except FileNotFoundError:
        raise RunDirError(f"cannot read {path}: no such file") from None


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Read a run directory's ``metrics.jsonl`` (one JSON object per line; may be empty)."""
    directory = Path(run_dir)
    if not directory.exists():
        raise RunDirError(f"run directory {directory} does not exist")
    if not directory.is_dir():
        raise RunDirError(f"{directory} is a file, not a run directory")
    path = directory / "metrics.jsonl"
    if not path.exists():
        raise RunDirError(f"{directory} has no metrics.jsonl (is it a fedgmr run directory?)")
    from fedgmr.experiment.rundir import MAX_FILE_BYTES

    rows = []
    for n, line in enumerate(_read_text(path, MAX_FILE_BYTES).splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise RunDirError(f"{path}:{n} is not valid JSON") from None
            if not isinstance(row, dict):
                raise RunDirError(f"{path}:{n} is not a JSON object (one evaluation record per line)")
            rows.append(row)
    return rows


def finite_number(value: Any) -> bool:
    """A real, finite number (not a bool, not NaN or infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_records(rows: Sequence[dict[str, Any]], path: str | Path, fields: Sequence[str] = COMPARE_FIELDS) -> None:
    """:class:`RunDirError` unless ``rows`` hold at least one record, each with finite
    numbers in ``fields``, an ``accuracy`` in [0, 1] and a ``time`` that never decreases."""
    if not rows:
        raise RunDirError(f"{path} holds no evaluation record (did the run stop before its first evaluation?)")
    previous = -math.inf
    for n, row in enumerate(rows, 1):
        for key in fields:
            if key not in row:
                hint = ("; it has 'wall_time': a Flower run written before every runtime wrote 'time' (rerun it)"
                        if key == "time" and "wall_time" in row else "")
                raise RunDirError(f"{path}: record {n} has no '{key}' field (needed: {', '.join(fields)}){hint}")
            if not finite_number(row[key]):
                raise RunDirError(f"{path}: record {n} has '{key}' = {row[key]!r:.40}, expected a finite number")
        if "accuracy" in fields and not 0 <= row["accuracy"] <= 1:
            raise RunDirError(f"{path}: record {n} has accuracy {row['accuracy']!r}, expected a fraction in [0, 1]")
        if "time" in fields:
            if row["time"] < previous:
                raise RunDirError(f"{path}: record {n} has time {row['time']!r}, before the previous record's "
                                  f"{previous!r} (records must be in time order)")
            previous = row["time"]


def read_run_metrics(run_dir: str | Path, fields: Sequence[str] = COMPARE_FIELDS) -> list[dict[str, Any]]:
    """``metrics.jsonl`` of a finished or running run, checked by :func:`check_records`."""
    rows = read_metrics(run_dir)
    check_records(rows, Path(run_dir) / "metrics.jsonl", fields)
    return rows


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    """A run directory's ``summary.json`` ({} when there is none yet)."""
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        return {}
    try:
        summary = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise RunDirError(f"{path} is damaged: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(summary, dict):
        raise RunDirError(f"{path} is damaged: not a JSON object")
    return summary


def run_clock(run_dir: str | Path) -> str:
    """The clock of a run directory's ``time``: ``virtual`` (the simulator; also a run
    whose summary predates the key or is not written yet) or ``wall`` (a Flower run)."""
    summary = read_summary(run_dir)
    clock = summary.get("clock", "virtual")
    if clock not in ("virtual", "wall"):
        raise RunDirError(f"{Path(run_dir) / 'summary.json'} is damaged: clock is {clock!r:.40}, expected "
                          f"'virtual' or 'wall'")
    return clock


def run_label(run_dir: str | Path) -> str:
    """The method a run directory holds (its summary's ``method``, else the folder name);
    a wall-clock run is marked with its runtime, e.g. ``fedgmr (flower)``."""
    summary = read_summary(run_dir)
    method = summary.get("method")
    label = method if isinstance(method, str) and method else Path(run_dir).name
    if run_clock(run_dir) == "wall":
        runtime = summary.get("runtime")
        label += f" ({runtime if isinstance(runtime, str) and runtime else 'wall clock'})"
    return label


def headline_metric(run_dir: str | Path) -> str:
    """What a run is judged by: ``personal_accuracy`` for a method whose clients keep their
    own models (its summary's ``headline_metric``), else ``accuracy`` (the global model)."""
    value = read_summary(run_dir).get("headline_metric")
    return value if value in ("accuracy", "personal_accuracy") else "accuracy"


def default_metric(run_dirs: Sequence[str | Path]) -> tuple[str, list[str]]:
    """The metric ``compare`` and ``table`` use without ``--metric``: ``personal_accuracy``
    when every run is of a personalised method, else ``accuracy``; and the personalised
    runs then judged by their global model (for a note: never mixed in one figure)."""
    heads = {str(d): headline_metric(d) for d in run_dirs}
    if heads and all(h == "personal_accuracy" for h in heads.values()):
        return "personal_accuracy", []
    return "accuracy", [d for d, h in heads.items() if h == "personal_accuracy"]


def summary_t_star(run_dirs: Sequence[str | Path], required: bool = True) -> float | None:
    """The t* the runs' summaries agree on (``t_star``; runs without one are left out).

    :class:`ConfigError` when two runs disagree, or (``required``) when none has one;
    otherwise None when none has one."""
    found: dict[float, list[str]] = {}
    for d in run_dirs:
        value = read_summary(d).get("t_star")
        if value is None:
            continue
        if not (finite_number(value) and value >= 0):
            raise RunDirError(f"{Path(d) / 'summary.json'} is damaged: t_star is {value!r:.40}, expected a time >= 0")
        found.setdefault(float(value), []).append(str(d))
    if len(found) > 1:
        which = "; ".join(f"{t:g} in {', '.join(dirs)}" for t, dirs in found.items())
        raise ConfigError(f"the runs' summaries disagree on t* ({which}): pass --t-star")
    if not found:
        if required:
            raise ConfigError("no run's summary.json has a t_star (set run.t_star in the config, or t-star in a "
                              "Flower run config): pass --t-star")
        return None
    return next(iter(found))


def run_eval_interval(run_dir: str | Path) -> float | None:
    """The evaluation grid step of a run directory (None: evaluated on a step cadence)."""
    summary = read_summary(run_dir)
    if "eval_interval" in summary:
        value = summary["eval_interval"]
        where: Path = Path(run_dir) / "summary.json"
    else:
        config_path = Path(run_dir) / "config.yaml"
        if not config_path.exists():
            return None
        import yaml

        try:
            cfg = yaml.safe_load(_read_text(config_path)) or {}
        except yaml.YAMLError as exc:
            raise RunDirError(f"{config_path} is damaged: {str(exc).splitlines()[0]}") from None
        run = cfg.get("run") if isinstance(cfg, dict) else None
        value = run.get("eval_interval") if isinstance(run, dict) else None
        where = config_path
    if value is not None and not (finite_number(value) and value > 0):
        raise RunDirError(f"{where} is damaged: eval_interval is {value!r:.40}, expected a number > 0 or null")
    return value


#: keys that say how a run was executed, not what it computed (and the seed): runs that
#: differ only in these are seeds of one experiment. ``run.eval_from`` belongs here: it
#: leaves out early evaluations and changes neither training nor any later record
EXECUTION_KEYS = frozenset({"seed", "data.root", "run.executor", "run.workers", "run.torch_threads",
                            "run.ray_address", "run.checkpoint_every", "run.checkpoint_seconds", "run.device",
                            "run.loggers", "run.mlflow_uri", "run.eval_from"})


def flatten_config(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config tree as dotted keys (``options`` mappings stay one value)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value and key != "options":
            flat.update(flatten_config(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def read_run_config(run_dir: str | Path) -> dict[str, Any] | None:
    import yaml

    try:
        cfg = yaml.safe_load(_read_text(Path(run_dir) / "config.yaml"))
    except (OSError, ValueError, yaml.YAMLError, RunDirError):
        return None
    return cfg if isinstance(cfg, dict) else None


def with_defaults(cfg: dict[str, Any]) -> dict[str, Any]:
    """A saved config with every key the current version knows, at its default where the
    file does not name it. A run written before a key existed saved no value for it, and
    new keys default to what earlier versions did (the bit-identity checks hold the code to
    that), so a run of a later version with the key at its default computed the same: both
    must read as seeds of one experiment. Structural only (no validation, so a config that
    no longer validates is completed the same way): sections are merged key by key, any
    other value, a mapping included, is taken as saved."""
    from pydantic import BaseModel

    from fedgmr.config.experiment import ExperimentConfig

    def merge(section: BaseModel, saved: Any) -> Any:
        if not isinstance(saved, dict):
            return saved
        defaults = section.model_dump(mode="json", warnings=False)
        out = dict(saved)
        for name, default in defaults.items():
            sub = getattr(section, name, None)
            if name not in out:
                out[name] = default
            elif isinstance(sub, BaseModel):
                out[name] = merge(sub, out[name])
        return out

    return merge(ExperimentConfig.model_construct(), cfg)


def experiment_identity(run_dir: str | Path) -> str | None:
    """What a run computed, seed aside (None when the run has no readable config):
    runs with the same identity are seeds of one experiment (keys a run's version did not
    write count at their defaults: :func:`with_defaults`)."""
    cfg = read_run_config(run_dir)
    if cfg is None:
        return None
    flat = {k: v for k, v in flatten_config(with_defaults(cfg)).items() if k not in EXECUTION_KEYS}
    flat["clock"] = run_clock(run_dir)  # a Flower run and a simulation of one config are not seeds of one row
    return json.dumps(flat, sort_keys=True, default=str)


def _seed_of(run_dir: str | Path) -> Any:
    cfg = read_run_config(run_dir)
    return None if cfg is None else cfg.get("seed")


def compare_runs(run_dirs: Sequence[str | Path], t_star: float, target: float | None = None,
                 span: float | None = None, metric: str = "accuracy") -> dict[str, Any]:
    """Acc@t* per experiment, MRI of the first over the others, time-to-accuracy.

    Runs that differ only in their seed (and in how they were executed) are one row: its
    Acc@t* is the mean of each seed's Acc@t*, ± the sample std across seeds
    (``std_kind: "seeds"``). A row of one run shows the std of the evaluations in its
    window (``std_kind: "window"``). The first row is the method, the others baselines.

    Each run's Acc@t* window is ``t* ± 10Δ`` with Δ its evaluation grid step (the index
    window for step-cadence runs), or ``t* ± span`` seconds for every run when ``span`` is
    given. ``target`` defaults to 90 % of the lowest best accuracy among the runs, so
    every run reaches it. ``metric`` (one of :data:`ACCURACY_METRICS`) is the accuracy
    every figure is computed from, the same for every run: global and personalised
    accuracy are never mixed.
    """
    if not run_dirs:
        raise ConfigError("give at least one run directory")
    if metric in TABLE_METRICS and not TABLE_METRICS[metric].accuracy:
        accuracies = ", ".join(m.name for m in TABLE_METRICS.values() if m.accuracy)
        raise ConfigError(f"invalid value for '--metric': compare computes MRI and time-to-accuracy, so it takes an "
                          f"accuracy ({accuracies}); `fedgmr table --metric {metric}` tabulates {metric!r}")
    if not finite_number(t_star) or t_star < 0:
        raise ConfigError(f"invalid value for '--t-star': must be a finite time >= 0 in seconds (got {t_star})")
    if span is not None and not (finite_number(span) and span > 0):
        raise ConfigError(f"invalid value for '--window': must be a finite number of seconds > 0 (got {span})")
    if target is not None and not (finite_number(target) and 0 < target <= 1):
        raise ConfigError(f"invalid value for '--target': must be an accuracy in (0, 1] (got {target})")
    runs = []
    for d in run_dirs:
        times, accs = metric_series(read_run_metrics(d), metric, Path(d) / "metrics.jsonl")
        runs.append({"dir": str(d), "method": run_label(d), "times": times, "accs": accs,
                     "final_accuracy": accs[-1], "end_time": times[-1], "interval": run_eval_interval(d),
                     "identity": experiment_identity(d), "seed": _seed_of(d)})
    if target is None:
        target = 0.9 * min(max(r["accs"]) for r in runs)
    groups: dict[str, list[dict[str, Any]]] = {}
    for i, r in enumerate(runs):  # seeds of one experiment form one row, in order of first appearance
        groups.setdefault(r["identity"] or f"#{i}", []).append(r)
    table = []
    for members in groups.values():
        per_seed = [acc_at_t(r["times"], r["accs"], t_star, interval=r["interval"], span=span) for r in members]
        ttas = [time_to_accuracy(r["times"], r["accs"], target) for r in members]
        reached = [t for t in ttas if not math.isnan(t)]
        first = members[0]
        if len(members) > 1:
            values = np.asarray([m for m, _ in per_seed], dtype=float)
            mean, std, kind = float(values.mean()), float(values.std(ddof=1)), "seeds"
        else:
            (mean, std), kind = per_seed[0], "window"
        table.append({"run": first["dir"], "runs": [m["dir"] for m in members],
                      "seeds": [m["seed"] for m in members], "n": len(members), "method": first["method"],
                      "acc_at_t": mean, "std": std, "std_kind": kind, "per_seed": [m for m, _ in per_seed],
                      "final_accuracy": float(np.mean([m["final_accuracy"] for m in members])),
                      "end_time": float(np.mean([m["end_time"] for m in members])),
                      "window": (span if span is not None else 10 * first["interval"] if first["interval"] else None),
                      "time_to_target": float(np.mean(reached)) if reached else math.nan,
                      "reached_target": len(reached)})
    first = table[0]["acc_at_t"]
    others = [row["acc_at_t"] for row in table[1:]]
    value, note = math.nan, None
    if not others:
        note = "no baseline run given"
    elif any(math.isnan(v) for v in [first, *others]):
        missing = [row["method"] for row in table if math.isnan(row["acc_at_t"])]
        note = f"no Acc@t* for {', '.join(missing)} (the run ends before t* or has no evaluation in the window)"
    elif any(v == 0 for v in others):
        zero = [row["method"] for row in table[1:] if row["acc_at_t"] == 0]
        note = f"undefined: Acc@t* of {', '.join(zero)} is 0 (no relative improvement over 0)"
    else:
        value = mri(first, others)
    return {"t_star": t_star, "target": target, "metric": metric, "runs": table, "mri": value, "mri_note": note,
            "mri_of": table[0]["method"], "over": [row["method"] for row in table[1:]]}
