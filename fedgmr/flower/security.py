"""Credentials and command lines for a secured Flower deployment (TLS + SuperNode
authentication), made with the ``cryptography`` package: no network, no ``openssl``.

:func:`make_credentials` writes into one folder

* ``ca.crt`` / ``ca.key``: a certificate authority (self-signed);
* ``server.pem`` / ``server.key``: the SuperLink's TLS certificate, signed by the CA, for
  the host names and addresses given;
* ``node-<i>.key`` / ``node-<i>.pub``: SuperNode ``i``'s key pair for Flower's node
  authentication (EC, NIST P-384, OpenSSH format, as ``flwr supernode register`` and
  ``flower-supernode --auth-supernode-private-key`` read them).

Private keys are written with mode 0600, and never into a FedGMR run directory (a folder
holding, or inside one holding, ``metrics.jsonl`` or ``summary.json``), where they would
travel with results. :func:`deployment_commands` gives the exact ``flower-superlink``,
``flower-supernode``, ``flwr supernode register`` and ``flwr run`` lines that use them;
they name key *files*, never key material.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from fedgmr.errors import ConfigError

#: files whose presence marks a FedGMR run directory (simulator or Flower ServerApp)
RUN_DIR_MARKERS = ("metrics.jsonl", "summary.json")
DEFAULT_HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class Credentials:
    """The files :func:`make_credentials` wrote (absolute paths)."""

    directory: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    node_keys: tuple[Path, ...]
    node_pubs: tuple[Path, ...]

    @property
    def private(self) -> tuple[Path, ...]:
        return (self.ca_key, self.server_key, *self.node_keys)


def inside_run_dir(path: Path) -> Path | None:
    """The FedGMR run directory ``path`` is (or lies inside), else None."""
    for d in (path, *path.parents):
        if any((d / m).exists() for m in RUN_DIR_MARKERS):
            return d
    return None


def _write_secret(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _names(hosts: tuple[str, ...]) -> list:
    from cryptography import x509

    out: list = []
    for h in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            out.append(x509.DNSName(h))
    return out


def make_credentials(directory: str | Path, nodes: int, hosts: tuple[str, ...] = DEFAULT_HOSTS,
                     days: int = 365, prefix: str = "node") -> Credentials:
    """Write a CA, the SuperLink's certificate for ``hosts`` and ``nodes`` SuperNode key
    pairs into ``directory`` (created; an existing file is never overwritten). The
    certificate always covers 127.0.0.1 and localhost too: the SuperLink's own SuperExec
    connects to it there.

    Raises :class:`~fedgmr.errors.ConfigError` when ``directory`` is (inside) a run
    directory, a file would be overwritten, or the arguments are out of range."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if nodes < 0 or days < 1 or not hosts:
        raise ConfigError(f"need nodes >= 0, days >= 1 and at least one host (got {nodes}, {days}, {hosts!r})")
    d = Path(directory).expanduser().resolve()
    run_dir = inside_run_dir(d)
    if run_dir is not None:
        raise ConfigError(f"{d} is inside the run directory {run_dir}: keep keys out of run directories (they are "
                          "copied and shared with results); choose another folder")
    names = ["ca.crt", "ca.key", "server.pem", "server.key"] + [f"{prefix}-{i}.{e}" for i in range(nodes)
                                                               for e in ("key", "pub")]
    taken = [n for n in names if (d / n).exists()]
    if taken:
        raise ConfigError(f"{d} already holds {', '.join(taken)}: refusing to overwrite keys; choose an empty folder")
    d.mkdir(parents=True, exist_ok=True)

    now = dt.datetime.now(dt.timezone.utc)
    start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)
    pem = serialization.Encoding.PEM
    pkcs8 = serialization.PrivateFormat.PKCS8
    plain = serialization.NoEncryption()

    hosts = tuple(dict.fromkeys((*hosts, *DEFAULT_HOSTS)))
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "FedGMR deployment CA")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))

    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
                   .issuer_name(ca_name).public_key(server_key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.SubjectAlternativeName(_names(tuple(hosts))), critical=False)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                   .sign(ca_key, hashes.SHA256()))

    creds = Credentials(d, d / "ca.crt", d / "ca.key", d / "server.pem", d / "server.key",
                        tuple(d / f"{prefix}-{i}.key" for i in range(nodes)),
                        tuple(d / f"{prefix}-{i}.pub" for i in range(nodes)))
    creds.ca_cert.write_bytes(ca_cert.public_bytes(pem))
    _write_secret(creds.ca_key, ca_key.private_bytes(pem, pkcs8, plain))
    creds.server_cert.write_bytes(server_cert.public_bytes(pem))
    _write_secret(creds.server_key, server_key.private_bytes(pem, pkcs8, plain))
    for key_path, pub_path in zip(creds.node_keys, creds.node_pubs):
        key = ec.generate_private_key(ec.SECP384R1())
        _write_secret(key_path, key.private_bytes(pem, serialization.PrivateFormat.OpenSSH, plain))
        pub_path.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                          serialization.PublicFormat.OpenSSH) + b"\n")
    return creds


