"""The emulated testbed (fedgmr.flower.testbed): network namespaces joined by veth pairs
shaped with tc tbf, a timed TCP transfer over each shaped direction, a short Flower run
across it, and the tear-down - after a normal exit, an exception and Ctrl-C - leaving no
namespace, link or process behind.

Traffic goes only between addresses the testbed makes inside its own namespaces
(10.77.<i>.1/2) and to loopback inside them. Needs root, ``ip`` and ``tc``: skipped with
the reason elsewhere (the refusal itself is tested everywhere).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import scaled, timeout_scale

from fedgmr.flower import testbed as tb

BIN = Path(sys.executable).parent
REASON = tb.unavailable_reason()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"no testbed here: {REASON}")


def _ours(token: str) -> tuple[list[str], str]:
    """Namespaces and root-namespace links whose names carry the testbed's ``token``."""
    names = [n for n in tb.list_namespaces() if token in n]
    tok = token.split("-")[1]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=30).stdout
    return names, "\n".join(line for line in links.splitlines() if f"fg{tok}" in line)


def _wait_for(what: str, condition, timeout: float):
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)
    return value


# -- the refusal: everywhere ---------------------------------------------------------------
def test_refuses_in_one_line_without_root(monkeypatch, tmp_path):
    monkeypatch.setattr(tb.os, "geteuid", lambda: 1000)
    assert tb.unavailable_reason() == "the testbed needs root (network namespaces and tc); run it as root"
    with pytest.raises(tb.TestbedUnavailable, match="needs root"):
        with tb.ShapedNetwork([1e6], [1e6]):
            pass  # pragma: no cover
    from fedgmr.cli import app

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"method": "fedgmr", "data": {"name": "digits"}}))
    res = CliRunner().invoke(app, ["flower", "testbed", str(cfg), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines() == ["error: the testbed needs root (network namespaces and tc); run it "
                                               "as root"]


def test_refuses_without_ip_or_tc(monkeypatch):
    monkeypatch.setattr(tb.os, "geteuid", lambda: 0)
    real = tb.shutil.which
    monkeypatch.setattr(tb.shutil, "which", lambda name: None if name == "tc" else real(name))
    assert tb.unavailable_reason() == "the testbed needs `tc` (iproute2) on PATH"
    monkeypatch.setattr(tb.shutil, "which", lambda name: None)
    assert tb.unavailable_reason() == "the testbed needs `ip` (iproute2) on PATH"


def test_find_transfers_splits_a_byte_counter_into_bursts():
    """Bursts of a sampled counter: a pause longer than a few packets' time ends one; bursts
    below ``min_bytes`` (polls, acknowledgements) are left out."""
    rate = 10_000.0  # bytes/s: one 1514-byte frame every 0.15 s; a pause over 0.61 s splits
    series, t, v = [], 0.0, 0
    for _ in range(100):  # idle 1 s
        series.append((t, v))
        t += 0.01
    start1 = series[-1][0]
    for _ in range(200):  # 20 kB in 2 s
        t += 0.01
        v += 100
        series.append((t, v))
    end1 = t
    for _ in range(100):  # idle 1 s, then a 300-byte poll, idle 1 s
        t += 0.01
        series.append((t, v))
    t += 0.01
    v += 300
    series.append((t, v))
    for _ in range(100):
        t += 0.01
        series.append((t, v))
    bursts = tb.find_transfers(series, rate, min_bytes=3000)
    assert len(bursts) == 1
    assert bursts[0]["bytes"] == 20_000
    assert bursts[0]["start"] == pytest.approx(start1) and bursts[0]["seconds"] == pytest.approx(end1 - start1)
    assert len(tb.find_transfers(series, rate, min_bytes=100)) == 2


def test_find_transfers_trims_chatter_at_a_bursts_edges():
    """A SYN before and a FIN, then a poll, after a bulk transfer, each within the burst
    gap but cut off from the bulk by a pause, are not part of the transfer's time."""
    rate = 200_000.0  # 2 kB per 10 ms sample
    series, t, v = [(0.0, 0)], 0.0, 0
    t += 0.05
    v += 74  # SYN, 50 ms before the bulk
    series.append((t, v))
    t += 0.05
    series.append((t, v))
    bulk_start = t
    for _ in range(43):  # 86 kB in 0.43 s
        t += 0.01
        v += 2000
        series.append((t, v))
    bulk_end = t
    for extra in (66, 300):  # a FIN 0.1 s later, a poll's reply 0.1 s after that
        t += 0.1
        v += extra
        series.append((t, v))
    t += 1.0
    series.append((t, v))
    (burst,) = tb.find_transfers(series, rate, min_bytes=3000)
    assert burst["start"] == pytest.approx(bulk_start) and burst["seconds"] == pytest.approx(bulk_end - bulk_start)
    assert burst["bytes"] == 86_000
    # a slow link's last, partial frame is data, not chatter: kept
    slow = [(0.0, 0), *((0.15 * (i + 1), 1514 * (i + 1)) for i in range(10)), (1.5 + 0.07, 1514 * 10 + 634)]
    (burst,) = tb.find_transfers(slow, 10_000.0, min_bytes=3000)
    assert burst["bytes"] == 1514 * 10 + 634 and burst["seconds"] == pytest.approx(1.57)


def test_find_transfers_places_the_edges_between_late_samples():
    """With ``edges`` (the shaped wire rate), a sampler that ran late before the first and
    the last increment does not stretch the transfer: 20 kB at 100 kB/s are 0.2 s (not 0.68)."""
    rate = 100_000.0
    series = [(0.0, 0), (0.5, 0)]  # the sampler stalled: the next sample comes 0.3 s late
    series += [(0.8, 1000), *((0.8 + 0.01 * i, 1000 + 1000 * i) for i in range(1, 19)), (1.18, 20_000), (2.0, 20_000)]
    (plain,) = tb.find_transfers(series, rate, min_bytes=3000)
    (edged,) = tb.find_transfers(series, rate, min_bytes=3000, edges=rate)
    assert plain["seconds"] == pytest.approx(0.68) and plain["bytes"] == edged["bytes"] == 20_000
    assert edged["start"] == pytest.approx(0.79) and edged["seconds"] == pytest.approx(0.2)


def _transfer(client: int, direction: str, start: float, seconds: float, nbytes: float) -> dict:
    return {"client": client, "node": client, "tier": 1.0, "direction": direction, "time": start, "start": start,
            "end": start + seconds, "seconds": seconds, "bytes": nbytes, "shaped": seconds,
            "predicted_seconds": seconds, "predicted_bytes": nbytes, "payload_bytes": None, "message": None,
            "step": None}


def test_messages_are_matched_to_their_transfers_and_the_latency_is_fitted():
    """Hand-made records with a known answer: three replies whose round trips hold
    1.35, 0.65 and 1.05 s beyond their transfers and training (median 1.05: 0.525 s per
    message, charged on the download and on the upload), one with no download seen, a
    timeout, and a transfer of another client that belongs to no message."""
    t0 = 1_000_000.0
    transfers = [_transfer(0, "down", 1.0, 0.5, 90_000), _transfer(0, "up", 1.1, 0.3, 4_000),  # requests, ACKs
                 _transfer(0, "up", 3.0, 1.0, 95_000),
                 _transfer(0, "down", 10.0, 0.4, 90_000), _transfer(0, "up", 11.0, 0.8, 95_000),
                 _transfer(1, "down", 1.0, 2.0, 40_000), _transfer(1, "up", 20.0, 2.0, 40_000),
                 _transfer(1, "down", 30.0, 2.0, 40_000), _transfer(1, "up", 40.0, 2.0, 40_000)]

    def msg(iid: str, client: int, sent: float, replied: float, compute: float | None, outcome: str = "reply"):
        return {"instruction": iid, "node": 100 + client, "client": client, "step": 0, "sent": t0 + sent,
                "replied": t0 + replied, "round_trip": replied - sent, "bytes_down": 86_000, "bytes_up": 86_000,
                "compute_s": compute, "outcome": outcome}

    messages = [msg("a", 0, 0.95, 4.3, 0.5),  # 3.35 - 0.5 - 1.0 - 0.5 = 1.35
                msg("b", 0, 9.9, 12.45, 0.7),  # 2.55 - 0.4 - 0.8 - 0.7 = 0.65
                msg("c", 1, 18.0, 22.95, 0.0),  # 4.95 - 2.0 (no download seen) -> no latency
                msg("d", 1, 29.9, 44.95, 10.0),  # 15.05 - 2.0 - 2.0 - 10.0 = 1.05
                msg("e", 1, 50.0, 170.0, None, "timeout")]
    matched = tb.match_messages(transfers, messages, t0)
    by_id = {m["instruction"]: m for m in matched}
    assert by_id["a"]["latency_s"] == pytest.approx(1.35) and by_id["b"]["latency_s"] == pytest.approx(0.65)
    assert by_id["c"]["latency_s"] is None and by_id["c"]["down_s"] is None and by_id["c"]["up_s"] == 2.0
    assert by_id["d"]["latency_s"] == pytest.approx(1.05) and by_id["e"]["latency_s"] is None
    assert by_id["a"]["sent"] == pytest.approx(0.95) and by_id["a"]["down_wire_bytes"] == 90_000
    # the uplink burst inside the download is counted once: busy 1.5 s, not 1.8 s
    assert by_id["a"]["up_s"] == pytest.approx(1.3) and by_id["a"]["busy_s"] == pytest.approx(1.5)
    assert by_id["a"]["up_transfers"] == 2
    assert [t["message"] for t in transfers] == ["a", "a", "a", "b", "b", None, "c", "d", "d"]
    assert transfers[0]["payload_bytes"] == 86_000 and transfers[5]["payload_bytes"] is None
    fit = tb.fit_message_latency(matched)
    assert fit["n"] == 3 and fit["per_message"]["median"] == pytest.approx(1.05)
    assert fit["message_latency"] == pytest.approx(1.05 / 2)
    assert fit["compute_s"]["median"] == pytest.approx(0.7)
    assert tb.fit_message_latency([]) == {"n": 0, "message_latency": 0.0}
    # a negative median (transfers overlapping the training) fits no latency
    neg = [{**m, "latency_s": -0.2} for m in matched if m["latency_s"] is not None]
    assert tb.fit_message_latency(neg)["message_latency"] == 0.0


def test_the_comparison_table_has_a_column_per_prediction():
    ratios = {"1 down": {"measured/predicted": {"n": 3, "median": 1.1, "p25": 1.0, "p75": 1.2, "min": 1.0,
                                                "max": 1.3}}}
    at = {"step": 9, "accuracy": 0.9, "client_uploads": [5, 4]}
    result = {"at_time": {"time": 30.0, "deployed": {"step": 8, "accuracy": 0.85, "client_uploads": [4, 4]},
                          "simulated": at},
              "predictions": [{"name": f"p{i}", "dir": f"sim{i}", "compute_s": 0.1, "message_bytes": 1000.0 * i,
                               "message_latency": 0.25 * (i == 3), "at_time": at, "transfer_ratios": ratios}
                              for i in range(4)]}
    table = tb.comparison_table(result)
    assert "(4) p3" in table[3] and table[4].count("|") == 7
    assert any(line.startswith("| largest uploads deviation") and "20 %" in line for line in table)  # |4 - 5| / 5
    assert any("1.10 [1.00-1.20]" in line for line in table)


def test_fast_poll_starts_the_fast_polling_supernode_and_caps_the_pull_backoff(monkeypatch, tmp_path):
    """`--fast-poll S`: node i's SuperNode is `fedgmr flower supernode --poll-interval S --`
    followed by exactly the flower-supernode arguments it gets without it (the line
    `fedgmr flower commands --fast-poll S` prints), its SuperExec gets `--pull-backoff S`;
    unset, Flower's own flower-supernode and no back-off. That command line parses and
    hands Flower's entry point the arguments; a non-positive S is refused before anything
    is written. No namespaces needed."""
    args = ("/venv/bin", "10.77.1.1:9093", "/k/ca.crt", "/k/node-1.key", 1, 2, "/o/fedgmr.yaml", 0)
    plain_sn, plain_se = tb.node_commands(*args)
    assert plain_sn[0] == "/venv/bin/flower-supernode" and "--pull-backoff" not in plain_se
    flower_args = plain_sn[1:]
    assert flower_args == ["--superlink", "10.77.1.1:9093", "--root-certificates", "/k/ca.crt",
                           "--auth-supernode-private-key", "/k/node-1.key", "--node-config",
                           "partition-id=1 num-partitions=2", "--isolation", "process", "--host", "127.0.0.1",
                           "--port", "9094"]
    fast_sn, fast_se = tb.node_commands(*args, fast_poll=0.2)
    assert fast_sn == ["/venv/bin/fedgmr", "flower", "supernode", "--poll-interval", "0.2", "--", *flower_args]
    assert fast_se == [*plain_se, "--pull-backoff", "0.2"]
    assert fast_se[:6] == ["/venv/bin/fedgmr", "flower", "superexec", "--runtime-api-address", "127.0.0.1:9094",
                           "--insecure"]
    # the same launcher and back-off as the printed fast-polling deployment
    from fedgmr.flower.security import deployment_commands

    printed = deployment_commands(tmp_path, 2, fast_poll=0.2)
    line = shlex.split(printed["supernodes"][1])
    assert ["/venv/bin/" + line[0], *line[1:6]] == fast_sn[:6] and line[6] == "--superlink"
    assert shlex.split(printed["superexecs"][1])[-2:] == fast_se[-2:]
    assert "Flower's flower-supernode" in tb.polling_label(None)
    assert "--poll-interval 0.2" in tb.polling_label(0.2) and "pull-backoff 0.2" in tb.polling_label(0.2)

    # `fedgmr flower supernode` parses that line and runs Flower's entry point with its arguments
    flwr_cli = pytest.importorskip("flwr.supernode.cli")
    seen = {}

    def fake_flower_supernode():
        seen["argv"] = list(sys.argv)
        raise SystemExit(0)

    monkeypatch.setattr(flwr_cli, "flower_supernode", fake_flower_supernode)
    from fedgmr.cli import app

    res = CliRunner().invoke(app, fast_sn[1:])
    assert res.exit_code == 0, res.output
    assert seen["argv"] == ["flower-supernode", *flower_args]

    # a non-positive interval is refused before anything is made or written
    monkeypatch.setattr(tb, "unavailable_reason", lambda: None)
    out = tmp_path / "out"
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(tb.ConfigError, match="--fast-poll"):
            tb.run_testbed(_config(tmp_path), out, fast_poll=bad)
    assert not out.exists()


# -- shaped links -------------------------------------------------------------------------------
@needs_netns
@pytest.mark.slow
def test_shaped_transfers_take_the_shaped_time_and_nothing_is_left():
    """A TCP transfer of a known size over each direction of two shaped links takes
    size / rate (3 s each) within 0.6-1.6x (the upper bound widened on a loaded machine);
    the tc counters saw the bytes; afterwards no namespace or link of the testbed exists."""
    # node 2: a slow link and transfers smaller than a 64 kB GSO packet, which a shaper that
    # charges whole GSO packets after the fact (htb) lets through at line rate
    down, up = [1.0e6, 0.25e6, 10e3], [0.5e6, 0.125e6, 2.5e3]
    seconds = 3.0
    upper = min(4.0, 1.6 * timeout_scale())
    results = []
    with tb.ShapedNetwork(down, up) as net:
        token = net.token
        names, links = _ours(token)
        assert len(names) == 4 and net.server_ns in names and not links  # nothing in the caller's namespace
        for node in (0, 1, 2):
            for direction, rate in (("down", down[node]), ("up", up[node])):
                nbytes = int(rate * seconds)
                r = tb.measure_transfer(net, node, direction, nbytes, timeout=scaled(60))
                print(f"node {node} {direction}: {nbytes} B at {rate / 1e6:g} MB/s: measured {r['seconds']:.3f} s, "
                      f"shaped {r['shaped']:.3f} s, ratio {r['ratio']:.3f}")
                assert r["bytes"] == nbytes
                results.append((node, direction, r))
        counters = net.counters()
    for node, direction, r in results:
        assert 0.6 <= r["ratio"] <= upper, (node, direction, r)
        assert counters[node][direction] >= r["bytes"], counters
    assert _ours(token) == ([], "")


@needs_netns
def test_everything_is_removed_after_an_exception_inside():
    with pytest.raises(ZeroDivisionError):
        with tb.ShapedNetwork([1e6, 1e6], [1e6, 1e6]) as net:
            token = net.token
            sleeper = net.popen(net.nodes[1].namespace, ["sleep", "600"], "sleeper", Path("/tmp"))
            # and one not started through popen: the namespace's own pids are killed too
            stray = subprocess.Popen(["ip", "netns", "exec", net.nodes[0].namespace, "sleep", "600"],
                                     start_new_session=True)
            _wait_for("the stray process in node 0's namespace",
                      lambda: stray.pid in tb._namespace_pids(net.nodes[0].namespace), 30)
            assert len(_ours(token)[0]) == 3
            1 / 0
    assert sleeper.poll() is not None
    assert stray.wait(timeout=scaled(30)) is not None
    assert _ours(token) == ([], "")


@needs_netns
def test_stale_namespaces_of_a_killed_testbed_are_removed():
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"{tb.PREFIX}-{dead.pid}-beef-node0"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    try:
        assert name in tb.remove_stale_namespaces()
        assert name not in tb.list_namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


# -- the Flower deployment across it ----------------------------------------------------------------
def _config(tmp_path: Path, steps: int = 4) -> Path:
    raw = {"name": "testbed", "method": "fedgmr", "seed": 0,
           "data": {"name": "digits", "partition": "dirichlet", "alpha": 0.5},
           "model": {"name": "mlp", "options": {"hidden": [64]}},
           "clients": {"num_clients": 2, "heterogeneity": [1.0, 0.2]},
           "training": {"lr": 0.1, "local_steps": 10}, "restoration": {"check_interval": 2, "patience": 1},
           "coordination": {"trigger": "k", "k": 1}, "run": {"max_steps": steps, "eval_every": 2, "device": "cpu"}}
    path = tmp_path / "fedgmr.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONUNBUFFERED": "1",
            "FLWR_DISABLE_UPDATE_CHECK": "1"}


@needs_netns
@pytest.mark.slow
@pytest.mark.parametrize("fast_poll", [None, 0.2], ids=["flower-supernode", "fast-poll"])
def test_flower_run_across_the_testbed_and_its_teardown(tmp_path, fast_poll):
    """`fedgmr flower testbed` on two shaped nodes: the run completes, every node's link
    carried its traffic, the prediction and the comparison are written, nothing is left.
    Once with Flower's SuperNodes, once with `--fast-poll 0.2` (the fast-polling SuperNodes,
    their SuperExecs' and the ServerApp's pull back-off capped)."""
    out = tmp_path / "out"
    extra = ["--fast-poll", str(fast_poll)] if fast_poll else []
    res = subprocess.run([str(BIN / "fedgmr"), "flower", "testbed", str(_config(tmp_path)), "--out", str(out),
                          "--scale", "0.05", "--duration", str(scaled(120)), *extra], capture_output=True, text=True,
                         env=_env(), timeout=scaled(900))
    print(res.stdout[-4000:], res.stderr[-4000:])
    assert res.returncode == 0, res.stderr[-3000:]
    token = res.stdout.split("server namespace fgtb-")[1].split("-server")[0]
    assert _ours(f"fgtb-{token}") == ([], "")
    # this run's namespaces only: the other parametrisation may be running on another xdist worker
    assert not [n for n in tb.list_namespaces() if n.startswith(f"fgtb-{token}-")]
    result = json.loads((out / "testbed.json").read_text())
    assert result["fast_poll"] == fast_poll and f"SuperNodes: {tb.polling_label(fast_poll)}" in res.stdout
    supernode_log = (out / "logs" / "supernode0.log").read_text()
    server_log = (out / "deployed" / "server.log").read_text()
    if fast_poll:
        assert "its waits capped at 0.2 s" in supernode_log, supernode_log[-2000:]
        assert "asked for again after at most 0.2 s" in server_log
    else:
        assert "waits capped" not in supernode_log and "pull-backoff" not in server_log
    assert result["deployed"]["steps"] == 4 and result["deployed"]["replies"] >= 4
    assert result["simulated"]["steps"] >= 1  # the same time window, virtual
    for link in result["links"]:
        assert link["bytes_down"] > 0 and link["bytes_up"] > 0, link
    assert result["compute_seconds_per_round"] > 0
    assert (out / "deployed" / "metrics.jsonl").exists() and (out / "sim" / "metrics.jsonl").exists()
    assert (out / "accuracy.png").exists()
    # every reply crossed its node's shaped uplink: wire bytes >= the payload the server counted
    assert sum(link["bytes_up"] for link in result["links"]) >= result["deployed"]["bytes_up"]
    if fast_poll:
        # polls every 0.2 s cross each link with no pause of 0.25 s: find_transfers sees one
        # long burst per link, so transfers are not tied to messages (documented in §4)
        assert "per-transfer times and the latency fit are not reliable" in res.stdout
        return
    # node i is client slot i: each link carried its own client's uploads (seen as bursts)
    transfers = json.loads((out / "transfers.json").read_text())
    for c in (0, 1):
        assert any(t["client"] == c and t["direction"] == "up" for t in transfers), transfers
    assert "uploads per client, simulated" in res.stdout
    # every transfer is kept in testbed.json, tied to its message where it had one
    kept = result["transfers"]
    assert kept and all({"node", "direction", "bytes", "start", "end", "seconds", "predicted_seconds",
                         "payload_bytes", "message"} <= set(t) for t in kept)
    assert all(t["end"] >= t["start"] and 0 < t["seconds"] < 120 for t in kept)
    tied = [t for t in kept if t["message"] is not None and t["role"] == "payload"]
    assert tied and all(t["bytes"] >= 0.5 * t["payload_bytes"] for t in tied), tied
    assert all(t["bytes"] < 5 * t["payload_bytes"] + 50_000 for t in tied), tied
    assert {t["message"] for t in tied} == {m["instruction"] for m in result["messages"] if m["down_s"] is not None}
    replies = [m for m in result["messages"] if m["outcome"] == "reply"]
    assert len(replies) >= 4 and all(m["compute_s"] is not None and m["compute_s"] >= 0 for m in replies)
    assert all(0 < m["round_trip"] < 120 and m["bytes_down"] > 0 and m["bytes_up"] > 0 for m in replies)
    fit = result["latency_fit"]
    assert fit["n"] >= 1 and fit["message_latency"] >= 0
    assert [p["dir"] for p in result["predictions"]][-1] == "sim-latency"
    assert (out / "sim-latency" / "metrics.jsonl").exists() and "network.message_latency =" in res.stdout


def _sigint_default() -> None:
    """In the child: SIGINT back to its default. A suite started in the background
    (`pytest ... &` from a script) ignores SIGINT, its children inherit that, and the
    testbed would never see the Ctrl-C this test sends (tests/test_run_dir.py does the same)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@needs_netns
@pytest.mark.slow
def test_ctrl_c_tears_the_testbed_down(tmp_path):
    """SIGINT while the SuperLink and SuperNodes run: the command exits 130 and leaves no
    namespace, link or process."""
    out = tmp_path / "out"
    log = open(tmp_path / "testbed.log", "w")
    p = subprocess.Popen([str(BIN / "fedgmr"), "flower", "testbed", str(_config(tmp_path, steps=500)), "--out",
                          str(out), "--duration", "600", "--no-predict"], stdout=log, stderr=subprocess.STDOUT,
                         env=_env(), start_new_session=True, preexec_fn=_sigint_default)
    try:
        text = lambda: (tmp_path / "testbed.log").read_text()  # noqa: E731
        _wait_for("the testbed's start", lambda: "started the SuperLink" in text() or p.poll() is not None, 300)
        assert p.poll() is None, text()
        token = "fgtb-" + text().split("server namespace fgtb-")[1].split("-server")[0]
        names = _ours(token)[0]
        assert len(names) == 3
        pids = [pid for ns in names for pid in tb._namespace_pids(ns)]
        assert pids  # the SuperLink, SuperNodes, SuperExecs
        os.kill(p.pid, signal.SIGINT)
        assert p.wait(timeout=scaled(120)) == 130, text()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        log.close()
    print(text())
    assert "interrupted: the testbed's namespaces and processes were removed" in text()
    assert _ours(token) == ([], "")
    for pid in pids:
        assert not tb._pid_alive(pid), pid
