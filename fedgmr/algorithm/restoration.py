"""Gradual Model Restoration (docs/reference.md §5): when to restore, and what restoring does.

* :class:`EarlyStopping` - a plateau detector (patience, min_delta, cool-down).
* Triggers decide *when*: :class:`EarlyStoppingTrigger` (validation plateau),
  :class:`FixedTimeTrigger` (fractions of a horizon), :class:`DeadlineTrigger` (a
  plateau, or a rung's deadline, whichever comes first; not the paper's) and
  :class:`NoTrigger`.
* :class:`DensityLadder` decides *what*: clients climb a ladder of densities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass
class EarlyStopping:
    """Detects a plateau of a score that should increase.

    ``update(score)`` returns True when the best score has not improved by more than
    ``min_delta`` for ``patience`` consecutive checks. After firing, the next
    ``cooldown`` checks are ignored and the counter restarts.
    """

    patience: int
    min_delta: float = 0.0
    cooldown: int = 0
    best: float = -math.inf
    bad_checks: int = 0
    cooldown_left: int = 0

    def __post_init__(self) -> None:
        if self.patience < 1:
            raise ValueError(f"patience must be >= 1, got {self.patience}")

    def update(self, score: float) -> bool:
        improved = score > self.best + self.min_delta
        if improved:
            self.best = score
        if self.cooldown_left > 0:
            # a restoration just happened: give the new sub-models time, count nothing
            self.cooldown_left -= 1
            self.bad_checks = 0
            return False
        self.bad_checks = 0 if improved else self.bad_checks + 1
        if self.bad_checks >= self.patience:
            self.restart()
            return True
        return False

    def restart(self) -> None:
        """After a restoration (this detector's or another trigger's): the counter starts
        again and the cool-down begins."""
        self.bad_checks = 0
        self.cooldown_left = self.cooldown

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best if math.isfinite(self.best) else None, "bad_checks": self.bad_checks,
                "cooldown_left": self.cooldown_left}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = -math.inf if state["best"] is None else float(state["best"])
        self.bad_checks = int(state["bad_checks"])
        self.cooldown_left = int(state["cooldown_left"])


class RestorationTrigger:
    """Decides when restoration fires. Subclasses override the hooks they use."""

    name = "none"
    #: whether the runtime must evaluate the global model on the validation split
    needs_validation = False

    def on_validation(self, step: int, score: float) -> bool:
        """Called every check interval with the global model's validation score."""
        return False

    def on_time(self, now: float) -> int:
        """Called after each server step with the virtual time; returns how many
        restorations are due."""
        return 0

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class NoTrigger(RestorationTrigger):
    """Never restores: the "w/o GMR" ablation."""


class EarlyStoppingTrigger(RestorationTrigger):
    """Restores when the validation score plateaus (the paper's default)."""

    name = "early_stopping"
    needs_validation = True

    def __init__(self, patience: int, min_delta: float = 0.0, cooldown: int | None = None) -> None:
        self.monitor = EarlyStopping(patience, min_delta, patience if cooldown is None else cooldown)

    def on_validation(self, step: int, score: float) -> bool:
        return self.monitor.update(score)

    def state_dict(self) -> dict[str, Any]:
        return self.monitor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.monitor.load_state_dict(state)


class FixedTimeTrigger(RestorationTrigger):
    """Restores one ladder step at fixed fractions of a virtual-time horizon."""

    name = "fixed_time"

    def __init__(self, horizon: float, fractions: Sequence[float] = (0.2, 0.4, 0.6, 0.8, 1.0)) -> None:
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.times = sorted(f * horizon for f in fractions)
        self.fired = 0

    def on_time(self, now: float) -> int:
        eps = 1e-9 * max(1.0, self.times[-1] if self.times else 1.0)  # 0.2 * 3 = 0.6000000000000001
        due = sum(1 for t in self.times if t <= now + eps)
        new = due - self.fired
        self.fired = due
        return max(new, 0)

    def state_dict(self) -> dict[str, Any]:
        return {"fired": self.fired}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.fired = int(state["fired"])


