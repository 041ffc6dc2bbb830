"""What FedGMR puts in Flower messages, as flat ``{key: scalar | bytes}`` dicts.

Nothing here imports Flower: :mod:`fedgmr.flower.adapter` turns these dicts into a
Flower ``ConfigRecord`` and back. Tensors travel as raw little-endian bytes - the
sub-model as :func:`~fedgmr.algorithm.encoding.encode_sparse` (header, optional mask
code, float32 values), buffers as raw arrays with their dtype and shape - never pickle.

Payloads are what a real wire carries (docs/reference.md §6.1):

* the instruction (download) always carries the mask code with the values: the ClientApp
  keeps no mask between messages (Flower may start a process per message; what it keeps
  is its client method's state, :mod:`fedgmr.flower.client`), so it never already holds
  the mask;
* the reply (upload) carries the values only, ``HEADER_BYTES + 4 k`` bytes: the server
  decodes them against the mask it assigned to that client (:func:`decode_reply`'s
  ``assigned``). A client that trained a *smaller* mask than assigned (``Reply.mask``)
  says so explicitly: ``encode_reply(..., send_mask=True)`` puts the mask code in the
  payload (its header flags it), and the strategy checks that it lies inside the
  assignment.

A train instruction carries the model version tag the reply must echo; the server uses it
for staleness and to reject replies for a version it never sent (future or mismatched).

Values beside the model (an assignment's ``Wire.beside`` vectors down, a client method's
extras up; docs/distributed.md, "What runs where") travel as ``extra.<name>``
fields of raw little-endian float32, each validated like the values: its exact count
(the coordinates it lies on, or the count the server declared), finite, names known.
They are counted on the wire as the simulator's network model counts them: 4 bytes per
value, with no header of their own (they share the payload's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NoReturn

import numpy as np
import torch

from fedgmr.algorithm.encoding import (HEADER_BYTES, decode_mask, decode_sparse, encode_mask, encode_sparse,
                                      mask_code_limit, payload_nbytes)
from fedgmr.algorithm.maskinfo import gather
from fedgmr.errors import InvalidUpdateError
from fedgmr.strategy.messages import Reply
from fedgmr.training.local import TrainSettings

#: the name of the ConfigRecord holding FedGMR's fields, in instructions and replies
RECORD = "fedgmr"
_BUF = "buf."
_EXTRA = "extra."
#: buffer dtypes accepted on the wire (BatchNorm statistics and counters)
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64, "float16": torch.float16}
#: dtypes a client's own state may hold (it never leaves the node: SCAFFOLD's mask ``held`` is bool)
STATE_DTYPES = {**_DTYPES, "bool": torch.bool, "int32": torch.int32, "uint8": torch.uint8,
                "bfloat16": torch.bfloat16}
_SETTINGS = ("lr", "momentum", "weight_decay", "batch_size", "local_steps", "loss")
#: the fields of a reply besides its ``buf.*`` buffers (anything else is rejected)
_REPLY_REQUIRED = ("client", "version", "num_samples", "loss", "payload")
_REPLY_OPTIONAL = ("num_processed", "val_score", "compute_s")
#: the fields of an instruction besides its ``train.*`` settings, ``buf.*`` buffers and ``extra.*`` values
_INSTRUCTION_FIELDS = ("client", "version", "seed", "kind", "validate", "model", "upload")
#: Flower's integers are signed 64-bit; nothing on the wire may exceed that
_INT64 = 1 << 63
#: largest local_steps / batch_size an instruction may ask of a client
_MAX_LOCAL_WORK = 1_000_000


# ---------------------------------------------------------------------- buffers
def encode_buffers(buffers: Mapping[str, torch.Tensor], prefix: str = _BUF,
                   dtypes: Mapping[str, torch.dtype] = _DTYPES) -> dict[str, Any]:
    """``buf.<name>`` -> raw bytes, ``buf.<name>.dtype`` -> str, ``buf.<name>.shape`` -> ints
    (``prefix`` replaces ``buf.``; ``dtypes``: the dtypes allowed)."""
    out: dict[str, Any] = {}
    for name, t in buffers.items():
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in dtypes:
            raise ValueError(f"buffer {name!r} has unsupported dtype {dtype}")
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits as int16
            t = t.view(torch.int16)
        arr = t.numpy()
        out[f"{prefix}{name}"] = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        out[f"{prefix}{name}.dtype"] = dtype
        out[f"{prefix}{name}.shape"] = [int(s) for s in t.shape] or [-1]  # [-1]: a scalar
    return out


def _buffer_names(fields: Mapping[str, Any], prefix: str = _BUF) -> set[str]:
    """Buffer names mentioned by any ``buf.*`` key (``buf.x``, ``buf.x.dtype``, ``buf.x.shape``)."""
    names = set()
    for key in fields:
        if isinstance(key, str) and key.startswith(prefix):
            rest = key[len(prefix):]
            names.add(rest[:-6] if rest.endswith((".dtype", ".shape")) else rest)
    return names


def decode_buffers(fields: Mapping[str, Any], expected: Mapping[str, torch.Tensor] | None = None,
                   max_bytes: int | None = None, prefix: str = _BUF,
                   dtypes: Mapping[str, torch.dtype] = _DTYPES) -> dict[str, torch.Tensor]:
    """Inverse of :func:`encode_buffers`. Every buffer needs all three of its fields with
    the right types (bytes, a known dtype name, a list of non-negative ints or ``[-1]``)
    and a byte count that matches them; with ``expected``, unknown names, wrong shapes or
    dtypes are rejected too. Anything malformed raises :class:`InvalidUpdateError`
    before the buffer is allocated."""
    out: dict[str, torch.Tensor] = {}
    for name in sorted(_buffer_names(fields, prefix)):
        key = f"{prefix}{name}"
        raw, dtype_name, shape = fields.get(key), fields.get(f"{key}.dtype"), fields.get(f"{key}.shape")
        if not isinstance(raw, bytes) or not isinstance(dtype_name, str) or dtype_name not in dtypes \
                or not isinstance(shape, list):
            raise InvalidUpdateError(f"buffer {name!r} is malformed (needs bytes, a dtype name and a shape list)")
        ref = None
        if expected is not None:
            ref = expected.get(name)
            if ref is None:
                raise InvalidUpdateError(f"unknown buffer {name!r}")
        if max_bytes is not None and len(raw) > max_bytes:
            raise InvalidUpdateError(f"buffer {name!r} of {len(raw)} bytes exceeds the limit of {max_bytes}")
        dims = [] if shape == [-1] else shape
        if not shape or len(dims) > 8 or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in dims):
            raise InvalidUpdateError(f"buffer {name!r} has a bad shape {_show(shape)}")
        dtype = dtypes[dtype_name]
        if ref is not None and (tuple(dims) != tuple(ref.shape) or dtype != ref.dtype):
            raise InvalidUpdateError(f"buffer {name!r} is {dtype}{_show(dims)}; expected {ref.dtype}{list(ref.shape)}")
        bf16 = dtype == torch.bfloat16
        np_dtype = np.dtype("int16" if bf16 else str(dtype).removeprefix("torch.")).newbyteorder("<")
        if len(raw) != math.prod(dims) * np_dtype.itemsize:
            raise InvalidUpdateError(f"buffer {name!r}: {len(raw)} bytes for shape {_show(dims)}")
        t = torch.from_numpy(np.frombuffer(raw, dtype=np_dtype).astype(np_dtype.newbyteorder("="))).reshape(dims)
        out[name] = t.view(torch.bfloat16) if bf16 else t
    return out


# ---------------------------------------------------------------------- extras
def encode_extras(extras: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """``extra.<name>`` -> the vector's values as raw little-endian float32 (flattened)."""
    out: dict[str, Any] = {}
    for name, t in extras.items():
        arr = t.detach().reshape(-1).to("cpu", torch.float32).contiguous().numpy()
        out[f"{_EXTRA}{name}"] = arr.astype("<f4", copy=False).tobytes()
    return out


