"""SCAFFOLD's server (option II), a plug-in of FedGMR's strategy: the server control variate ``c``
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
from typing import Any

import torch

from fedgmr.algorithm.aggregation import coverage_counts
from fedgmr.algorithm.local_rules import scaffold_server_control
from fedgmr.strategy.update import Update
from fedgmr.strategy.messages import Assignment, StepReport
from fedgmr.strategy.plugins import ServerPlugin
from fedgmr.training.client_methods import ScaffoldClient


class ScaffoldControl(ServerPlugin):
    """SCAFFOLD's server control variate ``c`` and global step size.

    server_lr: the global step size ``eta_g`` (1: the rule's result as it is).
    """

    name = "SCAFFOLD's control variate"
    reply_extras = ScaffoldClient.reply_extras  # delta_c, checked by the strategy

    def __init__(self, server_lr: float = 1.0) -> None:
        if not server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {server_lr}")
        self.server_lr = float(server_lr)
        # delta_c of the replies accepted since the last aggregation: (mask, values), applied once
        self._pending_dc: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def bind(self, strategy: Any) -> None:
        super().bind(strategy)
        #: the server control variate (zero at the start)
        self.c = torch.zeros_like(strategy.params)

    def wire(self, a: Assignment) -> Assignment:
        return dataclasses.replace(a, wire=dataclasses.replace(a.wire, beside={"c": self.c}, reply_beside=("delta_c",)))

    def on_accept(self, update: Update) -> None:
        self._pending_dc[update.client_id] = (update.mask, update.extras["delta_c"])

    def server_step(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        if self.server_lr == 1.0:
            return new
        return old + self.server_lr * (new - old)

    def population_coverage(self) -> torch.Tensor:
        """Per coordinate, how many clients hold it: the mask each client last received
        (its level's mask before its first job)."""
        return coverage_counts(self.strategy.held_masks())

    def after_aggregate(self, report: StepReport) -> StepReport:
        used = set(report.used)
        updates = [self._pending_dc[c] for c in sorted(self._pending_dc) if c in used]
        if updates:
            self.c = scaffold_server_control(self.c, updates, self.population_coverage())
        # a delta_c the rule did not use (dropped as too stale) is discarded with its update
        self._pending_dc.clear()
        return report

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        tensors["scaffold/c"] = self.c
        pending = []
        for cid, (mask, dc) in sorted(self._pending_dc.items()):
            tensors[f"scaffold/dc/{cid}/mask"] = mask
            tensors[f"scaffold/dc/{cid}/values"] = dc
            pending.append(cid)
        state["scaffold"] = {"pending": pending}

    def load_state_dict(self, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        self.c = tensors["scaffold/c"].clone()
        self._pending_dc = {}
        incoming = self.strategy.incoming
        for cid in state.get("scaffold", {}).get("pending", []):
            entry = incoming.get(int(cid))
            mask = entry.mask if entry is not None else tensors[f"scaffold/dc/{cid}/mask"]
            self._pending_dc[int(cid)] = (mask, tensors[f"scaffold/dc/{cid}/values"].clone())


__all__ = ["ScaffoldControl"]
