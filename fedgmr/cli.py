"""The ``fedgmr`` command line: run, compare, plot, demo, methods, presets."""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer

from fedgmr.config import apply_overrides, parse_value, read_config_file
from fedgmr.errors import ConfigError, FedGMRError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="FedGMR: model-heterogeneous federated learning with Gradual Model Restoration.")


def _fail(exc: Exception) -> None:
    """One line on stderr and the error's documented exit code (see fedgmr.errors)."""
    code = getattr(exc, "exit_code", 1)
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(code)


def load_raw_config(config: str) -> dict[str, Any]:
    """A config file path, or the name of a shipped preset."""
    from fedgmr.presets import load_preset, preset_names

    path = Path(config)
    # a file wins over a preset of the same name; a directory never shadows a preset
    if path.is_file():
        return read_config_file(path)
    if config in preset_names():
        return load_preset(config)
    if path.exists():
        raise ConfigError(f"'{config}' is not a config file (a directory?) nor a preset "
                          f"(presets: {', '.join(preset_names())})")
    raise ConfigError(f"'{config}' is neither a config file nor a preset (presets: {', '.join(preset_names())})")


def resolve(config: str, overrides: list[str]):
    from fedgmr.methods import resolve_config

    raw = load_raw_config(config)
    apply_overrides(raw, overrides)
    explicit = {item.split("=", 1)[0].strip(): parse_value(item.split("=", 1)[1]) for item in overrides if "=" in item}
    return resolve_config(raw, explicit)