def deployment_commands(directory: str | Path, nodes: int, superlink: str = "127.0.0.1:9093",
                        connection: str = "secure", app: str = "fedgmr-app",
                        prefix: str = "node", warm_config: str | Path | None = None,
                        runtime_port: int = 9094, fast_poll: float | None = None) -> dict[str, list[str]]:
    """The command lines of a secured deployment using the files in ``directory``:
    ``superlink`` (the server), ``supernodes`` (one per node, partition ``i``, with
    ``--isolation process``), ``superexecs`` (beside each SuperNode, on the same device: the
    warm ``fedgmr flower superexec`` that runs its ClientApps, over the SuperNode's
    loopback Runtime API; ``--warm-config`` when ``warm_config`` is given),
    ``register`` (the operator registers each node's public key) and ``run``; plus
    ``config`` (the ``config.toml`` connection for ``flwr``). Paths are absolute; no line
    holds key material. The SuperLink listens on the ``superlink`` host when that is a
    loopback address, else on every interface (``0.0.0.0``). Node ``i``'s Runtime API
    listens on ``127.0.0.1:runtime_port + i``, so every node and its SuperExec can run on
    one machine as well as on their own devices. With ``fast_poll`` (seconds) each SuperNode
    line is ``fedgmr flower supernode --poll-interval S -- <the same flower-supernode
    arguments>`` (Flower's SuperNode with its fixed waits capped at S) and each SuperExec
    line gets ``--pull-backoff S``."""
    d = Path(directory).expanduser().resolve()
    host, _, port = superlink.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"superlink must be HOST:PORT, got {superlink!r}")
    q = shlex.quote
    bind = host if host in ("127.0.0.1", "localhost", "::1") else "0.0.0.0"
    server = (f"flower-superlink --host {q(bind)} --port {port} --database state.db "
              f"--disable-runtime-dependency-installation --ssl-ca-certfile {q(str(d / 'ca.crt'))} "
              f"--ssl-certfile {q(str(d / 'server.pem'))} --ssl-keyfile {q(str(d / 'server.key'))} "
              "--enable-supernode-auth")
    if fast_poll is not None and not fast_poll > 0:
        raise ConfigError(f"the fast-polling SuperNodes' poll interval must be positive, got {fast_poll}")
    launcher = f"fedgmr flower supernode --poll-interval {fast_poll:g} -- " if fast_poll else "flower-supernode "
    supernodes = [f"{launcher}--superlink {q(superlink)} --root-certificates {q(str(d / 'ca.crt'))} "
                  f"--auth-supernode-private-key {q(str(d / f'{prefix}-{i}.key'))} "
                  f"--node-config {q(f'partition-id={i} num-partitions={nodes}')} --isolation process "
                  f"--port {runtime_port + i}"
                  for i in range(nodes)]
    warm = f" --warm-config {q(str(Path(warm_config).expanduser().resolve()))}" if warm_config else ""
    if not 1024 <= runtime_port <= 65535 - nodes:
        raise ConfigError(f"runtime ports {runtime_port}..{runtime_port + nodes - 1} are not all in 1024-65535")
    backoff = f" --pull-backoff {fast_poll:g}" if fast_poll else ""
    superexecs = [f"fedgmr flower superexec --runtime-api-address 127.0.0.1:{runtime_port + i} --insecure{warm}"
                  f"{backoff}" for i in range(nodes)]
    register = [f"flwr supernode register {q(str(d / f'{prefix}-{i}.pub'))} {q(connection)}" for i in range(nodes)]
    config = [f"[superlink.{connection}]", f'address = "{superlink}"',
              f'root-certificates = "{d / "ca.crt"}"']
    return {"superlink": [server], "config": config, "register": register, "supernodes": supernodes,
            "superexecs": superexecs, "run": [f"flwr run {q(app)} {q(connection)} --stream"]}
