"""The testbed's simulator predictions (fedgmr.flower.testbed.predict_run, format_result)
with the transport's measured bytes per message (issue 43): every predicted transfer
carries them, uploads take their link time, and the comparison prints the third reading."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import tiny_config

pytest.importorskip("flwr", reason="the testbed module lives in fedgmr.flower: pip install 'fedgmr[flower]'")

from fedgmr.flower.testbed import format_result, predict_run  # noqa: E402


def test_predicted_transfers_carry_the_message_bytes(tmp_path: Path):
    raw = tiny_config(method="fedavg", clients={"num_clients": 4}, run={"max_steps": 2, "eval_every": 1})
    plain, t0 = predict_run(raw, tmp_path / "a", scale=0.01, compute=0.05, max_time=400.0)
    framed, t1 = predict_run(raw, tmp_path / "b", scale=0.01, compute=0.05, max_time=400.0, message_bytes=5000.0)
    first = {(t["client"], t["direction"]): t for t in t0[:8]}
    again = {(t["client"], t["direction"]): t for t in t1[:8]}
    assert set(first) == set(again) and len(first) == 8  # the first round: 4 downloads, 4 uploads
    for key, t in first.items():
        assert again[key]["bytes"] == t["bytes"] + 5000.0
        # 1 MB/s x tier x scale: tier 1 up at 5 MB/s x 0.01 = 50 kB/s -> 5000 bytes take 0.1 s more
        rate = t["bytes"] / t["seconds"]
        assert again[key]["seconds"] == pytest.approx(t["seconds"] + 5000.0 / rate)
    assert framed["time"] <= plain["time"] and framed["steps"] <= plain["steps"]


def test_the_comparison_prints_the_reading_with_bytes_per_message():
    ratio = {"median": 1.02, "p25": 1.0, "p75": 1.1, "n": 3}
    text = format_result({
        "deployed": {"steps": 60, "time": 175.9, "final_accuracy": 0.7521, "replies": 63, "timeouts": 0,
                     "restorations": 0},
        "message_bytes": 15234.0,
        "at_time_overhead": {"step": 71, "accuracy": 0.801, "client_uploads": [20, 14]},
        "transfer_ratios_overhead": {"1 down": {"measured/predicted": ratio}, "1 up": {"measured/predicted": ratio}},
    })
    assert ("simulated with the ClientApp time and 15,234 bytes per message (network.message_bytes, measured): "
            "steps 71, accuracy 80.10%, uploads per client [20, 14]") in text
    assert "measured/predicted with those bytes, median per tier/direction: 1 down 1.02, 1 up 1.02" in text
