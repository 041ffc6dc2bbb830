"""Bounds on one client's influence, a part applied to every accepted reply on its way
into the strategy's buffer (docs/distributed.md, "Bounds on one client's influence").

The strategy hands each reply that passed validation to :meth:`InfluenceBounds.bound`,
which

* clips the update - the change from the model the client was dispatched, on its mask
  (for a delta rule, the delta itself), together with the change of its floating-point
  buffers - to the norm bound (``max_update_norm``, and/or ``norm_multiple`` x the
  median of the last :data:`NORM_WINDOW` accepted norms), scaling it down in its
  direction;
* replaces the claimed sample count by the one the server knows (``client_samples``), or
  caps it (``max_samples``), and caps ``num_processed`` (``max_processed``).

Every bound is off by default, and the part then changes nothing. It keeps what it needs
between dispatch and reply (the model each job was sent) and its counters; the strategy
stores them in its checkpoints.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

import torch

log = logging.getLogger(__name__)

#: adaptive norm bound: accepted update norms remembered, and how many are needed before
#: the median is trusted (until then an update may be at most as large as the model sent)
NORM_WINDOW = 50
NORM_MIN_HISTORY = 5

#: a model as the server sent it: flat parameters and buffers
Sent = tuple[torch.Tensor, dict[str, torch.Tensor]]


@dataclass
class BoundStats:
    """How often the bounds on a client's influence acted (all counts since the start)."""

    clipped: int = 0  # updates scaled down to the norm bound
    capped: int = 0  # sample counts above what the server knows or allows


@dataclass
class Bounded:
    """What :meth:`InfluenceBounds.bound` lets into the buffer: the update's values, the
    buffers (clipped with them) and the two counts that weigh it."""

    values: torch.Tensor
    buffers: dict[str, torch.Tensor]
    num_samples: int
    num_processed: int


