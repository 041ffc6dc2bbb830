"""Run an experiment into a directory: resolved config, metrics.jsonl, summary.json,
a plot and checkpoints; resume an interrupted run to exactly the same metrics.

A run directory is a unit (:mod:`fedgmr.experiment.rundir`): one process at a time
(an exclusive lock), results of one run only (``overwrite`` clears everything a previous
run wrote, checkpoint included), written and deleted only under the names the run
recorded as its own (the manifest; never through a link), and a resume continues only
the run its checkpoint belongs to (the config and the metrics written so far are checked
against it). A new run writes its config before it loads its data: a run killed while it
builds resumes from "no checkpoint yet" (it runs from the start).
Checkpoints are on by default (``run.checkpoint_every`` steps or
``run.checkpoint_seconds`` of wall time, whichever comes first).

A run that makes no progress - no server step, a stall with every client idle, or
``run.fail_after_rejections`` client updates rejected in a row - still writes its
metrics and a summary marked ``"status": "failed"``, then raises
:class:`~fedgmr.errors.RunFailedError`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from fedgmr.config import ExperimentConfig, dump_config, parse_config
from fedgmr.data import FederatedData
from fedgmr.errors import ConfigError, RunDirError, RunFailedError
from fedgmr.experiment.build import build_experiment
from fedgmr.experiment.checkpoint import checkpoint_path, load_checkpoint, save_checkpoint, tensors_under
from fedgmr.experiment.interrupt import sigint_latch
from fedgmr.experiment.loggers import RunLoggers
from fedgmr.experiment.metrics import acc_at_t, read_metrics
from fedgmr.experiment.rundir import (CONFIG_FILE, CORE_ENTRIES, LOCK_FILE, MANIFEST_FILE, METRICS_FILE, PLOT_FILE,
                                      SUMMARY_FILE, RunLock, begin_run, claim, config_digest, fsync_file, holds_run,
                                      open_for_write, owned_entries, prepare, read_run_file, read_run_text,
                                      refuse_held_run, remove_entry, remove_owned, write_atomic, writing)
from fedgmr.sim.simulator import Simulator

log = logging.getLogger(__name__)

#: a time-triggered checkpoint waits at least this many times as long as the previous
#: checkpoint took (at most ~1 % of the wall time goes to them)
CHECKPOINT_COST_FACTOR = 100.0

__all__ = ["run_experiment", "saved_config", "finalize", "CONFIG_FILE", "METRICS_FILE", "SUMMARY_FILE", "PLOT_FILE"]


def saved_config(run_dir: str | Path) -> ExperimentConfig:
    """The resolved config of an existing run directory (``RunDirError`` if it has none
    or it is not a valid config)."""
    run_dir = Path(run_dir)
    path = run_dir / CONFIG_FILE
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is a file, not a run directory")
    if not os.path.lexists(path):
        if os.path.lexists(run_dir / MANIFEST_FILE):  # a run began here and was stopped before it wrote its config
            raise RunDirError(f"{run_dir} has no {CONFIG_FILE}: its run was stopped before it wrote its config, so "
                              f"there is nothing to resume; start it again: fedgmr run CONFIG --out {run_dir}")
        raise RunDirError(f"{run_dir} has no {CONFIG_FILE}: not a fedgmr run directory")
    try:
        return parse_config(_read_saved_config(path))
    except ConfigError as exc:
        raise RunDirError(f"{path} is not the config this run was started with: {exc}") from None


def _read_saved_config(path: Path) -> dict[str, Any]:
    """A run directory's ``config.yaml`` as a dict (a regular file of bounded size: a
    FIFO or a link to a device is a one-line ``RunDirError``, never a hang)."""
    try:
        data = yaml.safe_load(read_run_text(path))
    except FileNotFoundError:
        raise RunDirError(f"{path} is missing: not a fedgmr run directory") from None
    except yaml.YAMLError as exc:
        raise RunDirError(f"{path} is damaged: {(str(exc).splitlines() or ['not YAML'])[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RunDirError(f"{path} is damaged: not a mapping of config keys")
    return data


class _Progress:
    """Progress over server steps or virtual time: a rich bar (``enabled``), or a plain
    line on stderr every ``every`` seconds of wall time and at the end (for logs: nohup,
    SLURM, CI), or nothing. ``show_accuracy`` False (a blind run): neither shows the test
    accuracy."""

    def __init__(self, cfg: ExperimentConfig, enabled: bool, every: float | None = None,
                 wall_start: float | None = None, show_accuracy: bool = True) -> None:
        self.enabled = enabled
        self.show_accuracy = show_accuracy
        #: ``time.perf_counter()`` at which the run's wall time (``wall_time_s``) starts, earlier
        #: runs of a resumed one included: the lines' ``elapsed=`` is that same figure
        self.wall_start = wall_start
        self.by_steps = cfg.run.max_steps is not None
        self.total = float(cfg.run.max_steps if self.by_steps else cfg.run.max_time)  # type: ignore[arg-type]
        self.bar = None
        self.every = None if enabled else every
        self.started: tuple[float, float] | None = None  # (wall clock, progress) at the first update
        self.last_line = -math.inf
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

    def update(self, sim: Simulator, acc: float | None, final: bool = False) -> None:
        done = sim.step if self.by_steps else min(sim.now, self.total)
        if self.bar:
            info = f"step {sim.step}  t={sim.now:,.0f}s  density {sum(sim.strategy.densities()) / sim.strategy.num_clients:.2f}"
            if acc is not None and self.show_accuracy:
                info += f"  acc {100 * acc:.1f}%"
            self.bar.update(self.task, completed=done, info=info)
        elif self.every is not None:
            now = time.perf_counter()
            if self.started is None:
                self.started = (now, done)  # a resumed run: the rate counts this process's progress only
                self.last_line = now
            if final or now - self.last_line >= self.every:
                self.last_line = now
                self._line(sim, acc, done, now, final)

    def _line(self, sim: Simulator, acc: float | None, done: float, now: float, final: bool) -> None:
        """``progress: step=12/30 virtual_time=123.4s acc=45.20% avg_density=0.412 restorations=2
        elapsed=0:00:12 eta=0:00:30`` (a time-bound run: ``step=12 virtual_time=123.4/600s``)."""
        assert self.started is not None
        since = now - self.started[0]
        rate = (done - self.started[1]) / since if since > 0 else 0.0
        elapsed = since if self.wall_start is None else now - self.wall_start
        eta = "0:00:00" if final else (_hms((self.total - done) / rate) if rate > 0 else "?")
        step = f"{sim.step}/{self.total:.0f}" if self.by_steps else f"{sim.step}"
        vtime = f"{sim.now:.1f}s" if self.by_steps else f"{sim.now:.1f}/{self.total:.0f}s"
        dens = sum(sim.strategy.densities()) / sim.strategy.num_clients
        shown = "" if not self.show_accuracy else f"acc={'n/a' if acc is None else f'{100 * acc:.2f}%'} "
        print(f"progress: step={step} virtual_time={vtime} {shown}"
              f"avg_density={dens:.3f} restorations={sim.strategy.ladder.restorations} elapsed={_hms(elapsed)} "
              f"eta={eta}", file=sys.stderr, flush=True)


def _hms(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class _MetricsLog:
    """``metrics.jsonl`` open for appending, with the size and sha256 of its content (a
    checkpoint records them; a resume checks the file still starts with those bytes)."""

    def __init__(self, path: Path, keep: int = 0) -> None:
        self.path = path
        fd = open_for_write(path, os.O_RDWR | os.O_APPEND)  # never through a link planted in the run directory
        try:
            with writing(path):
                prefix = b""
                while len(prefix) < keep:
                    chunk = os.pread(fd, keep - len(prefix), len(prefix))
                    if not chunk:
                        break
                    prefix += chunk
                os.ftruncate(fd, keep)  # drop what was written after the checkpoint (all of it: a new run)
                self.fh = os.fdopen(fd, "ab")
        except BaseException:
            os.close(fd)
            raise
        with writing(path):
            fsync_file(self.fh)
        self.hash = hashlib.sha256(prefix)
        self.size = len(prefix)

    def write(self, rec: dict[str, Any]) -> None:
        line = (json.dumps(rec) + "\n").encode("utf-8")
        with writing(self.path):
            self.fh.write(line)
            self.fh.flush()  # readers (progress, tests, tail -f) see every record at once
        self.hash.update(line)
        self.size += len(line)

    def sync(self) -> dict[str, Any]:
        """fsync the file; its size and sha256 for a checkpoint."""
        with writing(self.path):
            fsync_file(self.fh)
        return {"bytes": self.size, "sha256": self.hash.copy().hexdigest()}

    def close(self) -> None:
        self.fh.close()


def _verify_metrics(path: Path, expected: Any, records: int) -> int:
    """Bytes of ``metrics.jsonl`` the checkpoint covers, after checking they are unchanged."""
    if not isinstance(expected, dict) or not {"bytes", "sha256"} <= set(expected):
        raise RunDirError(f"{checkpoint_path(path.parent)} is damaged: it does not describe {METRICS_FILE}")
    try:
        size = int(expected["bytes"])
    except (TypeError, ValueError):
        size = -1
    if size < 0:
        raise RunDirError(f"{checkpoint_path(path.parent)} is damaged: it does not describe {METRICS_FILE}")
    try:
        data = read_run_file(path, size, prefix=True)  # the bytes the checkpoint covers, no more
    except FileNotFoundError:
        raise RunDirError(f"{path} is missing: the checkpoint expects {records} records") from None
    if len(data) < size or hashlib.sha256(data[:size]).hexdigest() != expected["sha256"] \
            or data[:size].count(b"\n") != records:
        raise RunDirError(f"{path} does not match the checkpoint: its first {records} records were changed or "
                          f"cut short")
    return size


def _check_resumable(out: Path, cfg: ExperimentConfig, state: dict[str, Any]) -> None:
    """The checkpoint belongs to this run: config.yaml and ``cfg`` match its config hash.
    ``cfg`` may name another ``run.device``: a checkpoint resumes on any device."""
    config_path = out / CONFIG_FILE
    raw = _read_saved_config(config_path)
    on_disk = config_digest(raw)
    if on_disk != state.get("config_sha256"):
        raise RunDirError(f"{config_path} was changed after the checkpoint was written (it does not match the "
                          f"checkpoint's config hash); restore it, or start a new run in another directory")
    _check_same_config(config_path, raw, cfg)


def _check_same_config(config_path: Path, raw: dict[str, Any], cfg: ExperimentConfig) -> None:
    """``cfg`` is the config saved in ``config_path`` (``raw``), but perhaps its ``run.device``."""
    try:  # keys added to the library since the run started take their defaults (which keep the old behaviour)
        saved = parse_config(raw)
    except ConfigError as exc:
        raise RunDirError(f"{config_path}: {exc}") from None
    moved = saved.model_copy(update={"run": saved.run.model_copy(update={"device": cfg.run.device})})
    if config_digest(cfg) != config_digest(moved):
        raise RunDirError(f"the config given differs from {config_path}, the config of the run to resume")


def _finished(out: Path) -> None:
    """Refuse to resume a run that already wrote its summary."""
    path = out / SUMMARY_FILE
    if not os.path.lexists(path):
        return
    try:
        status = json.loads(read_run_text(path)).get("status", "completed")
    except (OSError, ValueError, AttributeError, RunDirError):
        status = "completed"
    raise RunDirError(f"{out} holds a {'failed' if status == 'failed' else 'finished'} run ({SUMMARY_FILE} "
                      f"exists): nothing to resume; start a new run with --overwrite or another --out")


def _no_records(path: Path) -> bool:
    """Whether ``metrics.jsonl`` is missing or empty (a run that never evaluated)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    return stat.S_ISREG(st.st_mode) and st.st_size == 0


