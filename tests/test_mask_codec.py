"""Mask codes: exact round trips, near-entropy sizes, the smallest coding chosen, and
rejection of every malformed code."""

from __future__ import annotations

import math
import struct
import zlib

import numpy as np
import pytest
import torch

from fedgmr.algorithm import encoding
from fedgmr.algorithm.encoding import (
    MASK_HEADER_BYTES,
    MAX_NUMEL,
    decode_mask,
    encode_mask,
    mask_code_kind,
    mask_code_limit,
    mask_code_nbytes,
    mask_code_sizes,
)
from fedgmr.errors import InvalidUpdateError

MHEAD = struct.Struct("<BII")
ALL, RICE, COMPLEMENT, ZLIB, BITMAP = 0xA0, 0xA1, 0xA2, 0xA3, 0xA4


def _bernoulli(n: int, rho: float, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, generator=torch.Generator().manual_seed(seed)) < rho


def _entropy_bytes(n: int, rho: float) -> float:
    h = -(rho * math.log2(rho) + (1 - rho) * math.log2(1 - rho))
    return n * h / 8


def _prefix(n: int, k: int) -> torch.Tensor:
    m = torch.zeros(n, dtype=torch.bool)
    m[:k] = True
    return m


def _blocks(n: int, period: int, width: int) -> torch.Tensor:
    m = torch.zeros(n, dtype=torch.bool)
    for s in range(0, n, period):
        m[s:s + width] = True
    return m


def _reference_rice(n: int, idx: list[int], b: int, kind: int = RICE) -> bytes:
    """A slow, obviously-correct Rice code (bit strings), independent of the codec."""
    gaps = [i - p - 1 for p, i in zip([-1] + idx[:-1], idx)]
    unary = "".join("0" * (g >> b) + "1" for g in gaps)
    rem = "".join(format(g & ((1 << b) - 1), f"0{b}b") if b else "" for g in gaps)

    def pack(bits: str) -> bytes:
        bits += "0" * (-len(bits) % 8)
        return bytes(int(bits[i:i + 8], 2) for i in range(0, len(bits), 8))

    kept = len(idx) if kind == RICE else n - len(idx)
    return MHEAD.pack(kind, n, kept) + bytes([b]) + pack(unary) + pack(rem)


# ---------------------------------------------------------------------------- round trips
RHOS = [0.001, 0.05, 0.2, 0.5, 0.8, 0.99, 1.0]


@pytest.mark.parametrize("rho", RHOS)
@pytest.mark.parametrize("n", [10_007, 200_003])
def test_random_masks_round_trip_with_the_smallest_code(rho, n):
    mask = _bernoulli(n, rho, seed=int(rho * 1000))
    code = encode_mask(mask)
    out = decode_mask(code, n)
    assert out.dtype == torch.bool and out.shape == (n,)
    assert torch.equal(out, mask)
    sizes = mask_code_sizes(mask)
    assert len(code) == min(sizes.values()) == mask_code_nbytes(mask)
    assert sizes[mask_code_kind(code)] == len(code)
    assert MHEAD.unpack_from(code)[1:] == (n, int(mask.sum()))


STRUCTURED = {
    "prefix": lambda: _prefix(100_003, 30_000),
    "suffix": lambda: ~_prefix(100_003, 70_000),
    "blocks": lambda: _blocks(100_003, 1000, 137),
    "empty": lambda: torch.zeros(100_003, dtype=torch.bool),
    "full": lambda: torch.ones(100_003, dtype=torch.bool),
    "one": lambda: _prefix(13, 0).index_fill(0, torch.tensor([12]), True),
    "tiny-off": lambda: torch.zeros(1, dtype=torch.bool),
    "tiny-on": lambda: torch.ones(1, dtype=torch.bool),
    "nothing": lambda: torch.zeros(0, dtype=torch.bool),
}


@pytest.mark.parametrize("name", list(STRUCTURED))
def test_structured_and_edge_masks_round_trip(name):
    mask = STRUCTURED[name]()
    code = encode_mask(mask)
    assert torch.equal(decode_mask(code, mask.numel()), mask)
    assert torch.equal(decode_mask(code), mask)
    assert len(code) == mask_code_nbytes(mask) <= mask_code_limit(mask.numel())


@pytest.mark.parametrize("rho", [0.0, 0.05, 0.5, 0.97, 1.0])
def test_every_applicable_coding_round_trips(rho):
    mask = _bernoulli(5003, rho, seed=3)
    sizes = mask_code_sizes(mask)
    assert set(sizes) >= {"rice", "rice-complement", "zlib", "bitmap"}
    assert ("all" in sizes) == bool(mask.all())
    for kind, size in sizes.items():
        code = encode_mask(mask, kind=kind)
        assert mask_code_kind(code) == kind and len(code) == size
        assert torch.equal(decode_mask(code, 5003), mask)


