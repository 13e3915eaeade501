"""etcd and Redis configured as in production, for tests: their own CA, client certificates, users.

  secure_backends (module) -> SecureBackends: .etcd (client-cert auth + etcd authentication on,
                               user `persys` whose role reads and writes the prefix /persys only),
                               .redis (TLS only, client certificates required, the default user
                               off, ACL user `persys` limited to `persys:*` and Persys' commands),
                               .pki (the backends' own CA, not Persys' cluster CA), .etcd_access /
                               .redis_access (how a scheduler reaches them), .etcdctl(), .redis_admin()

The users' passwords are random, written to 0600 files (what production does) and only ever
passed to the servers over stdin or in a 0600 configuration file, never on a command line.
Neither etcd nor Redis can listen on port 0 and report the port (Redis' `--tls-port 0` means "no
TLS listener"), so both take a free port from the kernel and retry on a collision, as
tests/fixtures_infra.py does.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from persys.backend_access import BackendAccess, BackendTLS
from persys.credentials import CredentialRef
from tests.fixtures_infra import EtcdServer, _Server, _start_with_retry

__all__ = ["BackendPKI", "SecureBackends", "SecureRedis", "secure_backends"]

# What Persys' Redis ACL user needs (docs/security.md, "etcd and Redis in production"): the event
# stream's commands, then the meter's sample stream's (a consumer group).
REDIS_ACL = ("resetkeys ~persys:* resetchannels -@all +ping +xadd +xrevrange +xread "
             "+xgroup|create +xreadgroup +xack +xautoclaim +xinfo|groups")


class BackendPKI:
    """A CA of the backends' own (ECDSA P-256), and certificates it issues into one folder."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self._name = subject
        self.cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                     .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - datetime.timedelta(minutes=5))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self._key, hashes.SHA256()))
        self.ca = folder / "ca.crt"
        self.ca.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, common_name: str, server: bool = False) -> tuple[Path, Path]:
        """(certificate, key) for `common_name`; servers get localhost/127.0.0.1 names and both usages."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
                   .issuer_name(self._name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        cert_path, key_path = self.folder / f"{name}.crt", self.folder / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        key_path.chmod(0o600)
        return cert_path, key_path


def _secret_file(path: Path) -> tuple[str, Path]:
    value = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    return value, path


class AuthEtcd(EtcdServer):
    """etcd with --client-cert-auth (from EtcdServer's tls) and a short simple-token lifetime, so
    tests see tokens expire and the store authenticate again."""

    token_ttl = 2

    def _argv(self) -> list[str]:
        # bcrypt cost 4 (its minimum) keeps Authenticate cheap on a shared test machine.
        return [*super()._argv(), f"--auth-token-ttl={self.token_ttl}", "--bcrypt-cost=4"]


class SecureRedis(_Server):
    """redis-server on TLS only (no plain port), client certificates required, ACL users from a
    0600 configuration file; the default user is off."""

    binary_name = "redis-server"

    def __init__(self, workdir: Path, server: tuple[Path, Path, Path], users: list[str]) -> None:
        super().__init__(workdir)
        self.ca, self.cert, self.key = server
        self.users = users

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0"

    def _argv(self) -> list[str]:
        conf = self.workdir / "redis.conf"
        lines = ["port 0", "bind 127.0.0.1", f"tls-port {self.port}", f"tls-cert-file {self.cert}",
                 f"tls-key-file {self.key}", f"tls-ca-cert-file {self.ca}", "tls-auth-clients yes",
                 f"dir {self.workdir}", 'save ""', "appendonly no", "user default off", *self.users]
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        return [self.binary, str(conf)]

    def _ready(self) -> bool:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.cert), str(self.key))
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as raw, \
                    context.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"-NOAUTH")  # up, and nobody gets in unauthenticated
        except OSError:
            return False


@dataclass
class SecureBackends:
    dir: Path
    pki: BackendPKI
    etcd: AuthEtcd
    redis: SecureRedis
    etcd_password: str
    redis_password: str
    redis_root_password: str
    etcd_access: BackendAccess
    redis_access: BackendAccess
    admin_cert: tuple[Path, Path]  # the etcd and Redis administrator (CN root)

    def etcdctl(self, *args: str, stdin: str | None = None, user: tuple[Path, Path] | None = None) -> str:
        """etcdctl as `root`: with client-cert auth on, etcd takes the user from the certificate's CN."""
        cert, key = user or self.admin_cert
        out = subprocess.run(
            [shutil.which("etcdctl") or "etcdctl", f"--endpoints=https://{self.etcd.endpoint}",
             f"--cacert={self.pki.ca}", f"--cert={cert}", f"--key={key}", *args],
            env={**os.environ, "ETCDCTL_API": "3"}, input=stdin, text=True, capture_output=True, timeout=20)
        if out.returncode != 0:
            raise RuntimeError(f"etcdctl {args[:2]} failed: {out.stderr.strip()}")
        return out.stdout

    def redis_admin(self) -> aioredis.Redis:
        """A Redis client as the administrator (`root`, every key and command)."""
        return aioredis.Redis.from_url(
            self.redis.url, username="root", password=self.redis_root_password, protocol=2,
            ssl_ca_certs=str(self.pki.ca), ssl_certfile=str(self.admin_cert[0]), ssl_keyfile=str(self.admin_cert[1]))


def _enable_etcd_auth(b: SecureBackends) -> None:
    """As in docs/security.md: root, a role limited to the Persys prefix, its user, auth on."""
    b.etcdctl("user", "add", "root", "--interactive=false", stdin=secrets.token_urlsafe(24) + "\n")
    b.etcdctl("user", "grant-role", "root", "root")
    b.etcdctl("role", "add", "persys")
    b.etcdctl("role", "grant-permission", "persys", "--prefix=true", "readwrite", "/persys")
    b.etcdctl("user", "add", "persys", "--interactive=false", stdin=b.etcd_password + "\n")
    b.etcdctl("user", "grant-role", "persys", "persys")
    b.etcdctl("auth", "enable")


@pytest.fixture(scope="module")
def secure_backends() -> Iterator[SecureBackends]:
    if shutil.which("etcdctl") is None:
        pytest.skip("etcdctl not found on PATH")
    with tempfile.TemporaryDirectory(prefix="persys-secure-") as tmp:
        d = Path(tmp)
        pki = BackendPKI(d / "backend-pki", "backends-ca")
        server_cert, server_key = pki.issue("server", "backend-server", server=True)
        admin = pki.issue("admin", "root")
        client_cert, client_key = pki.issue("persys-client", "persys-scheduler")
        etcd_password, etcd_file = _secret_file(d / "etcd-password")
        redis_password, _ = _secret_file(d / "redis-password")
        root_password, _ = _secret_file(d / "redis-root-password")
        etcd = _start_with_retry(lambda w: AuthEtcd(w, (pki.ca, server_cert, server_key)), d / "etcd")
        digest = hashlib.sha256(redis_password.encode()).hexdigest()
        users = [f"user persys on #{digest} {REDIS_ACL}",
                 f"user root on #{hashlib.sha256(root_password.encode()).hexdigest()} ~* &* +@all"]
        redis = _start_with_retry(lambda w: SecureRedis(w, (pki.ca, server_cert, server_key), users), d / "redis")
        assert isinstance(etcd, AuthEtcd) and isinstance(redis, SecureRedis)
        os.environ["PERSYS_TEST_REDIS_PASSWORD"] = redis_password  # the scheduler reads it by env: reference
        tls = BackendTLS(pki.ca, client_cert, client_key)
        b = SecureBackends(
            d, pki, etcd, redis, etcd_password, redis_password, root_password,
            BackendAccess("etcd", tls, "persys", CredentialRef("file", str(etcd_file))),
            BackendAccess("redis", tls, "persys", CredentialRef("env", "PERSYS_TEST_REDIS_PASSWORD")),
            admin)
        try:
            _enable_etcd_auth(b)
            yield b
        finally:
            os.environ.pop("PERSYS_TEST_REDIS_PASSWORD", None)
            redis.stop()
            etcd.stop()
