"""Accuracy and average density against virtual time, as PNG."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import os
import textwrap

import numpy as np

from fedgmr.errors import ConfigError, FedGMRError


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, imported on first use: a run or a command that
    draws nothing does not pay for it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_runs(runs: Sequence[tuple[str, Sequence[dict[str, Any]]]], path: str | Path,
              title: str | None = None, t_star: float | None = None) -> Path:
    """One figure: test accuracy (left axis, solid) and average density (right axis,
    dashed) against virtual time, one colour per run."""
    curves = []
    for label, rows in runs:
        t = np.array([r["time"] for r in rows], dtype=float)
        curves.append(Curve(label, t, np.array([100 * r["accuracy"] for r in rows], dtype=float),
                            dashed=(t, np.array([r["avg_density"] for r in rows], dtype=float))))
    if title is None and len(runs) > 1:
        title = default_title([label for label, _ in runs])
    return draw_curves(curves, path, "virtual time (s)", "test accuracy (%)", title=title, vline=t_star,
                       right_label="average density (dashed)")


def shared_label_parts(labels: Sequence[str]) -> tuple[str, list[str]]:
    """What every label shares, said once, and each label without it: a common leading
    part (whole ``, ``-separated parts: the method of a sweep over one method) and a common
    trailing `` (...)`` (``(mean ± std, 3 seeds)``). ``("fedgmr_wo_gmr (mean ± std, 3 seeds)",
    ["ladder=[0.1]", "ladder=[1.0]"])``; ``("", labels)`` when nothing is shared or a label
    would be left empty. The legend then names only what tells the curves apart."""
    if len(labels) < 2:
        return "", list(labels)
    heads = [label.rsplit(" (", 1) if label.endswith(")") and " (" in label else [label, ""] for label in labels]
    tail = heads[0][1] if all(h[1] == heads[0][1] for h in heads) else ""
    bodies = [h[0] if tail else label for h, label in zip(heads, labels)]
    parts = [b.split(", ") for b in bodies]
    lead = 0
    while all(len(p) > lead + 1 and p[lead] == parts[0][lead] for p in parts):
        lead += 1
    shared = ", ".join(parts[0][:lead]) + (f" ({tail}" if tail else "")
    short = [", ".join(p[lead:]) for p in parts]
    if not shared.strip() or any(not s for s in short) or len(set(short)) < len(short):
        return "", list(labels)
    return shared.strip(), short


def default_title(labels: Sequence[str], what: str = "test accuracy") -> str:
    """The title of a figure of several runs: ``test accuracy: fedgmr vs fedavg vs ...``."""
    names = list(dict.fromkeys(labels))
    shown = " vs ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return f"{what}: {shown}"


def check_plot_path(path: str | Path, option: str = "--out") -> Path:
    """Refuse, before any work, an output path a plot cannot be written to: an unknown
    image format (:class:`ConfigError`, naming ``option``), a missing or unwritable folder, or
    a folder in place of the file (:class:`FedGMRError`)."""
    path = Path(path)
    plt = _pyplot()
    formats = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in formats:
        raise ConfigError(f"invalid value for '{option}': {str(path)!r} must end in an image format "
                          f"({', '.join('.' + f for f in sorted(formats))}), e.g. .png")
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise FedGMRError(f"cannot write plot {path}: it is a directory")
    if not parent.is_dir():
        why = "is a file, not a folder" if parent.exists() else "does not exist"
        raise FedGMRError(f"cannot write plot {path}: folder {parent} {why}")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise FedGMRError(f"cannot write plot {path}: permission denied")
    return path


def write_plot(runs: Sequence[tuple[str, Sequence[dict[str, Any]]]], path: str | Path, option: str = "--out",
               title: str | None = None, t_star: float | None = None) -> Path:
    """:func:`plot_runs` for the command line: any failure to write is one ``FedGMRError`` line."""
    path = check_plot_path(path, option)
    try:
        return plot_runs(runs, path, title=title, t_star=t_star)
    except OSError as exc:
        raise FedGMRError(f"cannot write plot {path}: {exc.strerror or exc}") from None


@dataclass
class Curve:
    """One line of a :func:`draw_curves` figure, with optional shaded bands."""

    label: str
    x: np.ndarray
    y: np.ndarray
    #: (low, high) shaded around the line (± std over seeds, the 10-90 % of clients)
    band: tuple[np.ndarray, np.ndarray] | None = None
    #: a second, lighter band (the min-max of clients)
    outer: tuple[np.ndarray, np.ndarray] | None = None
    #: (x, y) on the right axis, dashed (average density)
    dashed: tuple[np.ndarray, np.ndarray] | None = None
    #: a fixed colour (a reference line among many), else the next of the colour cycle
    color: str | None = None


def curve_colors(n: int, cycle: Sequence[str]) -> list[str]:
    """Colours for ``n`` curves: the style's cycle while it has enough, else matplotlib's
    20-colour ``tab20`` (its ten dark shades first, then the light ones), so that a plot of
    every method of a table (17 rows) gives no two curves one colour up to 20."""
    if n <= len(cycle):
        return list(cycle)
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    tab20 = [to_hex(c) for c in colormaps["tab20"].colors]
    return tab20[0::2] + tab20[1::2]


def draw_curves(curves: Sequence[Curve], path: str | Path, xlabel: str, ylabel: str, title: str | None = None,
                vline: float | None = None, right_label: str | None = None, legend_loc: str = "best") -> Path:
    """One figure: a line per curve (with its bands), a dashed right-axis series per curve
    that has one, an optional vertical mark (t*)."""
    plt = _pyplot()
    below = len(curves) > 1 or legend_loc == "outside"
    entries = ([c.label for c in curves] + (["t*"] if vline is not None else [])
               + (["average density (dashed, right axis)"] if any(c.dashed is not None for c in curves) else []))
    rows = -(-len(entries) // legend_columns(entries)) if below else 0
    # the axes keep their height however many rows the legend below them takes
    fig, ax = plt.subplots(figsize=(7.5, 4.2 + 0.17 * max(0, rows - 2)), dpi=120)
    ax2 = ax.twinx() if any(c.dashed is not None for c in curves) else None
    colors = curve_colors(sum(c.color is None for c in curves), plt.rcParams["axes.prop_cycle"].by_key()["color"])
    cycle = 0
    for c in curves:
        if c.color is None:
            color, cycle = colors[cycle % len(colors)], cycle + 1
        else:
            color = c.color
        if c.outer is not None:
            ax.fill_between(c.x, *c.outer, color=color, alpha=0.12, lw=0)
        if c.band is not None:
            ax.fill_between(c.x, *c.band, color=color, alpha=0.25, lw=0)
        ax.plot(c.x, c.y, color=color, lw=2.2 if c.color else 1.6, label=c.label)
        if c.dashed is not None and ax2 is not None:
            ax2.plot(*c.dashed, color=color, lw=1.1, ls="--", alpha=0.8)
    if ax2 is not None:
        ax2.set_ylabel(right_label or "")
        ax2.set_ylim(0, 1.05)
    if vline is not None:
        ax.axvline(vline, color="grey", lw=0.8, ls=":", label=f"t* = {vline:,g} s")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if ax2 is not None and any(c.dashed is not None for c in curves):  # one entry for every run's dashed line
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], color="grey", lw=1.1, ls="--"))
        labels.append((right_label or "right axis").replace(" (dashed)", "") + " (dashed, right axis)")
    if below:
        # below the axes: it never covers a curve
        ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=8, frameon=False,
                  ncol=legend_columns(labels))
    else:
        ax.legend(handles, labels, loc=legend_loc, fontsize=8)
    if title:
        ax.set_title(wrap_title(title))
    return _save(fig, path)


#: characters per title line: about the width of the 7.5-inch axes at the title's font size
TITLE_WIDTH = 72
#: characters of 8-point legend text (with each entry's line sample) across the 7.5-inch axes
LEGEND_WIDTH = 110


def legend_columns(labels: Sequence[str], width: int = LEGEND_WIDTH) -> int:
    """Columns of a legend below the axes: up to 3, as many as fit the axes' width with the
    longest label (its line sample and spacing: 8 characters more). A legend wider than
    the axes would widen the saved figure (cut to its contents) and shrink the axes in it."""
    longest = max((len(label) for label in labels), default=0)
    return max(1, min(3, len(labels), width // (longest + 8)))


def wrap_title(title: str, width: int = TITLE_WIDTH) -> str:
    """``title`` broken into lines of at most ``width`` characters (a longer word stays
    whole): a title wider than the axes would otherwise widen the saved figure (it is cut
    to its contents) and leave the axes a narrow strip in the middle."""
    return "\n".join(textwrap.wrap(title, width=width, break_long_words=False, break_on_hyphens=False)) or title


def _save(fig: Any, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` (a one-line error when it cannot be written) and close it."""
    fig.tight_layout()
    path = Path(path)
    try:
        fig.savefig(path, bbox_inches="tight")  # the legend below the axes included
    except OSError as exc:
        raise FedGMRError(f"cannot write plot {path}: {exc.strerror or exc}") from None
    finally:
        _pyplot().close(fig)
    return path


