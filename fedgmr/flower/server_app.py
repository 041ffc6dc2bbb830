"""The Flower ServerApp: ``serverapp = "fedgmr.flower.server_app:app"``.

Builds FedGMR's strategy from the FedGMR config the run names, waits for the SuperNodes,
and runs :class:`~fedgmr.flower.loop.BufferedServerLoop` over Flower's Grid. Writes a run
directory to the run config's ``out-dir`` (when set): ``config.yaml``, ``metrics.jsonl``
and ``summary.json`` in the simulator's schema with ``time`` on the wall clock
(``clock: wall`` in the summary), and ``server.log``; ``fedgmr compare``, ``plot`` and
``table`` read it like a simulator run.

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
replies; 0 turns it off), ``quarantine-window`` and ``quarantine-seconds``.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, Mapping

from fedgmr.flower.adapter import GridLink, flower_version, make_server_app
from fedgmr.flower.client import load_run_config
from fedgmr.flower.loop import BufferedServerLoop, LoopSettings, bound_influence, summary
from fedgmr.flower.quarantine import QuarantinePolicy

log = logging.getLogger(__name__)


def _num(run_config: Mapping[str, Any], key: str, default: float | None) -> float | None:
    v = run_config.get(key)
    return default if v is None or v == "" else float(v)


def refuse_client_state(cfg: Any) -> None:
    """Client methods that keep state between jobs or exchange vectors beside the model
    (SCAFFOLD, Ditto, FedBN) need the simulator's client-state store: not on Flower yet."""
    from fedgmr.errors import ConfigError
    from fedgmr.training.client_methods import client_method

    if cfg.clustering.kind != "none":  # several models per job and cluster state: the Flower payload carries one
        raise ConfigError(f"clustering.kind {cfg.clustering.kind!r} sends per-cluster models, which the Flower "
                          f"runtime does not carry yet; run it in the simulator (fedgmr run)")
    method = client_method(cfg.local)
    if method.stateful or method.needs_extras or method.returns_extras:
        raise ConfigError(f"local.algorithm {cfg.local.algorithm!r} keeps client state between jobs, which the "
                          f"Flower runtime does not carry yet; run it in the simulator (fedgmr run)")
    if cfg.clients.concurrency is not None and cfg.clients.concurrency < cfg.clients.num_clients:
        raise ConfigError(f"clients.concurrency {cfg.clients.concurrency} samples clients per round, which the "
                          f"Flower runtime does not do yet (it keeps every node busy); unset it, or run it in the "
                          f"simulator (fedgmr run)")


def serve(link: GridLink, run_config: Mapping[str, Any]) -> dict[str, Any]:
    """Run FedGMR's buffered loop over ``link``; returns the summary."""
    from fedgmr.config import dump_config
    from fedgmr.experiment.build import build_experiment, wants_client_validation

    out_dir = Path(str(run_config["out-dir"])) if run_config.get("out-dir") else None
    pkg_log = logging.getLogger("fedgmr")
    # stdout is what Flower streams to `flwr run --stream` / `flwr log` (it mirrors the
    # ServerApp process's stdout and stderr to the SuperLink)
    stream = logging.StreamHandler(sys.stdout)
    stream.setFormatter(logging.Formatter("%(levelname)s fedgmr: %(message)s"))
    handlers: list[logging.Handler] = [stream]
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(out_dir / "server.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handlers.append(handler)
    for h in handlers:
        pkg_log.addHandler(h)
    level = pkg_log.level
    if level == logging.NOTSET or level > logging.INFO:
        pkg_log.setLevel(logging.INFO)
    try:
        quarantine = QuarantinePolicy.from_run_config(run_config)  # a bad key fails before anything is built
        cfg = load_run_config(run_config)
        refuse_client_state(cfg)
        exp = build_experiment(cfg)
        exp.executor.close()
        bound_influence(exp.strategy, [len(idx) for idx in exp.partition.clients], run_config)
        n = cfg.clients.num_clients
        want = int(_num(run_config, "min-nodes", n) or n)
        nodes = link.wait_for_nodes(want, float(_num(run_config, "node-wait", 120.0) or 0.0))
        if not nodes:
            raise RuntimeError("no SuperNode connected")
        log.info("flwr %s: %d node(s) connected, %d client slot(s)", flower_version(), len(nodes), n)
        steps = int(_num(run_config, "num-server-steps", cfg.run.max_steps or 50) or 50)
        settings = LoopSettings(
            max_steps=steps, k=int(_num(run_config, "k", cfg.coordination.k) or 1),
            mode=cfg.coordination.mode, trigger=cfg.coordination.trigger, slack=cfg.coordination.deadline_slack,
            reply_timeout=float(_num(run_config, "reply-timeout", 60.0) or 60.0),
            step_timeout=float(_num(run_config, "step-timeout", 30.0) or 30.0),
            max_wall=_num(run_config, "max-wall", None),
            # a deployment has no virtual clock: it evaluates every N server steps (5 unless set)
            eval_every=int(_num(run_config, "eval-every", cfg.run.eval_every or 5) or 5),
            check_interval=cfg.restoration.check_interval,
        )
        t_star = _num(run_config, "t-star", None)
        if out_dir is not None:
            (out_dir / "summary.json").unlink(missing_ok=True)  # a previous run's summary never pairs with new metrics
            (out_dir / "config.yaml").write_text(dump_config(cfg))
        metrics = open(out_dir / "metrics.jsonl", "w") if out_dir else None

        def on_record(rec: dict[str, Any]) -> None:
            log.info("step %d/%d (t=%.1fs wall): accuracy %.4f, avg density %.3f, restorations %d, rejected %d, "
                     "timeouts %d", rec["step"], steps, rec["time"], rec["accuracy"], rec["avg_density"],
                     rec["restorations"], rec["rejected"], rec["timeouts"])
            if metrics:
                metrics.write(json.dumps(rec) + "\n")
                metrics.flush()

        workload = exp.simulator.executor.workload  # type: ignore[attr-defined]
        loop = BufferedServerLoop(exp.strategy, link, nodes[:n], exp.simulator.evaluator, settings,
                                  workload.settings, cfg.seed, wants_client_validation(cfg), on_record,
                                  quarantine=quarantine)
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
        log.info("summary: %s", json.dumps({k: v for k, v in result.items() if k != "rejection_log"}))
        if out_dir is not None:
            (out_dir / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
        return result
    finally:
        pkg_log.setLevel(level)
        for h in handlers:
            pkg_log.removeHandler(h)
            h.close()


app = make_server_app(serve)
