"""Why do downloads on the testbed take longer than their shaped time? Plain TCP only.

Issue 43: on ``fedgmr flower testbed`` downloads took 1.04-1.81x the simulator's time while
uploads were close to 1. This times a download over one node's shaped link
(:func:`fedgmr.flower.testbed.measure_transfer`: connect to the receiver's last-byte
acknowledgement) under conditions a SuperNode meets, each against the same download on
a quiet link with the testbed's shaping:

* the uplink's rate: ``down/4`` (the testbed's tiers), ``down`` or ``50 x down`` (the
  download's ACKs cross the uplink);
* polls: a small request and reply (300 B each way) every 0.1 s on the same link while
  the download runs (a SuperNode polls the SuperLink);
* a saturating upload on the same node's uplink at the same time, with the testbed's
  uplink queue (30 s at the rate, at least 4 MB) and with a short one (0.2 s);
* the uplink token bucket's size (5 ms as the testbed's, and 100 ms).

It also times each download from the server end's byte counter, as the testbed does
(:class:`~fedgmr.flower.testbed.LinkSampler` + :func:`~fedgmr.flower.testbed.find_transfers`),
to see what that measurement adds. ``--bare --old-detector`` measures as the testbed did
before issue 43's fixes (links shaped at the payload rate, bursts untrimmed). Needs root,
``ip`` and ``tc``; everything it makes is removed on the way out. Run (as root):
``python benchmarks/testbed_downlink.py [--repeats 3] [--json rows.json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from fedgmr.flower import testbed as tb

_ECHO = r"""
import socket, sys, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2]))); srv.listen(8)
def serve(c):
    while True:
        b = c.recv(4096)
        if not b: return
        if sys.argv[3] == "echo": c.sendall(b"r" * len(b))
while True:
    c, _ = srv.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

_POLL = r"""
import socket, sys, time
host, port, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
while True:
    try:
        s = socket.create_connection((host, port), timeout=5); break
    except OSError:
        time.sleep(0.1)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
if kind == "poll":
    while True:
        s.sendall(b"p" * 300); got = 0
        while got < 300: got += len(s.recv(4096))
        time.sleep(0.1)
else:
    chunk = b"u" * 65536
    while True: s.sendall(chunk)
"""


def _shape(ns: str, dev: str, rate: float, burst: int, limit: int) -> None:
    tb._run(["tc", "-n", ns, "qdisc", "change", "dev", dev, "root", "handle", "1:", "tbf", "rate",
             f"{int(rate * 8)}bit", "burst", str(burst), "limit", str(limit)])


def _old_find_transfers(series: list[tuple[float, int]], rate: float, min_bytes: float) -> list[dict[str, float]]:
    """The testbed's burst detector before the fix (no trimming, no edges), for comparison."""
    gap, out = max(0.25, 4 * 1514 / rate), []
    start_t = last_t = None
    start_v = last_v = 0
    prev_t, prev_v = series[0]
    for t, v in series[1:]:
        if v > prev_v:
            if start_t is None or t - last_t > gap:
                if start_t is not None and last_v - start_v >= min_bytes:
                    out.append({"seconds": last_t - start_t})
                start_t, start_v = prev_t, prev_v
            last_t, last_v = t, v
        prev_t, prev_v = t, v
    if start_t is not None and last_v - start_v >= min_bytes:
        out.append({"seconds": last_t - start_t})
    return out


def _counter_seconds(sampler: tb.LinkSampler, node: int, rate: float, nbytes: int, t0: float,
                     t1: float, wire: float, old: bool) -> float | None:
    """The download's duration as the testbed measures it: the largest burst on the
    server end's tx counter between ``t0`` (before the receiver starts) and ``t1`` (the
    sender done) + 0.3 s."""
    series = [(t, v) for t, v in sampler.series(node, "down") if t0 <= t <= t1 + 0.3]
    bursts = (_old_find_transfers(series, rate, 0.5 * nbytes) if old
              else tb.find_transfers(series, rate, 0.5 * nbytes, edges=rate * wire))
    return max((b["seconds"] for b in bursts), default=None)