def extra_names(fields: Mapping[str, Any]) -> set[str]:
    """The names of the ``extra.*`` fields of a message."""
    return {k[len(_EXTRA):] for k in fields if isinstance(k, str) and k.startswith(_EXTRA)}


def decode_extras(fields: Mapping[str, Any], at: Mapping[str, int], what: str, loose: Iterable[str] = (),
                  loose_total: int = 0) -> dict[str, torch.Tensor]:
    """The ``extra.*`` fields, each a finite float32 vector, validated before anything is
    allocated. Every name of ``at`` must be there with exactly that many values (the
    coordinates it lies on: SCAFFOLD's ``c`` and ``delta_c``); the names of ``loose`` may
    be there, holding ``loose_total`` values together, exactly (what the server declared:
    FedNova's one ``tau``). Any other name, a missing one, bytes that are not a whole
    number of float32 values, a wrong count or a NaN/Inf raises :class:`InvalidUpdateError`
    naming ``what`` (the side that declared them)."""
    loose = set(loose)
    names = extra_names(fields)
    for name in sorted(names):
        if name not in at and name not in loose:
            known = sorted(set(at) | loose)
            _bad(f"unexpected field {_EXTRA + name!r} ({what} exchanges "
                 f"{', '.join(known) if known else 'no values beside the model'})")
    for name in at:
        if name not in names:
            _bad(f"field {_EXTRA + name!r} is missing ({what} needs it)")
    total = 0
    for name in sorted(names):
        raw = fields[f"{_EXTRA}{name}"]
        if not isinstance(raw, bytes) or len(raw) % 4:
            _bad(f"field {_EXTRA + name!r} must be bytes of float32 values, got {_show(raw)}")
        if name in at and len(raw) // 4 != at[name]:
            _bad(f"field {_EXTRA + name!r} holds {len(raw) // 4} values; expected {at[name]}, one per coordinate "
                 f"of the values")
        if name not in at:
            total += len(raw) // 4
    if total != loose_total and (loose or total):
        _bad(f"the fields {', '.join(repr(_EXTRA + k) for k in sorted(names - set(at))) or '(none)'} hold {total} "
             f"values; {what} declared {loose_total}")
    out: dict[str, torch.Tensor] = {}
    for name in sorted(names):
        t = torch.from_numpy(np.frombuffer(fields[f"{_EXTRA}{name}"], dtype="<f4").astype(np.float32))
        if not bool(torch.isfinite(t).all()):
            _bad(f"field {_EXTRA + name!r} contains NaN or Inf")
        out[name] = t
    return out