def _start_files(out: Path, cfg: ExperimentConfig, names: set[str], keep_config: bool) -> None:
    """A new run's first files: what earlier runs owned here goes (``keep_config``: not
    their config.yaml, which a restarted run keeps), the config is written first, then
    an empty ``metrics.jsonl``."""
    begin_run(out, names, keep={CONFIG_FILE} if keep_config else ())
    if not keep_config:
        write_atomic(out / CONFIG_FILE, dump_config(cfg))  # first: from now on the run can be resumed
    _MetricsLog(out / METRICS_FILE).close()


def _discard_if_unused(out: Path) -> None:
    """Remove a directory this call created when nothing but the lock file went into it."""
    try:
        if all(p.name == LOCK_FILE for p in out.iterdir()):
            (out / LOCK_FILE).unlink(missing_ok=True)
            out.rmdir()
    except OSError:
        pass


def _close(executor: Any) -> None:
    """Close an executor without hiding the exception that ended the run."""
    try:
        executor.close()
    except Exception:  # noqa: BLE001
        log.warning("closing the executor failed", exc_info=True)


def _failure(sim: Simulator, limit: int) -> str | None:
    """Why the run made no progress, or None when it did."""
    rejected, uploads = sim.strategy.rejected, sim.uploads
    if sim.rejected_streak >= limit:
        return (f"the last {sim.rejected_streak} client updates were all rejected ({rejected} of {uploads} in all, "
                f"see the warnings; run.fail_after_rejections={limit})")
    if sim.step == 0:
        if uploads == 0:
            return f"no client update arrived by t={sim.now:,.1f}s: no server step could be aggregated"
        if rejected == 0:  # updates arrived, but the first aggregation waits for more (e.g. a synchronous round)
            return (f"no server step completed by t={sim.now:,.1f}s: {uploads} client updates arrived, none rejected, "
                    f"and the first aggregation still waits for more; raise run.max_time or run.max_steps")
        return f"no update could be aggregated: {rejected} of {uploads} client updates were rejected"
    if sim.stalled:
        return (f"the run stalled at step {sim.step} (t={sim.now:,.1f}s) with every client idle: "
                f"{rejected} of {uploads} client updates were rejected")
    return None


