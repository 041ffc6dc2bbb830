"""An emulated testbed: the Flower deployment with every SuperNode behind a shaped link.

:class:`ShapedNetwork` makes one network namespace for the server side and one per node,
joins each node to the server namespace with a veth pair of its own (addresses
``10.77.<i>.1`` on the server side, ``10.77.<i>.2`` on the node side, /24, which exist only
inside these namespaces), and shapes each direction with a token bucket (``tbf``) at that node's rate:
the server end's egress is the node's downlink, the node end's egress its uplink
(``netem`` is not needed). It starts processes inside the namespaces (``ip netns exec``,
each in its own process group) and on leaving - normally, on an exception, on Ctrl-C -
stops them, kills whatever is still running inside its namespaces and deletes the
namespaces (which deletes the veth pairs). Nothing is made in the caller's namespace.

:func:`run_testbed` is ``fedgmr flower testbed``: a SuperLink in the server namespace, a
SuperNode and a warm SuperExec (``fedgmr flower superexec``) in each node's namespace,
``flwr run`` against the SuperLink, the run directory and the links' byte counters, and
the simulator's prediction of the same run (the emulated rates, the calibrated compute time
per local round, the real payload sizes).

Each node's rates are the simulator's: ``network.down_per_tier × d`` down and
``network.up_per_tier × d`` up (MB/s) for a node of initial density ``d``, times one
``scale``. The simulator's shared server links (``server_up``, ``server_down``) are not
emulated: the prediction sets them out of the way.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from fedgmr.errors import ConfigError

log = logging.getLogger(__name__)

MB = 1_000_000.0
#: every namespace this module makes is named ``fgtb-<pid>-<token>-...``
PREFIX = "fgtb"
SUBNET = "10.77"
MAX_NODES = 250


class TestbedUnavailable(RuntimeError):
    """Namespaces or shaping cannot be made here (not root, no ``ip``/``tc``, no tbf)."""


def _run(args: Sequence[str], timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed ({res.returncode}): {(res.stderr or res.stdout).strip()}")
    return res


def unavailable_reason() -> str | None:
    """Why a testbed cannot be made here (one line), or None when it can.

    Checks root, ``ip`` and ``tc`` on ``PATH``, then makes a probe namespace with a veth
    pair shaped by tbf and deletes it again."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the testbed needs root (network namespaces and tc); run it as root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the testbed needs `{tool}` (iproute2) on PATH"
    probe = f"{PREFIX}-{os.getpid()}-probe{secrets.token_hex(2)}"
    try:
        res = _run(["ip", "netns", "add", probe], check=False)
        if res.returncode != 0:
            return f"cannot make a network namespace: {(res.stderr or res.stdout).strip()}"
        try:
            res = _run(["ip", "-n", probe, "link", "add", "pa", "type", "veth", "peer", "name", "pb"], check=False)
            if res.returncode != 0:
                return f"cannot make a veth pair: {(res.stderr or res.stdout).strip()}"
            res = _run(["tc", "-n", probe, "qdisc", "add", "dev", "pa", "root", "handle", "1:", "tbf", "rate",
                        "1mbit", "burst", "1600", "limit", "100000"], check=False)
            if res.returncode != 0:
                return f"cannot shape a link with tc tbf: {(res.stderr or res.stdout).strip()}"
        finally:
            _run(["ip", "netns", "del", probe], check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot make a network namespace: {exc}"
    return None


def list_namespaces() -> list[str]:
    """The names ``ip netns list`` shows."""
    res = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


def remove_stale_namespaces() -> list[str]:
    """Delete testbed namespaces whose creating process is gone (a ``kill -9``'d testbed),
    killing what still runs inside them first; returns their names."""
    removed = []
    for name in list_namespaces():
        parts = name.split("-")
        if len(parts) < 3 or parts[0] != PREFIX or not parts[1].isdigit():
            continue
        if _pid_alive(int(parts[1])):
            continue
        _kill_namespace_pids(name)
        _run(["ip", "netns", "del", name], check=False)
        removed.append(name)
    return removed


def _namespace_pids(ns: str) -> list[int]:
    res = _run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in res.stdout.split() if p.isdigit()]


def _kill_namespace_pids(ns: str, grace: float = 5.0) -> None:
    """TERM, then KILL, every process inside namespace ``ns`` (one this module made)."""
    pids = _namespace_pids(ns)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        pids = [p for p in _namespace_pids(ns) if p in pids]
        if pids:
            time.sleep(0.1)
    for pid in _namespace_pids(ns):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


#: bytes on the wire (Ethernet 14 + IPv4 20 + TCP 32 with timestamps) per TCP payload byte
#: in full segments (MSS 1448 on an MTU of 1500): the links are shaped to the simulator's
#: rate times this, so that a transfer's payload goes at the simulator's rate. Shaped at the
#: bare rate, plain TCP downloads and uploads took 1.035-1.047x their time
#: (``benchmarks/testbed_downlink.py``)
WIRE_PER_PAYLOAD = 1514 / 1448


def _burst(rate: float) -> int:
    """Token bucket size in bytes: 5 ms at the rate, at least one full frame (a bigger
    bucket would let a slow link's first kilobytes through at line rate)."""
    return max(1600, int(rate * 0.005))


def _queue(rate: float) -> int:
    """Queue limit in bytes: 30 s at the rate, at least 4 MB."""
    return max(4_000_000, int(rate * 30))


@dataclass
class NodeLink:
    """One node's namespace and its veth pair to the server namespace."""

    index: int
    namespace: str
    server_dev: str
    node_dev: str
    server_ip: str
    node_ip: str
    down: float  # bytes/s, server -> node
    up: float  # bytes/s, node -> server

    def counters(self, server_ns: str) -> dict[str, int]:
        """Bytes sent so far through the shaping qdiscs: ``down`` (server end) and ``up`` (node end)."""
        return {"down": _class_bytes(server_ns, self.server_dev), "up": _class_bytes(self.namespace, self.node_dev)}


def _class_bytes(ns: str, dev: str) -> int:
    res = _run(["tc", "-n", ns, "-s", "qdisc", "show", "dev", dev], check=False)
    words = res.stdout.split()
    for i, w in enumerate(words):
        if w == "Sent" and i + 1 < len(words) and words[i + 1].isdigit():
            return int(words[i + 1])
    return 0


