"""Bytes on the wire, from what an assignment says travels (docs/reference.md §6.1).

One rule for every method: it reads an :class:`~fedgmr.strategy.messages.Assignment`'s
mask and :class:`~fedgmr.strategy.messages.Wire`, never which method made them.

* A message's *values at the mask* are the models and the vectors beside them, each at the
  mask's coordinates (down), or the reply's values and the vectors beside them, each at
  the reply's coordinates (up). They travel as one sparse payload, sized by the runtime's
  ``payload(values, mask)`` function (the simulator's scales it by
  ``network.model_size_mb`` and adds ``mask``'s code when given: a download whose mask
  changed).
* Vectors sent *whole* (:attr:`Wire.plain` down, :attr:`Wire.reply_plain` up) are float32
  values counted as they are, never scaled: 4 bytes each in the payload beside the values,
  or, in a message with no values at the mask, a payload of their own (header and values).
* A message that carries nothing takes no bytes (local-only training).

With IMS on a nested policy, a wave that sends every client the global model and nothing
whole shares level blocks: block ``i`` is the values at the ``i``-th increment of the
level masks (times the vectors each coordinate carries), with its increment's mask code
when some receiver's mask changed at or above that level; a client needs the blocks up
to its level. Otherwise every client gets a payload of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from fedgmr.algorithm.encoding import payload_nbytes
from fedgmr.algorithm.maskinfo import mask_count
from fedgmr.strategy.messages import Assignment

#: ``payload(values, mask)``: the bytes of a sparse payload of ``values`` float32 values,
#: carrying ``mask``'s code when it is given
PayloadBytes = Callable[[int, torch.Tensor | None], float]


@dataclass(frozen=True)
class DownloadWave:
    """A wave's download: the blocks each client needs (indices into ``block_bytes``)."""

    blocks: list[list[int]]
    block_bytes: list[float]

    @property
    def total(self) -> float:
        """Bytes that leave the server: each block needed by some client, once."""
        return sum(self.block_bytes[b] for b in sorted({b for bl in self.blocks for b in bl}))


def message_bytes(values: int, plain: int, payload: PayloadBytes, mask: torch.Tensor | None = None) -> float:
    """Bytes of a message of ``values`` float32 values at a mask (``mask``: its code
    travels too) and ``plain`` float32 values sent whole."""
    if values:
        return payload(values, mask) + 4.0 * plain
    return float(payload_nbytes(plain)) if plain else 0.0


def download_bytes(a: Assignment, payload: PayloadBytes) -> float:
    """Bytes of ``a``'s download sent to its client alone."""
    w = a.wire
    models = 1 if w.models is None else len(w.models)
    values = (models + len(w.beside)) * mask_count(a.mask)
    plain = sum(v.numel() for v in w.plain.values())
    return message_bytes(values, plain, payload, a.mask if a.mask_changed else None)


def upload_bytes(a: Assignment, payload: PayloadBytes) -> float:
    """Bytes of the reply to ``a``: values only at its coordinates (the server knows
    them), the vectors beside them, and the values sent whole."""
    w = a.wire
    return message_bytes((1 + len(w.reply_beside)) * mask_count(a.reply_mask), w.reply_plain, payload)


def download_wave(assignments: Sequence[Assignment], payload: PayloadBytes,
                  increments: Callable[[], Sequence[torch.Tensor]] | None = None) -> DownloadWave:
    """The blocks of a wave's download. ``increments``: where the wave may share level
    blocks (IMS on a nested policy), what gives the level increments (called only when
    the wave does share them), else None."""
    if increments is not None and all(a.wire.models is None and not a.wire.plain for a in assignments):
        vectors = 1 + max((len(a.wire.beside) for a in assignments), default=0)
        top_changed = max((a.level for a in assignments if a.mask_changed), default=-1)
        block_bytes = [payload(vectors * mask_count(b), b if i <= top_changed else None)
                       for i, b in enumerate(increments())]
        return DownloadWave([list(range(a.level + 1)) for a in assignments], block_bytes)
    return DownloadWave([[i] for i in range(len(assignments))], [download_bytes(a, payload) for a in assignments])


__all__ = ["DownloadWave", "PayloadBytes", "download_bytes", "download_wave", "message_bytes", "upload_bytes"]