# ---------------------------------------------------------------------- instructions
@dataclass(frozen=True)
class TrainInstruction:
    """A client's job as it travels to a ClientApp."""

    client: int  # the server's slot for this node (echoed back)
    version: int  # model version tag
    seed: int
    kind: str  # "model" or "delta"
    mask: torch.Tensor  # bool over the flat parameter vector
    start: torch.Tensor  # flat weights, zero outside the mask
    buffers: dict[str, torch.Tensor]
    settings: TrainSettings
    validate: bool = False
    #: full-length vectors sent beside the model (``Wire.beside``: SCAFFOLD's ``c``), zero outside ``mask``
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    #: the coordinates the reply carries (``Wire.reply_coords``; None: ``mask``); FedBN leaves BatchNorm out
    upload_mask: torch.Tensor | None = None


def encode_instruction(client: int, version: int, seed: int, kind: str, mask: torch.Tensor,
                       params: torch.Tensor, buffers: Mapping[str, torch.Tensor],
                       settings: TrainSettings, validate: bool = False,
                       extras: Mapping[str, torch.Tensor] | None = None,
                       upload_mask: torch.Tensor | None = None) -> dict[str, Any]:
    """The fields of a train message: the sub-model ``params[mask]`` plus its mask code
    (always: the ClientApp keeps no mask between messages), the full-length vectors of
    ``extras`` at the mask (``extra.<name>``: the values at the mask's coordinates, as the
    simulator counts them) and, when the reply is to carry other coordinates than the
    mask (``upload_mask``), that mask's code (``upload``)."""
    fields: dict[str, Any] = {
        "client": int(client), "version": int(version), "seed": int(seed), "kind": kind,
        "validate": bool(validate), "model": encode_sparse(mask, gather(params, mask), send_mask=True),
    }
    for name in _SETTINGS:
        fields[f"train.{name}"] = getattr(settings, name)
    fields.update(encode_buffers(buffers))
    for name, v in (extras or {}).items():
        if v.numel() != mask.numel():
            raise ValueError(f"extra {name!r} has {v.numel()} values; a vector beside the model has one per "
                             f"coordinate ({mask.numel()})")
    fields.update(encode_extras({name: gather(v.reshape(-1), mask) for name, v in (extras or {}).items()}))
    if upload_mask is not None:
        fields["upload"] = encode_mask(upload_mask)
    return fields


