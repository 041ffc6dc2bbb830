"""Gradual Model Restoration as a part of the server: when the clients' sub-models grow.

The strategy holds one :class:`Restoration` and forwards the runtime's signals to it - the
global model's validation score, the clock, a client's own validation score - and the
part moves clients up the :class:`~fedgmr.algorithm.restoration.DensityLadder` when its
trigger (or a client's monitor) says so. The rules themselves are
:mod:`fedgmr.algorithm.restoration`; this part only wires them to the strategy's step.
"""

from __future__ import annotations

import logging
from typing import Any

from fedgmr.algorithm.restoration import DensityLadder, EarlyStopping, NoTrigger, RestorationTrigger

log = logging.getLogger(__name__)


class Restoration:
    """The ladder, the global trigger and the optional per-client monitors.

    client_patience: enables a monitor per client (``EarlyStopping`` with this patience,
        ``client_min_delta``); None: none.
    """

    def __init__(self, ladder: DensityLadder, trigger: RestorationTrigger | None = None,
                 client_patience: int | None = None, client_min_delta: float = 0.0) -> None:
        self.ladder = ladder
        self.trigger = trigger or NoTrigger()
        self.client_monitors = (
            [EarlyStopping(client_patience, client_min_delta, client_patience) for _ in ladder.levels]
            if client_patience else None
        )

    def on_validation(self, version: int, score: float) -> list[int]:
        """The global model ``version`` scored ``score``: the clients restored."""
        if self.trigger.on_validation(version, score):
            moved = self.ladder.restore()
            if moved:
                log.info("GMR restoration at step %d: clients %s -> densities %s",
                         version, moved, [self.ladder.density(c) for c in moved])
            return moved
        return []

    def on_time(self, now: float) -> list[int]:
        """Fixed-time restorations that are due at time ``now``."""
        moved: list[int] = []
        for _ in range(self.trigger.on_time(now)):
            moved += self.ladder.restore()
        return sorted(set(moved))

    def on_client_validation(self, client_id: int, score: float) -> bool:
        """Per-client monitor: step one client up when its local score plateaus."""
        if self.client_monitors is None:
            return False
        if self.client_monitors[client_id].update(score):
            return self.ladder.step_up(client_id)
        return False

    def state_dict(self) -> dict[str, Any]:
        """The ladder's, the trigger's and the monitors' state (the strategy's checkpoint keys)."""
        return {"ladder": self.ladder.state_dict(), "trigger": self.trigger.state_dict(),
                "client_monitors": [m.state_dict() for m in self.client_monitors] if self.client_monitors else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from the keys :meth:`state_dict` wrote."""
        self.ladder.load_state_dict(state["ladder"])
        self.trigger.load_state_dict(state["trigger"])
        if self.client_monitors is not None and state["client_monitors"]:
            for m, s in zip(self.client_monitors, state["client_monitors"]):
                m.load_state_dict(s)


__all__ = ["Restoration"]
