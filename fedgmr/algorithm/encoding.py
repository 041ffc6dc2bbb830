"""Wire encoding of a sparse sub-model: float32 values plus, optionally, a mask code.

Payloads are counted as a real wire carries them (docs/reference.md §6.1 and §12 item 8):

* an **upload** carries the values of the retained coordinates only: the server assigned
  the mask, so no mask bits travel up (``encode_sparse(mask, values, send_mask=False)``,
  decoded with ``decode_sparse(data, mask=assigned)``);
* a **download** carries the values plus the mask code, when the receiver does not hold
  the mask yet (``send_mask=True``).

Mask code (:func:`encode_mask` / :func:`decode_mask`), self-describing::

    tag u8 = 0xA0 | kind, N u32, k u32          (9 bytes, little-endian)
    kind 0  all       every coordinate kept (k == N); header only
    kind 1  rice      u8 b, then the Golomb-Rice coded gaps between consecutive kept
                      indices (gap_0 = idx_0, gap_i = idx_i - idx_{i-1} - 1):
                      unary quotients (gap >> b zeros, then a 1), packed, padded with 0
                      bits to a byte; then the b-bit remainders (MSB first), packed, padded
    kind 2  rice-complement   the same coding of the N - k *dropped* indices
    kind 3  zlib      zlib-deflated packed bitmap (inflates to exactly ceil(N/8) bytes)
    kind 4  bitmap    packed bitmap, ceil(N/8) bytes

The encoder writes the smallest of these (ties go to the lower kind), so a random mask
of density ρ costs about N·H(ρ)/8 bytes and never more than ``9 + ceil(N/8)``
(:func:`mask_code_limit`). The two Rice streams are kept separate so that both directions
are vectorised: the unary stream's terminators are ``np.flatnonzero`` of its bits.

Sparse payload (:func:`encode_sparse` / :func:`decode_sparse`)::

    magic "FGMR", version u8 = 2, flags u8 (bit 0: a mask code follows), N u32, k u32
    [mask code, when flag bit 0]          its length is what remains before the values
    k float32 values, little-endian

so ``len(encode_sparse(m, v, send_mask)) == payload_nbytes(k, mask_code_nbytes(m) if
send_mask else 0)`` always; a full mask sent with ``send_mask=True`` carries the 9-byte
``all`` code. No pickle anywhere; every malformed input raises
:class:`~fedgmr.errors.InvalidUpdateError`.
"""

from __future__ import annotations

import math
import struct
import zlib
from typing import Any

import numpy as np
import torch

from fedgmr.algorithm.maskinfo import mask_count, memo
from fedgmr.errors import InvalidUpdateError

MAGIC = b"FGMR"
VERSION = 2
_HEADER = struct.Struct("<4sBBII")  # magic, format version, flags, N, k
HEADER_BYTES = _HEADER.size
_HAS_MASK = 0x01
#: largest model a payload or mask code may describe when the caller does not say what to
#: expect (``expected_numel`` / ``numel`` / ``mask``). Small on purpose: decoding allocates
#: a bool per coordinate, so a bound taken from the header alone would let a few crafted
#: bytes claim gigabytes. Receivers always pass the size of their own model.
MAX_NUMEL = 1 << 20

# ---------------------------------------------------------------------- mask code
_MASK_HEADER = struct.Struct("<BII")  # tag (0xA0 | kind), N, k
MASK_HEADER_BYTES = _MASK_HEADER.size
_TAG = 0xA0
MASK_ALL, MASK_RICE, MASK_RICE_COMPLEMENT, MASK_ZLIB, MASK_BITMAP = range(5)
MASK_KINDS = {MASK_ALL: "all", MASK_RICE: "rice", MASK_RICE_COMPLEMENT: "rice-complement",
              MASK_ZLIB: "zlib", MASK_BITMAP: "bitmap"}
_KIND_OF_NAME = {v: k for k, v in MASK_KINDS.items()}
_MAX_RICE_B = 31
_ZLIB_LEVEL = 6  # level 9 is up to 10x slower for ~5% on random bitmaps, the same on structured ones