def _x_label(axis: str, run_dirs: Sequence[Path]) -> str:
    """The axis label; ``time`` says which clock the runs' ``time`` counts."""
    from fedgmr.experiment.curves import X_AXES
    from fedgmr.experiment.metrics import run_clock

    if axis != "time":
        return X_AXES.get(axis).label
    clocks = {run_clock(d) for d in run_dirs}
    return {frozenset({"virtual"}): "virtual time (s)", frozenset({"wall"}): "wall-clock time (s)"}.get(
        frozenset(clocks), "time (s; virtual, wall-clock for a Flower run)")


def _run_name(run_dir: Path) -> str:
    """A run's label: its summary's method (:func:`run_label`), else its config's, else
    the folder name."""
    from fedgmr.experiment.curves import run_config
    from fedgmr.experiment.metrics import read_summary, run_label

    method = run_config(run_dir).get("method")
    if read_summary(run_dir).get("method") or not isinstance(method, str) or not method:
        return run_label(run_dir)
    return method


def metric_curves(run_dirs: Sequence[str | Path], x: str = "time", metric: str = "accuracy",
                  bands: bool = True) -> list[Curve]:
    """The curves of ``fedgmr plot``: ``metric`` against ``x`` for each run (a directory
    without ``metrics.jsonl`` stands for the runs under it, e.g. a sweep). Seeds of one
    experiment are one mean line with a ±1 std band (``bands``), else every run is a
    line. With accuracy, the average density comes along (dashed, right axis)."""
    from fedgmr.experiment import curves as cv
    from fedgmr.experiment.metrics import check_records, read_metrics

    cv.choice(cv.X_AXES, x, "--x")
    spec = cv.choice(cv.METRICS, metric, "--metric")
    dirs = cv.expand_runs(run_dirs)
    fields = (("time",) if x == "time" else ()) + (("accuracy", "avg_density") if metric == "accuracy" else
                                                   () if spec.every else (spec.key,))
    rows = {}
    for d in dirs:
        records = read_metrics(d)
        check_records(records, d / "metrics.jsonl", fields)
        rows[d] = cv.metric_records(records, metric, d / "metrics.jsonl")
        cv.axis_values(rows[d], x, d / "metrics.jsonl")  # e.g. no 'wall_time' in a simulator run: one line
    groups = cv.group_seeds(dirs) if bands else [[d] for d in dirs]
    labels = cv.group_labels(groups, [_run_name(g[0]) for g in groups])
    out = []
    for label, group in zip(labels, groups):
        series = [(cv.axis_values(rows[d], x, d), cv.metric_values(rows[d], metric, d)) for d in group]
        density = ([(xs, cv.metric_values(rows[d], "avg_density", d)) for d, (xs, _) in zip(group, series)]
                   if metric == "accuracy" else None)
        if len(group) == 1:
            (xs, ys), = series
            out.append(Curve(label, xs, ys, dashed=density[0] if density else None))
            continue
        try:
            band = cv.seed_band(series)
        except FedGMRError as exc:
            raise type(exc)(f"{label}: {exc}") from None
        dens = cv.seed_band(density) if density else None
        out.append(Curve(f"{label} (mean ± std, {band.n} seeds)", band.x, band.mean,
                         band=(band.mean - band.std, band.mean + band.std),
                         dashed=(dens.x, dens.mean) if dens else None))
    return out


