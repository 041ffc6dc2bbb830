"""Quarantine of repeat offenders: a node whose replies keep being rejected gets no work
for a while.

A rejection costs the server a decode and a dispatch, and a node that sends garbage on
every reply would be given a fresh model after every step for the whole run. With a
:class:`QuarantinePolicy` of ``after`` = N, ``window`` = W and ``seconds`` = T, the N-th
invalid reply of a node within W seconds quarantines it: it gets no instruction for T
seconds, then it is let back with a clean record (a further N strikes quarantine it
again).

:class:`Quarantine` is pure bookkeeping: the caller passes the time (``now``) to every
call, so it is tested without a clock and used by :class:`~fedgmr.flower.loop.BufferedServerLoop`
on the wall clock. Node ids are whatever the caller uses (the loop passes Flower node ids).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping

from fedgmr.errors import ConfigError

#: run-config keys and their defaults (a deployment quarantines by default)
DEFAULTS = {"quarantine-after": 3, "quarantine-window": 600.0, "quarantine-seconds": 600.0}


@dataclass(frozen=True)
class QuarantinePolicy:
    """``after`` invalid replies within ``window`` seconds quarantine a node for
    ``seconds`` seconds; ``after`` = 0 turns quarantine off."""

    after: int = 3
    window: float = 600.0
    seconds: float = 600.0

    def __post_init__(self) -> None:
        if isinstance(self.after, bool) or not isinstance(self.after, int) or self.after < 0:
            raise ConfigError(f"quarantine-after must be an integer >= 0 (0: off), got {self.after!r}")
        for key, value in (("quarantine-window", self.window), ("quarantine-seconds", self.seconds)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                raise ConfigError(f"{key} must be a finite number of seconds > 0, got {value!r}")

    @property
    def enabled(self) -> bool:
        return self.after > 0

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> "QuarantinePolicy":
        """The policy a Flower run config sets (``quarantine-after``, ``quarantine-window``,
        ``quarantine-seconds``; :data:`DEFAULTS` for those it leaves out). Values are
        validated: :class:`~fedgmr.errors.ConfigError` names the key."""
        from fedgmr.flower.run_config import parse_run_config  # the run config's one schema

        rc = parse_run_config({k: run_config[k] for k in DEFAULTS if k in run_config})
        return cls(rc.quarantine_after, rc.quarantine_window, rc.quarantine_seconds)


@dataclass
class Quarantine:
    """Strikes and quarantines per node under ``policy``; every method takes ``now``."""

    policy: QuarantinePolicy
    #: times of each node's recent invalid replies (those within the window)
    strikes: dict[int, deque[float]] = field(default_factory=dict)
    #: node -> the time its quarantine ends
    until: dict[int, float] = field(default_factory=dict)
    #: quarantines imposed so far, and on which nodes (in order, repeats included)
    events: list[int] = field(default_factory=list)

    def strike(self, node: int, now: float) -> bool:
        """Record an invalid reply of ``node``; True when this one quarantines it."""
        if not self.policy.enabled:
            return False
        times = self.strikes.setdefault(node, deque())
        times.append(now)
        while times and now - times[0] > self.policy.window:
            times.popleft()
        if len(times) < self.policy.after or self.blocked(node, now):
            return False
        times.clear()
        self.until[node] = now + self.policy.seconds
        self.events.append(node)
        return True

    def blocked(self, node: int, now: float) -> bool:
        """Whether ``node`` is quarantined at ``now``."""
        end = self.until.get(node)
        return end is not None and now < end

    def release(self, now: float) -> list[int]:
        """The nodes whose quarantine has ended by ``now`` (each reported once), sorted."""
        done = sorted(n for n, end in self.until.items() if now >= end)
        for n in done:
            del self.until[n]
        return done

    @property
    def count(self) -> int:
        """Quarantines imposed so far."""
        return len(self.events)
