"""Decoders are bounded by the expected model size: a few crafted bytes claiming a
gigantic model are rejected before anything is allocated (the probe: a 38-byte message
made a ClientApp allocate 5 GB)."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import pytest
import torch
import yaml

from conftest import tiny_config
from fedgmr.algorithm.encoding import (
    HEADER_BYTES,
    MAX_NUMEL,
    decode_mask,
    decode_sparse,
    encode_sparse,
)
from fedgmr.errors import InvalidUpdateError
from fedgmr.training.local import TrainSettings

HEADER = struct.Struct("<4sBBII")
MHEAD = struct.Struct("<BII")
RICE = 0xA0 | 1
HUGE = 1 << 30


def crafted_38_bytes() -> bytes:
    """A well-formed-looking payload for a 2**30-coordinate model keeping 3 coordinates:
    header, a Rice mask code (b = 1, three gaps of 0) and three float32 values."""
    code = MHEAD.pack(RICE, HUGE, 3) + bytes([1, 0b11100000, 0b00000000])
    data = HEADER.pack(b"FGMR", 2, 1, HUGE, 3) + code + struct.pack("<3f", 1.0, 2.0, 3.0)
    assert len(data) == 38
    return data


def _peak_bytes(fn) -> tuple[int, BaseException | None]:
    """Peak traced allocation (numpy and Python objects) while ``fn`` runs, and what it raised."""
    tracemalloc.start()
    try:
        fn()
        raised = None
    except BaseException as exc:  # noqa: BLE001
        raised = exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak, raised


def test_the_crafted_message_claims_2_30_coordinates_and_is_rejected_without_allocating():
    data = crafted_38_bytes()
    for kw in ({}, {"expected_numel": 1000}, {"max_bytes": 1 << 20}):
        peak, raised = _peak_bytes(lambda: decode_sparse(data, **kw))
        assert isinstance(raised, InvalidUpdateError), kw
        assert peak < 64 * 1024, f"{peak} bytes traced while rejecting {kw}"
    # the mask code alone, without a size to expect
    peak, raised = _peak_bytes(lambda: decode_mask(data[HEADER_BYTES:-12]))
    assert isinstance(raised, InvalidUpdateError) and peak < 64 * 1024


def test_without_an_expected_size_only_small_models_decode():
    assert MAX_NUMEL <= 1 << 20
    small = torch.zeros(1000, dtype=torch.bool)
    small[:3] = True
    decode_sparse(encode_sparse(small, torch.ones(3)))  # fine: within the default cap
    big = torch.zeros(MAX_NUMEL + 1, dtype=torch.bool)
    big[:3] = True
    data = encode_sparse(big, torch.ones(3))
    with pytest.raises(InvalidUpdateError, match="pass expected_numel"):
        decode_sparse(data)
    mask, values = decode_sparse(data, expected_numel=MAX_NUMEL + 1)  # the receiver says what it expects
    assert mask.numel() == MAX_NUMEL + 1 and values.tolist() == [1.0] * 3


def test_the_client_decodes_instructions_against_its_own_model_size():
    from fedgmr.flower.payload import decode_instruction

    fields = {"client": 0, "version": 0, "seed": 1, "kind": "model", "validate": False,
              "model": crafted_38_bytes()}
    peak, raised = _peak_bytes(lambda: decode_instruction(fields, TrainSettings(), 690))
    assert isinstance(raised, InvalidUpdateError) and "690" in str(raised)
    assert peak < 64 * 1024
    with pytest.raises(TypeError):
        decode_instruction(fields, TrainSettings())  # type: ignore[call-arg]  # the size is required


def test_the_client_app_handler_rejects_the_crafted_message(tmp_path: Path):
    pytest.importorskip("flwr")
    from fedgmr.flower.client import train_handler, workload_for, load_run_config

    path = tmp_path / "fedgmr.yaml"
    path.write_text(yaml.safe_dump(tiny_config(clients={"num_clients": 4, "heterogeneity": "high"})))
    run_config = {"config": str(path)}
    workload_for(load_run_config(run_config))  # load the data first: measure the decode only
    fields = {"client": 0, "version": 0, "seed": 1, "kind": "model", "validate": False,
              "model": crafted_38_bytes()}
    peak, raised = _peak_bytes(lambda: train_handler(fields, run_config, {"partition-id": 0}, 0))
    assert isinstance(raised, InvalidUpdateError), raised
    assert "coordinates" in str(raised)
    assert peak < 1 << 20
