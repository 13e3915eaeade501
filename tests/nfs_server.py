"""A real NFS server for tests: nfs-ganesha in userspace (no kernel nfsd here), exporting a temp
folder over NFSv4 and NFSv3.

Usage from a conftest: `from tests.nfs_server import *`. Fixture:
  nfs_server  (session, started on first use) -> NfsServer  .export (NfsExport) .folder .pid .startup_s
NFSv3 is served because QEMU's NFS block driver speaks only v3, and finds the server through the
portmapper on port 111: an rpcbind already running is used, else one is started and stopped at
the end. Ganesha cannot report a kernel-chosen port, so free ports are picked and the start is
retried on a conflict. Two ganesha servers on one machine would fight over their portmapper
registration (QEMU would reach the last one): one per test run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from persys.storage import libnfs
from persys.storage.nfs_export import NfsExport

__all__ = ["NfsServer", "nfs_server", "start_nfs_server"]

READY_TIMEOUT = 20.0
START_TRIES = 3
RPCBIND_FILES = ("/run/rpcbind.sock", "/run/rpcbind/rpcbind.xdr", "/run/rpcbind/portmap.xdr")

CONFIG = """
NFS_CORE_PARAM {{ Protocols = 3, 4; NFS_Port = {nfs_port}; MNT_Port = {mnt_port}; Bind_addr = 127.0.0.1;
  Enable_NLM = false; Enable_RQUOTA = false; Mount_Path_Pseudo = true; }}
NFSV4 {{ Graceless = true; RecoveryBackend = fs; RecoveryRoot = {work}/recovery; }}
EXPORT {{ Export_Id = 1; Path = {folder}; Pseudo = /export; Access_Type = RW; Squash = No_Root_Squash;
  Protocols = 3, 4; Transports = TCP; SecType = sys; FSAL {{ Name = VFS; }} }}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _portmapper_answers() -> bool:
    res = subprocess.run(["rpcinfo", "-p", "127.0.0.1"], capture_output=True, timeout=10)
    return res.returncode == 0


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@dataclass
class NfsServer:
    export: NfsExport
    folder: Path  # what the server exports, on this machine's disk
    work: Path
    proc: subprocess.Popen[bytes]
    startup_s: float
    rpcbind: subprocess.Popen[bytes] | None = None  # ours to stop, when we started it

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        _stop(self.proc)
        if self.rpcbind is not None:
            _stop(self.rpcbind)
            for left in RPCBIND_FILES:  # its socket and warm-start state: as before we started it
                Path(left).unlink(missing_ok=True)
        shutil.rmtree(self.work, ignore_errors=True)


def _start_rpcbind(work: Path) -> subprocess.Popen[bytes] | None:
    if _portmapper_answers():
        return None
    log = open(work / "rpcbind.log", "wb")
    # -f: foreground, so it is our child to stop; (-h, binding one address, crashes Debian's rpcbind)
    proc = subprocess.Popen(["rpcbind", "-f"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + READY_TIMEOUT
    while not _portmapper_answers():
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            raise RuntimeError(f"rpcbind did not start: {(work / 'rpcbind.log').read_text()[-500:]}")
        time.sleep(0.1)
    return proc


def _ready(export: NfsExport, proc: subprocess.Popen[bytes], log: Path) -> bool:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        with contextlib.suppress(Exception):
            with libnfs.session(export.libnfs_url, 2):
                return True
        time.sleep(0.1)
    raise RuntimeError(f"ganesha did not serve within {READY_TIMEOUT:.0f} s: {log.read_text()[-800:]}")


def start_nfs_server(work: Path) -> NfsServer:
    """Start rpcbind (if none answers) and ganesha exporting `work/export`. Stop it yourself."""
    t0 = time.monotonic()
    folder = work / "export"
    for d in (folder, work / "recovery"):
        d.mkdir(parents=True, exist_ok=True)
    rpcbind = _start_rpcbind(work)
    try:
        for _ in range(START_TRIES):  # a picked port taken meanwhile: pick again
            export = NfsExport("127.0.0.1", "/export", _free_port())
            conf = work / "ganesha.conf"
            conf.write_text(CONFIG.format(nfs_port=export.port, mnt_port=_free_port(), work=work, folder=folder))
            log = work / "ganesha.log"
            proc = subprocess.Popen(
                ["ganesha.nfsd", "-F", "-L", str(log), "-f", str(conf), "-p", str(work / "ganesha.pid")],
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True, cwd=work)
            if _ready(export, proc, log):
                return NfsServer(export, folder, work, proc, time.monotonic() - t0, rpcbind)
            _stop(proc)
        raise RuntimeError(f"ganesha exited at start {START_TRIES} times: {log.read_text()[-800:]}")
    except BaseException:
        if rpcbind is not None:
            _stop(rpcbind)
            for left in RPCBIND_FILES:
                Path(left).unlink(missing_ok=True)
        raise


@pytest.fixture(scope="session")
def nfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NfsServer]:
    if shutil.which("ganesha.nfsd") is None:
        pytest.fail("ganesha.nfsd missing: run scripts/install.sh --test (nfs-ganesha nfs-ganesha-vfs)")
    work = Path(tmp_path_factory.mktemp("nfs"))
    os.chmod(work, 0o700)
    server = start_nfs_server(work)
    print(f"\nnfs-ganesha serving {server.export} in {server.startup_s:.2f} s (pid {server.pid})", file=sys.stderr)
    try:
        yield server
    finally:
        server.stop()