@dataclass
class ShapedNetwork:
    """A context manager: a server namespace and one namespace per node, joined by shaped
    veth pairs. ``down[i]``/``up[i]`` are node ``i``'s rates in bytes per second of TCP
    payload (each token bucket runs at ``wire`` times that: the packets' headers).

    Everything made is removed on leaving, whatever happened inside; processes started with
    :meth:`popen` are stopped first (their process groups), then anything else still inside
    the namespaces.
    """

    down: Sequence[float]
    up: Sequence[float]
    server_ns: str = ""
    nodes: list[NodeLink] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    procs: list[tuple[str, subprocess.Popen, Any]] = field(default_factory=list)
    wire: float = WIRE_PER_PAYLOAD

    def __post_init__(self) -> None:
        if len(self.down) != len(self.up):
            raise ValueError("one downlink and one uplink rate per node")
        if not 1 <= len(self.down) <= MAX_NODES:
            raise ValueError(f"the testbed takes 1 to {MAX_NODES} nodes, not {len(self.down)}")
        if not all(r > 0 for r in [*self.down, *self.up]):
            raise ValueError("every rate must be > 0 bytes/s")
        self.token = f"{os.getpid()}-{secrets.token_hex(2)}"

    # -- set-up and tear-down ---------------------------------------------------------
    def __enter__(self) -> "ShapedNetwork":
        reason = unavailable_reason()
        if reason:
            raise TestbedUnavailable(reason)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _add_ns(self, name: str) -> str:
        _run(["ip", "netns", "add", name])
        self.namespaces.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])
        return name

    def _build(self) -> None:
        tok = self.token.split("-")[1]
        self.server_ns = self._add_ns(f"{PREFIX}-{self.token}-server")
        for i, (down, up) in enumerate(zip(self.down, self.up)):
            ns = self._add_ns(f"{PREFIX}-{self.token}-node{i}")
            link = NodeLink(i, ns, f"fg{tok}s{i}", f"fg{tok}n{i}", f"{SUBNET}.{i}.1", f"{SUBNET}.{i}.2",
                            float(down), float(up))
            # made directly inside the two namespaces: nothing appears in the caller's
            _run(["ip", "link", "add", link.server_dev, "netns", self.server_ns, "type", "veth", "peer", "name",
                  link.node_dev, "netns", ns])
            for side_ns, dev, ip, rate in ((self.server_ns, link.server_dev, link.server_ip, link.down),
                                           (ns, link.node_dev, link.node_ip, link.up)):
                _run(["ip", "-n", side_ns, "addr", "add", f"{ip}/24", "dev", dev])
                _run(["ip", "-n", side_ns, "link", "set", dev, "up"])
                # tbf, not htb: with htb, transfers of tens of kB went through at 2-9x the
                # rate (docs/distributed.md section 4); tbf with a bucket smaller than a GSO
                # super-packet cuts it into frames and charges each. The queue is long
                # enough that TCP never loses a packet to it
                wire = rate * self.wire
                _run(["tc", "-n", side_ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate",
                      f"{int(wire * 8)}bit", "burst", str(_burst(wire)), "limit", str(_queue(wire))])
            self.nodes.append(link)

    def close(self) -> None:
        """Stop every process, then delete every namespace made (idempotent). A second
        Ctrl-C or SIGTERM while this runs is ignored, so that the tear-down completes."""
        main = threading.current_thread() is threading.main_thread()
        held = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
        try:
            self.stop_processes()
            for ns in reversed(self.namespaces):
                _kill_namespace_pids(ns)
                res = _run(["ip", "netns", "del", ns], check=False)
                if res.returncode != 0 and ns in list_namespaces():
                    log.warning("could not delete namespace %s: %s", ns, res.stderr.strip())
            self.namespaces.clear()
        finally:
            for s, h in held.items():
                signal.signal(s, h)

    # -- processes --------------------------------------------------------------------
    def popen(self, ns: str, args: Sequence[str], name: str, log_dir: Path, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.Popen:
        """Start ``args`` inside namespace ``ns`` in a process group of its own, stdout and
        stderr to ``log_dir/name.log``."""
        if ns not in self.namespaces:
            raise ValueError(f"{ns} is not a namespace of this testbed")
        out = open(Path(log_dir) / f"{name}.log", "w")
        try:
            p = subprocess.Popen(["ip", "netns", "exec", ns, *args], env=env, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd)
        except BaseException:
            out.close()
            raise
        self.procs.append((name, p, out))
        return p

    def stop_processes(self, grace: float = 10.0) -> None:
        for _, p, _ in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace
        for _, p, out in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("process %d did not exit after SIGKILL", p.pid)
            out.close()
        self.procs.clear()

    def counters(self) -> list[dict[str, int]]:
        return [link.counters(self.server_ns) for link in self.nodes]


@contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM (and SIGHUP) into KeyboardInterrupt while inside, so that ``finally``
    clauses - the testbed's tear-down - run as on Ctrl-C (SIGINT)."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    # a signal the caller ignores (``nohup`` ignores SIGHUP) stays ignored
    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)
           if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# -- measuring a transfer -------------------------------------------------------------------
_SINK = r"""
import socket, sys, time
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2]))); srv.listen(1); srv.settimeout(float(sys.argv[4]))
print("listening", flush=True)
conn, _ = srv.accept(); conn.settimeout(float(sys.argv[4]))
want, got, t0 = int(sys.argv[3]), 0, None
while got < want:
    b = conn.recv(1 << 16)
    if not b:
        break
    if t0 is None:
        t0 = time.monotonic()
    got += len(b)
t1 = time.monotonic()
conn.sendall(b"k"); conn.close()
print(f"{got} {t1 - (t0 or t1):.6f}", flush=True)
"""


def _send(ns: str, host: str, port: int, nbytes: int, timeout: float) -> float:
    """Send ``nbytes`` from namespace ``ns`` to ``host:port``; seconds from connect to the
    receiver's acknowledgement of the last byte."""
    code = r"""
import socket, sys, time
host, port, n, timeout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
deadline = time.monotonic() + timeout
while True:
    try:
        s = socket.create_connection((host, port), timeout=5); break
    except OSError:
        if time.monotonic() > deadline: raise
        time.sleep(0.1)
s.settimeout(timeout)
chunk = b"\0" * (1 << 16); t0 = time.monotonic(); left = n
while left > 0:
    sent = s.send(chunk[:min(left, len(chunk))]); left -= sent
s.recv(1)
print(f"{time.monotonic() - t0:.6f}", flush=True)
"""
    res = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code, host, str(port), str(nbytes),
                          str(timeout)], capture_output=True, text=True, timeout=timeout + 10)
    if res.returncode != 0:
        raise RuntimeError(f"sender failed: {res.stderr.strip()[-500:]}")
    return float(res.stdout.split()[-1])


