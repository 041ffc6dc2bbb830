"""FedGMR on real Flower processes, on loopback only, on ports picked here:

* ``flwr run`` against a ``flower-superlink --simulation`` (Flower's simulation runtime);
* ``flwr run`` against a ``flower-superlink`` and several ``flower-supernode`` processes
  (insecure mode), one of which sends every kind of malformed reply in turn (and is
  quarantined after three) and one of which never answers; the silent one runs its
  ClientApp through Flower's own per-message ``flwr-clientapp``, the others through
  ``fedgmr flower superexec`` (``--isolation process``);
* the same with TLS and SuperNode authentication, set up with ``fedgmr flower keys``'
  files and command lines: registered nodes run, a stranger and a node trusting another
  CA are kept out, a forged client id is rejected and its node quarantined.

Every process is started in its own process group and stopped by signalling that group.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import scaled, tiny_config

pytest.importorskip("flwr", reason="Flower is not installed: pip install 'fedgmr[flower]'")

from fedgmr.flower.faults import MALFORMED  # noqa: E402
from fedgmr.flower.project import federation_config_args, write_app, write_flower_config  # noqa: E402

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Processes:
    """Start commands in their own process groups; stop them all at the end."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env, self.procs = root, env, []

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "w")
        p = subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                             cwd=self.root)
        self.procs.append((name, p, log))
        return p

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def dump_logs(self, tail: int = 6000) -> str:
        """The tail of every process's log and of every server.log under the test's
        directory, for the failure report (the files stay in pytest's tmp directory)."""
        parts = []
        for path in sorted(self.root.rglob("*.log")):
            text = path.read_text(errors="replace")
            parts.append(f"----- {path} ({len(text)} chars, last {tail}) -----\n{text[-tail:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for _, p, _ in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        for _, p, log in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)  # and whatever it started in its group
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
            log.close()


@pytest.fixture
def procs(tmp_path: Path, request: pytest.FixtureRequest):
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "flwr-home"), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "RAY_USAGE_STATS_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "PYTHONUNBUFFERED": "1"}
    p = Processes(tmp_path, env)
    yield p
    p.stop()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"\n===== logs of the deployment (kept in {tmp_path}) =====\n{p.dump_logs()}")


def _wait_http(port: int, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{what} exited early"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise AssertionError(f"{what} did not listen on port {port} within {timeout} s")


def _superlink(procs: Processes, port: int, simulation: bool) -> subprocess.Popen:
    args = [str(BIN / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(port),
            "--database", str(procs.root / "state.db"), "--disable-runtime-dependency-installation"]
    p = procs.start("superlink", args + (["--simulation"] if simulation else []))
    _wait_http(port, p, "flower-superlink")
    return p


def _fedgmr_config(tmp_path: Path, clients: int, steps: int, heterogeneity: Any = "high") -> Path:
    raw = tiny_config(clients={"num_clients": clients, "heterogeneity": heterogeneity},
                      model={"name": "mlp", "options": {"hidden": [64]}},
                      training={"lr": 0.1, "local_steps": 30},
                      coordination={"k": 2}, run={"max_steps": steps, "eval_every": 2})
    path = tmp_path / "fedgmr.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _flwr_run(procs: Processes, app: Path, connection: str, out: Path, timeout: float,
              extra: list[str] | None = None) -> dict[str, Any]:
    p = procs.start("flwr-run", [str(BIN / "flwr"), "run", str(app), connection, "--stream", *(extra or [])])
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    summary = out / "summary.json"
    while (result := _read_json(summary)) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"no summary after {timeout} s\n--- flwr run:\n{procs.log('flwr-run')[-3000:]}"
                                 f"\n--- superlink:\n{procs.log('superlink')[-3000:]}")
        if p.poll() is not None and p.returncode != 0:
            raise AssertionError(f"flwr run failed:\n{procs.log('flwr-run')[-3000:]}")
        time.sleep(0.5)
    return result


