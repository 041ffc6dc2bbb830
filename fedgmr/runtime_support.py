"""Which runtime runs which configuration: one declared table, consulted by every entry
point that starts a runtime (docs/distributed.md, "What runs where").

The simulator runs every method. A deployment runtime refuses a configuration when a
feature it needs does not travel over that runtime yet; each refusal is one row of
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


def _client_method(cfg: Any) -> Any:
    from fedgmr.training.client_methods import client_method

    return client_method(cfg.local)


def _stateful(cfg: Any) -> str | None:
    return f"local.algorithm {cfg.local.algorithm!r}" if _client_method(cfg).stateful else None


def _extras(cfg: Any) -> str | None:
    method = _client_method(cfg)
    if method.stateful or not (method.needs_extras or method.returns_extras):
        return None  # (a stateful method is refused by its own row first)
    return f"local.algorithm {cfg.local.algorithm!r}"


def _sampling(cfg: Any) -> str | None:
    conc, n = cfg.clients.concurrency, cfg.clients.num_clients
    return None if conc is None or conc >= n else f"clients.concurrency {conc}"


#: every refusal of every runtime, in the order they are checked
RUNTIME_RULES: tuple[RuntimeRule, ...] = (
    RuntimeRule("clustering", ("flower",), _clustering,
                "sends per-cluster models, which the Flower runtime does not carry yet"),
    RuntimeRule("client state", ("flower",), _stateful,
                "keeps client state between jobs, which the Flower runtime does not carry yet"),
    RuntimeRule("values beside the model", ("flower",), _extras,
                "exchanges values beside the model (its extras), which the Flower payload does not carry yet"),
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


__all__ = ["RUNTIMES", "RUNTIME_RULES", "RuntimeRule", "check_runtime", "refusal"]