def run_experiment(cfg: ExperimentConfig, out_dir: str | Path, resume: bool = False, progress: bool = False,
                   overwrite: bool = False, data: FederatedData | None = None,
                   stop_after_steps: int | None = None, progress_every: float | None = None,
                   show_accuracy: bool = True) -> dict[str, Any]:
    """Run ``cfg`` into ``out_dir`` and return the summary.

    ``progress`` shows a rich progress bar; otherwise ``progress_every`` prints a plain
    progress line to stderr every that many seconds of wall time (and one at the end).
    ``show_accuracy`` False: neither shows the test accuracy (a blind run, ``fedgmr run
    --blind``); what is recorded does not change.

    ``resume`` continues from ``out_dir/checkpoint``; ``cfg`` must be the run's saved
    config (:func:`saved_config`). Metrics written after that checkpoint are discarded
    and recomputed, so the result equals an uninterrupted run. ``overwrite`` replaces a
    previous run in ``out_dir`` (only the files fedgmr wrote are removed).
    ``stop_after_steps`` stops early (as an interruption would), leaving a resumable run.

    Raises ``RunDirError`` for a directory that cannot be used (locked, holds another
    run, damaged or mismatched checkpoint, not writable) and ``RunFailedError`` for a run
    that made no progress (its metrics and a failed summary are written first).
    """
    if resume and overwrite:
        raise ConfigError("resume and overwrite exclude each other")
    out = Path(out_dir)
    RunLoggers.check(cfg)  # a tracker library that is not installed: one line before anything runs
    created = prepare(out, must_exist=resume)
    lock = RunLock(out)
    lock.acquire()  # refused when another process works on this directory
    try:
        with RunLoggers(cfg, out) as loggers:  # closed however the run ends
            return _run_locked(cfg, out, resume, progress, overwrite, data, stop_after_steps,
                               progress_every=progress_every, loggers=loggers, show_accuracy=show_accuracy)
    except BaseException:
        if created:  # e.g. the data failed to load: leave no empty run directory behind
            _discard_if_unused(out)
        raise
    finally:
        lock.release()