class DeadlineTrigger(EarlyStoppingTrigger):
    """Early stopping with a deadline per restoration (a rule of this library, not the
    paper's): restoration ``k`` fires on a validation plateau, or at
    ``fractions[k-1] x horizon`` if no plateau came first.

    The deadlines count every restoration, however it fired: a plateau before the first
    deadline takes that deadline's place, so the ladder is never climbed faster than the
    plateaus or the deadlines ask. A restoration by deadline restarts the plateau
    detector (its counter and cool-down), as one by plateau does.
    """

    name = "deadline"

    def __init__(self, patience: int, horizon: float, fractions: Sequence[float] = (0.2, 0.4, 0.6, 0.8, 1.0),
                 min_delta: float = 0.0, cooldown: int | None = None) -> None:
        super().__init__(patience, min_delta, cooldown)
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.deadlines = FixedTimeTrigger(horizon, fractions)
        self.fired = 0

    def on_validation(self, step: int, score: float) -> bool:
        if super().on_validation(step, score):
            self.fired += 1
            return True
        return False

    def on_time(self, now: float) -> int:
        self.deadlines.on_time(now)
        new = max(self.deadlines.fired - self.fired, 0)
        if new:
            self.fired += new
            self.monitor.restart()
        return new

    def state_dict(self) -> dict[str, Any]:
        return {**self.monitor.state_dict(), "deadlines_due": self.deadlines.fired, "fired": self.fired}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.monitor.load_state_dict(state)
        self.deadlines.fired = int(state["deadlines_due"])
        self.fired = int(state["fired"])


@dataclass
class DensityLadder:
    """Client densities on a ladder ``r1 < ... < rM``.

    ``levels[i]`` is client ``i``'s ladder index. A global restoration raises the floor
    by one rung and moves every client below the new floor up one level (so a client at
    0.2 waits while 0.05 clients catch up, as in the paper's Table 12). ``step_up``
    moves one client on its own (per-client monitors).
    """

    ladder: tuple[float, ...]
    levels: list[int]
    floor: int = field(default=-1)
    restorations: int = 0

    def __post_init__(self) -> None:
        if list(self.ladder) != sorted(set(self.ladder)) or not self.ladder:
            raise ValueError(f"ladder must be strictly increasing, got {list(self.ladder)}")
        if self.floor < 0:
            self.floor = min(self.levels) if self.levels else 0

    @classmethod
    def from_densities(cls, ladder: Sequence[float], densities: Sequence[float]) -> "DensityLadder":
        """Place each client on the ladder rung closest to its initial density."""
        levels = [min(range(len(ladder)), key=lambda j: abs(ladder[j] - d)) for d in densities]
        return cls(tuple(ladder), levels)

    @property
    def top(self) -> int:
        return len(self.ladder) - 1

    def density(self, client: int) -> float:
        return self.ladder[self.levels[client]]

    def densities(self) -> list[float]:
        return [self.ladder[l] for l in self.levels]

    def restore(self) -> list[int]:
        """One global restoration step; returns the clients that moved up."""
        if self.floor >= self.top and all(l >= self.top for l in self.levels):
            return []
        self.floor = min(self.floor + 1, self.top)
        moved = [i for i, l in enumerate(self.levels) if l < self.floor]
        for i in moved:
            self.levels[i] += 1
        self.restorations += 1
        return moved

    def step_up(self, client: int) -> bool:
        """Move one client up a level; False when it is already at the top."""
        if self.levels[client] >= self.top:
            return False
        self.levels[client] += 1
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"levels": list(self.levels), "floor": self.floor, "restorations": self.restorations}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.levels = [int(v) for v in state["levels"]]
        self.floor = int(state["floor"])
        self.restorations = int(state["restorations"])
