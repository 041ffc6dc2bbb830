"""SCAFFOLD's server (option II), on FedGMR's strategy: the server control variate ``c``
travels with every assignment (on the client's mask), replies carry ``delta_c`` beside
their values, and every aggregation also moves ``c``:

    x <- x + eta_g (rule(x, replies) - x)          (the rule: MA over the replies)
    c <- c + sum_i delta_c_i * m_i / N_j           (N_j: clients whose mask holds j)

Each ``delta_c`` is applied once, in the aggregation after it arrived. The math is
:func:`fedgmr.algorithm.local_rules.scaffold_server_control`; docs/methods/scaffold.md.
Synchronous only (a stale ``delta_c`` has no theory): the config refuses other modes.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from fedgmr.algorithm.aggregation import coverage_counts
from fedgmr.algorithm.local_rules import scaffold_server_control
from fedgmr.strategy.masked_buffered import MaskedBufferedStrategy
from fedgmr.strategy.messages import Assignment, Reply, StepReport
from fedgmr.training.client_methods import ScaffoldClient

log = logging.getLogger(__name__)


class ScaffoldStrategy(MaskedBufferedStrategy):
    """:class:`MaskedBufferedStrategy` plus SCAFFOLD's server control variate.

    server_lr: the global step size ``eta_g`` (1: the rule's result as it is).
    """

    reply_extras = ScaffoldClient.reply_extras  # delta_c, checked by the base class

    def __init__(self, *args: Any, server_lr: float = 1.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {server_lr}")
        self.server_lr = float(server_lr)
        #: the server control variate (zero at the start)
        self.c = torch.zeros_like(self.params)
        # delta_c of the replies accepted since the last aggregation: (mask, values), applied once
        self._pending_dc: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _assignment(self, client_id: int, version: int, level: int, density: float, mask: torch.Tensor,
                    changed: bool) -> Assignment:
        a = super()._assignment(client_id, version, level, density, mask, changed)
        return dataclasses.replace(a, wire=dataclasses.replace(a.wire, beside={"c": self.c}, reply_beside=("delta_c",)))

    def receive(self, reply: Reply) -> bool:
        accepted = super().receive(reply)
        if accepted:
            entry = self._incoming[reply.client_id]
            self._pending_dc[reply.client_id] = (entry.mask, entry.extras["delta_c"])
        return accepted

    def _server_step(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        if self.server_lr == 1.0:
            return new
        return old + self.server_lr * (new - old)

    def population_coverage(self) -> torch.Tensor:
        """Per coordinate, how many clients hold it: the mask each client last received
        (its level's mask before its first job)."""
        masks = [self._held.get(c, self.policy.mask(self.ladder.levels[c])) for c in range(self.num_clients)]
        return coverage_counts(masks)

    def aggregate(self) -> StepReport:
        report = super().aggregate()
        used = set(report.used)
        updates = [self._pending_dc[c] for c in sorted(self._pending_dc) if c in used]
        if updates:
            self.c = scaffold_server_control(self.c, updates, self.population_coverage())
        # a delta_c the rule did not use (dropped as too stale) is discarded with its update
        self._pending_dc.clear()
        return report

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        state, tensors = super().state_dict()
        tensors["scaffold/c"] = self.c
        pending = []
        for cid, (mask, dc) in sorted(self._pending_dc.items()):
            tensors[f"scaffold/dc/{cid}/mask"] = mask
            tensors[f"scaffold/dc/{cid}/values"] = dc
            pending.append(cid)
        state["scaffold"] = {"pending": pending}
        return state, tensors

    def load_state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state, tensors)
        self.c = tensors["scaffold/c"].to(self.device).clone()
        self._pending_dc = {}
        for cid in state.get("scaffold", {}).get("pending", []):
            entry = self._incoming.get(int(cid))
            mask = entry.mask if entry is not None else tensors[f"scaffold/dc/{cid}/mask"].to(self.device)
            self._pending_dc[int(cid)] = (mask, tensors[f"scaffold/dc/{cid}/values"].to(self.device).clone())


__all__ = ["ScaffoldStrategy"]
