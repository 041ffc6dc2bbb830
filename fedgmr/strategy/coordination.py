"""The coordination core: when the server steps, what follows a step, and what a record
holds - written once, driven by either clock and either transport (docs/reference.md §6.4).

The virtual-clock :class:`~fedgmr.sim.simulator.Simulator` and the Flower
:class:`~fedgmr.flower.loop.BufferedServerLoop` differ only in how replies reach the server
(an event queue of simulated transfers; messages pulled from a SuperLink) and in what
``now`` means (virtual seconds; wall-clock seconds since the start). Everything they decide
about the strategy is here:

* :class:`StepTrigger` - aggregate after ``k`` replies, at the deadline trigger's time, or
  when a synchronous round is complete; the deadline's arming rule;
* :func:`after_step` - GMR's validation check and the time-driven restorations after each
  server step;
* :func:`eval_due` - the step cadence of test evaluations;
* :func:`step_stats` and :func:`base_record` - the per-step statistics and the metrics
  record every runtime writes (a runtime adds its own keys after these).

Nothing here reads a clock, sleeps, schedules an event or imports a runtime.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Sequence

from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy, mean_density

__all__ = ["Coordination", "Decision", "StepTrigger", "after_step", "base_record", "eval_due", "step_stats"]


@dataclass
class Coordination:
    """When the server aggregates and whom it dispatches (docs/reference.md §6.4).

    mode: ``semi_async`` (aggregate after ``k`` arrivals or at a deadline) or ``sync``
        (wait for every dispatched client).
    trigger: ``k`` or ``deadline`` (semi-async only); the deadline is ``slack`` seconds
        after the first arrival, since the last aggregation, of a client at the highest
        density in flight (the reference runs' "fastest full-density client + 0.5 s").
    concurrency: clients training at once (None: all). Sync mode samples this many per round.
    server_time: seconds one aggregation takes before the new model is dispatched.
    ims: incremental model splitting with multicast of shared blocks.
    """

    mode: Literal["semi_async", "sync"] = "semi_async"
    trigger: Literal["k", "deadline"] = "k"
    k: int = 3
    slack: float = 0.5
    concurrency: int | None = None
    server_time: float = 0.5
    ims: bool = True

    def __post_init__(self) -> None:
        if self.mode not in ("semi_async", "sync") or self.trigger not in ("k", "deadline"):
            raise ValueError(f"unknown coordination: mode {self.mode!r}, trigger {self.trigger!r}")
        if self.k < 1:
            raise ValueError("coordination k must be >= 1")


class Decision(enum.Enum):
    """What :meth:`StepTrigger.decide` says the server does now."""

    WAIT = "wait"
    AGGREGATE = "aggregate"
    #: a synchronous round closed with nothing to aggregate (every reply failed or was
    #: rejected): the simulator closes it with an empty step, a deployment sends the model again
    EMPTY_ROUND = "empty_round"


class StepTrigger:
    """When the server steps (one instance per run, state saved in checkpoints).

    ``clients``: the number of clients; the trigger counts against
    ``min(concurrency, clients)`` (every client of a deployment is at work). A runtime
    calls :meth:`on_reply` when a reply arrives (it may arm the deadline: the runtime
    wakes itself at the time returned), :meth:`decide` whenever something happened, and
    :meth:`stepped` after each aggregation.
    """

    def __init__(self, coord: Coordination, clients: int) -> None:
        self.coord = coord
        self.active = min(coord.concurrency or clients, clients)
        #: the deadline trigger's time once armed (None: not armed since the last step)
        self.deadline_at: float | None = None

    @property
    def semi_async_deadline(self) -> bool:
        return self.coord.mode == "semi_async" and self.coord.trigger == "deadline"

    def on_reply(self, density: float, in_flight: Iterable[float], now: float) -> float | None:
        """A reply of a client at ``density`` arrived at ``now`` (``in_flight``: the
        densities of those still out). Deadline trigger: the first reply since the last
        step from a client at the highest density in play arms it ``slack`` later; that
        time is returned (None: nothing armed). Armed from an event that has happened, so
        it never lies in the past, whatever the jitter or queueing."""
        if not self.semi_async_deadline or self.deadline_at is not None:
            return None
        if density >= max([*in_flight, density]):
            self.deadline_at = now + self.coord.slack
            return self.deadline_at
        return None

    def step_cap(self) -> int:
        """At most this many new replies enter one step: ``k`` under the k trigger (a
        runtime that receives replies in batches keeps the rest for the next step)."""
        if self.coord.mode == "semi_async" and self.coord.trigger == "k":
            return self.coord.k
        return self.active

    def decide(self, arrivals: int, outstanding: bool, now: float) -> Decision:
        """``arrivals``: replies buffered since the last step; ``outstanding``: some client
        of the current synchronous round is still out (dispatched, not yet heard from);
        ``now``: the runtime's clock."""
        if self.coord.mode == "sync":
            if outstanding:
                return Decision.WAIT
            return Decision.AGGREGATE if arrivals else Decision.EMPTY_ROUND
        if arrivals == 0:
            return Decision.WAIT
        if self.coord.trigger == "deadline":
            passed = self.deadline_at is not None and now >= self.deadline_at
            return Decision.AGGREGATE if passed or arrivals >= self.active else Decision.WAIT
        return Decision.AGGREGATE if arrivals >= min(self.coord.k, self.active) else Decision.WAIT

    def stepped(self) -> None:
        """An aggregation happened: a deadline armed before it is void."""
        self.deadline_at = None

    def state_dict(self) -> dict[str, Any]:
        return {"deadline_at": self.deadline_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        at = state.get("deadline_at")
        self.deadline_at = None if at is None else float(at)


def step_stats(staleness: Sequence[float], used: Sequence[Any]) -> dict[str, float]:
    """The statistics of one aggregation a record carries: mean staleness, replies used."""
    return {"staleness_mean": sum(staleness) / len(staleness) if staleness else 0.0, "used": len(used)}


def after_step(strategy: MaskedBufferedStrategy, now: float, check_interval: int,
               validate: Callable[[], float]) -> tuple[float | None, list[int]]:
    """What follows server step ``strategy.version`` at time ``now``: GMR's validation
    check every ``check_interval`` steps (``validate()`` scores the new model on the
    server's validation split) and the time-driven restorations. Returns (the validation
    score or None, the clients restored)."""
    step = strategy.version
    val_score = None
    moved: list[int] = []
    if strategy.trigger.needs_validation and step % check_interval == 0:
        val_score = validate()
        moved += strategy.on_validation(val_score)
    moved += strategy.on_time(now)
    return val_score, moved


def eval_due(step: int, eval_every: int | None) -> bool:
    """Whether server step ``step`` is evaluated on the step cadence."""
    return bool(eval_every) and step % eval_every == 0  # type: ignore[operator]


def base_record(strategy: MaskedBufferedStrategy, *, time: float, step: int, accuracy: float | None,
                loss: float | None, bytes_up: float, bytes_down: float, uploads: int, downloads: int,
                client_uploads: Sequence[int], val_score: float | None, moved: Sequence[int],
                stats: dict[str, float]) -> dict[str, Any]:
    """The metrics record every runtime writes (docs/reference.md §9), in this key order;
    a runtime appends its own keys after these."""
    dens = strategy.densities()
    return {
        "time": time, "step": step, "accuracy": accuracy, "loss": loss,
        "avg_density": mean_density(dens), "bytes_up": bytes_up, "bytes_down": bytes_down,
        "uploads": uploads, "downloads": downloads, "client_uploads": list(client_uploads),
        "densities": dens, "val_accuracy": val_score, "restored": list(moved),
        "restorations": strategy.ladder.restorations,
        "staleness_mean": stats["staleness_mean"],
        "min_coverage": strategy.min_coverage(),
        "rejected": strategy.rejected,
    }

