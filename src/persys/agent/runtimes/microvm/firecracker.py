"""Firecracker backend: `firecracker --api-sock SOCK`, configured through its HTTP API on that socket.

Boot sequence (all PUT, each answered 204 by Firecracker): /logger, /metrics, /machine-config,
/boot-source, /drives/rootfs, /network-interfaces/ethN, then /actions InstanceStart. The guest's
serial console is Firecracker's stdout, so that goes to console.log. The root drive is a private
copy (a reflink where the filesystem can) of the spec's image, which is never opened for writing.

Firecracker exits when the guest reboots or powers off, so stopping is SendCtrlAltDel (the guest's
reboot path) and a kill only when the guest ignores it. Metrics are JSON lines whose counters are
deltas since the previous flush; they are summed into cumulative disk and network totals.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from persys.agent.runtimes.base import Probe
from persys.agent.runtimes.kvm import kvm_device_problem
from persys.agent.runtimes.microvm.hypervisor import HypervisorError, VMConfig, VMHandle, VMMetrics, VMStatus
from persys.agent.runtimes.microvm.supervise import (
    VMMProcesses,
    clone_file,
    guest_mac,
    path_exists,
    prepare_files,
    socket_path,
)
from persys.model.status import WorkloadUsage

# Firecracker flushes on its own every 60 s; extra flushes are rate-limited so frequent inspects do
# not grow the metrics file (each line is several KiB) much faster than Firecracker itself does.
DEFAULT_FLUSH_INTERVAL = 30.0


class FirecrackerAPIError(HypervisorError):
    def __init__(self, method: str, path: str, status: int, fault: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {fault}", spec_error=400 <= status < 500)
        self.status = status
        self.fault = fault


class FirecrackerAPI:
    """A minimal async client for Firecracker's HTTP API over its unix socket."""

    def __init__(self, socket: str | Path, timeout: float = 5.0) -> None:
        self._client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(socket)),
            base_url="http://localhost",  # the host part is ignored on a unix socket
            timeout=timeout,
        )

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            resp = await self._client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise HypervisorError(f"{method} {path}: {exc!r}") from exc
        if resp.status_code >= 300:
            fault = resp.text
            with contextlib.suppress(ValueError):
                fault = str(resp.json().get("fault_message", fault))
            raise FirecrackerAPIError(method, path, resp.status_code, fault)
        return resp.json() if resp.content else None

    async def put(self, path: str, body: dict[str, Any]) -> None:
        await self._request("PUT", path, body)

    async def get(self, path: str) -> Any:
        return await self._request("GET", path)

    async def action(self, action_type: str) -> None:
        await self.put("/actions", {"action_type": action_type})

    async def close(self) -> None:
        await self._client.aclose()


@dataclass
class _MetricsTotals:
    offset: int = 0
    flushed_at: float = 0.0
    totals: dict[str, int] = field(default_factory=dict)


# (section, field) of Firecracker's metrics lines -> our cumulative counter.
_COUNTERS = {
    ("block", "read_bytes"): "disk_read_bytes",
    ("block", "write_bytes"): "disk_write_bytes",
    ("net", "rx_bytes_count"): "net_rx_bytes",
    ("net", "tx_bytes_count"): "net_tx_bytes",
}