def measure_transfer(net: ShapedNetwork, node: int, direction: str, nbytes: int, timeout: float = 120.0,
                     port: int = 5201) -> dict[str, float]:
    """Time a TCP transfer of ``nbytes`` over node ``node``'s shaped link: ``direction``
    "down" (server namespace -> node) or "up". Bounded by ``timeout`` seconds. Returns the
    measured seconds (sender: connect to the receiver's last-byte ack), the shaped time
    ``nbytes / rate`` and the bytes the receiver counted."""
    link = net.nodes[node]
    if direction == "down":
        recv_ns, recv_ip, send_ns, rate = link.namespace, link.node_ip, net.server_ns, link.down
    elif direction == "up":
        recv_ns, recv_ip, send_ns, rate = net.server_ns, link.server_ip, link.namespace, link.up
    else:
        raise ValueError("direction is 'down' or 'up'")
    sink = subprocess.Popen(["ip", "netns", "exec", recv_ns, sys.executable, "-c", _SINK, recv_ip, str(port),
                             str(nbytes), str(timeout)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        line = sink.stdout.readline()  # "listening" (or EOF when it failed); bounded by its own timeout
        if "listening" not in line:
            raise RuntimeError(f"receiver did not start: {sink.stderr.read()[-500:]}")
        seconds = _send(send_ns, recv_ip, port, nbytes, timeout)
        out, err = sink.communicate(timeout=timeout)
        got = int(out.split()[-2]) if out.split() else 0
    finally:
        if sink.poll() is None:
            os.killpg(sink.pid, signal.SIGKILL)
            sink.wait(timeout=10)
    return {"bytes": float(got), "seconds": seconds, "shaped": nbytes / rate, "ratio": seconds / (nbytes / rate)}


# -- the Flower run ----------------------------------------------------------------------------
def tier_rates(cfg: Any, scale: float) -> tuple[list[float], list[float], list[float]]:
    """(tiers, down, up): each client's initial density and its emulated rates in bytes/s."""
    from fedgmr.sim.network import tier_densities

    tiers = tier_densities(cfg.clients.heterogeneity, cfg.clients.num_clients)
    down = [cfg.network.down_per_tier * d * scale * MB for d in tiers]
    up = [cfg.network.up_per_tier * d * scale * MB for d in tiers]
    return tiers, down, up


def calibrate_compute(cfg: Any, repeats: int = 5) -> float:
    """Median wall seconds of one client's local round (``training.local_steps`` steps of
    the full model) on this machine, with the config's torch threads (1 when unset)."""
    import torch

    from fedgmr.algorithm.params import get_buffers
    from fedgmr.flower.client import workload_for
    from fedgmr.sim.executor import TrainJob

    torch.set_num_threads(cfg.run.torch_threads or 1)
    workload = workload_for(cfg)
    start = workload.space.flatten(workload.model).detach().clone()
    buffers = {k: v.clone() for k, v in get_buffers(workload.model).items()}
    times = []
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        workload.run(TrainJob(r % len(workload.client_data), 0, r, start, buffers, None))
        if r:  # the first one warms up
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


# -- watching the links --------------------------------------------------------------------------
CLONE_NEWNET = 0x40000000


class LinkSampler(threading.Thread):
    """Reads the byte counters of the server ends of every veth (``/proc/net/dev`` inside
    the server namespace: ``tx`` is what a node's downlink carried, ``rx`` its uplink)
    every ``interval`` seconds, for at most ``limit`` seconds. The thread enters the server
    namespace itself (``setns`` is per thread); the rest of the process stays where it is."""

    def __init__(self, ns: str, devs: Sequence[str], interval: float = 0.01, limit: float = 7200.0) -> None:
        super().__init__(daemon=True, name="testbed-link-sampler")
        self.ns, self.devs, self.interval, self.limit = ns, list(devs), interval, limit
        self.samples: list[tuple[float, list[int]]] = []  # (time.time(), [rx0, tx0, rx1, tx1, ...])
        self.error: str | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/var/run/netns/{self.ns}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns failed")
            finally:
                os.close(fd)
            path = "/proc/thread-self/net/dev"
            end = time.monotonic() + self.limit
            while not self._stop_event.is_set() and time.monotonic() < end:
                with open(path) as f:
                    text = f.read()
                now = time.time()
                row: dict[str, list[int]] = {}
                for line in text.splitlines()[2:]:
                    name, _, rest = line.partition(":")
                    fields = rest.split()
                    row[name.strip()] = [int(fields[0]), int(fields[8])]
                self.samples.append((now, [v for d in self.devs for v in row.get(d, [0, 0])]))
                self._stop_event.wait(self.interval)
        except Exception as exc:  # reported, never raised into the run
            self.error = f"{type(exc).__name__}: {exc}"

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)

    def series(self, node: int, direction: str) -> list[tuple[float, int]]:
        """(time, cumulative bytes) of node ``node``'s ``down`` (server tx) or ``up`` (server rx)."""
        col = 2 * node + (1 if direction == "down" else 0)
        return [(t, v[col]) for t, v in self.samples]


def transfer_gap(rate: float) -> float:
    """The pause (seconds) that ends a burst on a link of ``rate`` bytes/s
    (:func:`find_transfers`): a few frames' time, at least 0.25 s."""
    return max(0.25, 4 * 1514 / rate)


def find_transfers(series: Sequence[tuple[float, int]], rate: float, min_bytes: float,
                   edges: float | None = None) -> list[dict[str, float]]:
    """The bursts of a byte counter: runs of increases with no pause longer than a few
    packets' time at ``rate``; those of at least ``min_bytes``. Each has its start (the
    last sample before the first increase), its duration (to the last increase) and bytes.

    A burst's edges are trimmed of chatter (:func:`_trim`): small increments (under 1000 B:
    a SYN, a FIN, a protocol's headers or poll) cut off from the bulk by a pause much longer
    than their own time at ``rate``. Untrimmed, they added 0.14-0.26 s to plain TCP
    downloads of 16-430 kB (``benchmarks/testbed_downlink.py``).

    ``edges`` (bytes/s on the wire: the shaped rate) places the start and the end between
    their samples: the first increment cannot have taken less than its bytes at that rate
    after the sample before it, nor the last one before the sample before it. A sampler
    that was late (a loaded machine) then no longer stretches a transfer by its delay."""
    gap = transfer_gap(rate)
    out: list[dict[str, float]] = []
    run: list[tuple[float, int]] = []  # every sample from the one before the burst's first increase
    last_up = 0.0  # time of the burst's last increase

    def close() -> None:
        if len(run) < 2:
            return
        ups = [run[0]] + [p for q, p in zip(run, run[1:]) if p[1] > q[1]]
        kept = _trim(ups, rate)
        first, last = run.index(kept[1]), run.index(kept[-1])
        start_t, start_v = run[first - 1]  # the last sample before the first increase kept
        end_t = kept[-1][0]
        if edges is not None:  # the first and last increments went at the shaped rate at most
            start_t = max(start_t, run[first][0] - (run[first][1] - start_v) / edges)
            end_t = min(end_t, run[last - 1][0] + (kept[-1][1] - run[last - 1][1]) / edges)
        if kept[-1][1] - start_v >= min_bytes:
            out.append({"start": start_t, "seconds": end_t - start_t, "bytes": float(kept[-1][1] - start_v)})

    prev = (series[0] if series else (0.0, 0))
    for t, v in series[1:]:
        if v > prev[1]:
            if not run or t - last_up > gap:
                close()
                run = [prev]
            last_up = t
        if run:
            run.append((t, v))
        prev = (t, v)
    close()
    return out


#: increments of a byte counter under this many bytes may be chatter at a burst's edge
CHATTER_BYTES = 1000


def _trim(run: list[tuple[float, int]], rate: float) -> list[tuple[float, int]]:
    """A burst (the sample before it, then each increase) without its edge chatter: a
    first or last increment under :data:`CHATTER_BYTES` separated from its neighbour by
    more than three times its own time at ``rate`` plus 20 ms is dropped, repeatedly
    (``run``: the sample before the burst, then the sample of each increase)."""
    pts = list(run)

    def lone(nbytes: int, pause: float) -> bool:
        return nbytes < CHATTER_BYTES and pause > 3 * nbytes / rate + 0.02

    while len(pts) > 2 and lone(pts[-1][1] - pts[-2][1], pts[-1][0] - pts[-2][0]):
        pts.pop()
    while len(pts) > 2 and lone(pts[1][1] - pts[0][1], pts[2][0] - pts[1][0]):
        pts.pop(0)
    return pts


# -- the Flower run ----------------------------------------------------------------------------
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _wait_listen(ns: str, port: int, proc: subprocess.Popen, what: str, timeout: float) -> None:
    """Poll ``ss`` inside ``ns`` until something listens on ``port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited early (status {proc.returncode})")
        res = _run(["ip", "netns", "exec", ns, "ss", "-ltnH", f"sport = :{port}"], check=False)
        if res.stdout.strip():
            return
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout:.0f} s")


def _log_time(line: str) -> float | None:
    """The epoch time of a ``2026-12-05 12:00:00,123 ...`` log line."""
    import datetime as dt

    try:
        stamp = dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    except ValueError:
        return None
    return stamp.timestamp()


def polling_label(fast_poll: float | None) -> str:
    """How the testbed's SuperNodes poll, in words (its header and ``testbed.json``)."""
    if not fast_poll:
        return "Flower's flower-supernode (its own waits: work asked for every 3 s, pull back-off 1-10 s)"
    return (f"fast-polling, fedgmr flower supernode --poll-interval {fast_poll:g}; SuperExecs and ServerApp "
            f"pull-backoff {fast_poll:g} s")


def node_commands(bindir: str | Path, superlink: str, ca_cert: str | Path, key: str | Path, index: int, nodes: int,
                  warm_config: str | Path, seed: int | None = None, fast_poll: float | None = None,
                  runtime_port: int = 9094) -> tuple[list[str], list[str]]:
    """Node ``index``'s SuperNode and warm SuperExec command lines (argument lists, run
    inside its namespace): Flower's ``flower-supernode`` with TLS, its node key, its
    partition, ``--isolation process`` and its Runtime API on ``127.0.0.1:runtime_port``;
    with ``fast_poll`` the same arguments after ``fedgmr flower supernode --poll-interval
    S --``, and ``--pull-backoff S`` on the SuperExec (what ``fedgmr flower commands
    --fast-poll S`` prints)."""
    bindir = Path(bindir)
    flower_args = ["--superlink", superlink, "--root-certificates", str(ca_cert), "--auth-supernode-private-key",
                   str(key), "--node-config", f"partition-id={index} num-partitions={nodes}", "--isolation",
                   "process", "--host", "127.0.0.1", "--port", str(runtime_port)]
    if fast_poll:
        supernode = [str(bindir / "fedgmr"), "flower", "supernode", "--poll-interval", f"{fast_poll:g}", "--",
                     *flower_args]
    else:
        supernode = [str(bindir / "flower-supernode"), *flower_args]
    superexec = [str(bindir / "fedgmr"), "flower", "superexec", "--runtime-api-address",
                 f"127.0.0.1:{runtime_port}", "--insecure", "--warm-config", str(warm_config),
                 *(["--seed", str(seed)] if seed is not None else []),
                 *(["--pull-backoff", f"{fast_poll:g}"] if fast_poll else [])]
    return supernode, superexec


def run_testbed(config: str | Path, out: str | Path, nodes: int | None = None, scale: float = 1.0,
                duration: float = 300.0, steps: int | None = None, k: int | None = None,
                reply_timeout: float = 120.0, predict: bool = True, seed: int | None = None,
                echo: Any = print, fast_poll: float | None = None) -> dict[str, Any]:
    """Run the FedGMR config ``config`` on an emulated testbed; write ``out``.

    The SuperLink runs with TLS and SuperNode authentication: every node's key is
    registered before its SuperNode starts, so the node ids are known in advance and node
    ``i`` (namespace ``node<i>``, partition ``i``, the link of tier ``i``) is the server's
    client slot ``i`` (the ServerApp gives slots in the order of node ids).

    ``out`` gets ``deployed/`` (the Flower run directory), ``logs/`` (every process's log),
    ``keys/``, ``links.json`` (each node's tier, rates and bytes carried), ``transfers.json``
    (every transfer seen on the links), ``sim/`` (the simulator's prediction, unless
    ``predict`` is false) and ``testbed.json`` (the comparison), which is returned.

    With ``fast_poll`` (seconds) every SuperNode is the fast-polling one (``fedgmr flower
    supernode --poll-interval S -- <the same flower-supernode arguments>``), every warm
    SuperExec gets ``--pull-backoff S`` and the ServerApp's run config ``pull-backoff = S``,
    as ``fedgmr flower commands --fast-poll S`` prints a deployment (:func:`node_commands`);
    unset, Flower's own ``flower-supernode`` and back-offs.
    """
    import yaml

    from fedgmr.config import read_config_file
    from fedgmr.flower.project import write_app, write_flower_config
    from fedgmr.flower.security import make_credentials
    from fedgmr.methods import resolve_config

    reason = unavailable_reason()  # before anything is read or written
    if reason:
        raise TestbedUnavailable(reason)
    config = Path(config).resolve()
    raw = read_config_file(config)
    if nodes is not None:
        raw.setdefault("clients", {})["num_clients"] = nodes
    if steps is not None:
        raw.setdefault("run", {})["max_steps"] = steps
    if seed is not None:
        raw["seed"] = seed
    raw.setdefault("run", {})["device"] = "cpu"
    cfg = resolve_config(raw)
    n = cfg.clients.num_clients
    if not 1 <= n <= MAX_NODES:
        raise ConfigError(f"the testbed takes 1 to {MAX_NODES} nodes, not {n}")
    if not scale > 0:
        raise ConfigError(f"--scale must be > 0, got {scale}")
    if fast_poll is not None and not (fast_poll > 0 and math.isfinite(fast_poll)):
        raise ConfigError(f"--fast-poll must be a positive number of seconds, got {fast_poll}")
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} is not empty: name a new folder for the testbed's output")
    logs = out / "logs"
    logs.mkdir(parents=True)
    run_cfg_path = out / "fedgmr.yaml"
    run_cfg_path.write_text(yaml.safe_dump(raw))
    tiers, down, up = tier_rates(cfg, scale)
    removed = remove_stale_namespaces()
    if removed:
        echo(f"removed {len(removed)} namespace(s) left by a testbed that was killed: {', '.join(removed)}")

    bindir = Path(sys.executable).parent
    flwr_home = out / "flwr-home"
    env = {**os.environ, "FLWR_HOME": str(flwr_home), "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
           "RAY_USAGE_STATS_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "PYTHONUNBUFFERED": "1"}
    port = 9093
    deployed = out / "deployed"
    max_steps = cfg.run.max_steps or 50
    creds = make_credentials(out / "keys", n, ("127.0.0.1", "localhost",
                                               *(f"{SUBNET}.{i}.1" for i in range(n))))
    app = write_app(out / "app", {"config": str(run_cfg_path), "out-dir": str(deployed),
                                  "num-server-steps": max_steps, "reply-timeout": float(reply_timeout),
                                  "step-timeout": float(reply_timeout), "max-wall": float(duration),
                                  "node-wait": 300.0, **({"k": k} if k else {}),
                                  **({"pull-backoff": float(fast_poll)} if fast_poll else {})})
    write_flower_config(flwr_home, {"testbed": {"address": f"127.0.0.1:{port}",
                                                "root-certificates": str(creds.ca_cert)}})
    links: list[dict[str, Any]] = []
    sampler: LinkSampler | None = None
    t_start = time.monotonic()
    with terminate_on_sigterm(), ShapedNetwork(down, up) as net:
        echo(f"testbed: server namespace {net.server_ns}, {n} node namespace(s) {PREFIX}-{net.token}-node0..{n - 1}")
        echo(f"  SuperNodes: {polling_label(fast_poll)}")
        if fast_poll and fast_poll < max(transfer_gap(r) for r in [*down, *up]):
            echo(f"  warning: each idle SuperNode asks for work every {fast_poll:g} s across its link, more often "
                 f"than the pause of {max(transfer_gap(r) for r in [*down, *up]):.2f} s that separates transfers "
                 "on the slowest link: per-transfer times and the latency fit are not reliable")
        for link, d in zip(net.nodes, tiers):
            echo(f"  node {link.index}: tier {d:g}, {link.node_ip} <-> {link.server_ip}, down "
                 f"{link.down / MB:.4g} MB/s, up {link.up / MB:.4g} MB/s")
        sl = net.popen(net.server_ns, [str(bindir / "flower-superlink"), "--host", "0.0.0.0", "--port", str(port),
                                       "--database", str(out / "state.db"), "--disable-runtime-dependency-installation",
                                       "--ssl-ca-certfile", str(creds.ca_cert), "--ssl-certfile",
                                       str(creds.server_cert), "--ssl-keyfile", str(creds.server_key),
                                       "--enable-supernode-auth"], "superlink", logs, env, out)
        _wait_listen(net.server_ns, port, sl, "flower-superlink", 120)
        # register every key first: node ids known before any SuperNode starts
        ids = []
        for i, pub in enumerate(creds.node_pubs):
            reg = subprocess.run(["ip", "netns", "exec", net.server_ns, str(bindir / "flwr"), "supernode", "register",
                                  str(pub), "testbed"], env=env, cwd=out, capture_output=True, text=True, timeout=120)
            m = re.search(r"SuperNode (\d+) registered", reg.stdout + reg.stderr)
            if reg.returncode != 0 or not m:
                raise RuntimeError(f"flwr supernode register failed: {(reg.stdout + reg.stderr).strip()[-500:]}")
            ids.append(int(m.group(1)))
        key_of_slot = [creds.node_keys[j] for j in sorted(range(n), key=lambda j: ids[j])]
        for link in net.nodes:
            supernode, superexec = node_commands(bindir, f"{link.server_ip}:{port}", creds.ca_cert,
                                                 key_of_slot[link.index], link.index, n, run_cfg_path, seed,
                                                 fast_poll)
            sn = net.popen(link.namespace, supernode, f"supernode{link.index}", logs, env, out)
            _wait_listen(link.namespace, 9094, sn, f"supernode {link.index}", 120)
            net.popen(link.namespace, superexec, f"superexec{link.index}", logs, env, out)
        sampler = LinkSampler(net.server_ns, [link.server_dev for link in net.nodes], limit=duration + 3600)
        sampler.start()
        try:  # the sampler thread holds the server namespace: it ends before the namespace is deleted
            echo(f"started the SuperLink, {n} SuperNode(s) and their warm SuperExecs; flwr run (at most "
                 f"{duration:g} s)")
            run = net.popen(net.server_ns, [str(bindir / "flwr"), "run", str(app), "testbed", "--stream"],
                            "flwr-run", logs, env, out)
            deadline = time.monotonic() + duration + 600  # node wait, start-up, the final evaluation
            summary = None
            while (summary := _read_json(deployed / "summary.json")) is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no summary.json after {duration + 600:.0f} s; see {logs}")
                if run.poll() is not None and run.returncode != 0:
                    raise RuntimeError(f"flwr run failed (status {run.returncode}); see {logs / 'flwr-run.log'}")
                time.sleep(1.0)
        finally:
            sampler.stop()
        for link, d, c in zip(net.nodes, tiers, net.counters()):
            links.append({"node": link.index, "tier": d, "down_MBps": link.down / MB, "up_MBps": link.up / MB,
                          "bytes_down": c["down"], "bytes_up": c["up"]})
    echo(f"testbed torn down; deployed run took {time.monotonic() - t_start:.0f} s wall in all")
    (out / "links.json").write_text(json.dumps(links, indent=1))
    if sampler.error:
        echo(f"warning: the link sampler failed ({sampler.error}): no per-transfer times")
    # the loop's clock starts right after the "node(s) connected" line of server.log
    t0 = next((_log_time(line) for line in (deployed / "server.log").read_text().splitlines()
               if "node(s) connected" in line), None) or (sampler.samples[0][0] if sampler.samples else 0.0)
    result: dict[str, Any] = {"config": str(config), "method": cfg.method, "nodes": n, "scale": scale,
                              "fast_poll": fast_poll, "supernodes": polling_label(fast_poll),
                              "tiers": tiers, "links": links,
                              "deployed": {k: summary.get(k) for k in ("method", "steps", "time", "final_accuracy",
                                                                         "replies", "timeouts", "restorations",
                                                                         "bytes_up", "bytes_down")}}
    if predict:
        result.update(_predictions(raw, cfg, out, scale, sampler, t0, down, up, tiers, summary, duration, deployed,
                                   logs))
        (out / "link_counters.json").write_text(json.dumps({"devices": sampler.devs, "t0": t0,
                                                            "samples": sampler.samples}))
    (out / "testbed.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def _predictions(raw: dict[str, Any], cfg: Any, out: Path, scale: float, sampler: LinkSampler, t0: float,
                 down: Sequence[float], up: Sequence[float], tiers: Sequence[float], summary: dict[str, Any],
                 duration: float, deployed: Path, logs: Path) -> dict[str, Any]:
    """The simulator's four predictions of the deployed run and their comparison with it:
    (1) calibrated training time; (2) the ClientApp's measured time per message; (3) that
    and the measured bytes per message (``network.message_bytes``); (4) the training time
    the clients reported, those bytes and the fitted per-message latency
    (``network.message_latency``, :func:`fit_message_latency`). Also every transfer seen
    on the links, matched to its message (:func:`match_messages`)."""
    result: dict[str, Any] = {}
    wall = float(summary.get("time") or duration)
    compute = calibrate_compute(cfg)
    result["compute_seconds_per_round"] = compute
    result["t0"] = t0
    result["simulated"], predicted = predict_run(raw, out / "sim", scale, compute, wall)
    sent = summary.get("messages") or []
    first = compare(sampler, t0, down, up, tiers, predicted, deployed, out / "sim", logs, sent)
    measured = first.pop("transfers")
    messages = first.pop("messages", [])
    result.update(first)
    result["transfers"], result["messages"] = measured, messages
    (out / "transfers.json").write_text(json.dumps(measured, indent=1))
    fit = fit_message_latency(messages)
    result["latency_fit"] = fit
    runs = [{"name": "calibrated training time", "dir": "sim", "compute_s": compute, "message_bytes": 0.0,
             "message_latency": 0.0, "at_time": (first.get("at_time") or {}).get("simulated"),
             "transfer_ratios": first.get("transfer_ratios")}]
    # a second prediction with the ClientApp's own time per message on this machine
    # (training, Flower's Runtime API round trips, the fork, CPU contention), measured
    # by the warm SuperExecs: what is left of the gap is the network and the protocol
    apps = clientapp_seconds(logs)
    if apps:
        result["clientapp_seconds"] = _quantiles(apps)
        result["simulated_clientapp_time"], predicted2 = predict_run(raw, out / "sim-clientapp", scale,
                                                                     statistics.median(apps), wall)
        second = compare(sampler, t0, down, up, tiers, predicted2, deployed, out / "sim-clientapp", logs, sent)
        if second.get("at_time"):
            result["at_time_clientapp_time"] = second["at_time"]["simulated"]
        runs.append({"name": "measured ClientApp time", "dir": "sim-clientapp", "compute_s": statistics.median(apps),
                     "message_bytes": 0.0, "message_latency": 0.0, "at_time": result.get("at_time_clientapp_time"),
                     "transfer_ratios": second.get("transfer_ratios")})
    # the transport's bytes per message (network.message_bytes): the median of what each
    # measured transfer carried beyond its predicted payload (bursts beside a message's
    # payload left out), in payload bytes (the links
    # carry the packets' headers at WIRE_PER_PAYLOAD times the simulator's rate)
    extra = [t["bytes"] / WIRE_PER_PAYLOAD - t["predicted_bytes"] for t in measured if t.get("role") != "beside"]
    overhead = max(0.0, statistics.median(extra)) if extra else 0.0
    if apps and extra:
        result["message_bytes"] = overhead
        result["simulated_overhead"], predicted3 = predict_run(raw, out / "sim-overhead", scale,
                                                               statistics.median(apps), wall, message_bytes=overhead)
        third = compare(sampler, t0, down, up, tiers, predicted3, deployed, out / "sim-overhead", logs, sent)
        result["transfer_ratios_overhead"] = third.get("transfer_ratios")
        if third.get("at_time"):
            result["at_time_overhead"] = third["at_time"]["simulated"]
        runs.append({"name": "ClientApp time + bytes per message", "dir": "sim-overhead",
                     "compute_s": statistics.median(apps), "message_bytes": overhead, "message_latency": 0.0,
                     "at_time": result.get("at_time_overhead"), "transfer_ratios": third.get("transfer_ratios")})
    # the fourth: training time as reported, bytes per message and the fitted latency
    if fit.get("n"):
        train = fit["compute_s"]["median"]
        result["simulated_latency"], predicted4 = predict_run(raw, out / "sim-latency", scale, train, wall,
                                                              message_bytes=overhead,
                                                              message_latency=fit["message_latency"])
        fourth = compare(sampler, t0, down, up, tiers, predicted4, deployed, out / "sim-latency", logs, sent)
        result["transfer_ratios_latency"] = fourth.get("transfer_ratios")
        if fourth.get("at_time"):
            result["at_time_latency"] = fourth["at_time"]["simulated"]
        runs.append({"name": "reported training time + bytes + latency per message", "dir": "sim-latency",
                     "compute_s": train, "message_bytes": overhead, "message_latency": fit["message_latency"],
                     "at_time": result.get("at_time_latency"), "transfer_ratios": fourth.get("transfer_ratios")})
    result["predictions"] = runs
    result["plot"] = str(plot_comparison(deployed, [out / r["dir"] for r in runs], out / "accuracy.png",
                                         f"{cfg.method}: testbed vs simulator", [r["name"] for r in runs]))
    return result


def match_messages(transfers: list[dict[str, Any]], messages: Sequence[dict[str, Any]], t0: float,
                   slack: float = 0.1) -> list[dict[str, Any]]:
    """Tie each transfer seen on the links to the message it carried; returns the
    messages with their transfers' times and their latency.

    ``messages`` are the ServerApp's records (``summary.json``'s ``messages``: epoch
    ``sent``/``replied``, ``client``, ``bytes_down``/``bytes_up`` payload, ``compute_s``);
    ``transfers`` those of :func:`compare` (``start``/``end`` in seconds since ``t0``), which
    get ``message``, ``step``, ``payload_bytes`` and ``role``: ``payload`` for the largest
    burst of its message in its direction, ``beside`` for the others (requests and ACKs
    going up while a download comes down, a reply split by a pause). A client has one instruction in flight
    at a time, so every ``down`` transfer of its link that starts within ``slack`` seconds
    of ``[sent, replied]`` belongs to it, and every ``up`` transfer that ends there. A
    message's ``latency_s`` is its round trip less the time its link was busy with it
    (``busy_s``: all its transfers, either way, counted once where they overlap) and its
    reported compute time: None when a direction saw no transfer or the client reported
    no compute time."""
    out = []
    for m in sorted(messages, key=lambda m: m["sent"]):
        sent, replied = m["sent"] - t0, m["replied"] - t0
        rec = {**m, "sent": round(sent, 4), "replied": round(replied, 4)}
        mine = {"down": [], "up": []}
        for t in transfers:
            if t["client"] != m["client"] or t.get("message") is not None:
                continue
            at = t["start"] if t["direction"] == "down" else t["end"]
            if sent - slack <= at <= replied + slack:
                t["message"], t["step"] = m["instruction"], m.get("step")
                t["payload_bytes"] = m["bytes_down"] if t["direction"] == "down" else m["bytes_up"]
                mine[t["direction"]].append(t)
        for d in ("down", "up"):
            for i, t in enumerate(sorted(mine[d], key=lambda t: -t["bytes"])):
                t["role"] = "beside" if i else "payload"  # its largest burst that way carried the payload
            rec[f"{d}_s"] = round(sum(t["seconds"] for t in mine[d]), 4) if mine[d] else None
            rec[f"{d}_wire_bytes"] = sum(t["bytes"] for t in mine[d]) if mine[d] else None
            rec[f"{d}_transfers"] = len(mine[d])
        # the time its link was busy with it, either way: requests and ACKs that go up
        # while a download comes down (or the reverse) are not counted twice
        rec["busy_s"] = round(_union([(t["start"], t["end"]) for t in mine["down"] + mine["up"]]), 4)
        ok = m.get("outcome") == "reply" and rec["down_s"] is not None and rec["up_s"] is not None \
            and m.get("compute_s") is not None
        rec["latency_s"] = round(m["round_trip"] - rec["busy_s"] - m["compute_s"], 4) if ok else None
        out.append(rec)
    return out


def _union(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length of the union of ``(start, end)`` intervals."""
    total, reach = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def fit_message_latency(messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``network.message_latency`` from matched messages (:func:`match_messages`): the
    median of their ``latency_s`` (round trip beyond both transfers and the training
    time), halved, since the simulator adds it to each download and each upload; 0 when
    that median is negative. Also the quantiles of the per-message latency and of the
    reported compute time."""
    lat = [m["latency_s"] for m in messages if m.get("latency_s") is not None]
    if not lat:
        return {"n": 0, "message_latency": 0.0}
    comp = [m["compute_s"] for m in messages if m.get("latency_s") is not None]
    return {"n": len(lat), "message_latency": max(0.0, statistics.median(lat)) / 2,
            "per_message": _quantiles(lat), "compute_s": _quantiles(comp)}


def predict_run(raw: dict[str, Any], out: Path, scale: float, compute: float,
                max_time: float, message_bytes: float = 0.0,
                message_latency: float = 0.0) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The simulator's run of ``raw`` with the testbed's network: client rates scaled by
    ``scale``, real payload sizes (no ``model_size_mb``), shared server links out of the
    way, ``compute`` seconds per local round; up to ``max_time`` virtual seconds (the
    deployment's wall time, whatever its steps), ``message_bytes`` beside every payload
    (``network.message_bytes``), ``message_latency`` seconds added to every message
    (``network.message_latency``). Writes ``out/metrics.jsonl``; returns a summary and every
    predicted transfer (client, direction, start, bytes on the wire, seconds)."""
    from fedgmr.experiment.build import build_experiment
    from fedgmr.methods import resolve_config

    sim = json.loads(json.dumps(raw))
    net = sim.setdefault("network", {})
    net["down_per_tier"] = net.get("down_per_tier", 20.0) * scale
    net["up_per_tier"] = net.get("up_per_tier", 5.0) * scale
    net["server_up"] = net["server_down"] = 1e6
    net.pop("model_size_mb", None)
    net["compute"] = {"kind": "constant", "seconds_per_round": compute}
    if message_bytes:
        net["message_bytes"] = float(message_bytes)
    if message_latency:
        net["message_latency"] = float(message_latency)
    run = sim.setdefault("run", {})
    run.update({"max_time": max_time, "executor": "serial", "device": "cpu"})
    run.pop("max_steps", None)  # the same time window as the deployment, whatever the steps
    run["eval_every"] = run.get("eval_every") or 5  # the deployment's cadence
    for key in ("eval_interval", "eval_from"):
        run.pop(key, None)
    if run.get("t_star") and run["t_star"] > max_time:
        run.pop("t_star")
    cfg = resolve_config(sim)
    out.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    transfers: list[dict[str, Any]] = []
    exp = build_experiment(cfg, on_record=records.append)
    network, sim_ = exp.simulator.network, exp.simulator
    wave, up_time = network.download_wave, network.upload_time

    def download_wave(now, clients, blocks, block_bytes):
        for c, bl in zip(clients, blocks):
            total = sum(block_bytes[b] for b in bl) + network.message_bytes
            transfers.append({"client": c, "direction": "down", "start": now, "bytes": total,
                              "seconds": total / network.down[c]})
        return wave(now, clients, blocks, block_bytes)

    def upload_time(client, nbytes):
        seconds = up_time(client, nbytes)
        transfers.append({"client": client, "direction": "up", "start": sim_.now,
                          "bytes": nbytes + network.message_bytes, "seconds": seconds})
        return seconds

    network.download_wave, network.upload_time = download_wave, upload_time
    try:
        sim_.run(cfg.run.max_steps, cfg.run.max_time)
        sim_.finish()
    finally:
        exp.executor.close()
    (out / "metrics.jsonl").write_text("".join(json.dumps(r, default=float) + "\n" for r in records))
    (out / "config.yaml").write_text(__import__("yaml").safe_dump(sim))
    last = records[-1] if records else {}
    return ({"method": cfg.method, "steps": last.get("step"), "time": last.get("time"),
             "final_accuracy": last.get("accuracy"), "restorations": last.get("restorations"),
             "client_uploads": last.get("client_uploads")}, transfers)


def _records(d: Path) -> list[dict[str, Any]]:
    path = d / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _at(recs: list[dict[str, Any]], t: float) -> dict[str, Any]:
    before = [r for r in recs if r["time"] <= t]
    return before[-1] if before else recs[0]


def _quantiles(values: Sequence[float]) -> dict[str, float]:
    v = sorted(values)
    if not v:
        return {}
    q = lambda p: v[min(len(v) - 1, int(round(p * (len(v) - 1))))]  # noqa: E731
    return {"n": len(v), "median": statistics.median(v), "p25": q(0.25), "p75": q(0.75), "min": v[0], "max": v[-1]}


def compare(sampler: LinkSampler | None, t0: float, down: Sequence[float], up: Sequence[float],
            tiers: Sequence[float], predicted: list[dict[str, Any]], deployed: Path, simulated: Path,
            logs: Path, messages: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Measured transfers (bursts on each link's counters) against the simulator's, per
    tier and direction; uploads per client and accuracy at matching times. With the
    ServerApp's ``messages``, each transfer is tied to its message (:func:`match_messages`,
    returned as ``messages``) and the per-tier ratios leave out the bursts beside a
    message's payload."""
    n = len(tiers)
    transfers: list[dict[str, Any]] = []
    per_tier: dict[str, dict[str, Any]] = {}
    for c in range(n):
        for direction, rate in (("down", down[c]), ("up", up[c])):
            pred = [p for p in predicted if p["client"] == c and p["direction"] == direction]
            if not pred or sampler is None or not sampler.samples:
                continue
            smallest = min(p["bytes"] for p in pred)
            seen = find_transfers(sampler.series(c, direction), rate, max(3000.0, 0.5 * smallest),
                                  edges=rate * WIRE_PER_PAYLOAD)
            pred_med_s = statistics.median(p["seconds"] for p in pred)
            pred_med_b = statistics.median(p["bytes"] for p in pred)
            for m in seen:
                start = m["start"] - t0
                transfers.append({"client": c, "node": c, "tier": tiers[c], "direction": direction, "time": start,
                                  "start": round(start, 4), "end": round(start + m["seconds"], 4),
                                  "seconds": m["seconds"], "bytes": m["bytes"],
                                  "shaped": m["bytes"] / (rate * WIRE_PER_PAYLOAD),
                                  "predicted_seconds": pred_med_s, "predicted_bytes": pred_med_b,
                                  "payload_bytes": None, "message": None, "step": None})
    matched = match_messages(transfers, messages, t0) if messages else None
    for d in sorted(set(tiers), reverse=True):
        for direction in ("down", "up"):
            ts = [t for t in transfers if t["tier"] == d and t["direction"] == direction
                  and t.get("role") != "beside"]
            if ts:
                per_tier[f"{d:g} {direction}"] = {
                    "measured/predicted": _quantiles([t["seconds"] / t["predicted_seconds"] for t in ts]),
                    "measured/shaped(own bytes)": _quantiles([t["seconds"] / t["shaped"] for t in ts]),
                    "wire bytes/payload": _quantiles([t["bytes"] / t["predicted_bytes"] for t in ts])}
    dep, sim = _records(deployed), _records(simulated)
    out: dict[str, Any] = {"transfers": transfers, "transfer_ratios": per_tier}
    if matched is not None:
        out["messages"] = matched
    if dep and sim:
        end = min(dep[-1]["time"], sim[-1]["time"])
        a, b = _at(dep, end), _at(sim, end)
        ups = [sum(1 for t in transfers if t["client"] == c and t["direction"] == "up" and t["time"] <= end
                   and t.get("role") != "beside") for c in range(n)]
        out["at_time"] = {"time": end,
                          "deployed": {"step": a.get("step"), "accuracy": a.get("accuracy"),
                                       "uploads": a.get("uploads"), "restorations": a.get("restorations"),
                                       "client_uploads": a.get("client_uploads"),
                                       "client_uploads(seen on the links)": ups},
                          "simulated": {"step": b.get("step"), "accuracy": b.get("accuracy"),
                                        "uploads": b.get("uploads"), "restorations": b.get("restorations"),
                                        "client_uploads": b.get("client_uploads")}}
        grid = sorted({r["time"] for r in dep if r["time"] <= end})
        out["accuracy_vs_time"] = [{"time": t, "deployed": _at(dep, t)["accuracy"],
                                    "simulated": _at(sim, t)["accuracy"]}
                                   for t in grid]
    return out


def clientapp_seconds(logs: Path) -> list[float]:
    """Every ClientApp's time per message as the warm SuperExecs logged it."""
    found = []
    for path in sorted(Path(logs).glob("superexec*.log")):
        found += [float(x) for x in re.findall(r"ClientApp process \d+ done in ([\d.]+) s", path.read_text())]
    return found


def plot_comparison(deployed: Path, simulated: Path | Sequence[Path], path: Path, title: str = "",
                    names: Sequence[str] | None = None) -> Path:
    """Accuracy against seconds, deployed (wall clock) and simulated (virtual), on one plot
    (``names``: the simulated runs' labels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    sims = [simulated] if isinstance(simulated, (str, Path)) else list(simulated)
    labels = [f"simulator, {n} (virtual s)" for n in (names or ["calibrated training time", "measured ClientApp time",
                                                                 "ClientApp time + bytes per message"])]
    for d, label, style in ((deployed, "testbed (wall s)", "-"),
                            *((p, labels[min(i, len(labels) - 1)], "--") for i, p in enumerate(sims))):
        recs = _records(d)
        ax.plot([r["time"] for r in recs], [r["accuracy"] for r in recs], style, marker=".", label=label)
    ax.set_xlabel("seconds")
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _reading(at: dict[str, Any]) -> str:
    """A prediction at the comparison time: its steps, accuracy and uploads per client."""
    return (f"steps {at['step']}, accuracy {(at['accuracy'] or 0) * 100:.2f}%, uploads per client "
            f"{at['client_uploads']}")


def format_result(result: dict[str, Any]) -> str:
    """The comparison as a few lines of text (what ``fedgmr flower testbed`` prints)."""
    lines = []
    dep, sim = result.get("deployed", {}), result.get("simulated")
    lines.append(f"deployed: {dep.get('steps')} steps in {dep.get('time') or 0:.1f} s wall, final accuracy "
                 f"{(dep.get('final_accuracy') or 0) * 100:.2f}%, replies {dep.get('replies')}, timeouts "
                 f"{dep.get('timeouts')}, restorations {dep.get('restorations')}")
    if sim:
        lines.append(f"simulated: {sim.get('steps')} steps in {sim.get('time') or 0:.1f} s virtual, final accuracy "
                     f"{(sim.get('final_accuracy') or 0) * 100:.2f}%, restorations {sim.get('restorations')} "
                     f"(compute {result.get('compute_seconds_per_round', 0):.3f} s per local round, calibrated)")
    ratios = result.get("transfer_ratios") or {}
    if ratios:
        lines.append("tier/direction  transfers  measured/predicted median [p25, p75]  measured/shaped(own bytes)  "
                     "wire bytes/payload")
        for key, r in ratios.items():
            a, b, c = r["measured/predicted"], r["measured/shaped(own bytes)"], r["wire bytes/payload"]
            lines.append(f"{key:<15} {a['n']:>9}  {a['median']:>8.2f} [{a['p25']:.2f}, {a['p75']:.2f}]"
                         f"{'':>14}{b['median']:>8.2f}{'':>20}{c['median']:.2f}")
    at = result.get("at_time")
    if at:
        d, s_ = at["deployed"], at["simulated"]
        lines.append(f"by t = {at['time']:.1f} s: steps {d['step']} deployed / {s_['step']} simulated; accuracy "
                     f"{(d['accuracy'] or 0) * 100:.2f}% / {(s_['accuracy'] or 0) * 100:.2f}%; restorations "
                     f"{d['restorations']} / {s_['restorations']}")
        lines.append(f"uploads per client, deployed (on the links): {d['client_uploads(seen on the links)']}")
        lines.append(f"uploads per client, simulated:               {s_['client_uploads']}")
    s2 = result.get("at_time_clientapp_time")
    if s2:
        q = result["clientapp_seconds"]
        lines.append(f"simulated with the measured ClientApp time ({q['median']:.2f} s per message, median of "
                     f"{q['n']}): {_reading(s2)}")
    s3 = result.get("at_time_overhead")
    if s3:
        lines.append(f"simulated with the ClientApp time and {result['message_bytes']:,.0f} bytes per message "
                     f"(network.message_bytes, measured): {_reading(s3)}")
        ratios3 = result.get("transfer_ratios_overhead") or {}
        if ratios3:
            lines.append("  measured/predicted with those bytes, median per tier/direction: " + ", ".join(
                f"{key} {r['measured/predicted']['median']:.2f}" for key, r in ratios3.items()))
    fit = result.get("latency_fit") or {}
    if fit.get("n"):
        q, c = fit["per_message"], fit["compute_s"]
        lines.append(f"per-message latency (round trip - transfers - reported training time), {q['n']} messages: "
                     f"median {q['median']:.3f} s [p25 {q['p25']:.3f}, p75 {q['p75']:.3f}]; training "
                     f"{c['median']:.3f} s; network.message_latency = {fit['message_latency']:.3f} s (half: it is "
                     f"charged on each download and each upload)")
    s4 = result.get("at_time_latency")
    if s4:
        lines.append(f"simulated with the reported training time, {result['message_bytes']:,.0f} bytes and "
                     f"{fit['message_latency']:.3f} s per message (message_bytes, message_latency): {_reading(s4)}")
    if result.get("predictions"):
        lines += comparison_table(result)
    if result.get("plot"):
        lines.append(f"plot: {result['plot']}")
    return "\n".join(lines)


def _iqr(q: dict[str, float]) -> str:
    return f"{q['median']:.2f} [{q['p25']:.2f}-{q['p75']:.2f}]"


def comparison_table(result: dict[str, Any]) -> list[str]:
    """The deployment against each prediction at the comparison time, as Markdown: steps,
    accuracy, uploads per client (and the largest deviation from the deployed count), and
    per tier the median measured/predicted transfer time down and up with its
    interquartile range."""
    at = result.get("at_time")
    runs = result.get("predictions") or []
    if not at or not runs:
        return []
    dep = at["deployed"]
    dep_ups = dep.get("client_uploads") or dep.get("client_uploads(seen on the links)") or []
    head = ["", f"by t = {at['time']:.1f} s", "", "| | deployed | " + " | ".join(
        f"({i + 1}) {r['name']}" for i, r in enumerate(runs)) + " |", "|---" * (len(runs) + 2) + "|"]
    rows = [["compute s / message bytes / latency s", "-", *(
        f"{r['compute_s']:.3f} / {r['message_bytes']:,.0f} / {r['message_latency']:.3f}" for r in runs)],
            ["steps", str(dep["step"]), *(str((r["at_time"] or {}).get("step")) for r in runs)],
            ["accuracy %", f"{(dep['accuracy'] or 0) * 100:.2f}",
             *(f"{((r['at_time'] or {}).get('accuracy') or 0) * 100:.2f}" for r in runs)],
            ["uploads per client", ", ".join(map(str, dep_ups)),
             *(", ".join(map(str, (r["at_time"] or {}).get("client_uploads") or [])) for r in runs)],
            ["largest uploads deviation (deployed vs predicted)", "-",
             *(_deviation(dep_ups, (r["at_time"] or {}).get("client_uploads")) for r in runs)]]
    keys = list((runs[0].get("transfer_ratios") or {}).keys())
    for key in keys:
        rows.append([f"measured/predicted {key}: median [IQR]", "-", *(
            _iqr(r["transfer_ratios"][key]["measured/predicted"]) if key in (r.get("transfer_ratios") or {}) else "-"
            for r in runs)])
    return head + ["| " + " | ".join(row) + " |" for row in rows]


def _deviation(deployed: Sequence[int], predicted: Sequence[int] | None) -> str:
    """The largest |deployed - predicted| / predicted over clients, as a percentage."""
    if not predicted or len(predicted) != len(deployed):
        return "-"
    devs = [abs(d - p) / p for d, p in zip(deployed, predicted) if p]
    return f"{max(devs) * 100:.0f} %" if devs else "-"


__all__ = ["comparison_table", "fit_message_latency", "format_result", "match_messages", "LinkSampler", "NodeLink",
           "node_commands", "polling_label",
           "ShapedNetwork", "TestbedUnavailable", "calibrate_compute", "compare",
           "find_transfers", "list_namespaces", "measure_transfer", "plot_comparison", "predict_run",
           "remove_stale_namespaces", "run_testbed", "terminate_on_sigterm", "tier_rates", "unavailable_reason"]
