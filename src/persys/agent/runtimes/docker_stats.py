"""The Docker Engine's container stats and timestamps as persys figures, for the docker and compose runtimes."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import aiodocker
from aiodocker.exceptions import DockerError

from persys.model.status import WorkloadUsage

_FRACTION_RE = re.compile(r"\.(\d+)")


def parse_docker_time(value: str | None) -> float:
    """Docker timestamps carry nanoseconds and 'Z'; `0001-01-01T00:00:00Z` means never."""
    if not value or value.startswith("0001-"):
        return 0.0
    value = _FRACTION_RE.sub(lambda m: "." + m.group(1)[:6].ljust(6, "0"), value, count=1)
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def cpu_percent(stats: dict[str, Any]) -> float:
    cpu = stats.get("cpu_stats") or {}
    pre = stats.get("precpu_stats") or {}
    cpu_delta = (cpu.get("cpu_usage") or {}).get("total_usage", 0) - (pre.get("cpu_usage") or {}).get("total_usage", 0)
    sys_delta = cpu.get("system_cpu_usage", 0) - pre.get("system_cpu_usage", 0)
    online = cpu.get("online_cpus") or len((cpu.get("cpu_usage") or {}).get("percpu_usage") or []) or 1
    if cpu_delta <= 0 or sys_delta <= 0:
        return 0.0
    return round(float(cpu_delta / sys_delta * online * 100.0), 3)


def memory_bytes(stats: dict[str, Any]) -> int:
    mem = stats.get("memory_stats") or {}
    usage = int(mem.get("usage") or 0)
    detail = mem.get("stats") or {}
    # Same as `docker stats`: page cache that can be dropped is not the workload's memory.
    cache = int(detail.get("total_inactive_file", detail.get("inactive_file", 0)) or 0)
    return usage - cache if usage > cache else usage


def blkio_bytes(stats: dict[str, Any]) -> tuple[int, int]:
    entries = (stats.get("blkio_stats") or {}).get("io_service_bytes_recursive") or []
    read = sum(int(e.get("value") or 0) for e in entries if str(e.get("op", "")).lower() == "read")
    write = sum(int(e.get("value") or 0) for e in entries if str(e.get("op", "")).lower() == "write")
    return read, write


def net_bytes(stats: dict[str, Any]) -> tuple[int, int]:
    nets = (stats.get("networks") or {}).values()
    return sum(int(n.get("rx_bytes") or 0) for n in nets), sum(int(n.get("tx_bytes") or 0) for n in nets)


def container_usage(stats: dict[str, Any]) -> WorkloadUsage:
    """One container's figures from one stats sample (`stream=False`: precpu_stats filled in)."""
    (rd, wr), (rx, tx) = blkio_bytes(stats), net_bytes(stats)
    return WorkloadUsage(
        cpu_percent=cpu_percent(stats),
        memory_bytes=memory_bytes(stats),
        disk_read_bytes=rd,
        disk_write_bytes=wr,
        net_rx_bytes=rx,
        net_tx_bytes=tx,
    )


def total_usage(parts: Iterable[WorkloadUsage]) -> WorkloadUsage:
    """The sum over several containers (a compose project's services)."""
    out = WorkloadUsage()
    for u in parts:
        out.cpu_percent = round(out.cpu_percent + u.cpu_percent, 3)
        out.memory_bytes += u.memory_bytes
        out.disk_read_bytes += u.disk_read_bytes
        out.disk_write_bytes += u.disk_write_bytes
        out.net_rx_bytes += u.net_rx_bytes
        out.net_tx_bytes += u.net_tx_bytes
    return out


async def sample_usage(docker: aiodocker.Docker, container_id: str, limit_s: float) -> WorkloadUsage | None:
    """A running container's figures, or None when the engine did not answer in time (usage is
    best-effort; the state is what matters)."""
    try:
        # stream=False makes the engine take two samples, so precpu_stats is filled in.
        samples = await asyncio.wait_for(docker.containers.container(container_id).stats(stream=False), timeout=limit_s)
    except (DockerError, TimeoutError, OSError):
        return None
    return container_usage(samples[-1]) if samples else None