class InfluenceBounds:
    """The bounds on one client's influence (see the module; all off by default).

    num_clients: how many clients the strategy serves (``client_samples`` lists one
        size each).
    """

    def __init__(self, num_clients: int, client_samples: Sequence[int] | None = None,
                 max_samples: int | None = None, max_processed: int | None = None,
                 max_update_norm: float | None = None, norm_multiple: float | None = None) -> None:
        if client_samples is not None and len(client_samples) != num_clients:
            raise ValueError(f"client_samples lists {len(client_samples)} sizes for {num_clients} clients")
        for name, v in (("max_samples", max_samples), ("max_processed", max_processed)):
            if v is not None and v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        for name, f in (("max_update_norm", max_update_norm), ("norm_multiple", norm_multiple)):
            if f is not None and not (math.isfinite(f) and f > 0):
                raise ValueError(f"{name} must be a positive finite number, got {f}")
        self.client_samples = None if client_samples is None else [int(n) for n in client_samples]
        self.max_samples = max_samples
        self.max_processed = max_processed
        self.max_update_norm = max_update_norm
        self.norm_multiple = norm_multiple
        self.stats = BoundStats()
        self.norms: deque[float] = deque(maxlen=NORM_WINDOW)  # accepted update norms (adaptive bound)
        # the model and buffers each outstanding job was dispatched with (references: the
        # strategy replaces its model at an aggregation, never mutates it)
        self.sent: dict[int, Sent] = {}

    # ------------------------------------------------------------------ state
    @property
    def norm_on(self) -> bool:
        """Whether updates are norm-bounded (fixed or adaptive)."""
        return self.max_update_norm is not None or self.norm_multiple is not None

    @property
    def median_update_norm(self) -> float | None:
        """Median norm of the recent accepted updates (None until one was measured)."""
        return statistics.median(self.norms) if self.norms else None

    def dispatched(self, client_id: int, model: Sent) -> None:
        """Client ``client_id`` was sent ``model`` (its update is measured from it)."""
        self.sent[client_id] = model

    def settled(self, client_id: int) -> None:
        """The client's reply was accepted: its job is no longer outstanding."""
        self.sent.pop(client_id, None)

    # ------------------------------------------------------------------ the bounds
    def bound(self, client_id: int, consumes: str, mask: torch.Tensor, values: torch.Tensor,
              buffers: dict[str, torch.Tensor], buffers_sent: set[str], num_samples: int,
              num_processed: int, current: Sent) -> Bounded:
        """A validated reply, bounded. ``buffers`` are the reply's (every buffer; those it
        did not send are the global ones), scaled in place when clipped; ``current``: the
        strategy's model, what a job with no record was sent."""
        if self.norm_on:
            values = self._clip(client_id, consumes, mask, values, buffers, buffers_sent, current)
        return Bounded(values, buffers, self._samples(client_id, num_samples),
                       self._cap(int(num_processed), self.max_processed))

    def _cap(self, n: int, limit: int | None) -> int:
        if limit is not None and n > limit:
            self.stats.capped += 1
            return limit
        return n

    def _samples(self, client_id: int, claimed: int) -> int:
        """The ``samples`` weight: the server's own count when it has one, else the claim
        capped at ``max_samples``."""
        if self.client_samples is not None:
            known = self.client_samples[client_id]
            if int(claimed) != known:
                self.stats.capped += 1
                log.debug("client %d claims %s samples; the server counts %d", client_id, claimed, known)
            return known
        return self._cap(int(claimed), self.max_samples)

    def _clip(self, client_id: int, consumes: str, mask: torch.Tensor, values: torch.Tensor,
              buffers: dict[str, torch.Tensor], buffers_sent: set[str], current: Sent) -> torch.Tensor:
        """Clip the update to the norm bound (values returned; ``buffers`` scaled in place),
        computed in float64."""
        start_params, start_bufs = self.sent.get(client_id, current)
        start = start_params[mask].double() if consumes == "model" else None
        dv = values.double() - start if start is not None else values.double()
        dbufs = {n: buffers[n].double() - start_bufs[n].double() for n in sorted(buffers_sent)
                 if buffers[n].is_floating_point() and n in start_bufs}
        norm = math.sqrt(float(dv.square().sum()) + sum(float(d.square().sum()) for d in dbufs.values()))
        bound = self.norm_bound(start_params[mask], {n: start_bufs[n] for n in dbufs})
        if norm > bound:
            scale = bound / norm
            self.stats.clipped += 1
            log.info("clipped update from client %d: norm %.4g above the bound %.4g", client_id, norm, bound)
            dv = dv * scale
            for n, d in dbufs.items():
                buffers[n] = (start_bufs[n].double() + d * scale).to(buffers[n].dtype)
            values = ((start + dv) if start is not None else dv).to(torch.float32)
            norm = bound
        self.norms.append(norm)
        return values

    def norm_bound(self, start: torch.Tensor, start_bufs: dict[str, torch.Tensor]) -> float:
        """The norm bound for an update dispatched with ``start`` (its masked weights)."""
        bounds = []
        if self.max_update_norm is not None:
            bounds.append(self.max_update_norm)
        if self.norm_multiple is not None:
            if len(self.norms) >= NORM_MIN_HISTORY:
                bounds.append(self.norm_multiple * statistics.median(self.norms))
            else:  # no history yet: no larger than the model the client was sent
                bounds.append(math.sqrt(float(start.double().square().sum())
                                        + sum(float(b.double().square().sum()) for b in start_bufs.values())))
        return min(bounds)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self, outstanding: list[dict[str, Any]], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The counters (returned) and, while norm-bounded, the models the ``outstanding``
        jobs were sent, once per model (into ``tensors``; each job's record gets ``sent``)."""
        if self.norm_on:
            sent_ids: dict[int, int] = {}
            for o in outstanding:
                sent = self.sent.get(o["client"])
                if sent is None:
                    continue
                if id(sent[0]) not in sent_ids:
                    key = f"sent/{len(sent_ids)}"
                    sent_ids[id(sent[0])] = len(sent_ids)
                    tensors[f"{key}/params"] = sent[0]
                    tensors.update({f"{key}/buf/{k}": v for k, v in sent[1].items()})
                o["sent"] = sent_ids[id(sent[0])]
        return {"clipped": self.stats.clipped, "capped": self.stats.capped, "norms": list(self.norms)}

    def load_state_dict(self, state: dict[str, Any] | None, outstanding: list[dict[str, Any]],
                        tensors: dict[str, torch.Tensor], current: Sent) -> None:
        """Restore from :meth:`state_dict`'s output; a job saved without its model (bounds
        off when saved) is measured against ``current``."""
        self.sent = {}
        for o in outstanding:
            key = f"sent/{o['sent']}" if "sent" in o else None
            if key is not None and f"{key}/params" in tensors:
                bufs = {k: tensors[f"{key}/buf/{k}"].clone() for k in current[1] if f"{key}/buf/{k}" in tensors}
                self.sent[int(o["client"])] = (tensors[f"{key}/params"].clone(), bufs)
            else:
                self.sent[int(o["client"])] = current
        state = state or {}
        self.stats = BoundStats(int(state.get("clipped", 0)), int(state.get("capped", 0)))
        self.norms = deque((float(v) for v in state.get("norms", [])), maxlen=NORM_WINDOW)


__all__ = ["NORM_WINDOW", "NORM_MIN_HISTORY", "BoundStats", "Bounded", "InfluenceBounds"]
