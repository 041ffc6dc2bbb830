"""Fault injection for tests and drills: a ClientApp reply mod that makes a node
misbehave, chosen by its node config key ``fedgmr-fault``.

Kinds: ``nan`` (a NaN value), ``shape`` (a payload for a model one coordinate larger),
``outside-mask`` (values at coordinates the server did not send), ``future-version``,
``stale-version`` (a version other than the one dispatched), ``unknown-client``,
``other-client`` (the reply claims another client's id: client 0, or 1 for client 0),
``oversized`` (a payload larger than any valid one), ``crash`` (the ClientApp raises),
``hang`` (it never answers: sleeps ``fedgmr-hang-seconds``, default 3600) and ``cycle``
(the malformed kinds in turn, one per reply).
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import torch

from fedgmr.algorithm.encoding import (
    decode_sparse,
    encode_sparse,
    mask_code_limit,
    payload_nbytes,
    sparse_header,
)

MALFORMED = ("nan", "shape", "outside-mask", "future-version", "unknown-client", "oversized", "stale-version")
KINDS = MALFORMED + ("other-client", "crash", "hang", "cycle")


def corrupt(fields: dict[str, Any], kind: str) -> dict[str, Any]:
    """Reply ``fields`` made malformed in the way ``kind`` names.

    A reply's payload is values only (the client does not echo the mask it was assigned),
    so the faults that need coordinates place the ``k`` values on the first ``k`` of the
    payload's ``N`` coordinates; where the payload carries a mask code, that mask is used."""
    out = dict(fields)
    n, k, has_mask = sparse_header(out["payload"])
    stand_in = torch.zeros(n, dtype=torch.bool)
    stand_in[:k] = True
    mask, values = decode_sparse(out["payload"], mask=None if has_mask else stand_in)
    if kind == "nan":
        values = values.clone()
        values[0] = float("nan")
        out["payload"] = encode_sparse(mask, values, send_mask=has_mask)
    elif kind == "shape":  # a payload for a model one coordinate larger
        out["payload"] = encode_sparse(torch.cat([mask, torch.ones(1, dtype=torch.bool)]),
                                       torch.cat([values, torch.zeros(1)]), send_mask=has_mask)
    elif kind == "outside-mask":  # report (with its mask code) every coordinate as trained
        full = torch.zeros(n)
        full[mask] = values
        wider = torch.ones(n, dtype=torch.bool)
        if k == n:  # a full-density client cannot step outside: claim a bigger model
            wider = torch.ones(n + 8, dtype=torch.bool)
            full = torch.cat([full, torch.zeros(8)])
        out["payload"] = encode_sparse(wider, full, send_mask=True)
    elif kind == "future-version":
        out["version"] = int(out["version"]) + 1000
    elif kind == "stale-version":
        out["version"] = int(out["version"]) - 1
    elif kind == "unknown-client":
        out["client"] = 10_000
    elif kind == "other-client":  # a forged identity: another (existing) client's id
        out["client"] = 1 if int(out["client"]) == 0 else 0
    elif kind == "oversized":  # larger than any valid reply (see payload.reply_limit)
        limit = payload_nbytes(n, mask_code_limit(n))
        out["payload"] = out["payload"] + bytes(limit + 1)
    else:
        raise ValueError(f"unknown fault kind {kind!r}; choose from {', '.join(KINDS)}")
    return out


def fault_mod(fields: dict[str, Any], node_config: Mapping[str, Any], count: int) -> dict[str, Any]:
    """Apply the node's configured fault (if any) to its ``count``-th reply."""
    kind = str(node_config.get("fedgmr-fault", "") or "")
    if not kind:
        return fields
    if kind == "crash":
        raise RuntimeError("fedgmr-fault=crash: this client fails on purpose")
    if kind == "hang":
        time.sleep(float(node_config.get("fedgmr-hang-seconds", 3600)))
        return fields
    if kind == "cycle":
        kind = MALFORMED[count % len(MALFORMED)]
    return corrupt(fields, kind)
