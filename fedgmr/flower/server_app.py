"""The Flower ServerApp: ``serverapp = "fedgmr.flower.server_app:app"``.

Builds FedGMR's strategy from the FedGMR config the run names, waits for the SuperNodes,
and runs :class:`~fedgmr.flower.loop.BufferedServerLoop` over Flower's Grid. Writes a run
directory to the run config's ``out-dir`` (when set): ``config.yaml``, ``metrics.jsonl``
and ``summary.json`` in the simulator's schema with ``time`` on the wall clock
(``clock: wall`` in the summary), and ``server.log``; ``fedgmr compare``, ``plot`` and
``table`` read it like a simulator run. The ``out-dir`` goes through the run-directory
guard of ``fedgmr run`` (:func:`fedgmr.experiment.rundir.open_new_run`): it is locked while
the ServerApp runs (a second writer is refused), a directory that already holds a run
(a simulator's or a Flower one) is refused, and only :data:`RUN_FILES` are written there,
never through a link.

Log lines (one per evaluation, the bounds, warnings) go to the process's stdout too:
Flower's ``flwr-serverapp`` / ``flwr-simulation`` mirror stdout and stderr to the
SuperLink, which is what ``flwr run --stream`` and ``flwr log`` show.

Run config keys (``[tool.flwr.app.config]`` or ``flwr run -c``): ``config`` (FedGMR
YAML/TOML path; default: the quickstart preset), ``seed``, ``num-server-steps``, ``k``,
``reply-timeout``, ``step-timeout``, ``max-wall``, ``min-nodes``, ``node-wait``,
``eval-every``, ``out-dir``, ``t-star`` (wall-clock seconds since the start: the summary's
Acc@t*), and the bounds on one client's influence
(:func:`~fedgmr.flower.loop.bound_influence`): ``max-samples``, ``max-update-norm``,
``update-norm-multiple`` (0 turns a bound off), and the quarantine of repeat offenders
(:class:`~fedgmr.flower.quarantine.QuarantinePolicy`): ``quarantine-after`` (N invalid
replies; 0 turns it off), ``quarantine-window`` and ``quarantine-seconds``; ``pull-backoff``
(seconds: the longest wait before asking again for a reply's objects not yet at the
SuperLink; unset: Flower's 1 s, doubling to 10 s; :meth:`GridLink.cap_pull_backoff`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from fedgmr.errors import ConfigError
from fedgmr.experiment.rundir import (CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, open_for_write, open_new_run, tmp_name,
                                      write_atomic)
from fedgmr.flower.adapter import GridLink, flower_version, make_server_app
from fedgmr.flower.client import load_run_config
from fedgmr.flower.loop import BufferedServerLoop, LoopSettings, bound_influence, summary
from fedgmr.flower.quarantine import QuarantinePolicy
from fedgmr.flower.run_config import DeploymentConfig, parse_run_config
from fedgmr.training.extras import extra_names

log = logging.getLogger(__name__)

SERVER_LOG = "server.log"
#: what a Flower run writes in its ``out-dir``: the run directory's manifest lists these,
#: and nothing else there is written or removed
RUN_FILES = (CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, tmp_name(CONFIG_FILE), tmp_name(SUMMARY_FILE), SERVER_LOG)


class _LogFile(logging.StreamHandler):  # type: ignore[type-arg]
    """``server.log``, opened like every file of a run directory (never through a link)."""

    def __init__(self, path: Path) -> None:
        super().__init__(os.fdopen(open_for_write(path, os.O_WRONLY | os.O_APPEND), "a", encoding="utf-8"))

    def close(self) -> None:
        try:
            self.stream.close()
        finally:
            super().close()


def refuse_client_state(cfg: Any) -> None:
    """What the Flower runtime cannot run yet (per-cluster models, client models scored on
    the server, client sampling): the refusals of the one runtime table,
    :data:`fedgmr.runtime_support.RUNTIME_RULES`."""
    from fedgmr.runtime_support import check_runtime

    check_runtime(cfg, "flower")


def check_against_config(rc: DeploymentConfig, cfg: Any) -> None:
    """Run-config values that contradict the FedGMR config they run (ConfigError, one line)."""
    n = cfg.clients.num_clients  # coordination.k above it is refused by the config itself
    if rc.k is not None and rc.k > n:
        raise ConfigError(f"invalid run-config value for 'k': {rc.k} is more than the {n} clients "
                          f"(clients.num_clients): a step could never gather {rc.k} replies; set it at most {n}")
    if rc.min_nodes is not None and rc.min_nodes > n:
        raise ConfigError(f"invalid run-config value for 'min-nodes': {rc.min_nodes} is more than the {n} clients "
                          f"(clients.num_clients) the config trains; set it at most {n}")


def serve(link: GridLink, run_config: Mapping[str, Any]) -> dict[str, Any]:
    """Run FedGMR's buffered loop over ``link``; returns the summary."""
    from fedgmr.config import dump_config
    from fedgmr.experiment.build import build_experiment, wants_client_validation

    rc = parse_run_config(run_config)  # every key typed and checked before anything is built or written
    out_dir = Path(rc.out_dir) if rc.out_dir else None
    pkg_log = logging.getLogger("fedgmr")
    # stdout is what Flower streams to `flwr run --stream` / `flwr log` (it mirrors the
    # ServerApp process's stdout and stderr to the SuperLink)
    stream = logging.StreamHandler(sys.stdout)
    stream.setFormatter(logging.Formatter("%(levelname)s fedgmr: %(message)s"))
    handlers: list[logging.Handler] = [stream]
    lock = None
    if out_dir is not None:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"invalid run-config value for 'out-dir': cannot create {out_dir}: "
                              f"{exc.strerror or exc}") from None
        # the run-directory guard of `fedgmr run`: a lock, a directory that holds a run
        # refused, only the run's own names written (and an unfinished start's removed)
        lock = open_new_run(out_dir, RUN_FILES, "a Flower run neither continues nor replaces a run: set another "
                                                "out-dir (or move the run away)")
        try:
            handler: logging.Handler = _LogFile(out_dir / SERVER_LOG)
        except BaseException:
            lock.release()
            raise
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handlers.append(handler)
    for h in handlers:
        pkg_log.addHandler(h)
    level = pkg_log.level
    if level == logging.NOTSET or level > logging.INFO:
        pkg_log.setLevel(logging.INFO)
    try:
        quarantine = QuarantinePolicy(rc.quarantine_after, rc.quarantine_window, rc.quarantine_seconds)
        if rc.pull_backoff is not None:
            if link.cap_pull_backoff(rc.pull_backoff):
                log.info("pull-backoff: a reply's objects not at the SuperLink yet are asked for again after at "
                         "most %g s", rc.pull_backoff)
            else:
                log.warning("pull-backoff: Flower's %s does not pull through pull_objects; its own back-off "
                            "stays", type(link.grid).__name__)
        cfg = load_run_config(run_config)
        refuse_client_state(cfg)
        check_against_config(rc, cfg)
        if cfg.run.personal_eval_every is not None:
            log.warning("run.personal_eval_every is not run under Flower: the clients' own models (their state) "
                        "stay on the nodes; the records score the global model")
        exp = build_experiment(cfg)
        exp.executor.close()
        bound_influence(exp.strategy, [len(idx) for idx in exp.partition.clients], rc)
        n = cfg.clients.num_clients
        nodes = link.wait_for_nodes(rc.min_nodes or n, rc.node_wait)
        if not nodes:
            raise RuntimeError("no SuperNode connected")
        log.info("flwr %s: %d node(s) connected, %d client slot(s)", flower_version(), len(nodes), n)
        steps = rc.num_server_steps or cfg.run.max_steps or 50
        settings = LoopSettings(
            max_steps=steps, k=rc.k or cfg.coordination.k,
            mode=cfg.coordination.mode, trigger=cfg.coordination.trigger, slack=cfg.coordination.deadline_slack,
            reply_timeout=rc.reply_timeout, step_timeout=rc.step_timeout, max_wall=rc.max_wall,
            # a deployment has no virtual clock: it evaluates every N server steps (5 unless set)
            eval_every=rc.eval_every or cfg.run.eval_every or 5,
            check_interval=cfg.restoration.check_interval,
        )
        t_star = rc.t_star
        if out_dir is not None:
            write_atomic(out_dir / CONFIG_FILE, dump_config(cfg))
        metrics = (os.fdopen(open_for_write(out_dir / METRICS_FILE, os.O_WRONLY | os.O_TRUNC), "w", encoding="utf-8")
                   if out_dir else None)

        def on_record(rec: dict[str, Any]) -> None:
            log.info("step %d/%d (t=%.1fs wall): accuracy %.4f, avg density %.3f, restorations %d, rejected %d, "
                     "timeouts %d", rec["step"], steps, rec["time"], rec["accuracy"], rec["avg_density"],
                     rec["restorations"], rec["rejected"], rec["timeouts"])
            if metrics:
                metrics.write(json.dumps(rec) + "\n")
                metrics.flush()

        workload = exp.simulator.executor.workload  # type: ignore[attr-defined]
        method = getattr(workload, "client_method", None)
        loop = BufferedServerLoop(exp.strategy, link, nodes[:n], exp.simulator.evaluator, settings,
                                  workload.settings, cfg.seed, wants_client_validation(cfg), on_record,
                                  quarantine=quarantine,
                                  client_extras=extra_names(getattr(method, "reply_extras", ())))
        if quarantine.enabled:
            log.info("quarantine: %d invalid replies within %g s keep a node out for %g s", quarantine.after,
                     quarantine.window, quarantine.seconds)
        try:
            records = loop.run()
        finally:
            if metrics:
                metrics.close()
        result = summary(records, loop.stats, len(loop.node_of_slot), name=cfg.name, method=cfg.method,
                         seed=cfg.seed, t_star=t_star)
        result["quarantined_nodes"] = list(loop.quarantine.events)
        result["rejection_log"] = loop.stats.log
        log.info("summary: %s", json.dumps({k: v for k, v in result.items() if k not in ("rejection_log", "messages")}))
        # every instruction's round trip (the testbed splits it into transfers, compute and latency)
        result["messages"] = loop.stats.messages
        if out_dir is not None:
            write_atomic(out_dir / SUMMARY_FILE, json.dumps(result, indent=2) + "\n")
        return result
    finally:
        pkg_log.setLevel(level)
        for h in handlers:
            pkg_log.removeHandler(h)
            h.close()
        if lock is not None:
            lock.release()


app = make_server_app(serve)