def test_rice_code_matches_an_independent_reference_bit_for_bit():
    mask = _bernoulli(2001, 0.03, seed=5)
    idx = torch.nonzero(mask).flatten().tolist()
    code = encode_mask(mask, kind="rice")
    b = code[MASK_HEADER_BYTES]
    assert code == _reference_rice(2001, idx, b)
    # a decoder accepts any Rice parameter, not only the encoder's choice
    for other in (0, 1, 7, 12):
        assert torch.equal(decode_mask(_reference_rice(2001, idx, other)), mask)
    dropped = torch.nonzero(~_bernoulli(2001, 0.97, seed=6)).flatten().tolist()
    full = torch.ones(2001, dtype=torch.bool)
    full[dropped] = False
    ref = _reference_rice(2001, dropped, 2, kind=COMPLEMENT)
    assert MHEAD.unpack_from(ref)[2] == int(full.sum())
    assert torch.equal(decode_mask(ref), full)


def test_the_mask_argument_may_be_any_shape_and_device_layout():
    mask = _bernoulli(6 * 7 * 11, 0.1).reshape(6, 7, 11)
    assert torch.equal(decode_mask(encode_mask(mask)), mask.reshape(-1))
    assert torch.equal(decode_mask(encode_mask(mask.transpose(0, 2))), mask.transpose(0, 2).reshape(-1))
    with pytest.raises(ValueError):
        encode_mask(mask.float())
    with pytest.raises(ValueError):
        encode_mask(mask, kind="huffman")
    with pytest.raises(ValueError):
        encode_mask(mask, kind="all")  # does not apply: not every coordinate kept


def test_decoded_mask_is_writable():
    for rho in (0.05, 0.5, 0.97, 1.0):
        m = decode_mask(encode_mask(_bernoulli(1000, rho)))
        m[0] = ~m[0]


# ---------------------------------------------------------------------------- sizes
@pytest.mark.parametrize("rho", [0.05, 0.2, 0.5])
def test_random_mask_codes_near_their_entropy(rho):
    n = 200_000
    mask = _bernoulli(n, rho, seed=11)
    assert mask_code_nbytes(mask) <= 1.10 * _entropy_bytes(n, rho) + 64


def test_sparse_masks_cost_far_less_than_a_bitmap():
    n = 200_000
    assert 3 * mask_code_nbytes(_bernoulli(n, 0.05, seed=1)) < n / 8
    assert mask_code_nbytes(_prefix(n, 60_000)) < 100
    assert mask_code_nbytes(torch.ones(n, dtype=torch.bool)) == MASK_HEADER_BYTES
    assert mask_code_nbytes(torch.zeros(n, dtype=torch.bool)) == MASK_HEADER_BYTES + 1  # rice, no gaps


def test_the_codec_picks_the_smallest_candidate():
    n = 200_000
    sparse, prefix, dense = _bernoulli(n, 0.05, seed=2), _prefix(n, 60_000), _bernoulli(n, 0.97, seed=3)
    assert mask_code_kind(encode_mask(sparse)) == "rice"
    assert mask_code_kind(encode_mask(prefix)) == "zlib"
    assert mask_code_kind(encode_mask(dense)) == "rice-complement"
    assert mask_code_kind(encode_mask(torch.ones(n, dtype=torch.bool))) == "all"
    for m in (sparse, prefix, dense):
        sizes = mask_code_sizes(m)
        assert len(encode_mask(m)) == min(sizes.values())
        assert sizes["bitmap"] == MASK_HEADER_BYTES + n // 8


def test_rice_parameter_is_the_exact_minimum_near_log2_mean_gap():
    mask = _bernoulli(50_000, 0.02, seed=4)
    idx = torch.nonzero(mask).flatten().tolist()
    code = encode_mask(mask, kind="rice")
    sizes = {b: len(_reference_rice(50_000, idx, b)) for b in range(0, 10)}
    assert len(code) == min(sizes.values())


def test_code_size_is_cached_per_mask_object(monkeypatch):
    mask = _bernoulli(10_000, 0.1)
    first = mask_code_nbytes(mask)

    def boom(*a, **k):
        raise AssertionError("recomputed")

    monkeypatch.setattr(encoding, "_candidates", boom)
    assert mask_code_nbytes(mask) == first
    with pytest.raises(AssertionError):
        mask_code_nbytes(mask.clone())  # another object: computed afresh


# ---------------------------------------------------------------------------- rejections
def _reject(data: bytes, numel: int | None = None, match: str | None = None) -> None:
    with pytest.raises(InvalidUpdateError, match=match):
        decode_mask(data, numel)


@pytest.mark.parametrize("rho", [0.0, 0.05, 0.5, 0.97, 1.0])
def test_truncated_or_padded_codes_are_rejected(rho):
    mask = _bernoulli(5003, rho, seed=9)
    for kind in mask_code_sizes(mask):
        code = encode_mask(mask, kind=kind)
        _reject(code[:-1])
        _reject(code + b"\x00")
        _reject(code + b"\x01")
        _reject(code[:MASK_HEADER_BYTES - 1], match="shorter than its header")
    _reject(b"")


