"""Real etcd / redis servers for tests, on free ports in temporary directories.

Usage from a conftest: `from tests.fixtures_infra import *`.  Fixtures:
  etcd_server   (session)  -> EtcdServer   .endpoint .url .pid .stop() .start() .data_dir
  redis_server  (session)  -> RedisServer  .endpoint .url .pid .stop() .start()
  store_url     (per test, twice)  -> a fresh SQLite file's URL, then a private etcd's URL
Helpers start_etcd(dir)/start_redis(dir) give a private server (stop it yourself).
Each helper stops exactly the process it started. Tests that stop a shared server must
start it again (the fixtures also restart a stopped server before handing it out).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

__all__ = [  # the private session fixtures must be exported too, for `import *`
    "EtcdServer",
    "RedisServer",
    "_etcd_session",
    "_redis_session",
    "etcd_server",
    "free_port",
    "redis_server",
    "start_etcd",
    "start_redis",
    "store_url",
]

READY_TIMEOUT = 15.0


def free_port() -> int:
    """A port the kernel considers free right now (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Server:
    binary_name = ""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which(self.binary_name)
        if binary is None:
            pytest.skip(f"{self.binary_name} binary not found on PATH")
        self.binary = binary
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: object = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def start(self) -> None:
        if self.running:
            return
        log = open(self.workdir / f"{self.binary_name}.log", "ab")  # closed in stop()
        self._log = log
        self.proc = subprocess.Popen(self._argv(), stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        STARTED_SERVERS.add(self)
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = (self.workdir / f"{self.binary_name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{self.binary_name} exited with {self.proc.returncode}:\n{tail}")
            if self._ready():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.binary_name} not ready on {self.endpoint} after {READY_TIMEOUT}s")

    def kill(self) -> None:
        """A crash: SIGKILL the process this object started, no clean shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        self.stop()

    def stop(self) -> None:
        """Stop the process this object started (SIGTERM, then SIGKILL), and only it."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()  # type: ignore[attr-defined]
            self._log = None


# Every server a test started, so the session can stop what a failed start or a test without
# try/finally left running (stop_leftover_servers, called by conftest at the end).
STARTED_SERVERS: set[_Server] = set()


def stop_leftover_servers() -> list[str]:
    """Stop every server still running; returns what was stopped (for the log)."""
    left = [srv for srv in STARTED_SERVERS if srv.running]
    for srv in left:
        srv.kill()
    STARTED_SERVERS.clear()
    return [f"{srv.binary_name} on {srv.endpoint}" for srv in left]


class EtcdServer(_Server):
    binary_name = "etcd"

    def __init__(self, workdir: Path, tls: tuple[Path, Path, Path] | None = None) -> None:
        """tls = (ca, server cert, server key): serve HTTPS and require client certs (mTLS)."""
        super().__init__(workdir)
        self.peer_port = free_port()
        self.data_dir = workdir / "data"
        self.tls = tls

    @property
    def url(self) -> str:
        return f"{'etcds' if self.tls else 'etcd'}://{self.endpoint}"

    def _argv(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        client = f"{'https' if self.tls else 'http'}://{self.endpoint}"
        tls_flags = []
        if self.tls:
            ca, cert, key = self.tls
            tls_flags = [f"--trusted-ca-file={ca}", f"--cert-file={cert}", f"--key-file={key}", "--client-cert-auth"]
        return [
            self.binary,
            *tls_flags,
            "--name=test",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=test={peer}",
            "--initial-cluster-state=new",
            # Short raft timers: quick leader election, and etcd's minimum lease TTL
            # (ceil(1.5 * election timeout)) drops from 2 s to 1 s.
            "--heartbeat-interval=10",
            "--election-timeout=100",
            "--logger=zap",
            "--log-level=warn",
        ]

    def _ready(self) -> bool:
        context = None
        if self.tls:
            # /health needs a client cert; the server's own pair is used (it must carry the
            # clientAuth extended key usage, as etcd recommends for member certs anyway).
            ca, cert, key = self.tls
            context = ssl.create_default_context(cafile=str(ca))
            context.load_cert_chain(str(cert), str(key))
        scheme = "https" if self.tls else "http"
        try:
            with urllib.request.urlopen(f"{scheme}://{self.endpoint}/health", timeout=1, context=context) as r:
                return bool(json.loads(r.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def etcdctl(self, *args: str) -> str:
        ctl = shutil.which("etcdctl") or "etcdctl"
        out = subprocess.run(
            [ctl, f"--endpoints={self.endpoint}", *args],
            env={**os.environ, "ETCDCTL_API": "3"},
            check=True,
            capture_output=True,
            timeout=10,
        )
        return out.stdout.decode()


class RedisServer(_Server):
    """redis-server on a unix socket in its work directory, no TCP port: redis cannot bind port 0
    and tell us the port, and a socket path is ours alone, so start() after stop() (a restart
    with the same address, as chaos tests need) cannot collide with anything else."""

    binary_name = "redis-server"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.socket_path = workdir / "redis.sock"
        if len(str(self.socket_path)) > 100:  # sun_path holds 108 bytes
            raise RuntimeError(f"redis socket path too long for a unix socket: {self.socket_path}")

    @property
    def endpoint(self) -> str:
        return str(self.socket_path)

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}?db=0"

    def _argv(self) -> list[str]:
        return [
            self.binary,
            "--port", "0",  # no TCP listener
            "--unixsocket", str(self.socket_path),
            "--unixsocketperm", "700",
            "--dir", str(self.workdir),
            "--save", "",
            "--appendonly", "yes",  # keep data across stop()/start()
            "--appendfsync", "no",
            "--daemonize", "no",
        ]  # fmt: skip

    def _ready(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(1)
                s.connect(str(self.socket_path))
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False


def _start_with_retry(make: Callable[[Path], _Server], workdir: Path) -> _Server:
    # free_port() is racy by nature; on a collision, retry on fresh ports.
    last: Exception | None = None
    for attempt in range(3):
        server = make(workdir / f"try{attempt}")
        try:
            server.start()
            return server
        except RuntimeError as e:
            server.stop()
            last = e
    raise RuntimeError(f"could not start server in {workdir}: {last}")


def start_etcd(workdir: Path, tls: tuple[Path, Path, Path] | None = None) -> EtcdServer:
    """A private etcd; tls=(ca, cert, key) enables HTTPS with client-cert auth."""
    server = _start_with_retry(lambda d: EtcdServer(d, tls), workdir)
    assert isinstance(server, EtcdServer)
    return server


def start_redis(workdir: Path) -> RedisServer:
    server = _start_with_retry(RedisServer, workdir)
    assert isinstance(server, RedisServer)
    return server


@contextlib.contextmanager
def _session_server(kind: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=f"persys-{kind}-") as tmp:
        yield Path(tmp)


@pytest.fixture(scope="session")
def _etcd_session() -> Iterator[EtcdServer]:
    with _session_server("etcd") as tmp:
        server = start_etcd(tmp)
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def etcd_server(_etcd_session: EtcdServer) -> EtcdServer:
    """Shared etcd (one per session); restarted here if a previous test left it stopped."""
    _etcd_session.start()
    return _etcd_session


@pytest.fixture(scope="session")
def _redis_session() -> Iterator[RedisServer]:
    with _session_server("redis") as tmp:
        server = start_redis(tmp)
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def redis_server(_redis_session: RedisServer) -> RedisServer:
    """Shared redis-server (one per session); restarted here if left stopped."""
    _redis_session.start()
    return _redis_session


@pytest.fixture(params=["sqlite", "etcd"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Runs the test on both state-store backends: a fresh SQLite file, then a private etcd."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'state.db'}"
        return
    etcd = start_etcd(tmp_path / "etcd")
    yield etcd.url
    etcd.stop()
