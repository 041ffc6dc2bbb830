"""The byte rule of fedgmr.strategy.wire, by hand: one rule read from the assignment's
Wire, whatever the method (docs/reference.md §6.1)."""

from __future__ import annotations

import torch

from fedgmr.algorithm.encoding import HEADER_BYTES, payload_nbytes
from fedgmr.strategy.messages import Assignment, Wire
from fedgmr.strategy.wire import download_bytes, download_wave, upload_bytes

N = 10
CODE = 3.0  # a mask code's bytes in this stub


def _payload(values: int, mask: torch.Tensor | None) -> float:
    """A runtime's payload function: header and values, doubled (model_size_mb), plus a stub code."""
    return 2.0 * payload_nbytes(values) + (CODE if mask is not None else 0.0)


def _mask(k: int) -> torch.Tensor:
    m = torch.zeros(N, dtype=torch.bool)
    m[:k] = True
    return m


def _a(k: int = 4, changed: bool = False, level: int = 0, **wire) -> Assignment:
    return Assignment(0, 0, level, k / N, _mask(k), mask_changed=changed, wire=Wire(**wire))


def test_the_global_model_values_only_and_the_code_when_the_mask_changed():
    assert download_bytes(_a(4), _payload) == 2.0 * (HEADER_BYTES + 4 * 4)
    assert download_bytes(_a(4, changed=True), _payload) == 2.0 * (HEADER_BYTES + 4 * 4) + CODE
    assert upload_bytes(_a(4, changed=True), _payload) == 2.0 * (HEADER_BYTES + 4 * 4)  # never a code up


def test_vectors_beside_and_models_add_the_masks_count_and_values_sent_whole_add_4_bytes():
    c = torch.zeros(N)
    scaffold = _a(4, beside={"c": c}, reply_beside=("delta_c",))
    assert download_bytes(scaffold, _payload) == upload_bytes(scaffold, _payload) == 2.0 * (HEADER_BYTES + 2 * 4 * 4)
    model = (torch.zeros(N), {})
    ifca = _a(4, models=(model, model, model), reply_plain=3)
    assert download_bytes(ifca, _payload) == 2.0 * (HEADER_BYTES + 3 * 4 * 4)
    assert upload_bytes(ifca, _payload) == 2.0 * (HEADER_BYTES + 4 * 4) + 4 * 3  # losses never rescaled
    fedbn = _a(4, reply_coords=_mask(3))
    assert upload_bytes(fedbn, _payload) == 2.0 * (HEADER_BYTES + 4 * 3)


def test_no_model_values_sent_whole_are_their_own_payload_and_nothing_takes_no_bytes():
    nothing = _mask(0)
    fedmd = _a(4, models=(), plain={"consensus": torch.zeros(7)}, reply_coords=nothing, reply_plain=7)
    assert download_bytes(fedmd, _payload) == upload_bytes(fedmd, _payload) == payload_nbytes(7)
    first = _a(4, models=(), reply_coords=nothing, reply_plain=7)  # no consensus yet
    assert download_bytes(first, _payload) == 0.0
    local_only = _a(4, models=(), reply_coords=nothing)
    assert download_bytes(local_only, _payload) == upload_bytes(local_only, _payload) == 0.0


def test_a_wave_shares_level_blocks_only_when_everyone_gets_the_global_model():
    incs = [_mask(2), _mask(5) & ~_mask(2)]
    calls = []

    def increments():
        calls.append(1)
        return incs

    c = torch.zeros(N)
    wave = download_wave([_a(2, level=0, beside={"c": c}), _a(5, changed=True, level=1, beside={"c": c})],
                         _payload, increments)
    assert wave.blocks == [[0], [0, 1]]
    # c travels in every block; each block up to the highest changed level carries its code
    assert wave.block_bytes == [2.0 * payload_nbytes(2 * 2) + CODE, 2.0 * payload_nbytes(2 * 3) + CODE]
    assert wave.total == sum(wave.block_bytes)
    only_low = download_wave([_a(2, level=0), _a(2, level=0)], _payload, increments)
    assert only_low.blocks == [[0], [0]] and only_low.total == only_low.block_bytes[0]
    # a cluster model (or none) is no level block: one payload each, the increments never asked for
    calls.clear()
    own = download_wave([_a(2, models=((torch.zeros(N), {}),)), _a(5)], _payload, increments)
    assert not calls and own.blocks == [[0], [1]]
    assert own.block_bytes == [2.0 * payload_nbytes(2), 2.0 * payload_nbytes(5)]
    assert download_wave([_a(2), _a(5)], _payload).blocks == [[0], [1]]  # no IMS
