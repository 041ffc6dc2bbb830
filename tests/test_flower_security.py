"""`fedgmr flower keys` / `commands` (fedgmr.flower.security): a CA, the SuperLink's
certificate and SuperNode key pairs made with `cryptography`, the command lines that use
them, and secrets kept out of run directories and printed output."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cryptography")

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key  # noqa: E402

from fedgmr.errors import ConfigError  # noqa: E402
from fedgmr.flower.security import deployment_commands, make_credentials  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _fedgmr(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedgmr", *args], capture_output=True, text=True, env=ENV, cwd=cwd,
                          timeout=120)


def test_credentials_are_a_ca_a_server_certificate_and_node_key_pairs(tmp_path):
    c = make_credentials(tmp_path / "keys", 2, hosts=("link.example",))
    ca = x509.load_pem_x509_certificate(c.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(c.server_cert.read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    server.verify_directly_issued_by(ca)  # raises unless the CA signed it
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["link.example", "localhost"]  # loopback always included
    for key, pub in zip(c.node_keys, c.node_pubs):
        private = load_ssh_private_key(key.read_bytes(), None)  # what flower-supernode reads
        public = load_ssh_public_key(pub.read_bytes())  # what `flwr supernode register` reads
        assert isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp384r1"
        assert private.public_key().public_numbers() == public.public_numbers()
    for secret in c.private:
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    assert len({p.read_bytes() for p in c.node_keys}) == 2


def test_keys_are_never_written_into_a_run_directory_nor_over_existing_ones(tmp_path):
    run = tmp_path / "runs" / "exp"
    run.mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    for target in (run, run / "keys"):
        with pytest.raises(ConfigError, match="run directory"):
            make_credentials(target, 1)
    assert not (run / "keys").exists() and sorted(p.name for p in run.iterdir()) == ["summary.json"]
    make_credentials(tmp_path / "keys", 1)
    before = (tmp_path / "keys" / "node-0.key").read_bytes()
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        make_credentials(tmp_path / "keys", 2)
    assert (tmp_path / "keys" / "node-0.key").read_bytes() == before


def test_commands_name_the_files_and_parse_with_flowers_flags(tmp_path):
    d = tmp_path / "my keys"  # a space: every path is quoted
    cmds = deployment_commands(d, 2, "10.0.0.5:9093", connection="prod", app="fedgmr-app")
    server = shlex.split(cmds["superlink"][0])
    assert server[0] == "flower-superlink" and "--enable-supernode-auth" in server and "--insecure" not in server
    assert server[server.index("--ssl-certfile") + 1] == str(d.resolve() / "server.pem")
    assert server[server.index("--host") + 1] == "0.0.0.0" and server[server.index("--port") + 1] == "9093"
    local = shlex.split(deployment_commands(d, 1, "127.0.0.1:9093")["superlink"][0])
    assert local[local.index("--host") + 1] == "127.0.0.1"
    node1 = shlex.split(cmds["supernodes"][1])
    assert node1[node1.index("--auth-supernode-private-key") + 1] == str(d.resolve() / "node-1.key")
    assert node1[node1.index("--node-config") + 1] == "partition-id=1 num-partitions=2"
    assert node1[node1.index("--isolation") + 1] == "process"  # ClientApps run by the warm SuperExec beside it
    exe = shlex.split(cmds["superexecs"][1])
    assert exe[:3] == ["fedgmr", "flower", "superexec"] and "--warm-config" not in exe
    from fedgmr.cli import app as cli_app
    import typer.main

    command = typer.main.get_command(cli_app)
    ctx = command.make_context("fedgmr", exe[1:])  # every printed option is one of the command's
    sub = command.get_command(ctx, "flower")
    parsed = sub.get_command(ctx, "superexec").make_context("superexec", exe[3:]).params
    assert parsed["runtime_api_address"] == "127.0.0.1:9095" and parsed["insecure"]  # node 1's own port
    # every node its own Runtime API port, its SuperExec on the same: all can share one machine
    ports = [shlex.split(line)[shlex.split(line).index("--port") + 1] for line in cmds["supernodes"]]
    apis = [shlex.split(line)[shlex.split(line).index("--runtime-api-address") + 1] for line in cmds["superexecs"]]
    assert len(set(ports)) == len(ports) and apis == [f"127.0.0.1:{p}" for p in ports]
    warm = shlex.split(deployment_commands(d, 1, "10.0.0.5:9093", warm_config=tmp_path / "run.yaml")["superexecs"][0])
    assert warm[warm.index("--warm-config") + 1] == str((tmp_path / "run.yaml").resolve())
    assert shlex.split(cmds["register"][0]) == ["flwr", "supernode", "register", str(d.resolve() / "node-0.pub"),
                                                "prod"]
    assert cmds["run"] == ["flwr run fedgmr-app prod --stream"]
    assert f'root-certificates = "{d.resolve() / "ca.crt"}"' in cmds["config"]
    with pytest.raises(ConfigError, match="HOST:PORT"):
        deployment_commands(d, 1, "nohost")


def test_fast_poll_commands_wrap_the_same_supernode_arguments(tmp_path):
    d = tmp_path / "keys"
    plain = deployment_commands(d, 2, "10.0.0.5:9093", warm_config=tmp_path / "run.yaml")
    fast = deployment_commands(d, 2, "10.0.0.5:9093", warm_config=tmp_path / "run.yaml", fast_poll=0.2)
    for p_line, f_line in zip(plain["supernodes"], fast["supernodes"]):
        p_args, f_args = shlex.split(p_line), shlex.split(f_line)
        # Flower's own flower-supernode arguments, after `--`, unchanged
        assert f_args[:6] == ["fedgmr", "flower", "supernode", "--poll-interval", "0.2", "--"]
        assert f_args[6:] == p_args[1:]
    for p_line, f_line in zip(plain["superexecs"], fast["superexecs"]):
        assert shlex.split(f_line) == shlex.split(p_line) + ["--pull-backoff", "0.2"]
    assert {k: v for k, v in fast.items() if k not in ("supernodes", "superexecs")} == \
        {k: v for k, v in plain.items() if k not in ("supernodes", "superexecs")}
    from fedgmr.cli import app as cli_app
    import typer.main

    command = typer.main.get_command(cli_app)
    args = shlex.split(fast["supernodes"][1])
    ctx = command.make_context("fedgmr", args[1:])
    parsed = command.get_command(ctx, "flower").get_command(ctx, "supernode").make_context(
        "supernode", args[3:]).params  # the printed line is the command's
    assert parsed["poll_interval"] == 0.2 and list(parsed["flower_args"]) == args[6:]
    exe = shlex.split(fast["superexecs"][1])
    assert command.get_command(ctx, "flower").get_command(ctx, "superexec").make_context(
        "superexec", exe[3:]).params["pull_backoff"] == 0.2
    with pytest.raises(ConfigError, match="positive"):
        deployment_commands(d, 1, "10.0.0.5:9093", fast_poll=0)


def test_cli_writes_the_keys_and_prints_commands_but_no_secret(tmp_path):
    proc = _fedgmr("flower", "keys", "keys", "--nodes", "3", "--superlink", "127.0.0.1:9500", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    keys = tmp_path / "keys"
    secrets = [p.read_text() for p in sorted(keys.glob("*.key"))]
    assert len(secrets) == 5  # ca, server, three nodes
    out = proc.stdout + proc.stderr
    assert "PRIVATE KEY" not in out
    for s in secrets:  # not a single line of key material (headers aside)
        assert not any(line in out for line in s.splitlines() if "PRIVATE KEY" not in line and len(line) > 20)
    lines = out.splitlines()
    assert sum(line.startswith("flower-supernode ") for line in lines) == 3
    assert sum(line.startswith("flwr supernode register ") for line in lines) == 3
    assert any(line.startswith("flower-superlink ") and "--port 9500" in line for line in lines)
    # `commands` prints the same lines again from the folder
    again = _fedgmr("flower", "commands", "keys", "--nodes", "3", "--superlink", "127.0.0.1:9500", cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.splitlines()[-12:] == lines[-12:]
    # a second `keys` into the same folder refuses, exit code of a ConfigError
    proc = _fedgmr("flower", "keys", "keys", cwd=tmp_path)
    assert proc.returncode != 0 and "refusing to overwrite" in proc.stderr
