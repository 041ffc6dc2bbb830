"""Per-message overhead in the virtual clock (network.message_bytes, network.message_latency;
issue 43): hand-computed transfer times, nothing changes at the defaults, and a whole
synchronous run's rounds lengthen by exactly the latency of its two messages."""

from __future__ import annotations

import pytest

from conftest import simulate, tiny_config
from fedgmr.errors import ConfigError
from fedgmr.methods import resolve_config
from fedgmr.sim.network import MB, Network


def _net(**kw) -> Network:
    # tier 1: 20 MB/s down, 5 MB/s up; server 10 MB/s up, 50 MB/s down
    return Network([1.0, 1.0], 20.0, 5.0, 10.0, 50.0, **kw)


def test_download_with_framing_and_latency_by_hand():
    net = _net(message_bytes=1 * MB, message_latency=0.25)
    # block 0 (2 MB) leaves the server in 0.2 s; client 0's framing (1 MB) 0.2 -> 0.3, client 1's 0.3 -> 0.4;
    # each client's own link carries 3 MB in 0.15 s; + 0.25 s latency
    finish = net.download_wave(0.0, [0, 1], [[0], [0]], [2 * MB])
    assert finish[0] == pytest.approx(0.3 + 0.25) and finish[1] == pytest.approx(0.4 + 0.25)


def test_upload_with_framing_and_latency_by_hand():
    net = _net(message_bytes=1 * MB, message_latency=0.25)
    seconds = net.upload_time(0, 4 * MB)
    assert seconds == pytest.approx(1.0)  # (4 + 1) MB at 5 MB/s
    # the server downlink carries 5 MB in 0.1 s from t = 1; the client's uplink is the bottleneck
    assert net.upload(1.0, seconds, 4 * MB) == pytest.approx(2.0 + 0.25)
    assert net.server_down.free_at == pytest.approx(1.1)


def test_no_overhead_by_default_is_the_old_clock_exactly():
    plain, zero = _net(), _net(message_bytes=0.0, message_latency=0.0)
    for net in (plain, zero):
        assert net.download_wave(0.0, [0, 1], [[0], [0, 1]], [2 * MB, 1 * MB]) == {0: 0.2, 1: 0.30000000000000004}
        assert net.upload(1.0, net.upload_time(0, 4 * MB), 4 * MB) == 1.8


def test_a_synchronous_round_lengthens_by_the_latency_of_its_two_messages():
    raw = tiny_config(method="fedavg", run={"max_steps": 3, "eval_every": 1})
    base, _ = simulate(raw)
    slow, _ = simulate({**raw, "network": {**raw["network"], "message_latency": 0.5}})
    assert [r["step"] for r in slow] == [r["step"] for r in base] == [0, 1, 2, 3]
    # download + upload: 2 x 0.5 s more per round, nothing else changes
    assert [s["time"] - b["time"] for b, s in zip(base, slow)] == pytest.approx([0.0, 1.0, 2.0, 3.0])
    assert [s["accuracy"] for s in slow] == [b["accuracy"] for b in base]
    assert [s["bytes_up"] for s in slow] == [b["bytes_up"] for b in base]  # byte counts stay payload bytes


def test_negative_overhead_is_refused():
    with pytest.raises(ConfigError, match="network.message_bytes"):
        resolve_config(tiny_config(network={"message_bytes": -1}))
    with pytest.raises(ValueError, match="must be >= 0"):
        Network([1.0], message_latency=-0.1)