def decode_instruction(fields: Mapping[str, Any], base: TrainSettings, numel: int,
                       expected_buffers: Mapping[str, torch.Tensor] | None = None,
                       extras: Iterable[str] = ()) -> TrainInstruction:
    """Parse a train message (client side). ``base`` supplies task-specific settings
    (task, pad index) that the server does not send; ``numel`` is the size of the
    client's own model (required: it bounds what decoding may allocate), and
    ``expected_buffers`` its buffers; ``extras`` the names of the vectors the client's
    method reads beside the model (``needs_extras``): each must be there, one finite value
    per coordinate of the mask, and no other. Anything malformed - an unknown or missing
    field, a wrong type, a payload for another model size, a bad setting, an upload mask
    outside the mask - raises :class:`InvalidUpdateError`."""
    fields = _mapping(fields)
    for key in fields:
        if key in _INSTRUCTION_FIELDS or key.startswith((_BUF, _EXTRA)):
            continue
        if not (key.startswith("train.") and key[len("train."):] in _SETTINGS):
            _bad(f"unexpected field {key!r}")
    kind = fields.get("kind", "model")
    if not isinstance(kind, str) or kind not in ("model", "delta"):
        _bad(f"field 'kind' must be 'model' or 'delta', got {_show(kind)}")
    validate = fields.get("validate", False)
    if not isinstance(validate, bool):
        _bad(f"field 'validate' must be a bool, got {_show(validate)}")
    mask, values = decode_sparse(_bytes(fields, "model"), expected_numel=numel,
                                 max_bytes=payload_nbytes(numel, mask_code_limit(numel)))
    overrides = {n: _setting(fields, n) for n in _SETTINGS if f"train.{n}" in fields}
    settings = TrainSettings(**{**base.__dict__, **overrides})
    client, version = _int(fields, "client", 0), _int(fields, "version", 0)
    seed = _int(fields, "seed", 0)
    buffers = decode_buffers(fields, expected_buffers)
    start = torch.zeros(mask.numel(), dtype=torch.float32)
    start[mask] = values
    kept = int(values.numel())
    sent = decode_extras(fields, {name: kept for name in extras}, "the client method")
    full: dict[str, torch.Tensor] = {}
    for name, v in sent.items():
        full[name] = torch.zeros(mask.numel(), dtype=torch.float32)
        full[name][mask] = v
    upload = None
    if "upload" in fields:
        code = _bytes(fields, "upload")
        if len(code) > mask_code_limit(numel):
            _bad(f"field 'upload' of {len(code)} bytes exceeds the limit of {mask_code_limit(numel)}")
        upload = decode_mask(code, numel)
        if bool((upload & ~mask).any()):
            _bad("field 'upload' names coordinates outside the mask the instruction sent")
    return TrainInstruction(client, version, seed, kind, mask, start, buffers, settings, validate, full, upload)