def run(repeats: int = 3, wire: float = tb.WIRE_PER_PAYLOAD, old: bool = False) -> list[dict[str, Any]]:
    """Every case on node 0 (tier 1 at --scale 0.01: 200 kB/s down) and node 1 (tier
    0.05: 10 kB/s down), links shaped at ``wire`` times the payload rate; returns one row
    per case, node and size (``old``: time the counter with the detector before the fix)."""
    down = [200e3, 10e3]
    sizes = {0: [86_000, 430_000], 1: [16_000]}
    rows = []
    cases: list[tuple[str, float, float, str]] = [  # name, uplink / downlink, uplink bucket seconds, background
        ("testbed shaping (up = down/4), quiet", 0.25, 0.005, ""),
        ("up = down", 1.0, 0.005, ""),
        ("up = 50 x down", 50.0, 0.005, ""),
        ("up = down/4, uplink bucket 100 ms", 0.25, 0.1, ""),
        ("up = down/4, polls every 0.1 s", 0.25, 0.005, "poll"),
        ("up = down/4, saturating upload, 30 s uplink queue", 0.25, 0.005, "upload"),
        ("up = down/4, saturating upload, 0.2 s uplink queue", 0.25, 0.005, "upload-short"),
    ]
    with tb.ShapedNetwork(down, [d / 4 for d in down], wire=wire) as net:
        logs = Path("/tmp") / f"testbed-downlink-{net.token}"
        logs.mkdir(exist_ok=True)
        sampler = tb.LinkSampler(net.server_ns, [link.server_dev for link in net.nodes], limit=3600)
        sampler.start()
        try:
            for name, up_factor, bucket, background in cases:
                for node, link in enumerate(net.nodes):
                    up = link.down * up_factor
                    limit = max(3000, int(up * 0.2)) if background == "upload-short" else tb._queue(up)
                    _shape(link.namespace, link.node_dev, up * wire, max(1600, int(up * wire * bucket)), limit)
                    bg = []
                    if background:
                        kind = "echo" if background == "poll" else "sink"
                        port = 5300 + node
                        bg.append(net.popen(net.server_ns, [sys.executable, "-c", _ECHO, link.server_ip, str(port),
                                                            kind], f"bg-server-{node}-{len(rows)}", logs))
                        time.sleep(0.5)
                        bg.append(net.popen(link.namespace, [sys.executable, "-c", _POLL, link.server_ip, str(port),
                                                             "poll" if background == "poll" else "upload"],
                                            f"bg-client-{node}-{len(rows)}", logs))
                        time.sleep(3.0)  # the upload fills its queue, the polls run
                    for nbytes in sizes[node]:
                        timed, counted = [], []
                        for _ in range(repeats):
                            t0 = time.time()
                            try:
                                r = tb.measure_transfer(net, node, "down", nbytes, timeout=120, port=5201)
                            except RuntimeError as exc:  # e.g. reset while its ACKs waited behind an upload
                                print(f"{name}: node {node}, {nbytes} B: failed ({str(exc)[-80:]})", flush=True)
                                continue
                            t1 = time.time()
                            time.sleep(0.6)  # the tail's samples are in; the next transfer starts apart
                            timed.append(r["ratio"])
                            c = _counter_seconds(sampler, node, link.down, nbytes, t0, t1, wire, old)
                            if c is not None:
                                counted.append(c / r["shaped"])
                        row = {"case": name, "node": node, "down_Bps": link.down, "up_Bps": up, "bytes": nbytes,
                               "shaped_s": nbytes / link.down, "ratio_sender": [round(x, 3) for x in timed],
                               "ratio_counter": [round(x, 3) for x in counted],
                               "median_sender": round(statistics.median(timed), 3) if timed else None,
                               "median_counter": round(statistics.median(counted), 3) if counted else None}
                        rows.append(row)
                        print(f"{name:<52} node {node} {nbytes / 1e3:>5.0f} kB ({row['shaped_s']:.2f} s shaped): "
                              f"sender {row['median_sender']}  counter {row['median_counter']}", flush=True)
                    for p in bg:
                        tb.os.killpg(p.pid, tb.signal.SIGKILL)
                        p.wait(timeout=10)
                    # back to the testbed's shaping
                    _shape(link.namespace, link.node_dev, link.up * wire, tb._burst(link.up * wire),
                           tb._queue(link.up * wire))
        finally:
            sampler.stop()
    return rows


def parser() -> argparse.ArgumentParser:
    """The command line (tests/test_benchmark_commands.py parses the documented ones with it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    ap.add_argument("--bare", action="store_true", help="shape at the payload rate (no allowance for headers)")
    ap.add_argument("--old-detector", action="store_true", help="time the counter as the testbed did before")
    return ap


if __name__ == "__main__":
    args = parser().parse_args()
    result = run(args.repeats, 1.0 if args.bare else tb.WIRE_PER_PAYLOAD, args.old_detector)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