def _np_mask(mask: torch.Tensor) -> np.ndarray:
    if mask.dtype != torch.bool:
        raise ValueError(f"a mask must be a bool tensor, got {mask.dtype}")
    return mask.detach().reshape(-1).cpu().numpy()


def _gaps(idx: np.ndarray) -> np.ndarray:
    """Gaps between consecutive indices (the first from -1), int64."""
    g = np.diff(idx, prepend=-1)
    g -= 1
    return g


def _rice_best(gaps: np.ndarray) -> tuple[int, int]:
    """(b, stream bytes) of the smallest Rice coding of ``gaps`` among b near
    log2(mean gap)."""
    c = gaps.size
    if c == 0:
        return 0, 0
    mean = float(gaps.sum()) / c
    b0 = int(math.floor(math.log2(mean))) if mean >= 1 else 0
    best: tuple[int, int] | None = None
    for b in range(max(0, b0 - 2), min(_MAX_RICE_B, b0 + 2) + 1):
        unary_bits = int((gaps >> b).sum()) + c
        size = -(-unary_bits // 8) + -(-(c * b) // 8)
        if best is None or size < best[1]:
            best = (b, size)
    assert best is not None
    return best


def _rice_streams(gaps: np.ndarray, b: int) -> bytes:
    q = gaps >> b
    ends = np.cumsum(q + 1) - 1  # positions of the unary terminators
    unary = np.zeros(int(ends[-1]) + 1 if ends.size else 0, dtype=np.uint8)
    unary[ends] = 1
    out = np.packbits(unary).tobytes()
    if b:
        r = (gaps & ((1 << b) - 1)).astype(np.uint32)
        bits = ((r[:, None] >> np.arange(b - 1, -1, -1, dtype=np.uint32)) & 1).astype(np.uint8)
        out += np.packbits(bits.reshape(-1)).tobytes()
    return out


def _candidates(m: np.ndarray, prune: bool = True) -> dict[int, tuple[int, Any]]:
    """Exact sizes (bytes, header included) of the applicable codings of ``m``, each with
    what building it needs. With ``prune``, a Rice coding whose lower bound (one unary bit
    per index) already exceeds a size in hand is left out: it could never be chosen."""
    n = m.size
    out: dict[int, tuple[int, Any]] = {}
    packed = np.packbits(m)
    out[MASK_BITMAP] = (MASK_HEADER_BYTES + packed.size, packed)
    k = int(np.count_nonzero(m))
    if k == n:
        out[MASK_ALL] = (MASK_HEADER_BYTES, None)
    for kind, count in sorted(((MASK_RICE, k), (MASK_RICE_COMPLEMENT, n - k)), key=lambda kc: kc[1]):
        if prune and MASK_HEADER_BYTES + 1 + -(-count // 8) > min(size for size, _ in out.values()):
            continue
        g = _gaps(np.flatnonzero(m if kind == MASK_RICE else ~m))
        b, size = _rice_best(g)
        out[kind] = (MASK_HEADER_BYTES + 1 + size, (g, b))
    z = zlib.compress(packed.tobytes(), _ZLIB_LEVEL)
    out[MASK_ZLIB] = (MASK_HEADER_BYTES + len(z), z)
    return out


def mask_code_sizes(mask: torch.Tensor) -> dict[str, int]:
    """Size in bytes (header included) of every applicable coding of ``mask``, by kind
    name; :func:`encode_mask` writes the smallest."""
    return {MASK_KINDS[kind]: size for kind, (size, _) in _candidates(_np_mask(mask), prune=False).items()}


def encode_mask(mask: torch.Tensor, kind: str | None = None) -> bytes:
    """The mask code of bool ``mask`` (flattened): the smallest coding, or ``kind``
    (one of :data:`MASK_KINDS`' names) when given."""
    m = _np_mask(mask)
    n = m.size
    if n > 0xFFFFFFFF:
        raise ValueError(f"a mask of {n} coordinates is too large to encode")
    cands = _candidates(m, prune=kind is None)
    if kind is None:
        chosen = min(cands, key=lambda c: (cands[c][0], c))
    else:
        if kind not in _KIND_OF_NAME:
            raise ValueError(f"unknown mask coding {kind!r}; choose from {', '.join(_KIND_OF_NAME)}")
        chosen = _KIND_OF_NAME[kind]
        if chosen not in cands:
            raise ValueError(f"coding {kind!r} does not apply to this mask")
    size, extra = cands[chosen]
    head = _MASK_HEADER.pack(_TAG | chosen, n, int(np.count_nonzero(m)))
    if chosen == MASK_ALL:
        body = b""
    elif chosen in (MASK_RICE, MASK_RICE_COMPLEMENT):
        g, b = extra  # type: ignore[misc]
        body = bytes([b]) + _rice_streams(g, b)
    elif chosen == MASK_ZLIB:
        body = extra  # type: ignore[assignment]
    else:
        body = extra.tobytes()  # type: ignore[union-attr]
    out = head + body
    assert len(out) == size
    return out


def mask_code_kind(data: bytes) -> str:
    """The coding a mask code uses (its kind's name); InvalidUpdateError when the first
    byte is not a mask tag."""
    if len(data) < 1 or data[0] & 0xF0 != _TAG or data[0] & 0x0F not in MASK_KINDS:
        raise InvalidUpdateError("mask code has a bad tag")
    return MASK_KINDS[data[0] & 0x0F]


def mask_code_nbytes(mask: torch.Tensor) -> int:
    """``len(encode_mask(mask))``, computed once per mask object (level masks are shared
    and reused; do not modify a mask in place after asking)."""
    # the candidates' sizes are exact (encode_mask asserts it): no need to build the code
    return memo(mask, "code_nbytes", lambda: min(size for size, _ in _candidates(_np_mask(mask)).values()))


def mask_code_limit(numel: int) -> int:
    """Largest mask code of a ``numel``-coordinate mask (the plain bitmap's size)."""
    return MASK_HEADER_BYTES + math.ceil(numel / 8)


def _bits_population(packed: np.ndarray, n: int, what: str) -> np.ndarray:
    """Unpack ``n`` bits; the padding bits must be zero."""
    if packed.size != -(-n // 8):
        raise InvalidUpdateError(f"{what} of {packed.size} bytes, expected {-(-n // 8)}")
    if n % 8 and int(packed[-1]) & ((1 << (8 - n % 8)) - 1):
        raise InvalidUpdateError(f"{what} has non-zero padding bits")
    return np.unpackbits(packed, count=n).view(bool)


def _rice_decode(body: memoryview, count: int, n: int) -> np.ndarray:
    """Indices (ascending, int64) from a Rice body (b byte + the two streams)."""
    if len(body) < 1:
        raise InvalidUpdateError("rice mask code is truncated (no parameter byte)")
    b = body[0]
    if b > _MAX_RICE_B:
        raise InvalidUpdateError(f"rice parameter {b} out of range")
    rem_bytes = -(-(count * b) // 8)
    unary_bytes = len(body) - 1 - rem_bytes
    if unary_bytes < 0:
        raise InvalidUpdateError("rice mask code is truncated (remainder stream)")
    unary = np.unpackbits(np.frombuffer(body[1:1 + unary_bytes], dtype=np.uint8))
    ends = np.flatnonzero(unary)
    if ends.size != count:
        raise InvalidUpdateError(f"rice mask code holds {ends.size} indices; its header says {count}")
    if unary_bytes != (-(-(int(ends[-1]) + 1) // 8) if count else 0):
        raise InvalidUpdateError("rice mask code has trailing bytes in its unary stream")
    q = np.diff(ends, prepend=-1)
    q -= 1
    if count and int(q.max()) > ((n - 1) >> b):
        raise InvalidUpdateError("rice mask code has a gap beyond the mask's end")
    gaps = q << b
    if b:
        packed = np.frombuffer(body[1 + unary_bytes:], dtype=np.uint8)
        bits = _bits_population(packed, count * b, "rice remainder stream")
        gaps += bits.reshape(count, b).astype(np.int64) @ (1 << np.arange(b - 1, -1, -1, dtype=np.int64))
    idx = np.cumsum(gaps + 1)
    idx -= 1
    if count and int(idx[-1]) >= n:
        raise InvalidUpdateError(f"rice mask code reaches index {int(idx[-1])} of a {n}-coordinate mask")
    return idx


def decode_mask(data: bytes, numel: int | None = None) -> torch.Tensor:
    """Inverse of :func:`encode_mask`: a writable bool tensor of N coordinates.

    Raises :class:`InvalidUpdateError` on anything malformed: a bad tag, N other than
    ``numel`` (or above :data:`MAX_NUMEL` when ``numel`` is None), truncated or trailing
    bytes, indices out of range, a population other than the header's k, a zlib stream
    that is corrupt or inflates to anything but ceil(N/8) bytes."""
    if len(data) < MASK_HEADER_BYTES:
        raise InvalidUpdateError("mask code shorter than its header")
    tag, n, k = _MASK_HEADER.unpack_from(data)
    kind = tag & 0x0F
    if tag & 0xF0 != _TAG or kind not in MASK_KINDS:
        raise InvalidUpdateError(f"mask code has a bad tag 0x{tag:02x}")
    if numel is not None and n != numel:
        raise InvalidUpdateError(f"mask code is for {n} coordinates, expected {numel}")
    if numel is None and n > MAX_NUMEL:
        raise InvalidUpdateError(f"mask code claims {n} coordinates, more than {MAX_NUMEL}; pass numel")
    if k > n:
        raise InvalidUpdateError(f"mask code claims {k} of {n} coordinates")
    body = memoryview(data)[MASK_HEADER_BYTES:]
    nbytes = math.ceil(n / 8)
    if kind == MASK_ALL:
        if k != n:
            raise InvalidUpdateError(f"an 'all' mask code must keep every coordinate, says {k} of {n}")
        if len(body):
            raise InvalidUpdateError("an 'all' mask code has trailing bytes")
        m = np.ones(n, dtype=bool)
    elif kind in (MASK_RICE, MASK_RICE_COMPLEMENT):
        complement = kind == MASK_RICE_COMPLEMENT
        idx = _rice_decode(body, n - k if complement else k, n)
        m = np.full(n, complement, dtype=bool)
        m[idx] = not complement
    else:
        if kind == MASK_ZLIB:
            inflater = zlib.decompressobj()
            try:
                raw = inflater.decompress(body, nbytes + 1)  # never more than one byte too many
            except zlib.error as exc:
                raise InvalidUpdateError(f"zlib mask code is corrupt: {exc}") from None
            if len(raw) > nbytes:
                raise InvalidUpdateError(f"zlib mask code inflates past {nbytes} bytes")
            if not inflater.eof or inflater.unused_data:
                raise InvalidUpdateError("zlib mask code is truncated or has trailing bytes")
            if len(raw) != nbytes:
                raise InvalidUpdateError(f"zlib mask code inflates to {len(raw)} bytes, expected {nbytes}")
        else:
            if len(body) != nbytes:
                raise InvalidUpdateError(f"bitmap mask code of {len(body)} bytes, expected {nbytes}")
            raw = body
        m = _bits_population(np.frombuffer(raw, dtype=np.uint8), n, "bitmap mask code")
        if int(np.count_nonzero(m)) != k:
            raise InvalidUpdateError(f"bitmap holds {int(np.count_nonzero(m))} coordinates; its header says {k}")
    return torch.from_numpy(m)


# ---------------------------------------------------------------------- sparse payloads
def _count(mask: torch.Tensor) -> int:
    """Kept coordinates (cached per mask object for the flat masks the strategies share)."""
    return mask_count(mask) if mask.dim() == 1 else int(mask.sum())


def payload_nbytes(kept: int, mask_bytes: int = 0) -> int:
    """Size of a sparse payload of ``kept`` float32 values carrying a mask code of
    ``mask_bytes`` (0: values only, as an upload travels)."""
    return HEADER_BYTES + mask_bytes + 4 * kept


def encode_sparse(mask: torch.Tensor, values: torch.Tensor, send_mask: bool = True) -> bytes:
    """Encode float32 ``values`` at the coordinates of bool ``mask``; with ``send_mask``
    the mask code travels too (a download), without it only the values (an upload: the
    receiver holds the mask). The size is :func:`payload_nbytes` exactly."""
    if mask.dtype != torch.bool:
        raise ValueError(f"a mask must be a bool tensor, got {mask.dtype}")
    n = mask.numel()
    if n > 0xFFFFFFFF:
        raise ValueError(f"a mask of {n} coordinates is too large to encode")
    k = _count(mask)
    if values.numel() != k:
        raise ValueError(f"{values.numel()} values for a mask of {k} coordinates")
    code = encode_mask(mask) if send_mask else b""
    vals = values.detach().reshape(-1).cpu().to(torch.float32).numpy().astype("<f4", copy=False).tobytes()
    return _HEADER.pack(MAGIC, VERSION, _HAS_MASK if send_mask else 0, n, k) + code + vals


def sparse_header(data: bytes) -> tuple[int, int, bool]:
    """(N, k, whether a mask code follows) of a sparse payload; InvalidUpdateError when
    the header is malformed."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidUpdateError(f"payload must be bytes, not {type(data).__name__}")
    if len(data) < HEADER_BYTES:
        raise InvalidUpdateError("payload shorter than its header")
    magic, version, flags, n, k = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION or flags & ~_HAS_MASK:
        raise InvalidUpdateError("payload has a bad header")
    return n, k, bool(flags & _HAS_MASK)


def decode_sparse(data: bytes, expected_numel: int | None = None, max_bytes: int | None = None,
                  mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode bytes from :func:`encode_sparse` into (bool mask, float32 values).

    A payload carrying its mask code returns the decoded mask (``mask`` is then only
    checked for size; whether the carried mask lies inside it is the caller's business).
    A values-only payload needs ``mask``, the mask the receiver assigned: the payload must
    hold exactly ``mask.sum()`` values, and ``mask`` itself is returned (not a copy).
    Raises :class:`InvalidUpdateError` on anything malformed (bad header, wrong size,
    unexpected length, oversized, a missing mask). Without ``expected_numel`` or ``mask``
    the payload may describe at most :data:`MAX_NUMEL` coordinates: every check that
    bounds what decoding allocates runs before anything is allocated."""
    if max_bytes is not None and len(data) > max_bytes:
        raise InvalidUpdateError(f"payload of {len(data)} bytes exceeds the limit of {max_bytes}")
    n, k, has_mask = sparse_header(data)
    if mask is not None and expected_numel is None:
        expected_numel = mask.numel()
    if expected_numel is not None and n != expected_numel:
        raise InvalidUpdateError(f"payload is for {n} coordinates, the model has {expected_numel}")
    if mask is not None and mask.numel() != n:
        raise InvalidUpdateError(f"payload is for {n} coordinates, the assigned mask has {mask.numel()}")
    if expected_numel is None and n > MAX_NUMEL:
        raise InvalidUpdateError(f"payload claims {n} coordinates, more than {MAX_NUMEL}; pass expected_numel")
    if k > n:
        raise InvalidUpdateError(f"payload claims {k} of {n} coordinates")
    code_bytes = len(data) - HEADER_BYTES - 4 * k
    if code_bytes < 0 or (not has_mask and code_bytes != 0):
        raise InvalidUpdateError(f"payload length {len(data)} does not match its header")
    body = memoryview(data)[HEADER_BYTES:]
    if has_mask:
        out_mask = decode_mask(body[:code_bytes], n)
        kept = int(np.count_nonzero(out_mask.numpy()))
        if kept != k:
            raise InvalidUpdateError(f"mask code keeps {kept} coordinates; the payload holds {k} values")
    else:
        if mask is None:
            raise InvalidUpdateError("payload carries no mask and no assigned mask was given")
        kept = _count(mask)
        if kept != k:
            raise InvalidUpdateError(f"payload holds {k} values; the assigned mask keeps {kept}")
        out_mask = mask
    values = np.frombuffer(body[code_bytes:], dtype="<f4").astype(np.float32)  # a copy: writable
    return out_mask, torch.from_numpy(values)