def plot_metric(run_dirs: Sequence[str | Path], path: str | Path, x: str = "time", metric: str = "accuracy",
                bands: bool = True, t_star: float | None = None) -> Path:
    """``fedgmr plot``: :func:`metric_curves` drawn, t* marked when ``x`` is time."""
    from fedgmr.experiment.curves import METRICS, expand_runs

    curves = metric_curves(run_dirs, x, metric, bands)
    label = METRICS.get(metric).label
    title = None
    if len(curves) > 1:
        shared, short = shared_label_parts([c.label for c in curves])
        curves = [replace(c, label=s) for c, s in zip(curves, short)]
        what = label.split(" (")[0] + ("" if not shared else f" {shared}" if shared.startswith("(") else f", {shared}")
        title = default_title(short, what)
    return draw_curves(curves, path, _x_label(x, expand_runs(run_dirs)), label, title=title,
                       vline=t_star if x == "time" else None,
                       right_label="average density (dashed)" if metric == "accuracy" else None)


def run_title(run_dir: str | Path, what: str) -> str:
    """The title of a figure of one run: its method, and for a sweep's cell the cell's
    other axes as its name spells them (``fedgmr (preset=mnist, alpha=0.1, seed=1):
    accuracy on each class``), so figures of two cells of one sweep are told apart."""
    from fedgmr.experiment.metrics import run_label
    from fedgmr.experiment.table import is_sweep_cell

    run_dir = Path(run_dir)
    label = run_label(run_dir)
    if is_sweep_cell(run_dir):
        axes = [part for part in run_dir.name.split(",") if not part.startswith("method=")]
        if axes:
            label += f" ({', '.join(axes)})"
    return f"{label}: {what}"