def test_wrong_numel_bad_tag_and_counts():
    code = encode_mask(_bernoulli(1000, 0.1))
    decode_mask(code, 1000)
    _reject(code, 999, match="1000 coordinates, expected 999")
    _reject(bytes([0xB1]) + code[1:], match="bad tag")   # wrong magic nibble
    _reject(bytes([0xA7]) + code[1:], match="bad tag")   # unknown kind
    _reject(MHEAD.pack(ALL, 10, 9), match="every coordinate")
    _reject(MHEAD.pack(RICE, 10, 11) + b"\x00", match="11 of 10")
    _reject(MHEAD.pack(ALL, MAX_NUMEL + 1, MAX_NUMEL + 1), match="more than")  # no allocation attempted
    assert decode_mask(MHEAD.pack(ALL, 5, 5), 5).all()


def test_population_mismatch_with_the_header_is_rejected():
    mask = _bernoulli(1000, 0.3, seed=1)
    k = int(mask.sum())
    for kind in ("rice", "rice-complement", "bitmap", "zlib"):
        code = encode_mask(mask, kind=kind)
        for lie in (k - 1, k + 1):
            _reject(code[:1] + struct.pack("<I", 1000) + struct.pack("<I", lie) + code[MASK_HEADER_BYTES:])


def test_bitmap_padding_bits_must_be_zero():
    code = bytearray(encode_mask(_prefix(13, 3), kind="bitmap"))
    code[-1] |= 0x01  # bit 15 of a 13-coordinate mask
    _reject(bytes(code), match="padding")


def test_zlib_bombs_and_corrupt_streams_are_rejected():
    n = 8000  # 1000 bytes of bitmap
    bomb = zlib.compress(bytes(50 * n))
    _reject(MHEAD.pack(ZLIB, n, 0) + bomb, match="inflates past")
    _reject(MHEAD.pack(ZLIB, n, 0) + zlib.compress(bytes(n // 8 + 1)), match="inflates past")
    _reject(MHEAD.pack(ZLIB, n, 0) + zlib.compress(bytes(n // 8 - 1)), match="expected 1000")
    _reject(MHEAD.pack(ZLIB, n, 0) + b"not a zlib stream", match="corrupt")
    good = zlib.compress(bytes(n // 8))
    assert not decode_mask(MHEAD.pack(ZLIB, n, 0) + good).any()
    _reject(MHEAD.pack(ZLIB, n, 0) + good[:-2], match="truncated")
    _reject(MHEAD.pack(ZLIB, n, 0) + good + b"\x00", match="trailing")
    _reject(MHEAD.pack(ZLIB, 0, 0) + zlib.compress(b"\x00" * 10_000), match="inflates past")


def test_rice_gaps_out_of_range_are_rejected():
    # one gap of 150 in a 100-coordinate mask
    _reject(_reference_rice(200, [150], 0)[:1] + struct.pack("<II", 100, 1) + _reference_rice(200, [150], 0)[9:],
            match="beyond")
    # every gap in range, but together they run past the end: indices 60 and 121
    code = _reference_rice(200, [60, 121], 3)
    assert decode_mask(code).nonzero().flatten().tolist() == [60, 121]
    _reject(code[:1] + struct.pack("<II", 100, 2) + code[9:], match="reaches index 121")
    # a complement coding whose dropped index is out of range
    comp = _reference_rice(200, [199], 0, kind=COMPLEMENT)
    _reject(comp[:1] + struct.pack("<II", 150, 149) + comp[9:])


def test_rice_stream_defects_are_rejected():
    idx = [3, 9, 40]
    code = _reference_rice(64, idx, 2)
    assert decode_mask(code, 64).nonzero().flatten().tolist() == idx
    _reject(code[:MASK_HEADER_BYTES] + bytes([40]) + code[MASK_HEADER_BYTES + 1:], match="parameter")
    _reject(code[:MASK_HEADER_BYTES], match="truncated")                        # no parameter byte
    _reject(MHEAD.pack(RICE, 64, 3) + bytes([2]), match="truncated")  # remainder stream missing
    # trailing zero byte in the unary stream (a longer unary stream, same remainders)
    body = code[MASK_HEADER_BYTES + 1:]
    unary_len = len(body) - math.ceil(3 * 2 / 8)
    _reject(code[:MASK_HEADER_BYTES + 1] + body[:unary_len] + b"\x00" + body[unary_len:], match="trailing")
    # non-zero padding bits in the remainder stream
    bad = bytearray(code)
    bad[-1] |= 0x01
    _reject(bytes(bad), match="padding")


def test_random_garbage_never_escapes_as_another_error():
    rng = np.random.default_rng(0)
    for trial in range(300):
        kind = 0xA0 | int(rng.integers(0, 5))
        n = int(rng.integers(0, 300))
        k = int(rng.integers(0, n + 1))
        body = rng.integers(0, 256, size=int(rng.integers(0, 60)), dtype=np.uint8).tobytes()
        try:
            m = decode_mask(MHEAD.pack(kind, n, k) + body, n)
        except InvalidUpdateError:
            continue
        assert m.numel() == n and int(m.sum()) == k
