"""Wire encoding of a sparse sub-model: retained values plus the mask.

The mask is stored either as a packed bitmask (``ceil(N/8)`` bytes) or as a list of
uint32 indices (``4 k`` bytes), whichever is smaller. Byte counts used by the
simulator's clock come from :func:`encoded_nbytes`, which equals ``len(encode_sparse(...))``.
No pickle anywhere.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import torch

from fedgmr.errors import InvalidUpdateError

MAGIC = b"FGMR"
_HEADER = struct.Struct("<4sBBII")  # magic, format version, mask kind, N, k
HEADER_BYTES = _HEADER.size
#: largest model a payload may describe when the caller does not say what to expect
MAX_NUMEL = 1 << 30
_BITMASK, _INDICES, _DENSE = 0, 1, 2


def mask_nbytes(numel: int, kept: int) -> int:
    """Bytes of the smaller mask encoding (none when every coordinate is kept)."""
    if kept == numel:
        return 0
    return min(math.ceil(numel / 8), 4 * kept)


def encoded_nbytes(numel: int, kept: int, value_bytes: int = 4) -> int:
    """Exact size of :func:`encode_sparse` for ``kept`` of ``numel`` coordinates."""
    return HEADER_BYTES + mask_nbytes(numel, kept) + value_bytes * kept


def encode_sparse(mask: torch.Tensor, values: torch.Tensor) -> bytes:
    """Encode float32 ``values`` at the coordinates of bool ``mask``."""
    mask_np = mask.detach().cpu().numpy().astype(bool)
    k = int(mask_np.sum())
    if values.numel() != k:
        raise ValueError(f"{values.numel()} values for a mask of {k} coordinates")
    n = mask_np.size
    if k == n:
        kind, mask_bytes = _DENSE, b""
    elif math.ceil(n / 8) <= 4 * k:
        kind, mask_bytes = _BITMASK, np.packbits(mask_np).tobytes()
    else:
        kind, mask_bytes = _INDICES, np.flatnonzero(mask_np).astype("<u4").tobytes()
    vals = values.detach().cpu().to(torch.float32).numpy().astype("<f4").tobytes()
    return _HEADER.pack(MAGIC, 1, kind, n, k) + mask_bytes + vals


def decode_sparse(data: bytes, expected_numel: int | None = None,
                  max_bytes: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode bytes from :func:`encode_sparse`; raises :class:`InvalidUpdateError` on
    anything malformed (bad header, wrong size, unexpected length, oversized)."""
    if max_bytes is not None and len(data) > max_bytes:
        raise InvalidUpdateError(f"payload of {len(data)} bytes exceeds the limit of {max_bytes}")
    if len(data) < HEADER_BYTES:
        raise InvalidUpdateError("payload shorter than its header")
    magic, version, kind, n, k = _HEADER.unpack_from(data)
    if magic != MAGIC or version != 1 or kind not in (_BITMASK, _INDICES, _DENSE):
        raise InvalidUpdateError("payload has a bad header")
    if expected_numel is not None and n != expected_numel:
        raise InvalidUpdateError(f"payload is for {n} coordinates, the model has {expected_numel}")
    if k > n:
        raise InvalidUpdateError(f"payload claims {k} of {n} coordinates")
    if expected_numel is None and n > MAX_NUMEL:
        raise InvalidUpdateError(f"payload claims {n} coordinates, more than {MAX_NUMEL}; pass expected_numel")
    if kind == _DENSE and k != n:
        raise InvalidUpdateError("dense payload must hold every coordinate")
    mbytes = {_BITMASK: math.ceil(n / 8), _INDICES: 4 * k, _DENSE: 0}[kind]
    if len(data) != HEADER_BYTES + mbytes + 4 * k:
        raise InvalidUpdateError(f"payload length {len(data)} does not match its header")
    body = memoryview(data)[HEADER_BYTES:]
    if kind == _DENSE:
        mask_np = np.ones(n, dtype=bool)
    elif kind == _BITMASK:
        mask_np = np.unpackbits(np.frombuffer(body[:mbytes], dtype=np.uint8), count=n).astype(bool)
        if int(mask_np.sum()) != k:
            raise InvalidUpdateError("bitmask population does not match the header")
    else:
        idx = np.frombuffer(body[:mbytes], dtype="<u4").astype(np.int64)
        if idx.size and (idx.max() >= n or np.any(np.diff(idx) <= 0)):
            raise InvalidUpdateError("index list out of range or not strictly increasing")
        mask_np = np.zeros(n, dtype=bool)
        mask_np[idx] = True
    values = np.frombuffer(body[mbytes:], dtype="<f4").astype(np.float32)
    return torch.from_numpy(mask_np.copy()), torch.from_numpy(values.copy())