def _setting(fields: Mapping[str, Any], name: str) -> Any:
    v = fields[f"train.{name}"]
    if name == "loss":
        if not isinstance(v, str) or v not in ("ce", "bce"):
            _bad(f"field 'train.loss' must be 'ce' or 'bce', got {_show(v)}")
        return v
    if name in ("batch_size", "local_steps"):
        return _int(fields, f"train.{name}", 1, _MAX_LOCAL_WORK)
    return _real(fields, f"train.{name}", 0.0)


# ---------------------------------------------------------------------- replies
def encode_reply(client: int, version: int, mask: torch.Tensor, values: torch.Tensor,
                 buffers: Mapping[str, torch.Tensor], num_samples: int, loss: float,
                 val_score: float | None = None, num_processed: int | None = None,
                 send_mask: bool = False, extras: Mapping[str, torch.Tensor] | None = None,
                 compute_s: float | None = None) -> dict[str, Any]:
    """The fields of a train reply: the trained values at ``mask``, values only (the
    server holds the mask it assigned). ``send_mask=True`` is for a client reporting a
    smaller ``mask`` than it was assigned: the mask code then travels in the payload.

    ``num_samples`` is the client's training-set size; ``num_processed`` (optional) the
    samples its local steps went through; ``extras`` the vectors its method sends beside
    the values (``extra.<name>``: SCAFFOLD's ``delta_c`` at the values' coordinates,
    FedNova's ``tau``); ``compute_s`` the seconds its local training took (reported for
    the testbed's per-message latency; the server never acts on it)."""
    fields: dict[str, Any] = {
        "client": int(client), "version": int(version), "num_samples": int(num_samples),
        "loss": float(loss), "payload": encode_sparse(mask, values, send_mask=send_mask),
    }
    if num_processed is not None:
        fields["num_processed"] = int(num_processed)
    if val_score is not None:
        fields["val_score"] = float(val_score)
    if compute_s is not None:
        fields["compute_s"] = float(compute_s)
    fields.update(encode_buffers(buffers))
    fields.update(encode_extras(extras or {}))
    return fields


def reply_limit(numel: int, buffers: Mapping[str, torch.Tensor] | None = None) -> int:
    """Largest acceptable sparse payload for a model of ``numel`` coordinates: every
    value plus the largest mask code (no valid reply is larger)."""
    return payload_nbytes(numel, mask_code_limit(numel))


def decode_reply(fields: Mapping[str, Any], numel: int, kind: str,
                 expected_buffers: Mapping[str, torch.Tensor],
                 assigned: torch.Tensor | None = None, extras: Iterable[str] = (),
                 loose: Iterable[str] = (), loose_total: int = 0) -> Reply:
    """Parse a reply (server side) into a :class:`Reply` for the strategy, which then
    checks versions, the mask, finiteness and the bounds on influence.

    ``assigned`` is the mask the server sent this client: a values-only payload must hold
    exactly its count of values (``Reply.mask`` is then None: the assignment). A payload
    carrying its own mask code gives ``Reply.mask`` (the strategy checks it lies inside the
    assignment).

    ``extras`` names the vectors the reply must carry beside its values, one per value
    (the assignment's ``Wire.reply_beside``); ``loose`` the others the client method may send
    (FedNova's ``tau``), ``loose_total`` values in all (the assignment's
    ``Wire.reply_plain``); see :func:`decode_extras`. They reach the strategy in
    ``Reply.extras``.

    One rule for every field: anything malformed raises :class:`InvalidUpdateError` -
    not a mapping, a missing or unknown field, a wrong type (bools are not numbers), an
    integer outside its range, a non-finite ``loss``, a ``val_score`` outside [0, 1], a bad
    payload (header, model size, length, oversized, value count, mask code), a buffer with
    a bad dtype, shape or byte count. Nothing else escapes."""
    fields = _mapping(fields)
    names = set(expected_buffers)
    for key in fields:
        if key in _REPLY_REQUIRED or key in _REPLY_OPTIONAL or key.startswith(_EXTRA):
            continue
        if key.startswith(_BUF):
            rest = key[len(_BUF):]
            base = rest[:-6] if rest.endswith((".dtype", ".shape")) else rest
            if rest in names or base in names:
                continue
        _bad(f"unexpected field {key!r}")
    for key in _REPLY_REQUIRED:
        if key not in fields:
            _bad(f"field {key!r} is missing")
    client, version = _int(fields, "client", 0), _int(fields, "version", 0)
    num_samples = _int(fields, "num_samples", 1)
    processed = _int(fields, "num_processed", 1) if "num_processed" in fields else None
    loss = _real(fields, "loss")
    val = _real(fields, "val_score", 0.0, 1.0) if "val_score" in fields else None
    if "compute_s" in fields:  # reported, never used: checked like every field
        _real(fields, "compute_s", 0.0, 1e6)
    payload = _bytes(fields, "payload")
    mask, values = decode_sparse(payload, expected_numel=numel, max_bytes=reply_limit(numel, expected_buffers),
                                 mask=assigned)
    reported = None if mask is assigned else mask
    biggest = max((t.numel() * t.element_size() for t in expected_buffers.values()), default=0)
    buffers = decode_buffers(fields, expected_buffers, max_bytes=biggest)
    sent = decode_extras(fields, {name: int(values.numel()) for name in extras}, "the server", loose, loose_total)
    return Reply(client, version, values, num_samples, buffers, kind, reported, loss, val, num_processed=processed,
                 extras=sent)


