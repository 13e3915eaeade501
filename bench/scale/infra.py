"""Child processes of the scale benchmark (etcd, Redis, scheduler, hollow agents, py-spy) and
/proc sampling. Every child is registered here and stopped by `stop_all()`, which the driver
runs in `finally`, from atexit and on SIGTERM; children also get SIGTERM from the kernel if the
driver dies abruptly (setpriv --pdeathsig), so nothing outlives a run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
_children: list[Child] = []
_lock = threading.Lock()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Child:
    """One child process with its output in `log_dir/<name>.log`."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None,
                 stop_signal: int = signal.SIGTERM) -> None:
        self.name = name
        self.argv = argv
        self.log = log_dir / f"{name}.log"
        self.stop_signal = stop_signal
        setpriv = shutil.which("setpriv")
        # The kernel sends SIGTERM to the child if this (the spawning) process dies.
        full = [setpriv, "--pdeathsig", "TERM", *argv] if setpriv else argv
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                full, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                start_new_session=True,  # Ctrl-C reaches the driver only; it stops children in order
            )
        with _lock:
            _children.append(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def text(self, tail: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def wait_for_output(self, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text(200_000):
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {needle!r} not seen after {timeout:.0f}s:\n{self.text()}")
            time.sleep(0.05)

    def stop(self, timeout: float = 15.0) -> int | None:
        """Signal this process (only it), wait, SIGKILL if it does not exit."""
        if self.alive():
            try:
                self.proc.send_signal(self.stop_signal)
                self.proc.send_signal(signal.SIGCONT)  # in case it was frozen with SIGSTOP
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            except ProcessLookupError:
                pass
        with _lock:
            if self in _children:
                _children.remove(self)
        return self.proc.returncode


def stop_all() -> None:
    """Stop every child still registered, newest first (clients before servers)."""
    with _lock:
        children = list(reversed(_children))
    for c in children:
        try:
            c.stop()
        except Exception as err:  # keep stopping the others
            print(f"warning: stopping {c.name} (pid {c.pid}) failed: {err}", flush=True)


# ---------------------------------------------------------------------- servers


def start_etcd(workdir: Path, quota_bytes: int = 8 << 30, snapshot_count: int = 10_000) -> tuple[Child, str]:
    """A private single-member etcd with default raft timers and real fsync; returns (child, host:port)."""
    binary = shutil.which("etcd") or "/usr/bin/etcd"
    last = ""
    for attempt in range(3):
        port, peer_port = free_port(), free_port()
        client, peer = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer_port}"
        child = Child(f"etcd-{attempt}", [
            binary, "--name=bench", f"--data-dir={workdir / f'etcd-{attempt}'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=bench={peer}", "--initial-cluster-state=new",
            f"--quota-backend-bytes={quota_bytes}", f"--snapshot-count={snapshot_count}",
            "--logger=zap", "--log-level=warn",
        ], workdir)  # fmt: skip
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and child.alive():
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as r:
                    if json.loads(r.read()).get("health") == "true":
                        return child, f"127.0.0.1:{port}"
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        last = child.text()
        child.stop()
    raise RuntimeError(f"etcd did not start:\n{last}")


def start_redis(workdir: Path) -> tuple[Child, str]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    last = ""
    for attempt in range(3):
        port = free_port()
        child = Child(f"redis-{attempt}", [
            binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(workdir),
            "--save", "", "--appendonly", "no", "--daemonize", "no",
        ], workdir)  # fmt: skip
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and child.alive():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return child, f"127.0.0.1:{port}"
            except OSError:
                pass
            time.sleep(0.1)
        last = child.text()
        child.stop()
    raise RuntimeError(f"redis-server did not start:\n{last}")


# ---------------------------------------------------------------------- /proc


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """Resident set size now (VmRSS), or the kernel's high-water mark of it (VmHWM)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def mem_available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (all its threads), in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


@dataclass
class Sampler:
    """Samples RSS and CPU of some processes every `interval` seconds in a thread."""

    pids: dict[str, int]
    interval: float = 0.5
    peak_rss: dict[str, int] = field(default_factory=dict)
    series: list[dict[str, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="proc-sampler", daemon=True)
        self._thread.start()

    def add(self, name: str, pid: int) -> None:
        self.pids = {**self.pids, name: pid}

    def _run(self) -> None:
        t0 = time.monotonic()
        n = 0
        while not self._stop.wait(self.interval):
            row: dict[str, float] = {"t": round(time.monotonic() - t0, 2)}
            for name, pid in self.pids.items():
                rss = rss_bytes(pid)
                if rss:
                    self.peak_rss[name] = max(self.peak_rss.get(name, 0), rss)
                row[f"{name}_rss_mb"] = round(rss / 2**20, 1)
                row[f"{name}_cpu_s"] = round(cpu_seconds(pid), 2)
            n += 1
            if n % 4 == 0:  # keep every 2 s in the JSON
                self.series.append(row)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