def _run_locked(cfg: ExperimentConfig, out: Path, resume: bool, progress: bool, overwrite: bool,
                data: FederatedData | None, stop_after_steps: int | None,
                progress_every: float | None = None, loggers: RunLoggers | None = None,
                show_accuracy: bool = True) -> dict[str, Any]:
    metrics_path = out / METRICS_FILE
    digest = config_digest(cfg)
    ckpt = None
    keep = 0
    from_start = False  # a resume of a run stopped while it started: no checkpoint and no record yet
    # what this run may write here: it creates and deletes nothing else (rundir's manifest)
    names = set(CORE_ENTRIES) | (loggers.entries() if loggers else set())
    owned = owned_entries(out)
    if resume:
        _finished(out)
        if checkpoint_path(out) is None and _no_records(metrics_path):
            config_path = out / CONFIG_FILE
            raw = _read_saved_config(config_path)
            _check_same_config(config_path, raw, cfg)
            digest = config_digest(raw)  # the checkpoints belong to config.yaml as saved
            from_start = True
            log.warning("%s has no checkpoint yet (the run was stopped while it loaded its data or built): "
                        "running it from the start", out)
        else:
            ckpt = load_checkpoint(out)
            _check_resumable(out, cfg, ckpt[0])
            digest = ckpt[0]["config_sha256"]  # config.yaml's (cfg may name another run.device)
            try:
                records = int(ckpt[0]["simulator"]["records"])
            except (KeyError, TypeError, ValueError):
                raise RunDirError(f"{checkpoint_path(out)} is damaged: no simulator state") from None
            keep = _verify_metrics(metrics_path, ckpt[0].get("metrics"), records)
    elif not overwrite:
        refuse_held_run(out, f"continue it with --resume {out} or replace it with --overwrite")
    # before any work: a name of the run's that is yours (a folder mlruns/, your own
    # config.yaml) or a link is refused, and the names are recorded before they are created
    claim(out, names, owned)

    last_acc: list[float | None] = [None]
    sink: list[_MetricsLog] = []  # the metrics file, opened once the experiment is built

    def on_record(rec: dict[str, Any]) -> None:
        sink[0].write(rec)
        if loggers:
            loggers.log(rec)
        last_acc[0] = rec["accuracy"]

    wall0 = time.perf_counter()
    # a directory without results to keep gets the config first: a run killed while it loads
    # its data and builds resumes "from no checkpoint yet". An --overwrite builds (and loads
    # the data) before touching the old run: a bad data path keeps it
    early = ckpt is None and (from_start or not holds_run(out))
    if early:
        _start_files(out, cfg, names, keep_config=from_start)
    try:
        exp = build_experiment(cfg, on_record=on_record, data=data)
    except Exception:
        if early and not from_start:  # e.g. a bad data path: leave no half-made run behind
            remove_owned(out, names)
            remove_entry(out / MANIFEST_FILE)
        raise
    sim = exp.simulator
    try:
        prior_wall = 0.0
        if ckpt is not None:
            state, tensors = ckpt
            try:
                exp.strategy.load_state_dict(state["strategy"],
                                             tensors_under(tensors, "strategy"))
                sim.load_state_dict(state["simulator"], tensors_under(tensors, "sim"))
                prior_wall = float(state.get("wall_time", 0.0))
            except Exception as exc:  # noqa: BLE001 - verified files that still do not fit this run
                raise RunDirError(f"{checkpoint_path(out)} does not fit this run: "
                                  f"{type(exc).__name__}: {exc}") from None
            sink.append(_MetricsLog(metrics_path, keep))
        else:
            if not early:
                _start_files(out, cfg, names, keep_config=False)  # the old run goes, checkpoint included
            sink.append(_MetricsLog(metrics_path))
        if loggers:  # a resume hands them the records it keeps
            loggers.open(ckpt is not None, lambda: read_metrics(out))
        every, seconds = cfg.run.checkpoint_every, cfg.run.checkpoint_seconds
        limit = cfg.run.fail_after_rejections or 3 * sim.concurrency
        # [end of the last checkpoint, wall seconds until the next time-triggered one]: a
        # slow checkpoint (a large model) stretches the interval to keep the overhead small
        timer = [time.perf_counter(), seconds or math.inf]

        def checkpoint(s: Simulator) -> None:
            start = time.perf_counter()
            st_state, st_tensors = exp.strategy.state_dict()
            sim_state, sim_tensors = s.state_dict()
            tensors = {f"strategy/{k}": v for k, v in st_tensors.items()}
            tensors.update({f"sim/{k}": v for k, v in sim_tensors.items()})
            metrics = sink[0].sync()  # the records the checkpoint counts reach the disk first
            save_checkpoint(out, {"strategy": st_state, "simulator": sim_state, "step": s.step,
                                  "wall_time": prior_wall + time.perf_counter() - wall0,
                                  "config_sha256": digest, "metrics": metrics}, tensors)
            now = time.perf_counter()
            timer[:] = [now, max(seconds or math.inf, CHECKPOINT_COST_FACTOR * (now - start))]

        if ckpt is None and (every or seconds):
            checkpoint(sim)  # a run killed before its first step can be resumed too

        def should_stop() -> bool:
            latch.check()  # a Ctrl-C that a finaliser swallowed is raised again here
            return sim.rejected_streak >= limit or bool(stop_after_steps and sim.step >= stop_after_steps)

        with sigint_latch() as latch, _Progress(cfg, progress, progress_every,
                                                # elapsed= as summary.json's wall_time_s counts it
                                                wall_start=wall0 - prior_wall, show_accuracy=show_accuracy) as bar:
            def on_step(s: Simulator) -> None:
                bar.update(s, last_acc[0])
                if (every and s.step % every == 0) or time.perf_counter() - timer[0] >= timer[1]:
                    checkpoint(s)  # a snapshot only: results never depend on when it is taken

            sim.run(cfg.run.max_steps, cfg.run.max_time, should_stop=should_stop, on_step=on_step)
            failure = _failure(sim, limit)
            if failure is None and stop_after_steps and sim.step >= stop_after_steps:
                return {"interrupted": True, "steps": sim.step}
            sim.finish()
            if every or seconds:
                checkpoint(sim)  # the final model, for `fedgmr evaluate` (a finished run is not resumed)
            bar.update(sim, last_acc[0], final=True)
        sink[0].sync()
    finally:
        if sink:
            sink[0].close()
        _close(exp.executor)
    summary = finalize(out, cfg, wall=prior_wall + time.perf_counter() - wall0, rejected=sim.strategy.rejected,
                       failure=failure)
    if loggers:
        loggers.finish(summary)
    if failure is not None:
        raise RunFailedError(f"the run failed: {failure} (metrics and summary in {out})")
    return summary


