"""Wire encoding of a width-structured sub-model: a header-only shape description.

A HeteroFL / FedRolex / FjORD sub-model is determined by its width rate and (FedRolex)
the window shift, given the architecture both sides share, so no mask bits travel:
the payload is a fixed header plus the float32 values in the full vector's order. An
IMS increment (level ``l`` minus level ``l-1`` of nested prefixes) is described by the
two rates. ``len(encode_structured(...)) == structured_nbytes(k)`` always.
"""

from __future__ import annotations

import struct
from typing import Callable

import numpy as np
import torch

from fedgmr.errors import InvalidUpdateError

MAGIC = b"FGMS"
# magic, version, N (full size), k (values), rate, lower rate (0 = none), shift
_HEADER = struct.Struct("<4sBIIffI")
HEADER_BYTES = _HEADER.size
#: what a slice's description (rates, shift) adds to a plain sparse payload's header: the
#: simulator's download size of a changed width mask (fedgmr.algorithm.policies)
STRUCTURED_CODE_BYTES = 12

MaskFn = Callable[[float, int], torch.Tensor]


def structured_nbytes(kept: int, value_bytes: int = 4) -> int:
    """Exact size of :func:`encode_structured` for ``kept`` values."""
    return HEADER_BYTES + value_bytes * kept


def encode_structured(values: torch.Tensor, numel: int, rate: float, shift: int = 0,
                      lower: float = 0.0) -> bytes:
    """Encode the values of the width-``rate`` slice (minus the width-``lower`` slice)."""
    if not 0.0 < rate <= 1.0 or not 0.0 <= lower < rate:
        raise ValueError(f"bad rates {rate}, {lower}")
    vals = values.detach().cpu().to(torch.float32).numpy().astype("<f4").tobytes()
    return _HEADER.pack(MAGIC, 1, int(numel), int(values.numel()), float(rate), float(lower), int(shift)) + vals


def decode_structured(data: bytes, mask_fn: MaskFn, expected_numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode to ``(mask, values)``; ``mask_fn(rate, shift)`` rebuilds a slice's mask."""
    if len(data) < HEADER_BYTES:
        raise InvalidUpdateError("payload shorter than its header")
    magic, version, n, k, rate, lower, shift = _HEADER.unpack_from(data)
    if magic != MAGIC or version != 1:
        raise InvalidUpdateError("payload has a bad header")
    if n != expected_numel:
        raise InvalidUpdateError(f"payload is for {n} coordinates, the model has {expected_numel}")
    if len(data) != structured_nbytes(k):
        raise InvalidUpdateError(f"payload length {len(data)} does not match its header")
    if not 0.0 < rate <= 1.0 or not 0.0 <= lower < rate:
        raise InvalidUpdateError(f"payload has bad width rates {rate}, {lower}")
    mask = mask_fn(rate, shift)
    if lower > 0:
        mask = mask & ~mask_fn(lower, shift)
    if int(mask.sum()) != k:
        raise InvalidUpdateError(f"the described slice holds {int(mask.sum())} values, payload has {k}")
    values = np.frombuffer(memoryview(data)[HEADER_BYTES:], dtype="<f4").astype(np.float32)
    return mask, torch.from_numpy(values.copy())