def plot_levels(run_dir: str | Path, path: str | Path, x: str = "time") -> Path:
    """``fedgmr plot --levels``: one accuracy curve per ladder level of one run."""
    from fedgmr.experiment import curves as cv
    from fedgmr.experiment.metrics import read_run_metrics

    run_dir = Path(run_dir)
    rows = read_run_metrics(run_dir, ("accuracy",))
    levels = cv.level_curves(rows, x, run_dir / "metrics.jsonl")
    out = [Curve(f"level {i} (density {level:g})", xs, ys) for i, (level, xs, ys) in enumerate(levels)]
    full = [(cv.axis_values(rows, x, run_dir / "metrics.jsonl"), cv.metric_values(rows, "accuracy", run_dir))]
    out.append(Curve("global model", full[0][0], full[0][1], color="black"))
    return draw_curves(out, path, _x_label(x, [run_dir]), "test accuracy (%)",
                       title=run_title(run_dir, "accuracy under each level's mask"))


def plot_classes(run_dir: str | Path, path: str | Path, x: str = "time") -> Path:
    """``fedgmr plot --classes``: the global model's accuracy on each class of one run."""
    from fedgmr.experiment import curves as cv
    from fedgmr.experiment.metrics import read_run_metrics

    run_dir = Path(run_dir)
    rows = read_run_metrics(run_dir, ("accuracy",))
    out = [Curve(f"class {c}", xs, ys) for c, xs, ys in cv.class_curves(rows, x, run_dir / "metrics.jsonl")]
    out.append(Curve("all classes", cv.axis_values(rows, x, run_dir / "metrics.jsonl"),
                     cv.metric_values(rows, "accuracy", run_dir), color="black"))
    return draw_curves(out, path, _x_label(x, [run_dir]), "test accuracy (%)",
                       title=run_title(run_dir, "accuracy on each class"))


def plot_coverage(run_dir: str | Path, path: str | Path, x: str = "time") -> Path:
    """``fedgmr plot --coverage``: the share of coordinates covered by 0, 1, 2, 3 and 4 or
    more of the updates of each aggregation (``coverage_hist``), stacked, of one run."""
    from fedgmr.experiment import curves as cv
    from fedgmr.experiment.metrics import read_run_metrics

    run_dir = Path(run_dir)
    xs, shares, labels = cv.coverage_shares(read_run_metrics(run_dir, ("accuracy",)), x, run_dir / "metrics.jsonl")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=120)
    ax.stackplot(xs, 100.0 * shares, labels=labels, alpha=0.85, step="post")
    ax.set_xlabel(_x_label(x, [run_dir]))
    ax.set_ylabel("coordinates (%)")
    ax.set_ylim(0, 100)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(wrap_title(run_title(run_dir, "coverage of each aggregation")))
    return _save(fig, path)


def plot_clients(run_dir: str | Path, path: str | Path, x: str = "time") -> Path:
    """``fedgmr plot --clients``: mean per-client accuracy with its 10-90 % and min-max
    bands over the clients, of one run."""
    from fedgmr.experiment import curves as cv
    from fedgmr.experiment.metrics import read_run_metrics

    run_dir = Path(run_dir)
    spread = cv.client_spread(read_run_metrics(run_dir, ("accuracy",)), x, run_dir / "metrics.jsonl")
    curve = Curve(f"mean of {spread.clients} clients (bands: 10-90 %, min-max)", spread.x, spread.mean,
                  band=(spread.p10, spread.p90), outer=(spread.lo, spread.hi))
    return draw_curves([curve], path, _x_label(x, [run_dir]), "client accuracy (%)",
                       title=run_title(run_dir, "accuracy on each client's held-out split"))
