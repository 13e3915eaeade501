"""A real image registry for tests: Debian's `docker-registry` (distribution 2.8) serving TLS with a
certificate from a throwaway CA and htpasswd (bcrypt) authentication.

The registry binds 127.0.0.1:0 itself and its log says the port ("listening on 127.0.0.1:PORT,
tls"): no port is picked first and bound later. dockerd trusts the CA through
/etc/docker/certs.d/127.0.0.1:PORT/ca.crt for the fixture's lifetime. Images are pushed with the
docker CLI under a unique repository (`docker login` into a temporary DOCKER_CONFIG).
Teardown stops the registry and removes the certs.d entry, the local tags it pushed and its files.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = ["DockerRegistry", "docker_registry"]

REGISTRY_BIN = "/usr/bin/docker-registry"
CERTS_D = Path("/etc/docker/certs.d")
REPO = Path(__file__).resolve().parents[1]
BUILD_BUSYBOX = REPO / "examples" / "images" / "build-busybox.sh"
LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+), tls")


@dataclass
class DockerRegistry:
    work: Path
    proc: subprocess.Popen[bytes]
    port: int
    user: str
    password: str
    docker_config: Path
    log: Path
    pushed: list[str] = field(default_factory=list)
    trusted: list[str] = field(default_factory=list)  # certs.d entries made (removed at the end)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def trust(self, host: str) -> None:
        """dockerd trusts the throwaway CA for `host` (127.0.0.1:PORT): certs.d/<host>/ca.crt."""
        (CERTS_D / host).mkdir(parents=True, exist_ok=True)
        shutil.copy(self.work / "ca.crt", CERTS_D / host / "ca.crt")
        self.trusted.append(host)

    def auth_file(self, path: Path, password: str | None = None, also: tuple[str, ...] = ()) -> Path:
        """A node credentials file (`persys agent --registry-auth`), mode 0600, for this registry
        (and the `also` hosts in front of it)."""
        import base64
        import json

        token = base64.b64encode(f"{self.user}:{password or self.password}".encode()).decode()
        path.write_text(json.dumps({"auths": {h: {"auth": token} for h in (self.host, *also)}}))
        path.chmod(0o600)
        return path

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DOCKER_CONFIG": str(self.docker_config)}
        p = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=180, env=env)
        if check and p.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} failed: {p.stdout}{p.stderr}")
        return p

    def push_busybox(self, name: str = "") -> str:
        """A fresh busybox image (its own layer: `docker import` of the host's busybox) pushed as
        127.0.0.1:PORT/persys-test-<uuid>/<name>:1; the local copy is removed again."""
        ref = f"{self.host}/persys-test-{uuid.uuid4().hex[:10]}/{name or 'bb'}:1"
        subprocess.run(["bash", str(BUILD_BUSYBOX), ref], check=True, capture_output=True, timeout=120)
        self.pushed.append(ref)
        self.docker("push", ref)
        self.remove_local(ref)
        return ref

    def remove_local(self, ref: str) -> None:
        self.docker("image", "rm", "-f", ref, check=False)

    def requests_for(self, repository: str) -> int:
        """How many manifest requests the registry logged for a repository."""
        return len(re.findall(rf"/v2/{re.escape(repository)}/manifests/", self.log.read_text(errors="replace")))

    def stop(self) -> None:
        for ref in self.pushed:
            self.remove_local(ref)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for host in self.trusted:
            shutil.rmtree(CERTS_D / host, ignore_errors=True)
        with contextlib.suppress(OSError):
            CERTS_D.rmdir()  # only if nothing else is in it


def _throwaway_ca(work: Path) -> tuple[Path, Path, Path]:
    """CA certificate, and a server certificate + key for 127.0.0.1 signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("persys test registry CA")).issuer_name(name("persys test "
          "registry CA")).public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(name("127.0.0.1")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = work / "ca.crt", work / "server.crt", work / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    paths[2].chmod(0o600)
    return paths


def start_registry(work: Path) -> DockerRegistry:
    if not Path(REGISTRY_BIN).exists() or shutil.which("htpasswd") is None:
        pytest.skip("docker-registry or htpasswd missing (scripts/install.sh --test installs docker-registry, "
                    "apache2-utils)")
    work.mkdir(parents=True, exist_ok=True)
    _ca, cert, key = _throwaway_ca(work)
    user, password = "persys", uuid.uuid4().hex
    htpasswd = subprocess.run(["htpasswd", "-Bbn", user, password], capture_output=True, text=True, check=True,
                              timeout=30).stdout
    (work / "htpasswd").write_text(htpasswd)
    config = work / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log: {level: info, accesslog: {disabled: false}}\n"
        f"storage: {{filesystem: {{rootdirectory: {work / 'data'}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: '127.0.0.1:0', secret: {uuid.uuid4().hex}, tls: {{certificate: {cert}, key: {key}}}}}\n"
        f"auth: {{htpasswd: {{realm: persys-test, path: {work / 'htpasswd'}}}}}\n")
    log = work / "registry.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([REGISTRY_BIN, "serve", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + 30
    while not (m := LISTENING.search(log.read_text(errors="replace"))):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"docker-registry did not start:\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)
    reg = DockerRegistry(work, proc, int(m.group(1)), user, password, work / "docker-config", log)
    try:
        reg.trust(reg.host)
        reg.docker_config.mkdir()
        env = {**os.environ, "DOCKER_CONFIG": str(reg.docker_config)}
        subprocess.run(["docker", "login", "--username", user, "--password-stdin", reg.host], input=password,
                       capture_output=True, text=True, check=True, timeout=60, env=env)
    except BaseException:
        reg.stop()
        raise
    return reg


@pytest.fixture(scope="module")
def docker_registry(docker_engine: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerRegistry]:
    reg = start_registry(tmp_path_factory.mktemp("registry"))
    try:
        yield reg
    finally:
        reg.stop()