def run_environment(cfg: ExperimentConfig) -> dict[str, Any]:
    """The stack this process computes ``cfg`` on (:func:`fedgmr.experiment.environment.environment`)."""
    from fedgmr.device import resolve_device
    from fedgmr.experiment.environment import environment

    try:
        device: str | None = str(resolve_device(cfg.run.device))
    except Exception:  # noqa: BLE001 - a record of the run, never a reason to lose its summary
        device = None
    return environment(device)


def personal_summary(cfg: ExperimentConfig, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary's personalised figures. For a method whose clients keep their own models
    (:data:`fedgmr.methods.PERSONAL_ALGORITHMS`): ``headline_metric: personal_accuracy`` (what
    ``fedgmr run`` prints and ``compare`` / ``table`` use by default) and
    ``global_model_meaningful`` (whether ``final_accuracy``, the server model's, means anything:
    Ditto's does). For any run that logs it: ``personal_accuracy`` ``{mean, std, worst10, time}``
    from the last record that does, with ``at_t_star`` (its Acc@t*) when ``run.t_star`` is set."""
    from fedgmr.methods import GLOBAL_MODEL_MEANINGFUL, is_personalised

    out: dict[str, Any] = {}
    if is_personalised(cfg.local.algorithm):
        out["headline_metric"] = "personal_accuracy"
        out["global_model_meaningful"] = cfg.local.algorithm in GLOBAL_MODEL_MEANINGFUL
    logged = [r for r in rows if isinstance(r.get("personal_accuracy"), (int, float))
              and math.isfinite(r["personal_accuracy"])]
    if logged:
        last = logged[-1]
        personal: dict[str, Any] = {"mean": last["personal_accuracy"], "std": last.get("personal_std"),
                                    "worst10": last.get("personal_worst10"), "time": last["time"]}
        if cfg.run.t_star is not None:
            mean, _ = acc_at_t([r["time"] for r in logged], [r["personal_accuracy"] for r in logged],
                               cfg.run.t_star, interval=cfg.run.eval_interval)  # the window `compare` uses
            personal["at_t_star"] = None if math.isnan(mean) else mean
        out["personal_accuracy"] = personal
    return out


def finalize(out: Path, cfg: ExperimentConfig, wall: float, rejected: int | None = None,
             failure: str | None = None) -> dict[str, Any]:
    """Write summary.json and the plot from the run's metrics.

    ``rejected``: the run's total of rejected updates (default: the last record's count,
    which misses rejections after the last evaluation). ``failure``: why the run failed;
    the summary's ``status`` is then ``failed``.
    """
    from fedgmr.experiment.metrics import read_metrics

    rows = read_metrics(out)
    last = rows[-1]
    summary: dict[str, Any] = {
        "name": cfg.name, "method": cfg.method, "seed": cfg.seed,
        "status": "failed" if failure else "completed",
        "runtime": "simulator", "clock": "virtual",  # `time` and `t_star` are virtual seconds (Flower: wall)
        "final_accuracy": last["accuracy"], "best_accuracy": max(r["accuracy"] for r in rows),
        "time": last["time"], "steps": last["step"], "final_avg_density": last["avg_density"],
        "restorations": last["restorations"], "bytes_up": last["bytes_up"], "bytes_down": last["bytes_down"],
        "uploads": last.get("uploads"), "downloads": last.get("downloads"),
        "rejected_updates": last["rejected"] if rejected is None else rejected,
        "wall_time_s": round(wall, 3), "evaluations": len(rows),
        "eval_interval": cfg.run.eval_interval,
    }
    if failure:
        summary["failure"] = failure
    summary["environment"] = run_environment(cfg)
    if cfg.run.t_star is not None:
        mean, std = acc_at_t([r["time"] for r in rows], [r["accuracy"] for r in rows], cfg.run.t_star,
                             interval=cfg.run.eval_interval)
        summary["t_star"] = cfg.run.t_star
        summary["acc_at_t_star"] = None if math.isnan(mean) else mean
        summary["acc_at_t_star_std"] = None if math.isnan(std) else std
    summary.update(personal_summary(cfg, rows))
    write_atomic(out / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    with writing(out / PLOT_FILE), tempfile.TemporaryDirectory(prefix="fedgmr-plot-") as tmp:
        from fedgmr.experiment.plots import plot_runs

        # drawn outside the run directory, then written like every file of the run (no link followed)
        drawn = plot_runs([(cfg.method, rows)], Path(tmp) / PLOT_FILE, title=f"{cfg.name}: {cfg.method}",
                          t_star=cfg.run.t_star)
        write_atomic(out / PLOT_FILE, drawn.read_bytes())
    return summary