def _bad(reason: str) -> NoReturn:
    raise InvalidUpdateError(reason)


def _show(v: Any) -> str:
    """A short description of a rejected value (never the whole of a large one)."""
    if isinstance(v, (bytes, str, list, tuple, dict)) and len(v) > 8:
        return f"a {type(v).__name__} of length {len(v)}"
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 1 << 64:
        return f"an int of {v.bit_length()} bits"
    try:
        text = repr(v)
    except Exception:  # noqa: BLE001 - an object whose repr fails
        return f"a {type(v).__name__}"
    return text if len(text) <= 40 else f"a {type(v).__name__} {text[:37]}..."


def _mapping(fields: Any) -> Mapping[str, Any]:
    if not isinstance(fields, Mapping):
        _bad(f"the message is a {type(fields).__name__}, not a record of fields")
    for key in fields:
        if not isinstance(key, str):
            _bad(f"field name {_show(key)} is not a string")
    return fields


def _bytes(fields: Mapping[str, Any], key: str) -> bytes:
    v = fields.get(key)
    if not isinstance(v, bytes):
        _bad(f"field {key!r} is missing or not bytes")
    return v


def _int(fields: Mapping[str, Any], key: str, lo: int = -_INT64, hi: int = _INT64 - 1) -> int:
    """An integer field in [lo, hi] (a bool is not an integer here)."""
    v = fields.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        _bad(f"field {key!r} is missing or not an integer: {_show(v)}")
    if not lo <= v <= hi:
        _bad(f"field {key!r} must lie in [{lo}, {hi}], got {_show(v)}")
    return v


def _real(fields: Mapping[str, Any], key: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    """A finite number in [lo, hi] (int or float; not a bool)."""
    v = fields.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        _bad(f"field {key!r} is missing or not a number: {_show(v)}")
    try:
        f = float(v)
    except OverflowError:  # an int beyond the float range
        _bad(f"field {key!r} is out of range")
    if not math.isfinite(f) or not lo <= f <= hi:
        _bad(f"field {key!r} must be a finite number in [{lo}, {hi}], got {_show(v)}")
    return f


__all__ = ["RECORD", "STATE_DTYPES", "TrainInstruction", "encode_instruction", "decode_instruction", "encode_reply",
           "decode_reply", "encode_buffers", "decode_buffers", "encode_extras", "decode_extras", "extra_names",
           "reply_limit", "HEADER_BYTES"]