@app.command()
def run(
    config: Optional[str] = typer.Argument(None, help="config file (YAML/TOML) or preset name"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="run directory to write"),
    set_: list[str] = typer.Option([], "--set", "-s", help="override a key: --set training.lr=0.1"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="continue the interrupted run in this directory"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing run in --out"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
) -> None:
    """Run one experiment and write its directory."""
    from fedgmr.experiment.runner import run_experiment, saved_config

    try:
        if resume is not None:
            cfg = saved_config(resume)
            if config is not None or set_:
                new = resolve(config or "quickstart", set_) if config else None
                if new is not None and new != cfg:
                    raise ConfigError("--resume continues the saved config; drop CONFIG/--set or use a new --out")
            target = resume
        else:
            if config is None:
                raise ConfigError("give a CONFIG file or preset name (e.g. 'quickstart')")
            if out is None:
                raise ConfigError("give --out DIR for the run directory")
            cfg = resolve(config, set_)
            target = out
        t0 = time.perf_counter()
        summary = run_experiment(cfg, target, resume=resume is not None, progress=not quiet and sys.stderr.isatty()
                                 or (not quiet and _force_progress()), overwrite=overwrite)
    except FedGMRError as exc:
        _fail(exc)
        return
    except KeyboardInterrupt:
        typer.echo("interrupted: resume with --resume (needs run.checkpoint_every)", err=True)
        raise typer.Exit(130)
    typer.echo(f"{summary['method']}: final accuracy {100 * summary['final_accuracy']:.2f}% at "
               f"t={summary['time']:,.1f}s after {summary['steps']} steps "
               f"({time.perf_counter() - t0:.1f}s wall) -> {target}")


def _force_progress() -> bool:
    import os

    return os.environ.get("FEDGMR_PROGRESS") == "1"


def format_compare(result: dict[str, Any]) -> str:
    """The compare table as text."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Acc@t* (t* = {result['t_star']:,.0f} s)  |  time-to-{100 * result['target']:.1f}%")
    for col in ("method", "run", "Acc@t* (%)", "window", "final (%)", "end time (s)", "time to target (s)"):
        table.add_column(col, justify="right" if col not in ("method", "run") else "left")
    for r in result["runs"]:
        acc = "n/a" if math.isnan(r["acc_at_t"]) else f"{100 * r['acc_at_t']:.2f} ± {100 * r['std']:.2f}"
        ttt = "never" if math.isnan(r["time_to_target"]) else f"{r['time_to_target']:,.1f}"
        window = "±10 evals" if r["window"] is None else f"±{r['window']:,.0f} s"
        table.add_row(r["method"], r["run"], acc, window, f"{100 * r['final_accuracy']:.2f}", f"{r['end_time']:,.1f}",
                      ttt)
    console = Console(width=120, record=True, file=open("/dev/null", "w"))
    console.print(table)
    text = console.export_text()
    if not math.isnan(result["mri"]):
        text += f"MRI of {result['mri_of']} over {', '.join(result['over'])}: {result['mri']:+.2f}%\n"
    return text


@app.command()
def compare(
    runs: list[Path] = typer.Argument(..., help="run directories; the first is the method, the rest baselines"),
    t_star: float = typer.Option(..., "--t-star", help="virtual time t* for Acc@t*"),
    target: Optional[float] = typer.Option(None, "--target", help="accuracy (0-1) for time-to-accuracy"),
    window: Optional[float] = typer.Option(None, "--window", help="Acc@t* half-window in virtual seconds for every "
                                           "run (default: 10 x each run's evaluation interval)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="also write a comparison PNG"),
) -> None:
    """Compare runs: Acc@t* ± std (over the evaluations in the window), MRI of the first
    run, time-to-accuracy."""
    from fedgmr.experiment.metrics import compare_runs, read_metrics
    from fedgmr.experiment.plots import plot_runs

    try:
        result = compare_runs(runs, t_star, target, span=window)
        if plot is not None:
            plot_runs([(r["method"], read_metrics(r["run"])) for r in result["runs"]], plot, t_star=t_star)
    except FedGMRError as exc:
        _fail(exc)
        return
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=lambda v: None))
    else:
        typer.echo(format_compare(result), nl=False)


@app.command()
def plot(
    runs: list[Path] = typer.Argument(..., help="run directories"),
    out: Path = typer.Option(..., "--out", "-o", help="PNG file to write"),
    t_star: Optional[float] = typer.Option(None, "--t-star"),
) -> None:
    """Plot accuracy and average density against virtual time for several runs."""
    from fedgmr.experiment.metrics import read_metrics
    from fedgmr.experiment.plots import plot_runs

    try:
        rows = []
        for d in runs:
            summary = Path(d) / "summary.json"
            label = json.loads(summary.read_text())["method"] if summary.exists() else Path(d).name
            rows.append((label, read_metrics(d)))
        plot_runs(rows, out, t_star=t_star)
    except FedGMRError as exc:
        _fail(exc)
    typer.echo(str(out))


@app.command()
def demo(
    out: Path = typer.Option(Path("demo-out"), "--out", "-o", help="directory for the three runs"),
    set_: list[str] = typer.Option([], "--set", "-s", help="override a key in all three runs"),
    quiet: bool = typer.Option(False, "--quiet", "-q"),
) -> None:
    """The quickstart: FedGMR vs FedAvg vs FedGMR w/o GMR on digits, then the compare table."""
    from fedgmr.experiment.metrics import compare_runs, read_metrics
    from fedgmr.experiment.plots import plot_runs
    from fedgmr.experiment.runner import run_experiment

    t0 = time.perf_counter()
    dirs = []
    try:
        for method in ("fedgmr", "fedavg", "fedgmr_wo_gmr"):
            cfg = resolve("quickstart", [*set_, f"method={method}"])
            typer.echo(f"running {method} ...")
            summary = run_experiment(cfg, out / method, progress=not quiet, overwrite=True)
            typer.echo(f"  final accuracy {100 * summary['final_accuracy']:.2f}%, {summary['steps']} steps, "
                       f"{summary['restorations']} restorations, {summary['wall_time_s']:.1f}s wall")
            dirs.append(out / method)
        t_star = cfg.run.t_star or cfg.run.max_time or 0.0
        result = compare_runs(dirs, t_star)
        plot_runs([(r["method"], read_metrics(r["run"])) for r in result["runs"]], out / "compare.png", t_star=t_star,
                  title="quickstart: digits, High heterogeneity, non-IID")
    except FedGMRError as exc:
        _fail(exc)
        return
    typer.echo(format_compare(result), nl=False)
    typer.echo(f"plot: {out / 'compare.png'}  (total wall time {time.perf_counter() - t0:.1f}s)")


@app.command("config")
def show_config(
    config: str = typer.Argument("quickstart", help="config file or preset name"),
    set_: list[str] = typer.Option([], "--set", "-s", help="override a key"),
) -> None:
    """Print the fully resolved config (every key with its value) as YAML."""
    from fedgmr.config import dump_config

    try:
        typer.echo(dump_config(resolve(config, set_)), nl=False)
    except FedGMRError as exc:
        _fail(exc)


@app.command()
def methods() -> None:
    """List the available methods."""
    from fedgmr.methods import METHODS

    for name in METHODS.names():
        m = METHODS.get(name)
        fixed = ", ".join(f"{k}={v}" for k, v in m.fixed.items())
        typer.echo(f"{name:20s} {m.description}" + (f"  [{fixed}]" if fixed else ""))


@app.command()
def presets() -> None:
    """List the shipped presets."""
    from fedgmr.presets import preset_names

    for name in preset_names():
        typer.echo(name)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    app()


if __name__ == "__main__":
    main()
