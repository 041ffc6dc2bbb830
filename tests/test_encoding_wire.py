"""Sparse wire payloads: round trips, exact sizes (values only up, values + mask code
down) and rejection of malformed payloads."""

from __future__ import annotations

import struct

import pytest
import torch

from fedgmr.algorithm.encoding import (
    HEADER_BYTES,
    MAGIC,
    MASK_HEADER_BYTES,
    MAX_NUMEL,
    decode_sparse,
    encode_mask,
    encode_sparse,
    mask_code_nbytes,
    payload_nbytes,
    sparse_header,
)
from fedgmr.errors import InvalidUpdateError

HEADER = struct.Struct("<4sBBII")  # magic, version, flags, N, k
VALUES_ONLY, WITH_MASK = 0, 1


def _case(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[torch.randperm(n, generator=g)[:k]] = True
    values = torch.randn(k, generator=g)
    return mask, values


CASES = {
    "half": (1000, 400),
    "few": (1000, 3),
    "full": (1000, 1000),
    "empty": (1000, 0),
    "odd": (13, 7),
    "sparse-large": (100_003, 5000),
    "dense-large": (100_003, 97_000),
}


@pytest.mark.parametrize("name", list(CASES))
def test_download_round_trip_and_exact_size(name):
    n, k = CASES[name]
    mask, values = _case(n, k)
    data = encode_sparse(mask, values)  # send_mask defaults to True
    assert isinstance(data, bytes)
    assert len(data) == payload_nbytes(k, mask_code_nbytes(mask)) == HEADER_BYTES + len(encode_mask(mask)) + 4 * k
    assert HEADER.unpack_from(data) == (MAGIC, 2, WITH_MASK, n, k)
    assert data[HEADER_BYTES:HEADER_BYTES + mask_code_nbytes(mask)] == encode_mask(mask)
    m2, v2 = decode_sparse(data, expected_numel=n, max_bytes=len(data))
    assert m2.dtype == torch.bool and v2.dtype == torch.float32
    assert torch.equal(m2, mask)
    assert torch.equal(v2, values)


@pytest.mark.parametrize("name", list(CASES))
def test_upload_is_header_plus_values_and_decodes_against_the_assigned_mask(name):
    n, k = CASES[name]
    mask, values = _case(n, k)
    data = encode_sparse(mask, values, send_mask=False)
    assert len(data) == payload_nbytes(k) == HEADER_BYTES + 4 * k
    assert HEADER.unpack_from(data) == (MAGIC, 2, VALUES_ONLY, n, k)
    assert sparse_header(data) == (n, k, False)
    m2, v2 = decode_sparse(data, expected_numel=n, max_bytes=len(data), mask=mask)
    assert m2 is mask  # the receiver's own mask object, not a copy
    assert torch.equal(v2, values)


def test_full_mask_download_carries_the_header_only_all_code():
    mask, values = _case(64, 64)
    data = encode_sparse(mask, values, send_mask=True)
    assert mask_code_nbytes(mask) == MASK_HEADER_BYTES
    assert len(data) == HEADER_BYTES + MASK_HEADER_BYTES + 4 * 64
    assert HEADER_BYTES == 14 and MASK_HEADER_BYTES == 9


def test_sizes_match_payload_nbytes_over_many_masks():
    for seed, (n, rho) in enumerate([(17, 0.3), (1024, 0.01), (5000, 0.5), (5001, 0.9), (777, 1.0), (9, 0.0)]):
        mask = torch.rand(n, generator=torch.Generator().manual_seed(seed)) < rho
        values = torch.randn(int(mask.sum()))
        k = int(mask.sum())
        assert len(encode_sparse(mask, values, send_mask=True)) == payload_nbytes(k, mask_code_nbytes(mask))
        assert len(encode_sparse(mask, values, send_mask=False)) == payload_nbytes(k, 0)


def test_payload_carrying_a_mask_returns_it_even_when_one_is_passed():
    assigned, _ = _case(200, 50, seed=1)
    smaller = assigned.clone()
    smaller[torch.nonzero(assigned)[:10, 0]] = False
    values = torch.randn(40)
    m2, v2 = decode_sparse(encode_sparse(smaller, values, send_mask=True), mask=assigned)
    assert torch.equal(m2, smaller) and torch.equal(v2, values)


def test_float64_values_are_sent_as_float32():
    mask, values = _case(50, 5)
    m2, v2 = decode_sparse(encode_sparse(mask, values.double()))
    assert v2.dtype == torch.float32
    assert torch.equal(v2, values)
    _, v3 = decode_sparse(encode_sparse(mask, values.double(), send_mask=False), mask=mask)
    assert torch.equal(v3, values)


def test_encode_rejects_value_count_mismatch_and_non_bool_masks():
    mask, values = _case(50, 5)
    with pytest.raises(ValueError):
        encode_sparse(mask, values[:4])
    with pytest.raises(ValueError):
        encode_sparse(mask, values[:4], send_mask=False)
    with pytest.raises(ValueError):
        encode_sparse(mask.float(), values)


# ---------------------------------------------------------------------------- decode rejections

def _reject(data: bytes, match: str | None = None, **kw) -> None:
    with pytest.raises(InvalidUpdateError, match=match):
        decode_sparse(data, **kw)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("send_mask", [True, False])
def test_truncated_payload(name, send_mask):
    n, k = CASES[name]
    mask, values = _case(n, k)
    data = encode_sparse(mask, values, send_mask=send_mask)
    kw = {} if send_mask else {"mask": mask}
    _reject(data[:-1], **kw)
    _reject(data + b"\x00", **kw)
    _reject(data[:HEADER_BYTES - 1], match="shorter than its header", **kw)
    _reject(b"", **kw)
    if send_mask:
        _reject(data[:HEADER_BYTES + 4 * k], **kw)  # values present, mask code cut off


def test_wrong_magic_version_and_flags():
    data = encode_sparse(*_case(100, 50))
    _reject(b"XGMR" + data[4:], match="bad header")
    _reject(data[:4] + bytes([1]) + data[5:], match="bad header")   # the old format version
    _reject(data[:5] + bytes([2]) + data[6:], match="bad header")   # unknown flag bit


def test_wrong_expected_numel_and_assigned_mask_size():
    mask, values = _case(100, 50)
    data = encode_sparse(mask, values)
    _reject(data, expected_numel=101, match="the model has 101")
    decode_sparse(data, expected_numel=100)
    up = encode_sparse(mask, values, send_mask=False)
    _reject(up, expected_numel=101, mask=mask)
    _reject(up, mask=torch.cat([mask, mask[:1]]), match="coordinates")


def test_values_only_payload_needs_the_assigned_mask_with_the_right_count():
    mask, values = _case(100, 50)
    up = encode_sparse(mask, values, send_mask=False)
    _reject(up, match="no assigned mask")
    other = mask.clone()
    other[torch.nonzero(~mask)[0]] = True  # 51 coordinates
    _reject(up, mask=other, match="assigned mask keeps 51")
    _reject(up, mask=torch.ones(100, dtype=torch.bool), match="assigned mask keeps 100")


def test_oversized_payload_with_max_bytes():
    for send_mask in (True, False):
        mask, values = _case(100, 50)
        data = encode_sparse(mask, values, send_mask=send_mask)
        kw = {} if send_mask else {"mask": mask}
        _reject(data, max_bytes=len(data) - 1, match="exceeds the limit", **kw)
        decode_sparse(data, max_bytes=len(data), **kw)


def test_k_larger_than_n_and_oversized_numel():
    _reject(HEADER.pack(MAGIC, 2, VALUES_ONLY, 4, 5) + b"\x00" * 20, mask=torch.ones(4, dtype=torch.bool))
    _reject(HEADER.pack(MAGIC, 2, WITH_MASK, 4, 5) + b"\x00" * 40, match="5 of 4")
    _reject(HEADER.pack(MAGIC, 2, WITH_MASK, MAX_NUMEL + 1, 0) + b"\x00" * 9, match="more than")


def test_mask_code_population_must_match_the_value_count():
    mask, _ = _case(100, 2, seed=3)  # the mask code keeps 2 coordinates
    crafted = HEADER.pack(MAGIC, 2, WITH_MASK, 100, 3) + encode_mask(mask) + struct.pack("<3f", 1, 2, 3)
    _reject(crafted, match="keeps 2 coordinates")
    ok = HEADER.pack(MAGIC, 2, WITH_MASK, 100, 2) + encode_mask(mask) + struct.pack("<2f", 1, 2)
    m, v = decode_sparse(ok, expected_numel=100)
    assert torch.equal(m, mask) and v.tolist() == [1.0, 2.0]


def test_mask_code_for_another_model_size_is_rejected():
    mask, _ = _case(100, 2, seed=3)
    crafted = HEADER.pack(MAGIC, 2, WITH_MASK, 101, 2) + encode_mask(mask) + struct.pack("<2f", 1, 2)
    _reject(crafted, match="100 coordinates, expected 101")


def test_decode_returns_writable_tensors():
    mask, values = _case(100, 50)
    m, v = decode_sparse(encode_sparse(mask, values))
    v += 1.0  # must not fail on a read-only buffer
    m[0] = ~m[0]
    _, v2 = decode_sparse(encode_sparse(mask, values, send_mask=False), mask=mask)
    v2 += 1.0
