"""Sparse wire encoding: round trips, exact sizes and rejection of malformed payloads."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch

from fedgmr.algorithm.encoding import (
    HEADER_BYTES,
    MAGIC,
    decode_sparse,
    encode_sparse,
    encoded_nbytes,
    mask_nbytes,
)
from fedgmr.errors import InvalidUpdateError

HEADER = struct.Struct("<4sBBII")
BITMASK, INDICES, DENSE = 0, 1, 2


def _case(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[torch.randperm(n, generator=g)[:k]] = True
    values = torch.randn(k, generator=g)
    return mask, values


def _kind(data: bytes) -> int:
    return HEADER.unpack_from(data)[2]


CASES = {
    "bitmask": (1000, 400, BITMASK),   # ceil(1000/8) = 125 bytes < 1600
    "index": (1000, 3, INDICES),       # 12 bytes < 125
    "full": (1000, 1000, DENSE),       # no mask bytes at all
    "empty": (1000, 0, INDICES),       # 0 bytes of indices
}


@pytest.mark.parametrize("name", list(CASES))
def test_round_trip_and_exact_size(name):
    n, k, kind = CASES[name]
    mask, values = _case(n, k)
    data = encode_sparse(mask, values)
    assert isinstance(data, bytes)
    assert len(data) == encoded_nbytes(n, k)
    assert len(data) == HEADER_BYTES + mask_nbytes(n, k) + 4 * k
    assert _kind(data) == kind
    m2, v2 = decode_sparse(data, expected_numel=n, max_bytes=len(data))
    assert m2.dtype == torch.bool and v2.dtype == torch.float32
    assert torch.equal(m2, mask)
    assert torch.equal(v2, values)


def test_header_layout():
    mask, values = _case(64, 10)
    data = encode_sparse(mask, values)
    assert HEADER_BYTES == 14
    magic, version, kind, n, k = HEADER.unpack_from(data)
    assert (magic, version, n, k) == (MAGIC, 1, 64, 10)


def test_encoder_picks_the_smaller_mask_encoding():
    n = 800  # bitmask = 100 bytes; indices = 4k bytes
    for k in (1, 10, 24, 25, 26, 100, 799):
        mask, values = _case(n, k, seed=k)
        data = encode_sparse(mask, values)
        assert len(data) - HEADER_BYTES - 4 * k == min(math.ceil(n / 8), 4 * k)
        assert len(data) == encoded_nbytes(n, k)
        expected_kind = INDICES if 4 * k < math.ceil(n / 8) else BITMASK
        assert _kind(data) == expected_kind, k
        m2, v2 = decode_sparse(data, expected_numel=n)
        assert torch.equal(m2, mask) and torch.equal(v2, values)


def test_mask_nbytes_vectors():
    assert mask_nbytes(100, 100) == 0
    assert mask_nbytes(100, 50) == 13
    assert mask_nbytes(1000, 3) == 12
    assert encoded_nbytes(1000, 3) == 14 + 12 + 12
    assert encoded_nbytes(1000, 3, value_bytes=2) == 14 + 12 + 6


def test_non_multiple_of_eight_bitmask_round_trip():
    mask, values = _case(13, 7)
    data = encode_sparse(mask, values)
    assert _kind(data) == BITMASK
    assert len(data) == encoded_nbytes(13, 7)
    m2, v2 = decode_sparse(data, expected_numel=13)
    assert torch.equal(m2, mask) and torch.equal(v2, values)


def test_float64_values_are_sent_as_float32():
    mask, values = _case(50, 5)
    m2, v2 = decode_sparse(encode_sparse(mask, values.double()))
    assert v2.dtype == torch.float32
    assert torch.equal(v2, values)


def test_encode_rejects_value_count_mismatch():
    mask, values = _case(50, 5)
    with pytest.raises(ValueError):
        encode_sparse(mask, values[:4])


# ---------------------------------------------------------------------------- decode rejections

def _reject(data: bytes, **kw) -> None:
    with pytest.raises(InvalidUpdateError):
        decode_sparse(data, **kw)


@pytest.mark.parametrize("name", list(CASES))
def test_truncated_payload(name):
    n, k, _ = CASES[name]
    data = encode_sparse(*_case(n, k))
    _reject(data[:-1])
    _reject(data + b"\x00")
    _reject(data[:HEADER_BYTES - 1])
    _reject(b"")


def test_wrong_magic_version_and_kind():
    data = encode_sparse(*_case(100, 50))
    _reject(b"XGMR" + data[4:])
    _reject(data[:4] + bytes([2]) + data[5:])   # format version
    _reject(data[:5] + bytes([7]) + data[6:])   # mask kind


def test_wrong_expected_numel():
    data = encode_sparse(*_case(100, 50))
    _reject(data, expected_numel=101)
    decode_sparse(data, expected_numel=100)


def test_oversized_payload_with_max_bytes():
    data = encode_sparse(*_case(100, 50))
    _reject(data, max_bytes=len(data) - 1)
    decode_sparse(data, max_bytes=len(data))


def test_k_larger_than_n_and_dense_count_mismatch():
    _reject(HEADER.pack(MAGIC, 1, INDICES, 4, 5) + b"\x00" * (4 * 5 + 4 * 5))
    _reject(HEADER.pack(MAGIC, 1, DENSE, 4, 3) + b"\x00" * 12)


def _indices_payload(n: int, idx: list[int]) -> bytes:
    k = len(idx)
    return (HEADER.pack(MAGIC, 1, INDICES, n, k) + struct.pack(f"<{k}I", *idx)
            + struct.pack(f"<{k}f", *[1.0] * k))


def test_crafted_index_lists():
    # a well-formed crafted payload decodes
    m, v = decode_sparse(_indices_payload(100, [2, 5, 99]), expected_numel=100)
    assert torch.nonzero(m).flatten().tolist() == [2, 5, 99]
    assert v.tolist() == [1.0, 1.0, 1.0]
    _reject(_indices_payload(100, [2, 5, 100]))      # out of range
    _reject(_indices_payload(100, [2, 5, 2**32 - 1]))
    _reject(_indices_payload(100, [5, 2, 9]))        # unsorted
    _reject(_indices_payload(100, [2, 5, 5]))        # duplicate


def _bitmask_payload(n: int, bits: list[int], k: int) -> bytes:
    arr = np.zeros(n, dtype=bool)
    arr[bits] = True
    return HEADER.pack(MAGIC, 1, BITMASK, n, k) + np.packbits(arr).tobytes() + struct.pack(f"<{k}f", *[0.5] * k)


def test_crafted_bitmask_population_mismatch():
    m, v = decode_sparse(_bitmask_payload(16, [1, 4, 9], 3))
    assert torch.nonzero(m).flatten().tolist() == [1, 4, 9]
    assert v.tolist() == [0.5, 0.5, 0.5]
    _reject(_bitmask_payload(16, [1, 4, 9], 2))   # 3 bits set, header says 2 (length consistent)
    _reject(_bitmask_payload(16, [1, 4], 3))      # 2 bits set, header says 3


def test_decode_returns_writable_tensors():
    data = encode_sparse(*_case(100, 50))
    m, v = decode_sparse(data)
    v += 1.0  # must not fail on a read-only buffer
    m[0] = ~m[0]
