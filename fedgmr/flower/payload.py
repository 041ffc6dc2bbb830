"""What FedGMR puts in Flower messages, as flat ``{key: scalar | bytes}`` dicts.

Nothing here imports Flower: :mod:`fedgmr.flower.adapter` turns these dicts into a
Flower ``ConfigRecord`` and back. Tensors travel as raw little-endian bytes - the
sub-model as :func:`~fedgmr.algorithm.encoding.encode_sparse` (header, optional mask
code, float32 values), buffers as raw arrays with their dtype and shape - never pickle.

Payloads are what a real wire carries (SPEC §6.1):

* the instruction (download) always carries the mask code with the values: the ClientApp
  is stateless (Flower may start a process per message), so it never already holds the
  mask;
* the reply (upload) carries the values only, ``HEADER_BYTES + 4 k`` bytes: the server
  decodes them against the mask it assigned to that client (:func:`decode_reply`'s
  ``assigned``). A client that trained a *smaller* mask than assigned (``Reply.mask``)
  says so explicitly: ``encode_reply(..., send_mask=True)`` puts the mask code in the
  payload (its header flags it), and the strategy checks that it lies inside the
  assignment.

A train instruction carries the model version tag the reply must echo; the server uses it
for staleness and to reject replies for a version it never sent (future or mismatched).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from fedgmr.algorithm.encoding import HEADER_BYTES, decode_sparse, encode_sparse, mask_code_limit, payload_nbytes
from fedgmr.algorithm.maskinfo import gather
from fedgmr.errors import InvalidUpdateError
from fedgmr.strategy.messages import Reply
from fedgmr.training.local import TrainSettings

#: the name of the ConfigRecord holding FedGMR's fields, in instructions and replies
RECORD = "fedgmr"
_BUF = "buf."
#: buffer dtypes accepted on the wire (BatchNorm statistics and counters)
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64, "float16": torch.float16}
_SETTINGS = ("lr", "momentum", "weight_decay", "batch_size", "local_steps", "loss")


# ---------------------------------------------------------------------- buffers
def encode_buffers(buffers: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """``buf.<name>`` -> raw bytes, ``buf.<name>.dtype`` -> str, ``buf.<name>.shape`` -> ints."""
    out: dict[str, Any] = {}
    for name, t in buffers.items():
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise ValueError(f"buffer {name!r} has unsupported dtype {dtype}")
        arr = t.detach().cpu().contiguous().numpy()
        out[f"{_BUF}{name}"] = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        out[f"{_BUF}{name}.dtype"] = dtype
        out[f"{_BUF}{name}.shape"] = [int(s) for s in t.shape] or [-1]  # [-1]: a scalar
    return out


def decode_buffers(fields: Mapping[str, Any], expected: Mapping[str, torch.Tensor] | None = None,
                   max_bytes: int | None = None) -> dict[str, torch.Tensor]:
    """Inverse of :func:`encode_buffers`; with ``expected``, unknown names, wrong shapes
    or dtypes raise :class:`InvalidUpdateError`."""
    out: dict[str, torch.Tensor] = {}
    for key, raw in fields.items():
        if not key.startswith(_BUF) or key.endswith((".dtype", ".shape")):
            continue
        name = key[len(_BUF):]
        dtype_name = fields.get(f"{key}.dtype")
        shape = fields.get(f"{key}.shape")
        if not isinstance(raw, bytes) or dtype_name not in _DTYPES or not isinstance(shape, list):
            raise InvalidUpdateError(f"buffer {name!r} is malformed")
        if max_bytes is not None and len(raw) > max_bytes:
            raise InvalidUpdateError(f"buffer {name!r} of {len(raw)} bytes exceeds the limit of {max_bytes}")
        dims = [] if shape == [-1] else shape
        if any(not isinstance(d, int) or d < 0 for d in dims):
            raise InvalidUpdateError(f"buffer {name!r} has a bad shape {shape}")
        dtype = _DTYPES[dtype_name]
        np_dtype = np.dtype(str(dtype).removeprefix("torch.")).newbyteorder("<")
        if len(raw) != math.prod(dims) * np_dtype.itemsize:
            raise InvalidUpdateError(f"buffer {name!r}: {len(raw)} bytes for shape {dims}")
        t = torch.from_numpy(np.frombuffer(raw, dtype=np_dtype).astype(np_dtype.newbyteorder("="))).reshape(dims)
        if expected is not None:
            ref = expected.get(name)
            if ref is None:
                raise InvalidUpdateError(f"unknown buffer {name!r}")
            if tuple(t.shape) != tuple(ref.shape) or t.dtype != ref.dtype:
                raise InvalidUpdateError(f"buffer {name!r} is {t.dtype}{tuple(t.shape)}; "
                                         f"expected {ref.dtype}{tuple(ref.shape)}")
        out[name] = t.clone()
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


def encode_instruction(client: int, version: int, seed: int, kind: str, mask: torch.Tensor,
                       params: torch.Tensor, buffers: Mapping[str, torch.Tensor],
                       settings: TrainSettings, validate: bool = False) -> dict[str, Any]:
    """The fields of a train message: the sub-model ``params[mask]`` plus its mask code
    (always: the ClientApp holds no state between messages)."""
    fields: dict[str, Any] = {
        "client": int(client), "version": int(version), "seed": int(seed), "kind": kind,
        "validate": bool(validate), "model": encode_sparse(mask, gather(params, mask), send_mask=True),
    }
    for name in _SETTINGS:
        fields[f"train.{name}"] = getattr(settings, name)
    fields.update(encode_buffers(buffers))
    return fields


def decode_instruction(fields: Mapping[str, Any], base: TrainSettings) -> TrainInstruction:
    """Parse a train message (client side). ``base`` supplies task-specific settings
    (task, pad index) that the server does not send."""
    mask, values = decode_sparse(_bytes(fields, "model"))
    start = torch.zeros(mask.numel(), dtype=torch.float32)
    start[mask] = values
    overrides = {n: fields[f"train.{n}"] for n in _SETTINGS if f"train.{n}" in fields}
    settings = TrainSettings(**{**base.__dict__, **overrides})
    return TrainInstruction(_int(fields, "client"), _int(fields, "version"), _int(fields, "seed"),
                            str(fields.get("kind", "model")), mask, start, decode_buffers(fields),
                            settings, bool(fields.get("validate", False)))


# ---------------------------------------------------------------------- replies
def encode_reply(client: int, version: int, mask: torch.Tensor, values: torch.Tensor,
                 buffers: Mapping[str, torch.Tensor], num_samples: int, loss: float,
                 val_score: float | None = None, num_processed: int | None = None,
                 send_mask: bool = False) -> dict[str, Any]:
    """The fields of a train reply: the trained values at ``mask``, values only (the
    server holds the mask it assigned). ``send_mask=True`` is for a client reporting a
    smaller ``mask`` than it was assigned: the mask code then travels in the payload.

    ``num_samples`` is the client's training-set size; ``num_processed`` (optional) the
    samples its local steps went through."""
    fields: dict[str, Any] = {
        "client": int(client), "version": int(version), "num_samples": int(num_samples),
        "loss": float(loss), "payload": encode_sparse(mask, values, send_mask=send_mask),
    }
    if num_processed is not None:
        fields["num_processed"] = int(num_processed)
    if val_score is not None:
        fields["val_score"] = float(val_score)
    fields.update(encode_buffers(buffers))
    return fields


def reply_limit(numel: int, buffers: Mapping[str, torch.Tensor] | None = None) -> int:
    """Largest acceptable sparse payload for a model of ``numel`` coordinates: every
    value plus the largest mask code (no valid reply is larger)."""
    return payload_nbytes(numel, mask_code_limit(numel))


def decode_reply(fields: Mapping[str, Any], numel: int, kind: str,
                 expected_buffers: Mapping[str, torch.Tensor],
                 assigned: torch.Tensor | None = None) -> Reply:
    """Parse a reply (server side) into a :class:`Reply` for the strategy, which then
    checks versions, the mask, shapes and finiteness.

    ``assigned`` is the mask the server sent this client: a values-only payload must hold
    exactly its count of values (``Reply.mask`` is then None: the assignment). A payload
    carrying its own mask code gives ``Reply.mask`` (the strategy checks it lies inside the
    assignment). Malformed payloads (bad header, wrong model size, oversized, a value
    count other than the mask's, undecodable buffers, a bad ``num_processed``) raise
    :class:`InvalidUpdateError`."""
    payload = _bytes(fields, "payload")
    mask, values = decode_sparse(payload, expected_numel=numel, max_bytes=reply_limit(numel, expected_buffers),
                                 mask=assigned)
    reported = None if mask is assigned else mask
    biggest = max((t.numel() * t.element_size() for t in expected_buffers.values()), default=0)
    buffers = decode_buffers(fields, expected_buffers, max_bytes=biggest)
    val = fields.get("val_score")
    processed = None
    if "num_processed" in fields:
        processed = _int(fields, "num_processed")
        if processed <= 0:
            raise InvalidUpdateError(f"num_processed must be a positive integer, got {processed}")
    return Reply(_int(fields, "client"), _int(fields, "version"), values, _int(fields, "num_samples"), buffers,
                 kind, reported, float(fields.get("loss", float("nan"))),
                 None if val is None else float(val), num_processed=processed)


def _bytes(fields: Mapping[str, Any], key: str) -> bytes:
    v = fields.get(key)
    if not isinstance(v, bytes):
        raise InvalidUpdateError(f"field {key!r} is missing or not bytes")
    return v


def _int(fields: Mapping[str, Any], key: str) -> int:
    v = fields.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidUpdateError(f"field {key!r} is missing or not an integer")
    return v


__all__ = ["RECORD", "TrainInstruction", "encode_instruction", "decode_instruction", "encode_reply",
           "decode_reply", "encode_buffers", "decode_buffers", "reply_limit", "HEADER_BYTES"]
