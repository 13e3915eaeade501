"""The hypervisor interface the microVM runtime drives, and the records that cross it.

A backend owns one VMM process per VM and everything VMM-specific (its API, its disk format, its
metrics); the runtime owns desired state: revisions, meta.json, adoption, usage sampling.
A `VMHandle` is plain data saved in meta.json, so a new runtime instance can hand it back to a
backend and keep controlling a VM that an earlier agent started.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from persys.agent.runtimes.base import Probe
from persys.model.status import WorkloadUsage


class HypervisorError(Exception):
    """A VMM refused or failed an operation; `spec_error` when the VM definition itself is at fault."""

    def __init__(self, message: str, *, spec_error: bool = False) -> None:
        super().__init__(message)
        self.spec_error = spec_error


@dataclass(frozen=True)
class VMConfig:
    """One VM to boot. Paths are absolute; `kernel` is an uncompressed ELF vmlinux."""

    vm_id: str
    workdir: Path  # private to this VM: disks, sockets and logs live here
    kernel: Path
    cmdline: str
    vcpus: int
    memory_mb: int
    initrd: Path | None = None
    rootfs: Path | None = None  # the base image: backends boot a private copy-on-write copy of it
    tap_devices: tuple[str, ...] = ()
    fresh_disk: bool = True  # False: keep the disk copy from an earlier run of the same revision


@dataclass
class VMHandle:
    """Everything needed to find and control a running VM again (stored as JSON in meta.json)."""

    hypervisor: str
    vm_id: str
    workdir: str
    wrapper_pid: int  # session/process group leader that records the VMM's exit status
    wrapper_start_ticks: int
    vmm_pid: int
    vmm_start_ticks: int
    started_at: float
    api_socket: str  # Firecracker API or QEMU QMP
    console_log: str
    vmm_log: str  # the VMM's own stderr/log: where its error messages go
    disk: str = ""  # the private copy of the rootfs ("" when the VM has no root drive)
    exit_file: str = ""
    taps: list[str] = field(default_factory=list)
    tap_baseline: dict[str, list[int]] = field(default_factory=dict)  # tap -> [rx, tx] at boot
    detail: dict[str, str] = field(default_factory=dict)  # backend specific (e.g. accel, metrics path)


@dataclass(frozen=True)
class VMStatus:
    running: bool
    detail: str = ""  # the VMM's own word for the state, e.g. QMP "running" or Firecracker "Running"
    exit_code: int | None = None  # the VMM's exit status once it has exited, when known


@dataclass(frozen=True)
class VMMetrics:
    """The VMM's CPU time and the VM's memory and cumulative I/O since it booted (0 where the
    backend cannot tell); the runtime turns CPU time into `usage.cpu_percent`."""

    cpu_ns: int = 0
    usage: WorkloadUsage = field(default_factory=WorkloadUsage)


@runtime_checkable
class Hypervisor(Protocol):
    name: str  # "firecracker" | "qemu"

    async def probe(self) -> Probe:
        """Whether this backend really works here, its version and features; never raises."""
        ...

    async def start(self, cfg: VMConfig) -> VMHandle:
        """Boots the VM and returns once the VMM runs it; raises HypervisorError."""
        ...

    async def stop(self, handle: VMHandle, grace: float) -> None:
        """Asks the guest to shut down, then kills the VMM if it is still there after `grace` s."""
        ...

    async def inspect(self, handle: VMHandle) -> VMStatus: ...

    async def metrics(self, handle: VMHandle) -> VMMetrics: ...

    def console_log(self, handle: VMHandle) -> Path:
        """The file the guest's serial console is written to."""
        ...

    def console_socket(self, handle: VMHandle) -> Path | None:
        """The unix socket an interactive client attaches to the serial console on (one at a
        time), None when this backend has none."""
        ...

    def files(self, handle: VMHandle) -> list[Path]:
        """Files the backend made outside `workdir` (e.g. sockets with short paths), for removal."""
        ...

    async def close(self) -> None:
        """Releases agent-side resources only: running VMs are left alone for the next agent."""
        ...