class FirecrackerHypervisor:
    """Runs microVMs with a `firecracker` binary (from PATH or a configured path)."""

    name = "firecracker"

    def __init__(
        self,
        *,
        binary: str = "firecracker",
        start_timeout: float = 5.0,
        api_timeout: float = 5.0,
        metrics_flush_interval: float = DEFAULT_FLUSH_INTERVAL,
    ) -> None:
        self._binary = binary
        self._flush_interval = metrics_flush_interval
        self._start_timeout = start_timeout
        self._api_timeout = api_timeout
        self._procs = VMMProcesses()
        self._metrics: dict[str, _MetricsTotals] = {}

    def binary(self) -> str | None:
        exe = self._binary
        return shutil.which(exe) if "/" not in exe else (exe if os.access(exe, os.X_OK) else None)

    async def probe(self) -> Probe:
        exe = self.binary()
        if exe is None:
            return Probe(available=False, reason=f"{self._binary} not found on PATH")
        try:
            proc = await asyncio.create_subprocess_exec(
                exe, "--version", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
            )
            out, _ = await asyncio.wait_for(proc.communicate(), 10)
        except (OSError, TimeoutError) as exc:
            return Probe(available=False, reason=f"{exe} --version: {exc!r}")
        m = re.search(r"v?(\d+\.\d+\.\d+\S*)", out.decode(errors="replace"))
        if proc.returncode != 0 or m is None:
            return Probe(available=False, reason=f"{exe} --version failed: {out[:200]!r}")
        # Firecracker is KVM-only: without a usable /dev/kvm it would fail at InstanceStart.
        if kvm_device_problem():
            return Probe(available=False, version=m.group(1), reason="/dev/kvm is missing or not accessible")
        return Probe(available=True, version=m.group(1), features=(f"firecracker:{m.group(1)}",))

    def _api(self, handle: VMHandle) -> FirecrackerAPI:
        return FirecrackerAPI(handle.api_socket, self._api_timeout)

    async def start(self, cfg: VMConfig) -> VMHandle:
        exe = self.binary()
        if exe is None:
            raise HypervisorError(f"{self._binary} not found")
        wd = cfg.workdir
        disk, console, vmm_log = wd / "rootfs.img", wd / "console.log", wd / "vmm.log"
        fc_log, metrics = wd / "firecracker.log", wd / "metrics.jsonl"
        api_sock = socket_path(wd, "firecracker.sock")
        if cfg.rootfs is not None and (cfg.fresh_disk or not path_exists(disk)):
            await clone_file(cfg.rootfs, disk)
        # Firecracker opens the log and metrics files but does not create them.
        prepare_files(console, f"booting {cfg.vm_id} with firecracker", remove=(api_sock,), touch=(fc_log, metrics))
        handle = await self._procs.launch(
            self.name, cfg, [exe, "--api-sock", str(api_sock)], api_socket=api_sock, console_log=console,
            vmm_log=vmm_log, exit_file=wd / "exit_code", disk=disk if cfg.rootfs else None, vmm_stdout=console,
        )
        handle.detail.update(metrics_path=str(metrics), log_path=str(fc_log))
        self._metrics.pop(handle.api_socket, None)
        try:
            if not await self._procs.wait_socket(handle, self._start_timeout):
                raise HypervisorError(self._procs.failure(handle, "firecracker exited before its API socket appeared"))
            await self._configure(handle, cfg, disk, fc_log, metrics)
        except BaseException:
            await self._procs.kill(handle, grace=0.5)
            raise
        return handle

    async def _configure(self, handle: VMHandle, cfg: VMConfig, disk: Path, fc_log: Path, metrics: Path) -> None:
        api = self._api(handle)
        try:
            # Logger and metrics first, so that everything after them is logged.
            await api.put("/logger", {"log_path": str(fc_log), "level": "Info", "show_level": True})
            await api.put("/metrics", {"metrics_path": str(metrics)})
            await api.put("/machine-config", {"vcpu_count": cfg.vcpus, "mem_size_mib": cfg.memory_mb})
            boot: dict[str, Any] = {"kernel_image_path": str(cfg.kernel), "boot_args": cfg.cmdline}
            if cfg.initrd is not None:
                boot["initrd_path"] = str(cfg.initrd)
            await api.put("/boot-source", boot)
            if cfg.rootfs is not None:
                await api.put("/drives/rootfs", {
                    "drive_id": "rootfs", "path_on_host": str(disk), "is_root_device": True, "is_read_only": False,
                })
            for i, tap in enumerate(cfg.tap_devices):
                iface = f"eth{i}"
                await api.put(f"/network-interfaces/{iface}", {
                    "iface_id": iface, "host_dev_name": tap, "guest_mac": guest_mac(cfg.vm_id, i),
                })
            await api.action("InstanceStart")
        finally:
            await api.close()

    async def stop(self, handle: VMHandle, grace: float) -> None:
        if self._procs.alive(handle):
            api = self._api(handle)
            try:
                # Ctrl+Alt+Del makes the guest reboot, and Firecracker exits on a guest reboot.
                await api.action("SendCtrlAltDel")
                if await self._procs.wait_exit(handle, grace):
                    return
            except HypervisorError:
                pass  # API gone or the guest has no keyboard controller: fall through to signals
            finally:
                await api.close()
        await self._procs.kill(handle, grace=1.0)

    async def inspect(self, handle: VMHandle) -> VMStatus:
        if not self._procs.alive(handle):
            return VMStatus(running=False, exit_code=await self._procs.exit_code_after_exit(handle))
        api = self._api(handle)
        try:
            info = await api.get("/")
            return VMStatus(running=True, detail=str(info.get("state", "")) if isinstance(info, dict) else "")
        except HypervisorError as exc:
            return VMStatus(running=True, detail=f"API unavailable: {exc}")
        finally:
            await api.close()

    async def metrics(self, handle: VMHandle) -> VMMetrics:
        cpu_ns, rss = self._procs.usage(handle)
        state = self._metrics.setdefault(handle.api_socket, _MetricsTotals())
        if self._procs.alive(handle) and time.monotonic() - state.flushed_at >= self._flush_interval:
            api = self._api(handle)
            try:
                await api.action("FlushMetrics")
                state.flushed_at = time.monotonic()
            except HypervisorError:
                pass  # totals as of Firecracker's own last periodic flush
            finally:
                await api.close()
        path = handle.detail.get("metrics_path", "")
        if path:
            await asyncio.to_thread(_consume_metrics, Path(path), state)
        t = state.totals
        return VMMetrics(cpu_ns, WorkloadUsage(memory_bytes=rss, **t))  # totals are keyed by usage field

    def console_log(self, handle: VMHandle) -> Path:
        return Path(handle.console_log)

    def console_socket(self, handle: VMHandle) -> Path | None:
        return None  # the guest's serial console is the VMM's stdout, a file: nothing to attach to

    def files(self, handle: VMHandle) -> list[Path]:
        self._metrics.pop(handle.api_socket, None)
        return [Path(handle.api_socket)]

    async def close(self) -> None:
        self._procs.forget()  # the VMs keep running; a later agent adopts them


def _consume_metrics(path: Path, state: _MetricsTotals) -> None:
    """Adds the counters of complete metrics lines written since the last call to `state`."""
    try:
        with open(path, "rb") as f:
            f.seek(state.offset)
            data = f.read()
    except OSError:
        return
    end = data.rfind(b"\n") + 1  # a line still being written is read next time
    for line in data[:end].splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict):
            continue
        for (section, key), name in _COUNTERS.items():
            value = doc.get(section, {}).get(key, 0) if isinstance(doc.get(section), dict) else 0
            if isinstance(value, int):
                state.totals[name] = state.totals.get(name, 0) + value
    state.offset += end
