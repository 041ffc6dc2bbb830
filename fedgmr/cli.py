"""The ``fedgmr`` command line: run, compare, plot, demo, methods, presets."""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import typer

from fedgmr.config import apply_overrides, parse_config, parse_value, read_config_file
from fedgmr.errors import ConfigError, FedGMRError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="FedGMR: model-heterogeneous federated learning with Gradual Model Restoration.")


def _fail(exc: Exception) -> None:
    """One line on stderr and the error's documented exit code (see fedgmr.errors)."""
    code = getattr(exc, "exit_code", 1)
    typer.echo("error: " + " ".join(str(exc).splitlines()), err=True)
    raise typer.Exit(code)


def _exclude_option(verb: str) -> Any:
    """``--exclude``, as ``fedgmr table``, ``plot``, ``evaluate`` and ``tiers`` take it."""
    return typer.Option([], "--exclude", help=f"{verb} without the runs that match every --exclude, each "
                        "written as for --only (--exclude heterogeneity=medium --exclude partition=iid leaves "
                        "out one column, Medium IID); repeatable")


def _drop_option(verb: str) -> Any:
    """``--drop``, one more group of ``--exclude`` conditions per flag."""
    return typer.Option([], "--drop", metavar="'KEY=V[,V] KEY=V...'",
                        help=f"{verb} without the runs that match every KEY=V of this one flag, written as for "
                        "--only and separated by spaces (--drop 'heterogeneity=medium partition=iid'); "
                        "repeatable: a run matching any --drop, or every --exclude, is left out")


def _import_option(what: str = "before anything runs") -> Any:
    """The repeatable ``--import`` option of the commands that read configs."""
    return typer.Option([], "--import", metavar="MODULE",
                        help=f"import your module {what} (a name importable from here or a .py "
                        "file), so what it registers (models, data sets, methods, rules, policies) can be named; "
                        "repeatable")


def _import_user_code(imports: list[str]) -> None:
    """Import each ``--import``; a failure is one line and exit code 6 (PluginError)."""
    from fedgmr.plugins import import_all

    try:
        import_all(imports)
    except FedGMRError as exc:
        _fail(exc)


def _version() -> str:
    """The installed distribution's version, else ``fedgmr.__version__``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedgmr")
    except PackageNotFoundError:
        from fedgmr import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"fedgmr {_version()}")
        raise typer.Exit()


@app.callback()
def _start(version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                        help="print the version and exit")) -> None:
    """FedGMR: model-heterogeneous federated learning with Gradual Model Restoration."""
    from fedgmr.plugins import load_plugins

    for name, error in load_plugins():  # installed packages' fedgmr.plugins entry points
        typer.echo(f"warning: fedgmr plugin '{name}' failed to load and is skipped: {error}", err=True)


def load_raw_config(config: str) -> dict[str, Any]:
    """A config file path, or the name of a shipped preset (:func:`fedgmr.presets.load_raw_config`)."""
    from fedgmr.presets import load_raw_config as load

    return load(config)


def resolve(config: str, overrides: list[str]):
    from fedgmr.methods import resolve_config

    raw = load_raw_config(config)
    apply_overrides(raw, overrides)
    explicit = {item.split("=", 1)[0].strip(): parse_value(item.split("=", 1)[1]) for item in overrides if "=" in item}
    return resolve_config(raw, explicit)


@app.command()
def run(
    config: Optional[str] = typer.Argument(None, help="config file (YAML/TOML) or preset name"),
    out_arg: Optional[str] = typer.Option(None, "--out", "-o", metavar="DIR", help="run directory to write"),
    set_: list[str] = typer.Option([], "--set", "-s", metavar="KEY=VALUE",
                                  help="override a key: --set training.lr=0.1; repeatable"),
    resume_arg: Optional[str] = typer.Option(None, "--resume", metavar="DIR",
                                             help="continue the interrupted run in this directory from its "
                                             "last checkpoint, with its saved config (no CONFIG, --set, --out)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace the run in --out (removes only the files "
                                   "fedgmr wrote, checkpoint included)"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar (on a terminal) and no progress "
                               "lines (otherwise: every $FEDGMR_PROGRESS_EVERY seconds, default 30, on stderr)"),
    imports: list[str] = _import_option("before the config is read (also with --resume)"),
    blind: bool = typer.Option(False, "--blind", help="show no test accuracy (progress bar or lines, the last "
                               "line): for a run of a protocol's grid, read only when the grid is complete; "
                               "what is recorded does not change"),
) -> None:
    """Run one experiment and write its directory.

    Exit codes: 0 done, 2 bad config or usage, 3 run directory problem (holds a run, \
in use, damaged or mismatched checkpoint, not writable), 4 data, 5 the run failed (no \
progress; its metrics and a failed summary are written), 6 an --import failed, 130 \
interrupted.
    """
    # usage and the config are checked before the runner (and PyTorch) is imported: a mistake answers at once
    _import_user_code(imports)
    cfg = None
    # "" would be the current directory: refused rather than run into it
    out = Path(out_arg) if out_arg else None
    resume = Path(resume_arg) if resume_arg else None
    target = resume if resume is not None else out
    try:
        empty = next((flag for flag, v in (("--out", out_arg), ("--resume", resume_arg)) if v is not None
                      and not v.strip()), None)
        if empty:
            raise ConfigError(f"{empty} is empty: name the run directory (use {empty} . for this one)")
        if resume is not None:
            # the one thing a resume may change is where it computes (--set run.device=cpu)
            device_sets = [s for s in set_ if s.split("=", 1)[0].strip() == "run.device"]
            extra = [name for name, given in (("CONFIG", config is not None),
                                              ("--set", len(device_sets) < len(set_)),
                                              ("--out", out is not None), ("--overwrite", overwrite)) if given]
            if extra:
                raise ConfigError(f"--resume continues the run exactly as saved in {resume}; drop "
                                  f"{', '.join(extra)} (to change anything but run.device, start a new run "
                                  f"with --out)")
            from fedgmr.experiment.runner import saved_config

            cfg = saved_config(resume)
            if device_sets:
                cfg = parse_config(apply_overrides(cfg.model_dump(mode="json"), device_sets[-1:]))
        else:
            if config is None:
                raise ConfigError("give a CONFIG file or preset name (e.g. 'quickstart')")
            if out is None:
                raise ConfigError("give --out DIR for the run directory")
            cfg = resolve(config, set_)
        bar, every = _progress_mode(quiet)
        _check_device(cfg.run.device)
        _warn_t_star(cfg)
        from fedgmr.experiment.runner import run_experiment

        summary = run_experiment(cfg, target, resume=resume is not None, progress=bar, overwrite=overwrite,
                                 progress_every=every, show_accuracy=not blind)
    except FedGMRError as exc:
        _fail(exc)
        return
    except KeyboardInterrupt:
        typer.echo(_interrupted_message(cfg, target), err=True)
        raise typer.Exit(130)
    result = "finished" if blind else final_result(summary)
    typer.echo(f"{summary['method']}: {result} at t={summary['time']:,.1f}s after "
               f"{summary['steps']} steps ({summary['wall_time_s']:.1f}s wall) -> {target}")
    rejected = summary.get("rejected_updates") or 0
    if rejected:
        typer.echo(f"warning: the server rejected {rejected:,} of {summary.get('uploads') or 0:,} client updates "
                   "(the log says which and why); the result may not be the method's", err=True)


def final_result(summary: dict[str, Any]) -> str:
    """What a finished run is judged by, for its printed line: ``final accuracy 96.38%``
    (the global model), or for a personalised method (summary ``headline_metric``) the
    clients' own models: ``final personal accuracy 88.70% ± 3.10 (worst 10%: 80.00%)``,
    with the global model's figure, labelled, only where that model means something (Ditto)."""
    if summary.get("headline_metric") != "personal_accuracy":
        return f"final accuracy {100 * summary['final_accuracy']:.2f}%"
    personal = summary.get("personal_accuracy") or {}

    def pct(value: Any) -> str:
        return "n/a" if not isinstance(value, (int, float)) or math.isnan(value) else f"{100 * value:.2f}"

    text = (f"final personal accuracy {pct(personal.get('mean'))}% ± {pct(personal.get('std'))} "
            f"(worst 10%: {pct(personal.get('worst10'))}%)")
    if summary.get("global_model_meaningful"):
        text += f", global model {pct(summary.get('final_accuracy'))}%"
    return text


def _warn_t_star(cfg: Any) -> None:
    """A run that ends before its t* has no Acc@t*: say so before it starts."""
    t_star, end = cfg.run.t_star, cfg.run.max_time
    if t_star is not None and end is not None and end <= t_star:
        typer.echo(f"warning: run.max_time {end:g} s ends before run.t_star {t_star:g} s: the run will have no "
                   "Acc@t* (acc_at_t_star null); lower run.t_star or raise run.max_time", err=True)


def _check_device(spec: str) -> None:
    """Refuse a ``run.device`` this machine lacks before the runner is imported: a CPU run
    needs no look at all; CUDA asked of a CPU-only PyTorch build is refused from its
    ``torch/version.py`` without importing it; otherwise only PyTorch is imported to ask."""
    if spec in ("cpu", "auto"):  # auto: the CPU when there is no GPU, never an error
        return
    if spec.startswith("cuda") and _torch_build_is_cpu_only():
        raise ConfigError(f"run.device '{spec}' is not available: torch.cuda.is_available() is False here "
                          "(a CPU-only torch build: torch.version.cuda is None); use run.device=cpu or auto")
    from fedgmr.device import resolve_device

    resolve_device(spec)


