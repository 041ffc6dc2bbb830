"""Bandwidth model of the virtual clock (docs/reference.md §6.1, 6.2, 6.3, 6.5).

Each client has a downlink and an uplink that scale with its initial tier ``d``
(20 d and 5 d MB/s by default). The server's uplink and downlink are shared FIFO links:
a transfer finishes when both the client's link and the server's link have carried it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from fedgmr.errors import ConfigError

MB = 1_000_000.0

#: initial densities (bandwidth tiers) for 10 clients; scaled for other client counts
HETEROGENEITY: dict[str, tuple[float, ...]] = {
    "high": (1.0, 0.5, 0.2, 0.1) + (0.05,) * 6,
    "medium": (1.0, 0.5, 0.2, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05),
    "low": (1.0, 1.0, 0.5, 0.5, 0.2, 0.2, 0.1, 0.1, 0.05, 0.05),
    "none": (1.0,) * 10,
}


def tier_densities(level: str | Sequence[float], num_clients: int) -> list[float]:
    """Initial density of each client: a named level's 10-client pattern stretched
    over ``num_clients`` (client i takes entry ``floor(10 i / N)``), or an explicit list."""
    if isinstance(level, str):
        try:
            pattern = HETEROGENEITY[level]
        except KeyError:
            raise ConfigError(f"clients.heterogeneity must be one of {sorted(HETEROGENEITY)} or a list, "
                              f"got {level!r}") from None
        return [pattern[(i * len(pattern)) // num_clients] for i in range(num_clients)]
    tiers = [float(d) for d in level]
    if len(tiers) != num_clients:
        raise ConfigError(f"clients.heterogeneity lists {len(tiers)} densities for {num_clients} clients")
    return tiers


@dataclass
class FifoLink:
    """A link that carries one transfer at a time at ``rate`` bytes/s."""

    rate: float
    free_at: float = 0.0

    def reserve(self, start: float, nbytes: float) -> float:
        """Carry ``nbytes`` starting no earlier than ``start``; returns the finish time."""
        begin = max(start, self.free_at)
        self.free_at = begin + nbytes / self.rate
        return self.free_at


class Network:
    """Client links plus the shared server links, with optional log-normal jitter.

    Parameters
    ----------
    tiers: each client's initial density ``d`` (its bandwidth tier).
    down_per_tier, up_per_tier: client bandwidth per unit of tier, MB/s.
    server_up, server_down: server link rates, MB/s.
    jitter_sigma: sigma of a log-normal factor on each transfer's client bandwidth.
    rng: the network-jitter random stream.
    message_bytes: bytes every message carries beside its payload (a transport's framing),
        on the client's link and the server's; a multicast block is shared, each
        recipient's message framing is not.
    message_latency: seconds every message takes beside its transfer (added to each
        download's and each upload's finish).
    """

    def __init__(self, tiers: Sequence[float], down_per_tier: float = 20.0, up_per_tier: float = 5.0,
                 server_up: float = 10.0, server_down: float = 50.0, jitter_sigma: float = 0.0,
                 rng: np.random.Generator | None = None, message_bytes: float = 0.0,
                 message_latency: float = 0.0) -> None:
        if message_bytes < 0 or message_latency < 0:
            raise ValueError("message_bytes and message_latency must be >= 0")
        self.down = [down_per_tier * d * MB for d in tiers]
        self.up = [up_per_tier * d * MB for d in tiers]
        self.server_up = FifoLink(server_up * MB)
        self.server_down = FifoLink(server_down * MB)
        self.jitter_sigma = jitter_sigma
        self.rng = rng or np.random.default_rng(0)
        self.message_bytes = float(message_bytes)
        self.message_latency = float(message_latency)

    def _jitter(self) -> float:
        return float(self.rng.lognormal(0.0, self.jitter_sigma)) if self.jitter_sigma > 0 else 1.0

    def download_wave(self, now: float, clients: Sequence[int], blocks: Sequence[Sequence[int]],
                      block_bytes: Sequence[float]) -> dict[int, float]:
        """Send each client the blocks it needs; returns each client's finish time.

        Every distinct block crosses the server uplink once, in block order (so with
        IMS the base block and each increment are multicast); a client is done when its
        last block has left the server and its own downlink has carried all its bytes.
        """
        sent: dict[int, float] = {}
        for b in sorted({b for bl in blocks for b in bl}):
            sent[b] = self.server_up.reserve(now, block_bytes[b])
        framed = {c: self.server_up.reserve(now, self.message_bytes) for c in clients} if self.message_bytes else {}
        finish = {}
        for c, bl in zip(clients, blocks):
            total = sum(block_bytes[b] for b in bl)
            if self.message_bytes:
                total += self.message_bytes
            own = now + total / (self.down[c] * self._jitter())
            finish[c] = max(own, max((sent[b] for b in bl), default=now), framed.get(c, now))
            if self.message_latency:
                finish[c] += self.message_latency
        return finish

    def upload_time(self, client: int, nbytes: float) -> float:
        """Seconds the client's own uplink needs for ``nbytes`` (jittered), with the message's
        framing bytes."""
        return (nbytes + self.message_bytes) / (self.up[client] * self._jitter())

    def upload(self, start: float, client_seconds: float, nbytes: float) -> float:
        """Finish time of an upload that starts at ``start`` and needs ``client_seconds``
        on the client's uplink; the server downlink is shared FIFO (the message's framing
        bytes and latency included)."""
        done = max(start + client_seconds, self.server_down.reserve(start, nbytes + self.message_bytes))
        return done + self.message_latency if self.message_latency else done

    def state_dict(self) -> dict:
        return {"up_free": self.server_up.free_at, "down_free": self.server_down.free_at,
                "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.server_up.free_at = float(state["up_free"])
        self.server_down.free_at = float(state["down_free"])
        self.rng.bit_generator.state = state["rng"]
