"""Fault injection for tests and drills: a ClientApp reply mod that makes a node
misbehave, chosen by its node config key ``fedgmr-fault``.

Kinds: ``nan`` (a NaN value), ``shape`` (a payload for a model one coordinate larger),
``outside-mask`` (values at coordinates the server did not send), ``future-version``,
``stale-version`` (a version other than the one dispatched), ``unknown-client``,
``oversized`` (a payload larger than any valid one), ``crash`` (the ClientApp raises),
``hang`` (it never answers: sleeps ``fedgmr-hang-seconds``, default 3600) and ``cycle``
(the malformed kinds in turn, one per reply).
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import torch

from fedgmr.algorithm.encoding import decode_sparse, encode_sparse, encoded_nbytes

MALFORMED = ("nan", "shape", "outside-mask", "future-version", "unknown-client", "oversized", "stale-version")
KINDS = MALFORMED + ("crash", "hang", "cycle")


def corrupt(fields: dict[str, Any], kind: str) -> dict[str, Any]:
    """Reply ``fields`` made malformed in the way ``kind`` names."""
    out = dict(fields)
    mask, values = decode_sparse(out["payload"])
    if kind == "nan":
        values = values.clone()
        values[0] = float("nan")
        out["payload"] = encode_sparse(mask, values)
    elif kind == "shape":
        out["payload"] = encode_sparse(torch.cat([mask, torch.ones(1, dtype=torch.bool)]),
                                       torch.cat([values, torch.zeros(1)]))
    elif kind == "outside-mask":
        full = torch.zeros(mask.numel())
        full[mask] = values
        wider = torch.ones_like(mask)
        if bool(mask.all()):  # a full-density client cannot step outside: claim a bigger model
            wider = torch.ones(mask.numel() + 8, dtype=torch.bool)
            full = torch.cat([full, torch.zeros(8)])
        out["payload"] = encode_sparse(wider, full)
    elif kind == "future-version":
        out["version"] = int(out["version"]) + 1000
    elif kind == "stale-version":
        out["version"] = int(out["version"]) - 1
    elif kind == "unknown-client":
        out["client"] = 10_000
    elif kind == "oversized":
        limit = encoded_nbytes(mask.numel(), mask.numel())
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