def _torch_build_is_cpu_only() -> bool:
    """Whether the installed torch was built without CUDA and ROCm, read from its
    ``version.py`` (``cuda = None``, ``hip = None``) without importing torch; False when
    unsure (then torch is asked)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("torch")  # a top-level package: found, not imported
        where = list(found.submodule_search_locations or []) if found is not None else []
        text = (Path(where[0]) / "version.py").read_text(encoding="utf-8") if where else ""
    except (ImportError, OSError, ValueError, UnicodeDecodeError):
        return False
    values = {m.group(1): m.group(2).strip() for m in
              re.finditer(r"^(cuda|hip)\s*(?::[^=\n]*)?=\s*(.+?)\s*$", text, re.M)}
    return values.get("cuda") == "None" and values.get("hip") == "None"


def _interrupted_message(cfg: Any, target: Optional[Path]) -> str:
    """What to do after Ctrl-C: resume from the last checkpoint, if there are any; a run
    stopped before its first record resumes from the start (docs/simulator.md, "Killed
    while it starts"), checkpoints or not."""
    import os
    import stat

    if cfg is None or target is None:
        return "interrupted"
    try:
        config_written = stat.S_ISREG(os.lstat(target / "config.yaml").st_mode)
    except OSError:
        config_written = False
    try:
        no_records = os.lstat(target / "metrics.jsonl").st_size == 0
    except OSError:
        no_records = True
    if not config_written:
        return f"interrupted before the run wrote its config to {target}: start it again with the same command"
    if no_records:
        return f"interrupted before the first record: run it from the start with: fedgmr run --resume {target}"
    if cfg.run.checkpoint_every is None and cfg.run.checkpoint_seconds is None:
        return (f"interrupted: checkpoints were off (run.checkpoint_every and run.checkpoint_seconds are null), "
                f"so {target} cannot be resumed")
    return f"interrupted: continue from the last checkpoint with: fedgmr run --resume {target}"


def _force_progress() -> bool:
    import os

    return os.environ.get("FEDGMR_PROGRESS") == "1"


#: seconds of wall time between two progress lines when stderr is not a terminal
PROGRESS_EVERY = 30.0


def _progress_mode(quiet: bool) -> tuple[bool, Optional[float]]:
    """How ``fedgmr run`` shows progress: (rich bar?, seconds between plain lines or None).

    ``-q`` or ``FEDGMR_PROGRESS=0``: nothing. ``FEDGMR_PROGRESS=1`` or stderr on a
    terminal: the bar. Otherwise (nohup, SLURM, CI): a line on stderr every
    ``FEDGMR_PROGRESS_EVERY`` seconds (default :data:`PROGRESS_EVERY`)."""
    import os

    if quiet or os.environ.get("FEDGMR_PROGRESS") == "0":
        return False, None
    if _force_progress() or sys.stderr.isatty():
        return True, None
    raw = os.environ.get("FEDGMR_PROGRESS_EVERY", "").strip()
    if not raw:
        return False, PROGRESS_EVERY
    try:
        every = float(raw)
    except ValueError:
        every = math.nan
    if not (math.isfinite(every) and every > 0):
        raise ConfigError(f"FEDGMR_PROGRESS_EVERY must be a number of seconds > 0, got {raw!r}")
    return False, every


def distinct_suffixes(paths: list[str], longest: int = 40) -> list[str]:
    """Run paths as a table shows them: whole when short and relative, else the fewest
    trailing components that still tell every path apart, after ``…/``
    (``/home/u/exp/a/fedgmr`` and ``/home/u/exp/b/fedgmr`` -> ``…/a/fedgmr``, ``…/b/fedgmr``)."""
    if all(len(p) <= longest and not Path(p).is_absolute() for p in paths):
        return list(paths)
    parts = [Path(p).parts for p in paths]
    for k in range(1, max(map(len, parts), default=1) + 1):
        tails = [str(Path(*x[-k:])) for x in parts]
        if len(set(tails)) == len(set(paths)):
            break
    return [t if len(x) <= k else "…/" + t for t, x in zip(tails, parts)]


def format_compare(result: dict[str, Any]) -> str:
    """The compare table as text."""
    from rich.console import Console
    from rich.table import Table

    metric = result.get("metric", "accuracy")
    label = "Acc@t*" if metric == "accuracy" else f"Acc@t* of {metric}"
    table = Table(title=f"{label} (t* = {result['t_star']:,.0f} s)  |  time-to-{100 * result['target']:.1f}%",
                  caption="±: sample std across seeds for a row of several seeds, else the std of the "
                          "evaluations in the run's window")
    for col in ("method", "run", f"{label} (%)", "± is", "window", "final (%)", "end time (s)", "time to target (s)"):
        table.add_column(col, justify="right" if col not in ("method", "run", "± is") else "left",
                         overflow="fold")  # a long run path wraps, never cut to an ellipsis
    shown = dict(zip((r["run"] for r in result["runs"]), distinct_suffixes([r["run"] for r in result["runs"]])))
    for r in result["runs"]:
        n = r.get("n", 1)
        acc = "n/a" if math.isnan(r["acc_at_t"]) else (
            f"{100 * r['acc_at_t']:.2f}" + ("" if math.isnan(r["std"]) else f" ± {100 * r['std']:.2f}"))
        ttt = "never" if math.isnan(r["time_to_target"]) else f"{r['time_to_target']:,.1f}"
        if n > 1 and not math.isnan(r["time_to_target"]) and r.get("reached_target", n) < n:
            ttt += f" ({r['reached_target']}/{n})"
        window = "±10 evals" if r["window"] is None else f"±{r['window']:,.0f} s"
        run = shown[r["run"]] if n == 1 else f"{n} seeds ({', '.join(str(x) for x in r['seeds'])})"
        kind = "across seeds" if r.get("std_kind") == "seeds" else "in window"
        table.add_row(r["method"], run, acc, kind, window, f"{100 * r['final_accuracy']:.2f}",
                      f"{r['end_time']:,.1f}", ttt)
    console = Console(width=120, record=True, file=open("/dev/null", "w"))
    console.print(table)
    text = console.export_text()
    if not math.isnan(result["mri"]):
        text += f"MRI of {result['mri_of']} over {', '.join(result['over'])}: {result['mri']:+.2f}%\n"
    elif result["over"]:
        text += f"MRI of {result['mri_of']} over {', '.join(result['over'])}: n/a ({result.get('mri_note')})\n"
    return text


def _json_safe(value: Any) -> Any:
    """NaN and infinity (an undefined MRI, a run that never reaches t*) become JSON null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


@app.command()
def compare(
    runs: list[Path] = typer.Argument(..., help="run directories; the first experiment is the method, the rest baselines (seeds of one experiment are one row)"),
    t_star: Optional[float] = typer.Option(None, "--t-star", help="time t* for Acc@t*, in seconds of each run's "
                                           "clock (virtual; wall for a Flower run) (default: the t_star the runs' "
                                           "summary.json files agree on)"),
    target: Optional[float] = typer.Option(None, "--target", help="accuracy (0-1) for time-to-accuracy"),
    window: Optional[float] = typer.Option(None, "--window", help="Acc@t* half-window in virtual seconds for every "
                                           "run (default: 10 x each run's evaluation interval)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="also write a comparison PNG"),
    metric: Optional[str] = typer.Option(None, "--metric", help="accuracy (the global model), personal_accuracy or "
                                         "personal_worst10 (each client's own model on its own test split) "
                                         "(default: personal_accuracy when every run is of a personalised method "
                                         "such as fedbn or ditto, else accuracy)"),
) -> None:
    """Compare runs: Acc@t* ± std, MRI of the first experiment, time-to-accuracy.

    Runs that differ only in the seed are one row (mean ± sample std across seeds). \
A missing or damaged run directory exits with code 3; an undefined MRI (a baseline at 0 \
accuracy) is shown as n/a (null in --json). Without --t-star, the runs' summaries must \
agree on one (exit code 2 otherwise). Runs of personalised methods (fedbn, ditto, fedmrl, \
fedmd, local_only, standalone) are compared by their clients' personal accuracy."""
    from fedgmr.errors import RunDirError
    from fedgmr.experiment.metrics import PLOT_FIELDS, compare_runs, default_metric, read_run_metrics, summary_t_star
    from fedgmr.experiment.plots import check_plot_path, write_plot

    try:
        for d in runs:  # before anything is read from them (t* included): a mistyped path is what to say
            if not d.exists():
                raise RunDirError(f"run directory {d} does not exist")
            if not d.is_dir():
                raise RunDirError(f"{d} is a file, not a run directory")
        if plot is not None:
            check_plot_path(plot, "--plot")
        if metric is None:
            metric, global_only = default_metric(runs)
            if global_only:
                typer.echo(f"note: {', '.join(global_only)} {'is a run' if len(global_only) == 1 else 'are runs'} of "
                           "a personalised method, compared here by the global model's accuracy as the others are; "
                           "--metric personal_accuracy compares the clients' own models (where every run logs it)",
                           err=True)
        if t_star is None:
            t_star = summary_t_star(runs)
        result = compare_runs(runs, t_star, target, span=window, metric=metric)
        if plot is not None:
            write_plot([(r["method"], read_run_metrics(r["run"], PLOT_FIELDS)) for r in result["runs"]], plot,
                       "--plot", t_star=t_star)
    except FedGMRError as exc:
        _fail(exc)
        return
    if as_json:
        typer.echo(json.dumps(_json_safe(result), indent=2, default=lambda v: None))
    else:
        typer.echo(format_compare(result), nl=False)


def _plot_t_star(text: str) -> float | None:
    """A given ``fedgmr plot --t-star``: a finite time >= 0, or ``none`` (None: no mark)."""
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"invalid value for '--t-star': a finite time >= 0 or 'none' (got {text!r})")
    return value


@app.command()
def plot(
    runs: list[Path] = typer.Argument(..., help="run directories, or directories holding runs (a sweep); "
                                      "with --levels, --clients, --classes or --coverage: one run"),
    out: Path = typer.Option(..., "--out", "-o", help="PNG file to write"),
    t_star: Optional[str] = typer.Option(None, "--t-star", help="mark t* at this virtual time (on a time axis; "
                                         "default: the t_star the runs' summary.json files agree on); "
                                         "'none': no mark"),
    x: str = typer.Option("time", "--x", help="x axis: time (s), step, bytes_up or bytes_total (MB up + down), "
                          "wall (wall-clock s: runs that record wall_time, e.g. Flower)"),
    metric: str = typer.Option("accuracy", "--metric", help="accuracy, loss, avg_density, min_coverage, "
                        "coverage_min, window_coverage_none, coverage_never or pruned_energy_mean (run.coverage_eval_every), "
                        "core_accuracy (run.level_eval_every: the global model under the first level's mask)"),
    bands: bool = typer.Option(True, "--bands/--no-bands", help="seeds of one experiment as a mean line with "
                               "a ±1 std band (default), or every run as its own line"),
    levels: bool = typer.Option(False, "--levels", help="one accuracy curve per ladder level (level_accuracy) "
                                "of one run"),
    clients: bool = typer.Option(False, "--clients", help="mean, 10-90 % and min-max of per-client accuracy "
                                 "(client_accuracy) of one run"),
    classes: bool = typer.Option(False, "--classes", help="one accuracy curve per class (class_accuracy) of one "
                                 "run"),
    coverage: bool = typer.Option(False, "--coverage", help="the share of coordinates covered by 0, 1, 2, 3, 4+ "
                                  "updates of each aggregation (coverage_hist), stacked, of one run"),
    only: list[str] = typer.Option([], "--only", help="plot part of the runs: those with one of these values of a "
                                   "key, as for fedgmr table (--only heterogeneity=high --only "
                                   "method=fedgmr,fjord_ims); repeatable"),
    exclude: list[str] = _exclude_option("plot"),
    drop: list[str] = _drop_option("plot"),
) -> None:
    """Plot accuracy (and average density, dashed) or another metric of runs.

    Against time, steps, bytes or wall-clock time; seeds of one experiment as a mean ± std \
band. A missing or damaged run directory (or one without the keys --x / --metric need) \
exits with code 3, an unwritable --out with code 1, a bad option or runs whose summaries \
disagree on t* (without --t-star) with code 2."""
    from fedgmr.experiment.curves import expand_runs
    from fedgmr.experiment.metrics import summary_t_star
    from fedgmr.experiment.plots import (check_plot_path, plot_classes, plot_clients, plot_coverage, plot_levels,
                                         plot_metric)

    try:
        mark = None if t_star is None else _plot_t_star(t_star)
        check_plot_path(out, "--out")
        single = {"--levels": (levels, plot_levels), "--clients": (clients, plot_clients),
                  "--classes": (classes, plot_classes), "--coverage": (coverage, plot_coverage)}
        chosen = [flag for flag, (on, _) in single.items() if on]
        if chosen:
            flag = chosen[0]
            if len(chosen) > 1:
                raise ConfigError(f"give one of --levels, --clients, --classes and --coverage (got "
                                  f"{' and '.join(chosen)})")
            if metric != "accuracy":
                what = "coverage shares" if flag == "--coverage" else "accuracy"
                raise ConfigError(f"{flag} plots {what}: drop --metric {metric}")
            if len(runs) != 1:
                raise ConfigError(f"{flag} plots one run: give one run directory (got {len(runs)})")
            if only or exclude or drop:
                raise ConfigError(f"{flag} plots one run: leave out --only, --exclude and --drop")
            single[flag][1](runs[0], out, x=x)
        else:
            dirs = _select_run_dirs(expand_runs(runs), only, exclude, drop)
            if t_star is None:  # not given: the t* the runs' summaries agree on
                mark = summary_t_star(dirs, required=False)
            plot_metric(dirs, out, x=x, metric=metric, bands=bands, t_star=mark)
    except FedGMRError as exc:
        _fail(exc)
        return
    typer.echo(str(out))


def _select_run_dirs(dirs: list[Path], only: list[str], exclude: list[str] | None = None,
                     drop: list[str] | None = None) -> list[Path]:
    """The run directories whose config has one of the ``--only`` values of each named key,
    less those matching every ``--exclude`` or all of one ``--drop`` (``fedgmr table``'s
    selection, on the configs alone); ConfigError when none is left."""
    from fedgmr.experiment.table import RunData, read_run_config

    if not only and not exclude and not drop:
        return list(dirs)
    runs = [RunData(d, read_run_config(d), [], [], [], [], None) for d in dirs]
    return [r.path for r in _select(runs, only, exclude or [], drop or [])]


def _unfinished_in_selection(paths: list[Path], unfinished: list[Path], only: list[str], exclude: list[str],
                             drop: Sequence[str] = ()) -> list[Path]:
    """The unfinished runs among ``paths`` that ``--only``/``--exclude``/``--drop`` would have
    tabulated had they finished, the selection made over every run found: those it leaves
    out anyway (another task's cells still running beside a finished one) are not worth a
    note. A run whose config cannot be read yet is kept."""
    from fedgmr.experiment.table import RunData, read_run_config

    if not unfinished or not (only or exclude or drop):
        return unfinished
    runs = []
    for path in paths:
        try:
            runs.append(RunData(path, read_run_config(path), [], [], [], [], None))
        except FedGMRError:  # config.yaml damaged, or half written
            continue
    try:
        kept = {r.path for r in _select(runs, only, exclude, drop)}
    except ConfigError:  # the selection itself is refused below, on the finished runs, with its message
        return unfinished
    readable = {r.path for r in runs}
    return [p for p in unfinished if p in kept or p not in readable]


def _select(runs: list[Any], only: list[str], exclude: list[str], drop: Sequence[str] = ()) -> list[Any]:
    """The runs ``--only`` keeps and neither ``--exclude`` (one group of conditions, all
    its flags together) nor a ``--drop`` (one group per flag) leaves out (``select_runs``);
    ConfigError naming the options when none is left."""
    from fedgmr.experiment.sweep import parse_only
    from fedgmr.experiment.table import select_runs

    # an empty --drop is parsed as one empty condition, which parse_only refuses in one line
    groups = [parse_only(exclude, "--exclude")] + [parse_only(d.split() or [d], "--drop") for d in drop]
    flags = ["--exclude"] + ["--drop"] * len(drop)
    kept = select_runs(runs, parse_only(only), groups, flags)
    if not kept:
        asked = " ".join([*(f"--only {o}" for o in only), *(f"--exclude {e}" for e in exclude),
                          *(f"--drop '{d}'" for d in drop)])
        raise ConfigError(f"no run is left by {asked}" if asked else "no finished run found")
    return kept


#: the demo's runs, in the order of its compare table (the first is the method)
DEMO_METHODS = ("fedgmr", "fedavg", "fedgmr_wo_gmr")
#: what a demo writes in its --out folder
DEMO_ENTRIES = frozenset({*DEMO_METHODS, "compare.png"})


def _keep_previous_demo(out: Path) -> Optional[Path]:
    """Move an earlier demo's results in ``out`` aside to ``out.previous-N`` (the first free
    N) and return where; None when ``out`` is absent or empty. A folder that holds anything
    but a demo's results is refused (:class:`~fedgmr.errors.RunDirError`)."""
    from fedgmr.errors import RunDirError

    if not out.exists() and not out.is_symlink():
        return None
    if out.is_symlink() or not out.is_dir():
        raise RunDirError(f"--out {out} is not a directory: give another --out")
    entries = {e.name for e in out.iterdir()}
    if not entries:
        return None
    foreign = sorted(entries - DEMO_ENTRIES)
    if foreign:
        raise RunDirError(f"--out {out} holds other files than a demo's results ({', '.join(foreign[:3])}"
                          f"{' ...' if len(foreign) > 3 else ''}): give another --out, or --overwrite to replace "
                          "the demo's runs in it")
    n = 1
    while True:
        kept = out.with_name(f"{out.name}.previous-{n}")
        if not kept.exists() and not kept.is_symlink():
            break
        n += 1
    try:
        out.rename(kept)
    except OSError as exc:
        raise RunDirError(f"cannot move the previous results in {out} aside to {kept}: {exc.strerror}; "
                          "give another --out or --overwrite") from None
    return kept


@app.command()
def demo(
    out: Path = typer.Option(Path("demo-out"), "--out", "-o", metavar="DIR", help="directory for the three runs"),
    set_: list[str] = typer.Option([], "--set", "-s", metavar="KEY=VALUE", help="override a key in all three runs"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace the results already in --out (default: "
                                   "move them aside, to OUT.previous-1, -2, ...)"),
    imports: list[str] = _import_option("first (e.g. to --set data.name to your data set)"),
) -> None:
    """The quickstart: FedGMR vs FedAvg vs FedGMR w/o GMR on digits, then the compare table.

    Results already in --out (an earlier demo) are moved aside to OUT.previous-N, never \
deleted, unless --overwrite; a folder holding anything else is refused (exit code 3).
    """
    t0 = time.perf_counter()
    _import_user_code(imports)
    dirs = []
    cfg, method = None, "fedgmr"
    try:
        configs = {m: resolve("quickstart", [*set_, f"method={m}"]) for m in DEMO_METHODS}  # all checked first
        if not overwrite:
            kept = _keep_previous_demo(out)
            if kept is not None:
                typer.echo(f"note: the previous results in {out} were moved to {kept} (--overwrite replaces them)",
                           err=True)
        from fedgmr.experiment.metrics import compare_runs, read_metrics
        from fedgmr.experiment.plots import plot_runs
        from fedgmr.experiment.runner import run_experiment

        for method in DEMO_METHODS:
            cfg = configs[method]
            typer.echo(f"running {method} ...")
            summary = run_experiment(cfg, out / method, progress=not quiet, overwrite=True)
            typer.echo(f"  {final_result(summary)}, {summary['steps']} steps, "
                       f"{summary['restorations']} restorations, {summary['wall_time_s']:.1f}s wall")
            dirs.append(out / method)
        t_star = cfg.run.t_star or cfg.run.max_time or 0.0
        result = compare_runs(dirs, t_star)
        plot_runs([(r["method"], read_metrics(r["run"])) for r in result["runs"]], out / "compare.png", t_star=t_star,
                  title="quickstart: digits, High heterogeneity, non-IID")
    except FedGMRError as exc:
        _fail(exc)
        return
    except KeyboardInterrupt:
        typer.echo(_interrupted_message(cfg, out / method), err=True)
        raise typer.Exit(130)
    typer.echo(format_compare(result), nl=False)
    typer.echo(f"plot: {out / 'compare.png'}  (total wall time {time.perf_counter() - t0:.1f}s)")


@app.command("config")
def show_config(
    config: str = typer.Argument("quickstart", help="config file or preset name"),
    set_: list[str] = typer.Option([], "--set", "-s", metavar="KEY=VALUE", help="override a key; repeatable"),
    imports: list[str] = _import_option(),
    explain_keys: list[str] = typer.Option([], "--explain", metavar="KEY", help="instead, describe a key "
                                           "(aggregation.trim) or every key of a section (aggregation): type, "
                                           "default, range, meaning; repeatable"),
) -> None:
    """Print the fully resolved config (every key with its value) as YAML, or describe keys."""
    from fedgmr.config import dump_config

    _import_user_code(imports)
    try:
        if explain_keys:
            from fedgmr.config_help import explain

            typer.echo("\n\n".join(explain(k) for k in explain_keys))
            return
        typer.echo(dump_config(resolve(config, set_)), nl=False)
    except FedGMRError as exc:
        _fail(exc)


@app.command()
def sweep(
    sweep_file: Path = typer.Argument(..., help="sweep file (YAML): base config, overrides and a grid of keys"),
    out_arg: str = typer.Option(..., "--out", "-o", metavar="DIR",
                                help="sweep directory: one run directory per cell + sweep.json"),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="cells run at once (default: CPU cores)"),
    executor: str = typer.Option("local", "--executor", help="local (processes) or ray (cells as Ray tasks)"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster to join (default: the "
                                              "base config's run.ray_address, else a local Ray)"),
    set_: list[str] = typer.Option([], "--set", "-s", metavar="KEY=VALUE",
                                   help="override a key in every cell (after the sweep file's "
                                   "set, before its grid): --set data.root=/data/femnist"),
    dry_run: bool = typer.Option(False, "--dry-run", help="list the cells and what a rerun would do; run nothing"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress display"),
    imports: list[str] = _import_option("here and in every cell (with the sweep file's imports:)"),
    only: list[str] = typer.Option([], "--only", help="run part of the grid: the cells with one of these values "
                                   "on an axis, as in the cell names (--only heterogeneity=high --only seed=0,1); "
                                   "repeatable; the cells keep their names, so a later full pass skips them"),
    max_cells: int = typer.Option(10_000, "--max-cells", min=1, help="refuse a grid of more cells than this, "
                                  "counted before any cell is made (a typo'd axis can make millions)"),
    blind: bool = typer.Option(False, "--blind", help="show no test accuracy: not in the progress lines, not in "
                               "the cells' logs (each runs as fedgmr run --blind), not in sweep.json's entries "
                               "of these cells; for a protocol's grid, read only when complete (docs/protocol.md); "
                               "what the cells record does not change"),
) -> None:
    """Run a grid of experiments; rerun to skip finished cells and resume interrupted ones."""
    from fedgmr.experiment.interrupt import sigterm_as_interrupt
    from fedgmr.experiment.sweep import (_cell_state, check_out, expand, import_sweep_code, load_sweep,
                                         parse_only, resolve_cells, run_sweep, select)

    out = Path(out_arg)
    try:
        if not out_arg.strip():
            raise ConfigError("--out is empty: name the sweep directory")
        if executor not in ("local", "ray"):
            raise ConfigError(f"--executor must be local or ray, got '{executor}'")
        spec, root = load_sweep(sweep_file, overrides=set_, imports=imports)
        chosen = parse_only(only)
        import_sweep_code(spec, root)
        if dry_run:
            check_out(out)
            cells = select(expand(spec, root, max_cells), chosen)
            resolve_cells(cells)
            from fedgmr.download import missing_data

            lacking = []
            for cell in cells:
                state = _cell_state(out / cell.name, cell.config)  # type: ignore[arg-type]
                gap = missing_data(cell.config.data.name, cell.config.data.root)  # type: ignore[union-attr]
                if gap and state != "done":
                    lacking.append(gap)
                typer.echo(f"{state:8s} {cell.name}" + (f"  (no data: {gap})" if gap and state != "done" else ""))
            typer.echo(f"{len(cells)} cells -> {out}")
            for gap in dict.fromkeys(lacking):
                typer.echo(f"note: {lacking.count(gap)} cell(s) cannot run without their data: {gap}", err=True)
            return
        display = _SweepDisplay(enabled=not quiet, live=sys.stderr.isatty() or _force_progress(), blind=blind)
        with display, sigterm_as_interrupt():  # `kill`, SLURM's scancel: stop as Ctrl-C does
            outcome = run_sweep(spec, Path(sweep_file), root, out, jobs=jobs, executor=executor,  # type: ignore
                                ray_address=ray_address, on_event=display.event, only=chosen,
                                max_cells=max_cells, blind=blind)
    except FedGMRError as exc:
        _fail(exc)
        return
    except KeyboardInterrupt:
        typer.echo(f"interrupted: rerun the same command to continue ({out / 'sweep.json'})", err=True)
        raise typer.Exit(130)
    done = sum(c.status == "done" for c in outcome.cells)
    typer.echo(f"sweep {spec.name}: {done}/{len(outcome.cells)} cells done ({len(outcome.skipped)} already "
               f"finished, {len(outcome.resumed)} resumed) in {outcome.wall_s:.1f}s wall -> {out}")
    for cell in outcome.cells:
        if (cell.result or {}).get("rejected_updates"):
            typer.echo(f"  warning: {cell.name}: the server rejected {cell.result['rejected_updates']:,} client "
                       f"updates (logs in {out / 'logs'})", err=True)
    if outcome.failed:
        for cell in outcome.failed:
            typer.echo(f"  failed {cell.name}: {cell.error}", err=True)
        typer.echo(f"error: {len(outcome.failed)} of {len(outcome.cells)} cells failed "
                   f"(logs in {out / 'logs'})", err=True)
        raise typer.Exit(1)


class _SweepDisplay:
    """One progress display for a whole sweep: a rich bar on a terminal, else a line per
    finished cell (so logs under nohup, SLURM or CI show progress); ``blind``: without the
    cells' accuracy."""

    def __init__(self, enabled: bool, live: bool, blind: bool = False) -> None:
        self.enabled, self.live, self.bar, self.task = enabled, live and enabled, None, None
        self.blind = blind
        self.running: set[str] = set()
        self.started: dict[str, float] = {}  # cell name -> when this sweep started it (monotonic)
        self.took: list[float] = []  # wall seconds of each cell this sweep ran to the end
        self.parallel = 0  # the most cells seen running at once (the sweep's --jobs, in effect)
        #: the cells this sweep will run and have not finished: name -> expected wall seconds
        #: (from finished cells like it, :func:`~fedgmr.experiment.sweep.expected_wall_times`; None: unknown)
        self.queued: dict[str, float | None] = {}
        self.paced: list[tuple[float, float]] = []  # (took, expected) of the finished cells that had an estimate

    def __enter__(self) -> "_SweepDisplay":
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=None)
            self.bar.__enter__()
            self.task = self.bar.add_task("sweep", total=None, info="")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def event(self, kind: str, cell: Any, finished: int, total: int) -> None:
        if not self.enabled:
            return
        if kind == "queued":
            self.queued[cell.name] = getattr(cell, "expected_s", None)
            return
        began = expected = None
        if kind == "start":
            self.running.add(cell.name)
            self.started[cell.name] = time.monotonic()
            self.parallel = max(self.parallel, len(self.running))
        else:  # the cell is no longer this sweep's to run: out of the plan the estimate reads
            self.running.discard(cell.name)
            began, expected = self.started.pop(cell.name, None), self.queued.pop(cell.name, None)
        if self.bar is not None:
            info = f"running: {', '.join(sorted(self.running))[:80]}" if self.running else ""
            self.bar.update(self.task, total=total, completed=finished, info=info)
            if kind == "fail":
                self.bar.console.print(f"[red]failed[/red] {cell.name}: {cell.error}")
            return
        if kind == "start":
            return
        acc = cell.result.get("acc_at_t_star", cell.result.get("final_accuracy"))
        what = {"skip": "skipped (done)", "done": "done", "fail": "failed", "left": "left to another sweep"}[kind]
        line = f"[{finished}/{total}] {what:15s} {cell.name}"
        if kind == "fail":
            line += f": {cell.error}"
        elif acc is not None and not self.blind and kind != "left":
            line += f"  acc {100 * acc:.2f}%"
        if kind == "done" and began is not None:
            now = time.monotonic()
            self.took.append(now - began)
            if expected:
                self.paced.append((self.took[-1], expected))
            line += f"  ({_duration(self.took[-1])}"
            left = total - finished
            if left:
                line += f"; about {_duration(self._left(left, now))} left"
            line += ")"
        typer.echo(line, err=True)

    def _left(self, left: int, now: float) -> float:
        """Wall seconds until the sweep ends, run as many at once as it has run. Without a
        plan of its cells (no ``queued`` events): the ``left`` cells at the mean pace of
        this sweep's cells so far. With one: each unfinished cell's expected time (from
        finished cells like it), scaled by how this sweep's cells compared with their
        expectations, less what a running cell has had; a cell with no expectation at the
        mean pace so far."""
        mean = sum(self.took) / len(self.took)
        if not self.queued:
            return left * mean / max(self.parallel, 1)
        pace = sum(t for t, _ in self.paced) / sum(e for _, e in self.paced) if self.paced else 1.0
        total = 0.0
        for name, expected in self.queued.items():
            need = expected * pace if expected else mean
            total += max(need - (now - self.started[name]), 0.0) if name in self.started else need
        return total / max(self.parallel, 1)


def _duration(seconds: float) -> str:
    """``42 s``, ``12 min 31 s``, ``2 h 05 min``: a wall time for a progress line."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _table_metric_help() -> str:
    from fedgmr.experiment.metrics import TABLE_METRICS

    windowed = [m.name for m in TABLE_METRICS.values() if not m.at_t_star and m.name != "accuracy"]
    counters = [m.name for m in TABLE_METRICS.values() if m.at_t_star]
    return (f"the series each cell shows: accuracy (the global model; the default, but personal_accuracy when "
            f"every run is of a personalised method such as fedbn or ditto), or {', '.join(windowed)}, "
            f"each seed's mean over the Acc@t* window; or a counter read at t*: {', '.join(counters)} "
            "(docs/sweeps.md)")


@app.command()
def table(
    dirs: list[Path] = typer.Argument(..., help="run or sweep directories (searched for run directories)"),
    t_star: str = typer.Option(..., "--t-star", help="virtual time t* for Acc@t*; several, comma-separated "
                               "(500,1000,2000), give each column once per t*; 'auto': the first grid time from "
                               "which most cells stay within --stable-tol of their value at the horizon"),
    fmt: str = typer.Option("md", "--format", "-f", help="md, latex or csv"),
    rows: str = typer.Option("method", "--rows", help="config keys for rows, comma-separated"),
    cols: Optional[str] = typer.Option(None, "--cols", help="config keys for columns, comma-separated "
                                       "(default: every other key that varies, e.g. heterogeneity,partition)"),
    target: Optional[float] = typer.Option(None, "--target", help="also tabulate time and MB up/down to this "
                                           "accuracy (0-1)"),
    window: Optional[float] = typer.Option(None, "--window", help="Acc@t* half-window in virtual seconds "
                                           "(default: 10 x each run's evaluation interval)"),
    mri_of: str = typer.Option("fedgmr", "--mri-of", help="method of the MRI row"),
    baselines: str = typer.Option(",".join(("fedavg", "fedasync", "heterofl", "fedrolex", "fjord", "fiarse")),
                                  "--baselines", help="methods the MRI is computed over (those present)"),
    value: str = typer.Option("acc", "--value", help="what cells show: acc (Acc@t*), final (final accuracy) or "
                              "time (virtual time at the run's end, e.g. for a fixed number of rounds)"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="also write the table to this file"),
    only: list[str] = typer.Option([], "--only", help="tabulate part of the runs: those with one of these values "
                                   "of a key (--only heterogeneity=high --only method=fjord,fjord_aux); "
                                   "repeatable"),
    exclude: list[str] = _exclude_option("tabulate"),
    drop: list[str] = _drop_option("tabulate"),
    metric: Optional[str] = typer.Option(None, "--metric", help=_table_metric_help()),
    paired_against: Optional[str] = typer.Option(None, "--paired-against", help="also print, per cell, the "
                                                 "seed-paired difference of this method's row (or a row label "
                                                 "as printed) minus each other row: mean, 95 % interval, p-value "
                                                 "and verdict"),
    holm: bool = typer.Option(False, "--holm", help="with --paired-against: also each column's p-values "
                              "Holm-adjusted as one family (its distinct comparisons), with the verdicts they "
                              "give at a 5 % family-wise error"),
    stable_tol: float = typer.Option(1.0, "--stable-tol", help="--t-star auto: the tolerance, in points of "
                                     "accuracy, within which a cell counts as stable"),
    horizon: Optional[float] = typer.Option(None, "--horizon", help="--t-star auto: the horizon whose values "
                                            "the cells must stay near (default: the latest time every run's "
                                            "window reaches)"),
    scan_from: Optional[float] = typer.Option(None, "--scan-from", help="--t-star auto: the earliest t* "
                                              "considered (default: the first with a whole window)"),
) -> None:
    """Acc@t* tables across seeds: mean ± std per cell, best bold, an MRI row, paired tests."""
    from fedgmr.experiment.metrics import TABLE_METRICS, MissingMetricError, default_metric
    from fedgmr.experiment.table import (auto_t_star, build_table, clipped_windows, find_runs, join_t_stars,
                                         read_run, render)

    try:
        tokens = [t.strip() for t in t_star.split(",") if t.strip()]
        try:
            t_stars: list[float | None] = [None if t == "auto" else float(t) for t in tokens]
        except ValueError:
            raise ConfigError(f"--t-star takes a time in virtual seconds, several comma-separated, or auto, "
                              f"got '{t_star}'") from None
        fixed = [t for t in t_stars if t is not None]
        if not t_stars or any(not math.isfinite(t) or t < 0 for t in fixed) or len(set(tokens)) != len(tokens) \
                or len(set(fixed)) != len(fixed):
            raise ConfigError(f"--t-star takes distinct times >= 0 in virtual seconds (or auto), got '{t_star}'")
        if not math.isfinite(stable_tol) or stable_tol < 0:
            raise ConfigError(f"--stable-tol takes points of accuracy >= 0, got {stable_tol:g}")
        if window is not None and not (math.isfinite(window) and window > 0):
            raise ConfigError(f"invalid value for '--window': must be a finite number of seconds > 0 (got {window}; "
                              f"for the evaluation at t* alone give half the grid step)")
        if None not in t_stars and (horizon is not None or scan_from is not None):
            raise ConfigError("--horizon and --scan-from belong to --t-star auto")
        if fmt not in ("md", "latex", "csv"):
            raise ConfigError(f"--format must be md, latex or csv, got '{fmt}'")
        if value not in ("acc", "final", "time"):
            raise ConfigError(f"--value must be acc, final or time, got '{value}'")
        paths = find_runs(dirs)
        unfinished = [p for p in paths if not (p / "summary.json").exists()]
        named = _unfinished_in_selection(paths, unfinished, only, exclude, drop)
        if named:
            typer.echo(f"note: {len(named)} unfinished run(s) left out: "
                       f"{', '.join(str(p) for p in named[:3])}{' ...' if len(named) > 3 else ''}", err=True)
        if metric is None:  # personalised methods are judged by their clients' own models
            metric, global_only = default_metric([p for p in paths if p not in unfinished])
            if global_only:
                typer.echo(f"note: {len(global_only)} run(s) of a personalised method tabulated by the global "
                           "model's accuracy as the others are (--metric personal_accuracy: the clients' own "
                           f"models): {', '.join(global_only[:3])}{' ...' if len(global_only) > 3 else ''}", err=True)
        runs, lacking = [], []
        for p in paths:
            if p in unfinished:
                continue
            try:
                runs.append(read_run(p, metric))
            except MissingMetricError:
                if metric == "accuracy":
                    raise
                lacking.append(p)  # e.g. cluster_purity of a method that does not cluster
        if lacking:
            if not runs:
                raise ConfigError(f"no run logs {metric!r} (personalised metrics need run.personal_eval_every and "
                                  f"data.client_test_fraction > 0; cluster_purity a clustered method; core_accuracy "
                                  f"run.level_eval_every)")
            typer.echo(f"note: {len(lacking)} run(s) without {metric!r} left out: "
                       f"{', '.join(str(p) for p in lacking[:3])}{' ...' if len(lacking) > 3 else ''}", err=True)
        runs = _select(runs, only, exclude, drop)
        row_list = [k.strip() for k in rows.split(",") if k.strip()]
        col_list = None if cols is None else [k.strip() for k in cols.split(",") if k.strip()]
        found = None
        if None in t_stars:
            if value != "acc" or target is not None:
                raise ConfigError("--t-star auto makes a table of Acc@t* only (no --value final/time, no --target)")
            spec = TABLE_METRICS[metric]
            found = auto_t_star(runs, row_list, col_list, tolerance=stable_tol / (100.0 if spec.percent else 1.0),
                                horizon=horizon, start=scan_from, span=window)
            if found.t_star is None:
                raise FedGMRError(f"--t-star auto: most cells never stay within {stable_tol:g} of their value at the "
                                  f"horizon {found.horizon:,.0f} s ({found.stable} of {found.total} do from some "
                                  "time on); run longer or raise --stable-tol")
        if value == "acc" and not (metric in TABLE_METRICS and TABLE_METRICS[metric].at_t_star):
            for t in (found.t_star if t is None else t for t in t_stars):  # type: ignore[union-attr]
                clipped = clipped_windows(runs, t, span=window)
                if clipped:
                    typer.echo(f"note: {len(clipped)} run(s) end inside the window of t* = {t:,g} s, so their "
                               f"values average fewer evaluations than a longer run's: "
                               f"{', '.join(str(p) for p in clipped[:3])}{' ...' if len(clipped) > 3 else ''}",
                               err=True)
        tables = []
        for t in t_stars:
            built = build_table(runs, found.t_star if t is None else t, rows=row_list,  # type: ignore[union-attr]
                                cols=col_list, target=target, span=window, mri_of=mri_of or None,
                                baselines=[b.strip() for b in baselines.split(",") if b.strip()],
                                value=value, paired_against=paired_against, holm=holm)  # type: ignore[arg-type]
            if t is None:
                built.auto = found
            tables.append(built)
        result = join_t_stars(tables)
        _note_seed_spread(result)
        _note_identical_rows(result)
        text = render(result, fmt)  # type: ignore[arg-type]
        if out is not None:
            try:
                out.write_text(text)
            except OSError as exc:
                raise FedGMRError(f"cannot write {out}: {exc.strerror}") from None
    except FedGMRError as exc:
        _fail(exc)
        return
    typer.echo(text, nl=False)


def _note_seed_spread(result: Any) -> None:
    """The protocol's rule: a column whose seed std exceeds 2 points needs 5 seeds. Name
    every cell that breaks it, one a line with its std and seed count, so that the columns
    to extend can be read off (stderr; the table is unchanged)."""
    from fedgmr.experiment.metrics import TABLE_METRICS

    if result.value != "acc" or not TABLE_METRICS[result.metric].percent:
        return
    wide = [(r, c) for (r, c), cell in result.cells.items()
            if cell["n"] < 5 and not math.isnan(cell["std"]) and 100 * cell["std"] > 2.0]
    if wide:
        from fedgmr.experiment.table import _label

        lines = [f"  {_label(r)} at {_label(c)}: std {100 * result.cells[(r, c)]['std']:.2f} points, "
                 f"{result.cells[(r, c)]['n']} seeds" for r, c in wide]
        typer.echo(f"note: {len(wide)} cell(s) have a seed std above 2 points with fewer than 5 seeds "
                   f"(docs/protocol.md asks for 5 there):\n" + "\n".join(lines), err=True)


def _note_identical_rows(result: Any) -> None:
    """Rows whose every cell holds the same seeds with the same values, to the last digit,
    are almost surely the same training under two names (in Table 1, the +Aux rows of the
    width baselines that size every tier to its bandwidth, and FedAvg with and without
    multicast downloads: docs/protocol_results.md). Their comparisons are not separate
    evidence: say so (stderr; the table is unchanged)."""
    from fedgmr.experiment.table import _label, same_values

    same = [rows for rows in same_values(result.cells, result.rows, result.cols) if len(rows) > 1]
    if same:
        shown = "; ".join(" = ".join(_label(r) for r in rows) for rows in same)
        typer.echo(f"note: rows with the same value in every seed of every cell, probably the same training "
                   f"under two names (compare their metrics.jsonl: bytes may differ; their comparisons are not "
                   f"separate evidence): {shown}", err=True)


_UNKNOWN_COMPONENT = re.compile(r"unknown (model|dataset|method|data set|rule|policy)\b")


def _suggest_import(exc: FedGMRError, imports: list[str]) -> FedGMRError:
    """A run whose config names a model, data set or method nothing registered here (a
    plugin's): the error, plus the ``--import`` that registers it."""
    if not _UNKNOWN_COMPONENT.search(str(exc)):
        return exc
    hint = (" (the run's own code registers it: pass the same --import as the run had, e.g. "
            "fedgmr evaluate RUN --import my_plugin.py)" if not imports else
            " (none of the --import modules given registers it: pass the module the run was made with)")
    out = FedGMRError(str(exc) + hint)
    out.exit_code = getattr(exc, "exit_code", 1)  # type: ignore[attr-defined]
    return out


@app.command()
def evaluate(
    dirs: list[Path] = typer.Argument(..., help="run or sweep directories (searched for run directories)"),
    levels: bool = typer.Option(True, "--levels/--no-levels", help="also evaluate under each ladder level's mask"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object per run instead of the table"),
    save: bool = typer.Option(False, "--save", help="also keep each result in its run directory "
                              "(evaluation.json), so the table re-prints without the checkpoint (--saved)"),
    saved: bool = typer.Option(False, "--saved", help="print what --save kept (evaluation.json): no checkpoint, "
                               "data or model needed"),
    imports: list[str] = _import_option("first (the runs' own models, data sets or methods)"),
    only: list[str] = typer.Option([], "--only", help="evaluate part of the runs: those with one of these values "
                                   "of a key, as for fedgmr table (--only heterogeneity=high --only "
                                   "method=fedgmr,fiarse_ims); repeatable"),
    exclude: list[str] = _exclude_option("evaluate"),
    drop: list[str] = _drop_option("evaluate"),
    blind: bool = typer.Option(False, "--blind", help="with --save: print no accuracy, only how many results "
                               "were kept (for the cells of a grid not yet read, as fedgmr sweep --blind)"),
    classes: bool = typer.Option(False, "--classes", help="also each class's accuracy, in full and under each "
                                 "level's mask (classification tasks; kept by --save, printed again by --saved)"),
) -> None:
    """Evaluate each run's saved global model on the test split, in full and per ladder level.

    Under each ladder level's mask, from the run's latest checkpoint (a finished run's \
holds its final model). Rebuilds the run, data included, from its config.yaml: a run of \
your own model, data set or method needs the same --import as the run had. --save keeps \
each result in its run directory; --saved prints those results again from a clone that \
holds no checkpoint."""
    import pandas as pd

    from fedgmr.errors import RunDirError
    from fedgmr.experiment.evaluate_run import evaluate_run, level_labels, load_evaluation
    from fedgmr.experiment.table import find_runs

    if save and saved:
        _fail(ConfigError("--save evaluates the checkpoints and --saved reads what an earlier --save kept: give one"))
        return
    if blind and not save:
        _fail(ConfigError("--blind prints no accuracy, so it only makes sense with --save (keep the results "
                          "unseen; print them later with --saved)"))
        return
    _import_user_code(imports)
    rows, class_rows, kept = [], [], 0
    try:
        paths = find_runs(dirs)
        for path in _select_run_dirs(paths, only, exclude, drop):
            result = load_evaluation(path) if saved else evaluate_run(path, levels, save=save, classes=classes)
            if saved and classes and not result.class_accuracy:
                raise RunDirError(f"{path} has no per-class evaluation saved: run `fedgmr evaluate {path} --save "
                                  f"--classes` where its checkpoint is")
            if saved and not levels:
                result.levels, result.level_accuracy, result.level_class_accuracy = [], [], []
            kept += 1
            if blind:
                continue
            if as_json:
                typer.echo(result.to_json())
                continue
            row = {"run": path.name, "step": result.step, "time (s)": f"{result.time:,.0f}",
                   "final": "yes" if result.final else "no", "accuracy (%)": f"{100 * result.accuracy:.2f}"}
            row.update({label: f"{100 * a:.2f}" for label, a in zip(level_labels(result.levels),
                                                                     result.level_accuracy)})
            rows.append(row)
            if classes:
                models = [("full", result.class_accuracy),
                          *zip(level_labels(result.levels), result.level_class_accuracy)]
                for label, accs in models:
                    class_rows.append({"run": path.name, "model": label,
                                       **{str(c): "–" if a is None else f"{100 * a:.1f}" for c, a in enumerate(accs)}})
    except FedGMRError as exc:
        _fail(_suggest_import(exc, imports))
        return
    if blind:
        typer.echo(f"saved the evaluation of {kept} run(s) (evaluation.json in each; print them with --saved)")
        return
    if rows:
        frame = pd.DataFrame(rows).fillna("–")
        typer.echo("Test accuracy of each run's saved global model; @d: under the mask of ladder level d "
                   "(d to 3 significant figures; final: the checkpoint is the run's last step).\n")
        typer.echo(frame.to_markdown(index=False))
    if class_rows:
        typer.echo("\nTest accuracy per class (%) of the same models: in full, and under the mask of each ladder "
                   "level (@d); –: a class the test split lacks.\n")
        typer.echo(pd.DataFrame(class_rows).fillna("–").to_markdown(index=False))


def _md_or_csv(fmt: str) -> bool:
    """Whether ``--format`` is md or csv, the two a frame of ``tiers`` or ``masks`` prints as;
    otherwise the one-line usage error (exit 2) is already out."""
    if fmt in ("md", "csv"):
        return True
    _fail(ConfigError(f"invalid value for '--format': must be md or csv (got {fmt!r})"))
    return False


@app.command()
def tiers(
    dirs: list[Path] = typer.Argument(..., help="run or sweep directories: the seeds of one configuration"),
    only: list[str] = typer.Option([], "--only", help="read part of the runs: those with one of these values of a "
                                   "key (--only method=fedgmr_fixed_time); repeatable"),
    exclude: list[str] = _exclude_option("read"),
    drop: list[str] = _drop_option("read"),
    fmt: str = typer.Option("md", "--format", "-f", help="md or csv"),
) -> None:
    """Participation per bandwidth tier: density, MB per model and uploads per step, before \
and after each tier's first restoration (the paper's Table 12), mean over the seeds."""
    import math

    import pandas as pd

    from fedgmr.experiment.metrics import EXECUTION_KEYS, read_run_metrics
    from fedgmr.experiment.table import find_runs, read_run
    from fedgmr.experiment.tiers import mean_rows, tier_participation
    from fedgmr.sim.network import tier_densities

    if not _md_or_csv(fmt):
        return
    try:
        runs = _select([read_run(p) for p in find_runs(dirs)], only, exclude, drop)
        per_run, configs = [], []
        for run in runs:
            flat = run.config
            records = read_run_metrics(run.path, ("time", "step"))  # the per-client lists: tier_participation
            tiers_of = tier_densities(flat["clients.heterogeneity"], int(flat["clients.num_clients"]))
            per_run.append(tier_participation(records, tiers_of, float(flat["network.model_size_mb"])))
            configs.append({k: v for k, v in flat.items() if k not in EXECUTION_KEYS})
        differ = sorted(k for k in set().union(*configs) if len({repr(c.get(k)) for c in configs}) > 1)
        if differ:
            raise ConfigError(f"the runs are not seeds of one configuration (they differ in {', '.join(differ[:5])}"
                              f"{' ...' if len(differ) > 5 else ''}): choose one with --only")
        frame = pd.DataFrame(mean_rows(per_run))
    except FedGMRError as exc:
        _fail(exc)
        return
    if fmt == "csv":
        typer.echo(frame.to_csv(index=False), nl=False)
        return
    typer.echo(f"Participation per bandwidth tier, mean over {len(per_run)} seed(s): density and model size (MB) a "
               f"client of the tier sends, and its uploads per server step, before and after the tier's first "
               f"restoration (to one evaluation-grid step).\n")
    formats = {"density before": "{:g}", "density after": "{:g}", "MB before": "{:.2f}", "MB after": "{:.2f}",
               "uploads/step before": "{:.3f}", "uploads/step after": "{:.3f}", "first restoration (s)": "{:,.0f}"}
    for col, spec in formats.items():
        frame[col] = [("–" if math.isnan(v) else spec.format(v)) for v in frame[col]]
    typer.echo(frame.to_markdown(index=False, disable_numparse=True))


@app.command()
def masks(
    config: str = typer.Argument(..., help="config file (a sweep's configs/CELL.yaml, a run's config.yaml) or "
                                 "preset name"),
    set_: list[str] = typer.Option([], "--set", "-s", metavar="KEY=VALUE", help="override a key; repeatable"),
    imports: list[str] = _import_option(),
    fmt: str = typer.Option("md", "--format", "-f", help="md or csv"),
) -> None:
    """Each ladder level's mask at initialisation, layer by layer: the coordinates it keeps \
of every prunable layer (builds the experiment: loads its data and initial model)."""
    import pandas as pd

    if not _md_or_csv(fmt):
        return
    _import_user_code(imports)
    try:
        cfg = resolve(config, set_)
        from fedgmr.experiment.build import build_experiment
        from fedgmr.experiment.mask_report import layer_rows, policy_masks

        exp = build_experiment(cfg)
        ladder, level_masks = policy_masks(exp)
        frame = pd.DataFrame(layer_rows(exp.space, level_masks, ladder))
    except FedGMRError as exc:
        _fail(exc)
        return
    if fmt == "csv":
        typer.echo(frame.to_csv(index=False), nl=False)
        return
    s = cfg.submodel
    typer.echo(f"Coordinates each ladder level's mask keeps at initialisation, per prunable layer (method "
               f"{cfg.method}, seed {cfg.seed}; submodel.policy {s.policy}, layer_floor {s.layer_floor:g}, "
               f"density_basis {s.density_basis}, cost_weighted {s.cost_weighted}).\n")
    frame["level"] = [f"{v:g}" for v in frame["level"]]
    frame["kept"] = [f"{v:,}" for v in frame["kept"]]
    frame["of"] = [f"{v:,}" for v in frame["of"]]
    frame["kept (%)"] = [f"{v:.1f}" for v in frame.pop("kept_pct")]
    typer.echo(frame.to_markdown(index=False, disable_numparse=True))


@app.command()
def methods(imports: list[str] = _import_option("first")) -> None:
    """List the available methods (with those your --import or plugins register)."""
    from fedgmr.methods import METHODS

    _import_user_code(imports)
    for name in METHODS.names():
        m = METHODS.get(name)
        fixed = ", ".join(f"{k}={v}" for k, v in m.fixed.items())
        typer.echo(f"{name:20s} {m.description}" + (f"  [{fixed}]" if fixed else ""))


@app.command()
def presets() -> None:
    """List the shipped presets, each with a line from its file's header."""
    from fedgmr.presets import preset_description, preset_names

    names = preset_names()
    width = max(map(len, names), default=0)
    for name in names:
        typer.echo(f"{name:<{width}}  {preset_description(name)}")


data_app = typer.Typer(no_args_is_help=True, help="The public data sets the paper-table presets read: where "
                       "they come from, and fetching them with checksums; what each client of a config holds.")
app.add_typer(data_app, name="data")


@data_app.command("list")
def data_list() -> None:
    """The data sets `fedgmr data fetch` knows, their source and where the presets look."""
    from fedgmr.download import data_root, iter_sources, missing

    root = data_root()
    for src in iter_sources():
        state = "missing" if missing(src.name, root / src.folder) else "present"
        typer.echo(f"{src.name:14s} {state:8s} {root / src.folder}  {src.description} [{src.licence}]")


@data_app.command("fetch")
def data_fetch(
    names: list[str] = typer.Argument(..., help="data sets: mnist, fashion_mnist, shakespeare"),
    root: Optional[Path] = typer.Option(None, "--root", help="data root (default: $FEDGMR_DATA, else "
                                        "../shared/data, where the presets look); each set goes in its folder"),
    mirror: Optional[str] = typer.Option(None, "--mirror", help="base URL to fetch from instead of the "
                                         "recorded source (the files keep their names)"),
    timeout: float = typer.Option(60.0, "--timeout", help="seconds without data before a download fails"),
) -> None:
    """Download, verify (SHA-256) and place data sets where the presets read them;
    an interrupted download resumes on the next call."""
    from fedgmr.download import fetch

    try:
        for name in names:
            files = fetch(name, root, mirror, timeout, report=lambda line: typer.echo(line, err=True))
            typer.echo(f"{name}: {len(files)} file(s) verified in {files[0].parent if files else root}")
    except FedGMRError as exc:
        _fail(exc)


@data_app.command("clients")
def data_clients(
    config: str = typer.Argument(..., help="config file (a run's config.yaml too) or preset name"),
    set_: list[str] = typer.Option([], "--set", "-s", metavar="KEY=VALUE", help="override a key; repeatable"),
    imports: list[str] = _import_option(),
    top: int = typer.Option(3, "--top", min=1, help="largest label shares shown per client"),
    threshold: float = typer.Option(0.05, "--threshold", min=0.0, max=1.0,
                                    help="count the classes that each make up at least this share of a client"),
    fmt: str = typer.Option("markdown", "--format", help="markdown, or csv (every class's count per client)"),
) -> None:
    """What each client of a config holds: samples, start density, label shares.

    The partition is the one a run of the config draws (its seed's partition stream), so
    this shows what a run's clients train on before anything runs."""
    from fedgmr.experiment.clients import describe_clients

    if fmt not in ("markdown", "csv"):
        _fail(ConfigError(f"--format must be markdown or csv, got {fmt!r}"))
    _import_user_code(imports)
    try:
        report = describe_clients(resolve(config, set_))
    except FedGMRError as exc:
        _fail(exc)
    typer.echo(report.csv() if fmt == "csv" else report.markdown(top, threshold), nl=False)


flower_app = typer.Typer(no_args_is_help=True, help="Set-up helpers for a secured Flower deployment (TLS + "
                         "SuperNode authentication).")
app.add_typer(flower_app, name="flower")


def _print_deployment(directory: Path, nodes: int, superlink: str, connection: str, app_dir: str,
                      warm_config: Optional[Path] = None, fast_poll: Optional[float] = None) -> None:
    from fedgmr.flower.security import deployment_commands

    cmds = deployment_commands(directory, nodes, superlink, connection, app_dir, warm_config=warm_config,
                               fast_poll=fast_poll)
    flwr_home = "${FLWR_HOME:-~/.flwr}"
    typer.echo("# 1. server: the SuperLink with TLS and SuperNode authentication\n" + cmds["superlink"][0])
    typer.echo(f"# 2. operator: add this connection to {flwr_home}/config.toml, then register each node's public key\n"
               + "\n".join(cmds["config"]) + "\n" + "\n".join(cmds["register"]))
    typer.echo("# 3. each device (copy it only its own node-<i>.key and ca.crt): its SuperNode, and beside it the "
               "warm SuperExec that runs its ClientApps\n"
               + "\n".join(f"{node}\n{exe}" for node, exe in zip(cmds["supernodes"], cmds["superexecs"])))
    typer.echo("# 4. operator: start the run\n" + cmds["run"][0])


@flower_app.command("keys")
def flower_keys(
    directory: Path = typer.Argument(..., help="folder for the CA, the server certificate and the node keys "
                                     "(created; never a run directory)"),
    nodes: int = typer.Option(3, "--nodes", help="SuperNode key pairs to make"),
    hosts: list[str] = typer.Option([], "--host", help="a name or address the SuperLink is reached at (repeatable; "
                                    "default: 127.0.0.1 and localhost)"),
    days: int = typer.Option(365, "--days", help="validity of the certificates"),
    superlink: str = typer.Option("127.0.0.1:9093", "--superlink", help="HOST:PORT of the SuperLink, for the "
                                  "printed commands"),
    connection: str = typer.Option("secure", "--connection", help="the flwr connection name"),
    app_dir: str = typer.Option("fedgmr-app", "--app", help="the Flower app project folder"),
    warm_config: Optional[Path] = typer.Option(None, "--warm-config", help="the run's FedGMR config, for the "
                                               "printed `fedgmr flower superexec` lines"),
    fast_poll: Optional[float] = typer.Option(None, "--fast-poll", help="print `fedgmr flower supernode "
                                              "--poll-interval S` (Flower's SuperNode, its fixed waits capped at S "
                                              "seconds) instead of flower-supernode"),
) -> None:
    """Write a CA, the SuperLink's TLS certificate and SuperNode key pairs, then print the
    commands that use them. Private keys are mode 0600 and never printed."""
    from fedgmr.flower.security import DEFAULT_HOSTS, make_credentials

    try:
        if fast_poll is not None and not fast_poll > 0:  # before any key is written
            raise ConfigError(f"--fast-poll must be positive, got {fast_poll}")
        creds = make_credentials(directory, nodes, tuple(hosts) or DEFAULT_HOSTS, days)
        typer.echo(f"# wrote {creds.directory}: ca.crt, server.pem, {nodes} node public key(s) (node-<i>.pub); "
                   f"private keys (mode 0600, keep them secret): ca.key, server.key, node-<i>.key")
        _print_deployment(creds.directory, nodes, superlink, connection, app_dir, warm_config, fast_poll)
    except FedGMRError as exc:
        _fail(exc)


def _check_keys_folder(directory: Path, nodes: int) -> None:
    """Refuse to print commands for a folder that does not hold what `fedgmr flower keys`
    writes (the CA certificate, the server certificate, a public key per node)."""
    if not directory.is_dir():
        what = "is a file" if directory.exists() else "does not exist"
        raise ConfigError(f"{directory} {what}: name the folder `fedgmr flower keys` wrote")
    missing = [name for name in ("ca.crt", "server.pem", *(f"node-{i}.pub" for i in range(nodes)))
               if not (directory / name).is_file()]
    if missing:
        raise ConfigError(f"{directory} lacks {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}: not a "
                          f"folder `fedgmr flower keys --nodes {nodes}` wrote (or --nodes is more than it made)")


@flower_app.command("new-app")
def flower_new_app(
    directory: Path = typer.Argument(..., help="folder for the app's pyproject.toml (what `flwr run DIR` reads)"),
    config: Optional[Path] = typer.Option(None, "--config", help="the FedGMR config the ServerApp and "
                                          "ClientApps build (YAML/TOML; stored as an absolute path)"),
    settings: list[str] = typer.Option([], "--set", help="a run-config key: --set num-server-steps=50 "
                                       "--set out-dir=/srv/out (docs/distributed.md lists them); repeatable"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing pyproject.toml there"),
) -> None:
    """Write the Flower app project that `flwr run` needs, its run config validated."""
    from fedgmr.config import parse_value
    from fedgmr.flower.project import write_app
    from fedgmr.flower.run_config import parse_run_config

    try:
        run_config: dict[str, Any] = {}
        for item in settings:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"--set expects key=value, got '{item}'")
            run_config[key.strip()] = parse_value(value)
        if config is not None:
            if not config.is_file():
                raise ConfigError(f"--config {config}: no such file")
            try:  # the config the ServerApp and every ClientApp will build: refused now, not at `flwr run`
                resolve(str(config), [])
            except ConfigError as exc:
                raise ConfigError(f"--config {config}: {exc}") from None
            run_config["config"] = str(config.resolve())
        parse_run_config(run_config)  # the ServerApp's own check, now rather than at `flwr run`
        target = directory / "pyproject.toml"
        if target.exists() and not overwrite:
            raise ConfigError(f"{target} exists: pass --overwrite to replace it, or choose another folder")
        if directory.exists() and not directory.is_dir():
            raise ConfigError(f"{directory} is a file, not a folder")
        try:
            write_app(directory, run_config)
        except OSError as exc:
            raise FedGMRError(f"cannot write {target}: {exc.strerror or exc}") from None
    except FedGMRError as exc:
        _fail(exc)
    typer.echo(f"wrote {target} (run config: {', '.join(f'{k}={v}' for k, v in run_config.items()) or 'defaults'}); "
               f"start it with: flwr run {directory} CONNECTION --stream")


@flower_app.command("commands")
def flower_commands(
    directory: Path = typer.Argument(..., help="the folder `fedgmr flower keys` wrote"),
    nodes: int = typer.Option(3, "--nodes", help="SuperNodes"),
    superlink: str = typer.Option("127.0.0.1:9093", "--superlink", help="HOST:PORT of the SuperLink"),
    connection: str = typer.Option("secure", "--connection", help="the flwr connection name"),
    app_dir: str = typer.Option("fedgmr-app", "--app", help="the Flower app project folder"),
    warm_config: Optional[Path] = typer.Option(None, "--warm-config", help="the run's FedGMR config, for the "
                                               "printed `fedgmr flower superexec` lines"),
    fast_poll: Optional[float] = typer.Option(None, "--fast-poll", help="print `fedgmr flower supernode "
                                              "--poll-interval S` (Flower's SuperNode, its fixed waits capped at S "
                                              "seconds) instead of flower-supernode"),
) -> None:
    """Print the flower-superlink / flower-supernode / flwr lines for the keys in DIRECTORY."""
    try:
        _check_keys_folder(directory, nodes)
        _print_deployment(directory, nodes, superlink, connection, app_dir, warm_config, fast_poll)
    except FedGMRError as exc:
        _fail(exc)


@flower_app.command("superexec")
def flower_superexec(
    runtime_api_address: str = typer.Option("127.0.0.1:9094", "--runtime-api-address",
                                            help="the SuperNode's Runtime API (its --host:--port)"),
    insecure: bool = typer.Option(False, "--insecure", help="connect to the Runtime API without TLS"),
    root_certificates: Optional[str] = typer.Option(None, "--root-certificates",
                                                    help="CA certificate of the Runtime API's TLS"),
    warm_config: Optional[Path] = typer.Option(None, "--warm-config", help="the run's FedGMR config: build this "
                                               "node's data and model once, before any task"),
    seed: Optional[int] = typer.Option(None, "--seed", help="the run's seed, when its run config overrides it"),
    poll_interval: Optional[float] = typer.Option(None, "--poll-interval", help="seconds between task polls "
                                                  "(default: $FLWR_SUPEREXEC_TASK_POLL_INTERVAL, else 0.2)"),
    parent_pid: Optional[int] = typer.Option(None, "--parent-pid", help="stop when this process exits"),
    auth_secret_file: Optional[Path] = typer.Option(None, "--superexec-auth-secret-file",
                                                    help="the SuperNode's SuperExec shared secret"),
    pull_backoff: Optional[float] = typer.Option(None, "--pull-backoff", help="a ClientApp whose message is not "
                                                 "at the SuperNode yet asks again after at most this many seconds "
                                                 "(default: Flower's 1 s, doubling to 10 s)"),
) -> None:
    """Run a warm SuperExec beside a `flower-supernode --isolation process`: every ClientApp
    task runs in a fork of this process (torch, Flower, FedGMR and, with --warm-config, the
    node's data already loaded) instead of a fresh flwr-clientapp process."""
    from fedgmr.flower.warm_exec import run_warm_superexec

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    wlog = logging.getLogger("fedgmr.flower.warm_exec")
    wlog.setLevel(logging.INFO)
    wlog.addHandler(handler)
    wlog.propagate = False
    try:
        secret = None
        if auth_secret_file is not None:
            try:
                secret = auth_secret_file.read_bytes()
            except OSError as exc:
                raise ConfigError(f"cannot read --superexec-auth-secret-file {auth_secret_file}: "
                                  f"{exc.strerror or exc}") from None
            if not secret.strip():
                raise ConfigError(f"--superexec-auth-secret-file {auth_secret_file} is empty")
        if pull_backoff is not None and not pull_backoff > 0:
            raise ConfigError(f"--pull-backoff must be positive, got {pull_backoff}")
        run_warm_superexec(runtime_api_address, insecure, root_certificates, warm_config, seed, poll_interval,
                           parent_pid, secret, pull_backoff)
    except FedGMRError as exc:
        _fail(exc)
    except RuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)


@flower_app.command("supernode", context_settings={"ignore_unknown_options": True})
def flower_supernode(
    flower_args: list[str] = typer.Argument(None, metavar="-- FLOWER_SUPERNODE_ARGS",
                                            help="flower-supernode's own arguments, after `--` (`-- --help` "
                                            "lists them)"),
    poll_interval: float = typer.Option(0.2, "--poll-interval", help="the longest sleep of the SuperNode's loop, "
                                        "in seconds (Flower 1.42: 3 s idle, 0.5 s waiting for a reply, 1-10 s "
                                        "back-off on a message's objects)"),
) -> None:
    """Run Flower's flower-supernode in this process with its fixed waits (asking the
    SuperLink for work every 3 s, looking for replies every 0.5 s, backing off 1-10 s on a
    message's objects) shortened to at most --poll-interval; everything else is Flower's.
    Flower 1.42 only."""
    from fedgmr.flower.fast_supernode import run_fast_supernode

    if not poll_interval > 0:
        typer.echo(f"error: --poll-interval must be positive, got {poll_interval}", err=True)
        raise typer.Exit(2)
    logging.getLogger("flwr").propagate = False  # Flower prints its own log lines; not twice
    try:
        run_fast_supernode(list(flower_args or []), poll_interval)
    except RuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)


@flower_app.command("testbed")
def flower_testbed(
    config: Path = typer.Argument(..., help="the FedGMR config to deploy (YAML/TOML)"),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="SuperNodes (default: clients.num_clients)"),
    scale: float = typer.Option(1.0, "--scale", help="factor on every tier's down/up rate (network.*_per_tier x d)"),
    out: Path = typer.Option(Path("testbed-out"), "--out", help="output folder (new or empty)"),
    duration: float = typer.Option(300.0, "--duration", help="the run's wall-clock bound in seconds (max-wall)"),
    steps: Optional[int] = typer.Option(None, "--steps", help="server steps (default: run.max_steps, else 50)"),
    predict: bool = typer.Option(True, "--predict/--no-predict", help="also run the simulator's prediction"),
    fast_poll: Optional[float] = typer.Option(None, "--fast-poll", help="start each SuperNode as `fedgmr flower "
                                              "supernode --poll-interval S` (Flower's SuperNode, its fixed waits "
                                              "capped at S seconds) with `--pull-backoff S` on the SuperExecs and "
                                              "pull-backoff S in the run config; default: Flower's flower-supernode"),
) -> None:
    """Run CONFIG on an emulated testbed (root): the SuperLink and each SuperNode in network
    namespaces of their own, every node's link shaped by tc to its tier's rates; then the
    simulator's prediction of the same run. Everything made is removed at the end, on
    errors and on Ctrl-C."""
    from fedgmr.flower.testbed import TestbedUnavailable, format_result, run_testbed

    try:
        result = run_testbed(config, out, nodes=nodes, scale=scale, duration=duration, steps=steps,
                             predict=predict, echo=typer.echo, fast_poll=fast_poll)
        typer.echo(format_result(result))
        typer.echo(f"written: {out / 'testbed.json'}")
    except TestbedUnavailable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2)
    except FedGMRError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        typer.echo("interrupted: the testbed's namespaces and processes were removed", err=True)
        raise typer.Exit(130)
    except RuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1)


def main() -> None:
    from fedgmr.experiment.sweep import die_with_parent

    die_with_parent()  # a cell of a sweep ends with its sweep
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    app()


if __name__ == "__main__":
    main()
