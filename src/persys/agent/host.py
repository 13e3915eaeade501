"""Host capacity and usage, read from /proc (cheap enough to sample every heartbeat)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, rest = line.partition(":")
            out[name] = int(rest.split()[0])  # kB
    except (OSError, ValueError, IndexError):
        pass
    return out


@dataclass(frozen=True)
class Capacity:
    cpu_millicores: int
    memory_mb: int
    disk_mb: int


def capacity(state_dir: Path) -> Capacity:
    mem = _meminfo().get("MemTotal", 0) // 1024
    try:
        disk = shutil.disk_usage(state_dir).total // (1024 * 1024)
    except OSError:
        disk = 0
    return Capacity((os.cpu_count() or 1) * 1000, mem, disk)


SECTOR = 512  # /proc/diskstats counts 512-byte sectors whatever the device's own sector size


def _physical(folder: Path) -> set[str]:
    """The entries of /sys/block or /sys/class/net backed by a device: real disks and NICs, not
    loop devices, device-mapper volumes (their disk counts their I/O already), bridges or veths."""
    try:
        return {p.name for p in folder.iterdir() if (p / "device").exists()}
    except OSError:
        return set()


def host_io(sys_root: Path = Path("/sys"), proc_root: Path = Path("/proc")) -> tuple[int, int, int, int]:
    """Cumulative bytes the node's disks read and wrote and its NICs received and sent."""
    rd = wr = rx = tx = 0
    disks = _physical(sys_root / "block")
    try:
        for line in (proc_root / "diskstats").read_text().splitlines():
            f = line.split()
            if len(f) >= 10 and f[2] in disks:
                rd += int(f[5]) * SECTOR
                wr += int(f[9]) * SECTOR
    except (OSError, ValueError):
        pass
    nics = _physical(sys_root / "class" / "net")
    try:
        for line in (proc_root / "net" / "dev").read_text().splitlines()[2:]:
            name, _, rest = line.partition(":")
            f = rest.split()
            if name.strip() in nics and len(f) >= 9:
                rx += int(f[0])
                tx += int(f[8])
    except (OSError, ValueError):
        pass
    return rd, wr, rx, tx


@dataclass(frozen=True)
class HostSample:
    cpu_percent: float
    memory_used_mb: int
    disk_used_mb: int
    io: tuple[int, int, int, int]  # disk read, disk write, net rx, net tx: cumulative bytes


def disk_used(folders: Sequence[Path]) -> int:
    """Bytes used on the filesystems holding `folders`, each filesystem counted once (the state
    folder and the local volume pool are often on one). A folder that cannot be read counts 0."""
    seen: set[int] = set()
    used = 0
    for folder in folders:
        try:
            dev = folder.stat().st_dev
            if dev in seen:
                continue
            used += shutil.disk_usage(folder).used
            seen.add(dev)
        except OSError:
            continue
    return used


class UsageSampler:
    """CPU % between two samples of /proc/stat, memory and disk in use, and the host's I/O
    counters. Disk in use: the filesystems of the agent's state folder and of `volume_dirs` (the
    local volume pool), what Persys fills on the node; one statvfs each, no walk of the files."""

    def __init__(self, state_dir: Path, volume_dirs: Sequence[Path] = ()) -> None:
        self.state_dir = state_dir
        self.volume_dirs = tuple(volume_dirs)
        self._last: tuple[int, int] | None = None

    def _cpu_times(self) -> tuple[int, int]:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        except (OSError, ValueError, IndexError):
            return 0, 0
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields), idle

    def sample(self) -> HostSample:
        total, idle = self._cpu_times()
        pct = 0.0
        if self._last is not None and total > self._last[0]:
            dt, di = total - self._last[0], idle - self._last[1]
            pct = max(0.0, min(100.0, 100.0 * (dt - di) / dt))
        self._last = (total, idle)
        info = _meminfo()
        mem_used = (info.get("MemTotal", 0) - info.get("MemAvailable", 0)) // 1024
        used = disk_used((self.state_dir, *self.volume_dirs)) // (1024 * 1024)
        return HostSample(pct, mem_used, used, host_io())
