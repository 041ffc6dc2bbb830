"""Run an experiment into a directory: resolved config, metrics.jsonl, summary.json,
a plot and checkpoints; resume an interrupted run to exactly the same metrics."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

from fedgmr.config import ExperimentConfig, dump_config, parse_config, read_config_file
from fedgmr.data import FederatedData
from fedgmr.errors import FedGMRError
from fedgmr.experiment.build import build_experiment
from fedgmr.experiment.checkpoint import load_checkpoint, save_checkpoint
from fedgmr.experiment.metrics import acc_at_t
from fedgmr.experiment.plots import plot_runs
from fedgmr.sim.simulator import Simulator

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
PLOT_FILE = "accuracy_density.png"


def saved_config(run_dir: str | Path) -> ExperimentConfig:
    """The resolved config of an existing run directory."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.exists():
        raise FedGMRError(f"{run_dir} has no {CONFIG_FILE}: not a fedgmr run directory")
    return parse_config(read_config_file(path))


class _Progress:
    """A rich progress bar over server steps or virtual time (silent when disabled)."""

    def __init__(self, cfg: ExperimentConfig, enabled: bool) -> None:
        self.enabled = enabled
        self.by_steps = cfg.run.max_steps is not None
        self.total = float(cfg.run.max_steps if self.by_steps else cfg.run.max_time)  # type: ignore[arg-type]
        self.bar = None
        if enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                transient=False)
            self.task = self.bar.add_task(cfg.method, total=self.total, info="")

    def __enter__(self) -> "_Progress":
        if self.bar:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar:
            self.bar.__exit__(*exc)

    def update(self, sim: Simulator, acc: float | None) -> None:
        if not self.bar:
            return
        done = sim.step if self.by_steps else min(sim.now, self.total)
        info = f"step {sim.step}  t={sim.now:,.0f}s  density {sum(sim.strategy.densities()) / sim.strategy.num_clients:.2f}"
        if acc is not None:
            info += f"  acc {100 * acc:.1f}%"
        self.bar.update(self.task, completed=done, info=info)


def run_experiment(cfg: ExperimentConfig, out_dir: str | Path, resume: bool = False, progress: bool = False,
                   overwrite: bool = False, data: FederatedData | None = None,
                   stop_after_steps: int | None = None) -> dict[str, Any]:
    """Run ``cfg`` into ``out_dir`` and return the summary.

    ``resume`` continues from ``out_dir/checkpoint``; metrics written after that
    checkpoint are discarded and recomputed, so the result equals an uninterrupted run.
    ``stop_after_steps`` stops early (as an interruption would), leaving a resumable run.
    """
    out = Path(out_dir)
    metrics_path = out / METRICS_FILE
    ckpt = None
    if resume:
        ckpt = load_checkpoint(out)
        keep = int(ckpt[0]["simulator"]["records"])
        lines = metrics_path.read_text().splitlines(keepends=True) if metrics_path.exists() else []
        if len(lines) < keep:
            raise FedGMRError(f"{metrics_path} has {len(lines)} records but the checkpoint expects {keep}")
    elif metrics_path.exists() and metrics_path.stat().st_size > 0 and not overwrite:
        raise FedGMRError(f"{out} already holds a run; pass --resume to continue it or --overwrite")

    last_acc: list[float | None] = [None]
    sink: list[Any] = []  # the metrics file, opened once the experiment is built

    def on_record(rec: dict[str, Any]) -> None:
        sink[0].write(json.dumps(rec) + "\n")
        sink[0].flush()
        last_acc[0] = rec["accuracy"]

    wall0 = time.perf_counter()
    # build (and load the data) before touching the run directory: a bad data path
    # leaves no half-made run behind
    exp = build_experiment(cfg, on_record=on_record, data=data)
    out.mkdir(parents=True, exist_ok=True)
    if ckpt is not None:
        metrics_path.write_text("".join(lines[:keep]))
    else:
        metrics_path.write_text("")
        (out / SUMMARY_FILE).unlink(missing_ok=True)
    (out / CONFIG_FILE).write_text(dump_config(cfg))
    fh = open(metrics_path, "a")
    sink.append(fh)
    sim = exp.simulator
    prior_wall = 0.0
    if ckpt is not None:
        state, tensors = ckpt
        exp.strategy.load_state_dict(state["strategy"], {k[9:]: v for k, v in tensors.items() if k.startswith("strategy/")})
        sim.load_state_dict(state["simulator"], {k[4:]: v for k, v in tensors.items() if k.startswith("sim/")})
        prior_wall = float(state.get("wall_time", 0.0))
    every = cfg.run.checkpoint_every

    def checkpoint(s: Simulator) -> None:
        st_state, st_tensors = exp.strategy.state_dict()
        sim_state, sim_tensors = s.state_dict()
        tensors = {f"strategy/{k}": v for k, v in st_tensors.items()}
        tensors.update({f"sim/{k}": v for k, v in sim_tensors.items()})
        save_checkpoint(out, {"strategy": st_state, "simulator": sim_state, "step": s.step,
                              "wall_time": prior_wall + time.perf_counter() - wall0}, tensors)

    interrupted = False
    try:
        with _Progress(cfg, progress) as bar:
            def on_step(s: Simulator) -> None:
                bar.update(s, last_acc[0])
                if every and s.step % every == 0:
                    checkpoint(s)

            stop = (lambda: sim.step >= stop_after_steps) if stop_after_steps else None
            sim.run(cfg.run.max_steps, cfg.run.max_time, should_stop=stop, on_step=on_step)
            if stop_after_steps and sim.step >= stop_after_steps:
                interrupted = True
            else:
                sim.finish()
                bar.update(sim, last_acc[0])
    finally:
        fh.close()
        exp.executor.close()
    if interrupted:
        return {"interrupted": True, "steps": sim.step}
    return finalize(out, cfg, wall=prior_wall + time.perf_counter() - wall0)


def finalize(out: Path, cfg: ExperimentConfig, wall: float) -> dict[str, Any]:
    """Write summary.json and the plot from the run's metrics."""
    from fedgmr.experiment.metrics import read_metrics

    rows = read_metrics(out)
    last = rows[-1]
    summary: dict[str, Any] = {
        "name": cfg.name, "method": cfg.method, "seed": cfg.seed,
        "final_accuracy": last["accuracy"], "best_accuracy": max(r["accuracy"] for r in rows),
        "time": last["time"], "steps": last["step"], "final_avg_density": last["avg_density"],
        "restorations": last["restorations"], "bytes_up": last["bytes_up"], "bytes_down": last["bytes_down"],
        "uploads": last.get("uploads"), "downloads": last.get("downloads"),
        "rejected_updates": last["rejected"], "wall_time_s": round(wall, 3), "evaluations": len(rows),
        "eval_interval": cfg.run.eval_interval,
    }
    if cfg.run.t_star is not None:
        mean, std = acc_at_t([r["time"] for r in rows], [r["accuracy"] for r in rows], cfg.run.t_star,
                             interval=cfg.run.eval_interval)
        summary["t_star"] = cfg.run.t_star
        summary["acc_at_t_star"] = None if math.isnan(mean) else mean
        summary["acc_at_t_star_std"] = None if math.isnan(std) else std
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    plot_runs([(cfg.method, rows)], out / PLOT_FILE, title=f"{cfg.name}: {cfg.method}", t_star=cfg.run.t_star)
    return summary
