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
def test_flower_run_across_the_testbed_and_its_teardown(tmp_path):
    """`fedgmr flower testbed` on two shaped nodes: the run completes, every node's link
    carried its traffic, the prediction and the comparison are written, nothing is left."""
    out = tmp_path / "out"
    res = subprocess.run([str(BIN / "fedgmr"), "flower", "testbed", str(_config(tmp_path)), "--out", str(out),
                          "--scale", "0.05", "--duration", str(scaled(120))], capture_output=True, text=True,
                         env=_env(), timeout=scaled(900))
    print(res.stdout[-4000:], res.stderr[-4000:])
    assert res.returncode == 0, res.stderr[-3000:]
    token = res.stdout.split("server namespace fgtb-")[1].split("-server")[0]
    assert _ours(f"fgtb-{token}") == ([], "")
    result = json.loads((out / "testbed.json").read_text())
    assert result["deployed"]["steps"] == 4 and result["deployed"]["replies"] >= 4
    assert result["simulated"]["steps"] >= 1  # the same time window, virtual
    for link in result["links"]:
        assert link["bytes_down"] > 0 and link["bytes_up"] > 0, link
    assert result["compute_seconds_per_round"] > 0
    assert (out / "deployed" / "metrics.jsonl").exists() and (out / "sim" / "metrics.jsonl").exists()
    assert (out / "accuracy.png").exists()
    # node i is client slot i: each link carried its own client's uploads (seen as bursts)
    transfers = json.loads((out / "transfers.json").read_text())
    for c in (0, 1):
        assert any(t["client"] == c and t["direction"] == "up" for t in transfers), transfers
    # every reply crossed its node's shaped uplink: wire bytes >= the payload the server counted
    assert sum(link["bytes_up"] for link in result["links"]) >= result["deployed"]["bytes_up"]
    assert "uploads per client, simulated" in res.stdout


@needs_netns
@pytest.mark.slow
def test_ctrl_c_tears_the_testbed_down(tmp_path):
    """SIGINT while the SuperLink and SuperNodes run: the command exits 130 and leaves no
    namespace, link or process."""
    out = tmp_path / "out"
    log = open(tmp_path / "testbed.log", "w")
    p = subprocess.Popen([str(BIN / "fedgmr"), "flower", "testbed", str(_config(tmp_path, steps=500)), "--out",
                          str(out), "--duration", "600", "--no-predict"], stdout=log, stderr=subprocess.STDOUT,
                         env=_env(), start_new_session=True)
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