def _read_json(path: Path) -> dict[str, Any] | None:
    """The file's JSON once it is completely written, else None."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def test_flwr_run_in_flowers_simulation_runtime(procs, tmp_path):
    pytest.importorskip("ray", reason="Flower's simulation runtime needs Ray: pip install 'flwr[simulation]'")
    port = _free_port()
    out = tmp_path / "out-sim"
    cfg = _fedgmr_config(tmp_path, clients=4, steps=6)
    app = write_app(tmp_path / "app", {"config": str(cfg), "out-dir": str(out), "num-server-steps": 6,
                                       "reply-timeout": scaled(60.0), "step-timeout": scaled(20.0),
                                       "max-wall": scaled(240.0), "node-wait": scaled(60.0)})
    write_flower_config(procs.env["FLWR_HOME"], {"sim": {"address": f"127.0.0.1:{port}", "insecure": True}})
    _superlink(procs, port, simulation=True)
    result = _flwr_run(procs, app, "sim", out, timeout=300, extra=federation_config_args({"num-supernodes": 4}))
    print("simulation:", json.dumps({k: v for k, v in result.items() if k != "rejection_log"}))
    assert result["nodes"] == 4 and result["steps"] == 6
    assert result["rejected_updates"] == 0
    assert result["final_accuracy"] > 0.15
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["step"] == 0 and records[-1]["step"] == 6
    assert all(len(r["densities"]) == 4 for r in records)
    assert all(r["time"] == r["wall_time"] for r in records) and result["clock"] == "wall"
    # `flwr run --stream` shows the ServerApp's per-step lines (uploaded every few seconds)
    deadline = time.monotonic() + scaled(60)
    while "fedgmr: step 6/6" not in procs.log("flwr-run") and time.monotonic() < deadline:
        time.sleep(0.5)
    streamed = procs.log("flwr-run")
    assert all(f"fedgmr: step {s}/6" in streamed for s in (0, 2, 4, 6)), streamed[-3000:]
    assert "deprecated" not in streamed, streamed[-3000:]  # no `options.` table in the connection


def test_superlink_and_supernodes_on_loopback_with_faulty_nodes(procs, tmp_path):
    port = _free_port()
    out = tmp_path / "out-deploy"
    honest, steps = 3, 8
    clients = honest + 2  # + one node cycling through malformed replies, + one that never answers
    # which node serves which client slot is up to node ids: with three full-density slots
    # for two faulty nodes, an honest node always trains the full model
    cfg = _fedgmr_config(tmp_path, clients=clients, steps=steps, heterogeneity=[1.0, 1.0, 1.0, 0.5, 0.2])
    app = write_app(tmp_path / "app", {"config": str(cfg), "out-dir": str(out), "num-server-steps": steps,
                                       # a ClientApp process per message: five cold starts (torch,
                                       # data, model) share 2 cores, ~25 s on a busy machine
                                       "reply-timeout": scaled(90.0), "step-timeout": scaled(8.0),
                                       "max-wall": scaled(900.0), "node-wait": scaled(60.0),
                                       # the default quarantine (3 rejections), over the whole run
                                       "quarantine-window": scaled(900.0), "quarantine-seconds": scaled(3600.0)})
    write_flower_config(procs.env["FLWR_HOME"], {"loop": {"address": f"127.0.0.1:{port}", "insecure": True}})
    _superlink(procs, port, simulation=False)
    faults = {honest: "cycle", honest + 1: "hang"}
    for i in range(clients):
        node_cfg = f"partition-id={i} num-partitions={clients}"
        if i in faults:
            node_cfg += f' fedgmr-fault="{faults[i]}"'
        api = _free_port()
        node = [str(BIN / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{port}", "--host",
                "127.0.0.1", "--port", str(api), "--node-config", node_cfg]
        if faults.get(i) == "hang":  # Flower's default: a flwr-clientapp process per message
            procs.start(f"supernode{i}", node)
        else:  # the documented default: a warm SuperExec forks each ClientApp (a cold
            # ClientApp would reply too late to this short run for the cycling node's faults)
            _wait_http(api, procs.start(f"supernode{i}", node + ["--isolation", "process"]), f"supernode {i}")
            procs.start(f"superexec{i}", [str(BIN / "fedgmr"), "flower", "superexec", "--runtime-api-address",
                                          f"127.0.0.1:{api}", "--insecure", "--warm-config", str(cfg)])
    result = _flwr_run(procs, app, "loop", out, timeout=1000)
    print("loopback:", json.dumps({k: v for k, v in result.items() if k != "rejection_log"}))
    print("\n".join(result["rejection_log"]))
    server_log = (out / "server.log").read_text()
    print("\n".join(line for line in server_log.splitlines() if "rejected" in line or "did not reply" in line))
    assert result["nodes"] == clients and result["steps"] == steps
    assert result["final_accuracy"] > 0.15
    assert result["rejected_updates"] >= 1
    # the silent node was given up on, or (when the run is shorter than the reply timeout,
    # which scales with the machine's load) still unanswered at the end
    assert result["timeouts"] + result["client_errors"] + result["unanswered"] >= 1
    assert "rejected update from client" in server_log
    # every rejection is the cycling node's: its third one quarantines it for the rest of the run
    assert result["quarantines"] == (1 if result["rejected_updates"] >= 3 else 0)
    assert result["rejected_updates"] <= 3 and len(result["quarantined_nodes"]) == result["quarantines"]
    assert ("quarantined node" in server_log) == (result["quarantines"] == 1)
    assert any(s in server_log for s in ("did not reply within", "failed: ", "never replied"))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["accuracy"] == r["accuracy"] for r in records)  # never NaN: the model was never corrupted
    assert len(MALFORMED) == 7
    # the honest and the cycling nodes' messages ran in forks of their warm SuperExecs, each to a
    # clean exit (a malformed reply is a clean exit of the ClientApp)
    import re

    forks = done = 0
    for i in range(honest + 1):
        log = procs.log(f"superexec{i}")
        forks += len(re.findall(r"ClientApp in forked process \d+", log))
        done += len(re.findall(r"ClientApp process \d+ done in [\d.]+ s \(status 0\)", log))
        assert "exited with status" not in log, log[-3000:]
    assert forks >= steps and done >= steps, (forks, done)


def _wait_for(what: str, condition, timeout: float, procs: Processes) -> Any:
    """Poll ``condition()`` until it returns something truthy (that is returned)."""
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s\n{procs.dump_logs(3000)}")
        time.sleep(0.5)
    return value


def test_secured_deployment_tls_node_auth_forged_ids_and_quarantine(procs, tmp_path):
    """TLS + SuperNode authentication, set up with `fedgmr flower keys`' files and command
    lines: three registered nodes (one forging another client's id) complete the run, an
    unregistered node and a node trusting another CA never get in."""
    import re
    import shlex

    from fedgmr.flower.security import deployment_commands, make_credentials

    t0 = time.monotonic()
    port, clients, steps = _free_port(), 3, 6
    keys = make_credentials(tmp_path / "keys", nodes=4)  # node-3: never registered
    other = make_credentials(tmp_path / "other-ca", nodes=0)
    cmds = deployment_commands(keys.directory, 4, f"127.0.0.1:{port}", connection="secure")
    out = tmp_path / "out-secure"
    cfg = _fedgmr_config(tmp_path, clients=clients, steps=steps, heterogeneity=[1.0, 1.0, 0.5])
    app = write_app(tmp_path / "app", {"config": str(cfg), "out-dir": str(out), "num-server-steps": steps,
                                       "reply-timeout": scaled(90.0), "step-timeout": scaled(8.0),
                                       "max-wall": scaled(900.0), "node-wait": scaled(120.0),
                                       "quarantine-after": 2, "quarantine-window": scaled(900.0),
                                       "quarantine-seconds": scaled(3600.0)})
    write_flower_config(procs.env["FLWR_HOME"], {"secure": {"address": f"127.0.0.1:{port}",
                                                            "root-certificates": str(keys.ca_cert)}})

    def bin_path(cmd: str) -> list[str]:  # the printed command line, run from this environment's bin/
        args = shlex.split(cmd)
        return [str(BIN / args[0]), *args[1:]]

    link = procs.start("superlink", bin_path(cmds["superlink"][0]))
    _wait_http(port, link, "flower-superlink (TLS)")
    node_ids = {}
    for i, line in enumerate(cmds["register"][:3]):
        reg = subprocess.run(bin_path(line), env=procs.env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=scaled(120))
        assert reg.returncode == 0, reg.stdout + reg.stderr
        node_ids[i] = int(re.search(r"SuperNode (\d+) registered", reg.stdout + reg.stderr).group(1))
    forger = 2
    for i, line in enumerate(cmds["supernodes"]):  # 0-2 registered (2 forges ids), 3 not registered
        api = _free_port()
        args = bin_path(line) + ["--host", "127.0.0.1", "--port", str(api)]
        if i == forger:
            args[args.index("--node-config") + 1] += ' fedgmr-fault="other-client"'
        node = procs.start(f"supernode{i}", args)
        if i < 3:  # the printed warm SuperExec beside it, on this node's Runtime API port
            _wait_http(api, node, f"supernode {i}")
            procs.start(f"superexec{i}", bin_path(cmds["superexecs"][i].replace(f"127.0.0.1:{9094 + i}",
                                                                                 f"127.0.0.1:{api}")))
    # trusts another CA (with a key of its own): the TLS handshake fails
    procs.start("wrong-ca", [str(BIN / "flower-supernode"), "--superlink", f"127.0.0.1:{port}", "--root-certificates",
                             str(other.ca_cert), "--auth-supernode-private-key", str(keys.node_keys[3]),
                             "--host", "127.0.0.1", "--port", str(_free_port()),
                             "--node-config", "partition-id=0 num-partitions=3"])

    result = _flwr_run(procs, app, "secure", out, timeout=1000)
    wall = time.monotonic() - t0
    server_log = (out / "server.log").read_text()
    print("secured:", json.dumps({k: v for k, v in result.items() if k != "rejection_log"}))
    print("registered node ids:", node_ids, f"wall {wall:.0f} s")
    print("\n".join(result["rejection_log"]))

    assert result["nodes"] == clients and result["steps"] == steps
    assert result["final_accuracy"] > 0.15
    # the forged client id is rejected and logged, and the forger quarantined after 2
    forged = [line for line in server_log.splitlines() if "claims to be client" in line]
    assert forged, server_log[-3000:]
    print("forged id:", forged[0])
    assert result["quarantined_nodes"] == [node_ids[forger]] and result["quarantines"] == 1
    quarantined = [line for line in server_log.splitlines() if f"quarantined node {node_ids[forger]}" in line]
    assert quarantined and result["rejected_updates"] >= 2
    print("quarantine:", quarantined[0])
    # the run's nodes are the registered ones: the stranger and the wrong-CA node never got work
    used = {int(n) for n in re.findall(r"\(node (\d+)\)", server_log)} | {node_ids[forger]}
    assert used <= set(node_ids.values()), used
    # the SuperLink refuses the unregistered key (and says so); only registered nodes were activated
    from cryptography.hazmat.primitives import serialization

    pem = serialization.load_ssh_public_key(keys.node_pubs[3].read_bytes()).public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    marker = pem.splitlines()[1]  # the first line of the stranger's key, as the SuperLink prints it
    refused = _wait_for("the SuperLink's refusal of the unregistered node", lambda: [
        line for line in procs.log("superlink").splitlines()
        if "No SuperNode found with the given public key" in line and marker in line], 60, procs)
    print("refused (superlink.log):", refused[0][:400])
    assert "Failed to activate SuperNode" in procs.log("supernode3")
    activated = {int(n) for n in re.findall(r"Activated node_id=(\d+)", procs.log("superlink"))}
    assert activated == set(node_ids.values()), (activated, node_ids)
    tls = _wait_for("the wrong-CA node's TLS failure", lambda: [
        line for line in procs.log("wrong-ca").splitlines() if "CERTIFICATE_VERIFY_FAILED" in line], 60, procs)
    print("wrong CA (wrong-ca.log):", tls[0])
    # secrets stay in the keys folder: no private key material in the run directory or any log
    secret_lines = {line for p in keys.private for line in p.read_text().splitlines()
                    if "PRIVATE KEY" not in line and len(line) > 20}
    for path in [*out.rglob("*"), *tmp_path.glob("*.log")]:
        if path.is_file():
            text = path.read_text(errors="replace")
            assert "PRIVATE KEY" not in text and not any(s in text for s in secret_lines), path


def test_scaffold_on_supernodes_keeps_client_state_and_equals_the_simulator(procs, tmp_path):
    """SCAFFOLD (client state c_i, values beside the model c and delta_c) on a SuperLink and
    three SuperNodes on loopback, synchronous rounds: every reply arrives with its delta_c
    and is accepted, and the run's records equal a simulator run's with the same slot ->
    partition assignment - which they only do when each node kept its c_i between its jobs
    (Context.state; tests/distributed/test_flower_client_state.py shows a forgetful node
    training another model)."""
    import re

    from fedgmr.experiment.build import build_experiment
    from fedgmr.flower.client import load_run_config
    from fedgmr.flower.loop import bound_influence

    port, clients, steps = _free_port(), 3, 3
    out = tmp_path / "out-scaffold"
    raw = tiny_config(method="scaffold", clients={"num_clients": clients}, network={"model_size_mb": None},
                      training={"lr": 0.1, "local_steps": 5}, run={"max_steps": steps, "eval_every": 1})
    cfg_path = tmp_path / "scaffold.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    # sync rounds: a step waits for every node (no step timeout within the run); the update-norm bound
    # off, as in the simulator
    run_config = {"config": str(cfg_path), "out-dir": str(out), "num-server-steps": steps, "eval-every": 1,
                  "reply-timeout": scaled(600.0), "step-timeout": scaled(900.0), "max-wall": scaled(900.0),
                  "node-wait": scaled(120.0), "update-norm-multiple": 0}
    app = write_app(tmp_path / "app", run_config)
    write_flower_config(procs.env["FLWR_HOME"], {"loop": {"address": f"127.0.0.1:{port}", "insecure": True}})
    _superlink(procs, port, simulation=False)
    for i in range(clients):
        api = _free_port()
        node = procs.start(f"supernode{i}", [str(BIN / "flower-supernode"), "--insecure", "--superlink",
                                             f"127.0.0.1:{port}", "--host", "127.0.0.1", "--port", str(api),
                                             "--node-config", f"partition-id={i} num-partitions={clients}",
                                             "--isolation", "process"])
        _wait_http(api, node, f"supernode {i}")
        procs.start(f"superexec{i}", [str(BIN / "fedgmr"), "flower", "superexec", "--runtime-api-address",
                                      f"127.0.0.1:{api}", "--insecure", "--warm-config", str(cfg_path)])
    partition_of = {}
    for i in range(clients):
        found = _wait_for(f"supernode {i}'s id", lambda i=i: re.search(r"SuperNode ID: (\d+)",
                                                                         procs.log(f"supernode{i}")), 120, procs)
        partition_of[int(found.group(1))] = i
    result = _flwr_run(procs, app, "loop", out, timeout=1000)
    print("scaffold:", json.dumps({k: v for k, v in result.items() if k != "rejection_log"}))
    assert result["nodes"] == clients and result["steps"] == steps
    # c went down to every node (its ClientApp refuses an instruction without it: an error reply)
    # and every reply's delta_c came back well-formed (SCAFFOLD rejects a reply without it)
    assert result["rejected_updates"] == 0 and result["client_errors"] == 0 and result["timeouts"] == 0
    assert result["uploads"] == clients * steps
    flower = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]

    # the simulator, each slot on the partition its node holds (the server gives slot i the i-th
    # node id), its sample counts bounded as the ServerApp bounds them
    perm = [partition_of[n] for n in sorted(partition_of)]
    cfg = load_run_config(run_config)
    exp = build_experiment(cfg)
    records: list[dict] = []
    try:
        work = exp.simulator.executor.workload
        work.client_data = [work.client_data[p] for p in perm]
        work.client_val = [work.client_val[p] for p in perm]
        bound_influence(exp.strategy, [len(idx) for idx in exp.partition.clients], run_config)
        exp.simulator.on_record = records.append
        exp.simulator.run(steps)
        exp.simulator.finish()
    finally:
        exp.executor.close()
    print("partitions by slot:", perm)
    assert [r["step"] for r in flower] == [r["step"] for r in records] == list(range(steps + 1))
    for f, s in zip(flower, records):
        assert f["accuracy"] == s["accuracy"], (f, s)
        # the float64 sums of an aggregation may take the replies in another order than the
        # simulator's: at most a last-bit difference in the model
        assert f["loss"] == pytest.approx(s["loss"], rel=1e-6, abs=1e-7), (f, s)
    assert flower[-1]["loss"] < flower[0]["loss"]


def test_fast_polling_supernodes_run_fedavg_to_the_end(procs, tmp_path):
    """`fedgmr flower supernode` (Flower's flower-supernode with its fixed waits capped)
    beside the warm SuperExec (`--pull-backoff`), the ServerApp's object pulls capped too
    (run config `pull-backoff`): a short synchronous FedAvg run on three such nodes
    completes every step, every instruction answered, none rejected or failed."""
    import re

    port, clients, steps = _free_port(), 3, 4
    out = tmp_path / "out-fastpoll"
    raw = tiny_config(method="fedavg", clients={"num_clients": clients},
                      model={"name": "mlp", "options": {"hidden": [32]}},
                      training={"lr": 0.1, "local_steps": 5}, run={"max_steps": steps, "eval_every": 1})
    cfg = tmp_path / "fedavg.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    # synchronous rounds with generous timeouts: a step waits for every node
    app = write_app(tmp_path / "app", {"config": str(cfg), "out-dir": str(out), "num-server-steps": steps,
                                       "reply-timeout": scaled(600.0), "step-timeout": scaled(900.0),
                                       "max-wall": scaled(900.0), "node-wait": scaled(120.0),
                                       "pull-backoff": 0.2})
    write_flower_config(procs.env["FLWR_HOME"], {"loop": {"address": f"127.0.0.1:{port}", "insecure": True}})
    _superlink(procs, port, simulation=False)
    for i in range(clients):
        api = _free_port()
        node = procs.start(f"supernode{i}", [str(BIN / "fedgmr"), "flower", "supernode", "--poll-interval", "0.2",
                                             "--", "--insecure", "--superlink", f"127.0.0.1:{port}", "--host",
                                             "127.0.0.1", "--port", str(api), "--node-config",
                                             f"partition-id={i} num-partitions={clients}", "--isolation", "process"])
        _wait_http(api, node, f"fast-polling supernode {i}")
        procs.start(f"superexec{i}", [str(BIN / "fedgmr"), "flower", "superexec", "--runtime-api-address",
                                      f"127.0.0.1:{api}", "--insecure", "--warm-config", str(cfg),
                                      "--pull-backoff", "0.2"])
    result = _flwr_run(procs, app, "loop", out, timeout=1000)
    print("fast-polling supernodes:", json.dumps({k: v for k, v in result.items() if k != "rejection_log"}))
    assert result["nodes"] == clients and result["steps"] == steps and result["status"] == "completed"
    assert result["rejected_updates"] == 0 and result["client_errors"] == 0 and result["timeouts"] == 0
    assert result["unanswered"] == 0 and result["uploads"] == clients * steps
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(steps + 1))
    assert "pull-backoff: a reply's objects not at the SuperLink yet are asked for again after at most 0.2 s" in \
        (out / "server.log").read_text()
    for i in range(clients):
        log = procs.log(f"supernode{i}")
        # Flower's own SuperNode ran, with its waits capped, and exchanged the messages
        assert "waits capped at 0.2 s" in log and re.search(r"SuperNode ID: \d+", log), log[-3000:]
        assert log.count("Sent successfully") >= steps, log[-3000:]
        assert "Failed to" not in log, log[-3000:]
        assert "exited with status" not in procs.log(f"superexec{i}")
