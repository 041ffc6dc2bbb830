"""Which runtime runs which configuration: one declared table, consulted by every entry
point that starts a runtime (docs/distributed.md, "What runs where").

The simulator runs every method. The Flower runtime carries client state (kept on the
node) and the values exchanged beside the model (in the payload), as the simulator does.
A deployment runtime refuses a configuration when a feature it needs does not travel over
that runtime yet; each refusal is one row of
:data:`RUNTIME_RULES` - the feature, the runtimes that refuse it and why - so the
refusals are listed, tested and documented from one place rather than written into each
runtime. :func:`check_runtime` raises the first refusal as a one-line ``ConfigError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from fedgmr.errors import ConfigError

#: the runtimes a rule may name (``simulator`` covers every executor: serial, process pool, Ray)
RUNTIMES = ("simulator", "flower")


@dataclass(frozen=True)
class RuntimeRule:
    """A feature some runtimes cannot run yet.

    name: short name of the feature (the docs' table, tests).
    refused_by: the runtimes that refuse it.
    applies: ``applies(cfg)`` -> the config's words for the feature when it uses it, else None.
    reason: why, completing "``<what>`` ..." (one clause, no trailing period).
    """

    name: str
    refused_by: tuple[str, ...]
    applies: Callable[[Any], str | None]
    reason: str


def _clustering(cfg: Any) -> str | None:
    kind = cfg.clustering.kind
    return None if kind == "none" else f"clustering.kind {kind!r}"


#: client methods that train no global model: their result is the clients' own models
#: (FedMD's accuracy is the mean over them; local_only's and standalone's the personal
#: accuracy), which a deployment keeps on the nodes and does not score
CLIENT_MODELS_ONLY = ("fedmd", "local_sgd", "standalone")


def _client_models_only(cfg: Any) -> str | None:
    algo = cfg.local.algorithm
    return f"local.algorithm {algo!r}" if algo in CLIENT_MODELS_ONLY else None


def _sampling(cfg: Any) -> str | None:
    conc, n = cfg.clients.concurrency, cfg.clients.num_clients
    return None if conc is None or conc >= n else f"clients.concurrency {conc}"


#: every refusal of every runtime, in the order they are checked
RUNTIME_RULES: tuple[RuntimeRule, ...] = (
    RuntimeRule("clustering", ("flower",), _clustering,
                "sends per-cluster models, which the Flower runtime does not carry yet"),
    RuntimeRule("client models only", ("flower",), _client_models_only,
                "trains no global model: its result is the clients' own models, which stay on the nodes and "
                "which the Flower runtime does not score yet"),
    RuntimeRule("client sampling", ("flower",), _sampling,
                "samples clients per round, which the Flower runtime does not do yet (it keeps every node "
                "busy); unset it"),
)


def refusal(cfg: Any, runtime: str) -> str | None:
    """Why ``runtime`` cannot run ``cfg`` (one line), or None when it can."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r} (known: {', '.join(RUNTIMES)})")
    for rule in RUNTIME_RULES:
        if runtime in rule.refused_by:
            what = rule.applies(cfg)
            if what is not None:
                return f"{what} {rule.reason}; run it in the simulator (fedgmr run)"
    return None


def check_runtime(cfg: Any, runtime: str) -> None:
    """``ConfigError`` (one line) when ``runtime`` cannot run ``cfg``."""
    why = refusal(cfg, runtime)
    if why is not None:
        raise ConfigError(why)


__all__ = ["CLIENT_MODELS_ONLY", "RUNTIMES", "RUNTIME_RULES", "RuntimeRule", "check_runtime", "refusal"]
