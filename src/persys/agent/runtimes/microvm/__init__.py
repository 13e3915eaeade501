"""MicroVM runtime: `type: microvm` workloads on Firecracker or, where it is missing, QEMU's `microvm` machine."""

from persys.agent.runtimes.microvm.firecracker import FirecrackerAPI, FirecrackerHypervisor
from persys.agent.runtimes.microvm.hypervisor import (
    Hypervisor,
    HypervisorError,
    VMConfig,
    VMHandle,
    VMMetrics,
    VMStatus,
)
from persys.agent.runtimes.microvm.qemu import QemuHypervisor, QMPClient
from persys.agent.runtimes.microvm.runtime import MicroVMRuntime

__all__ = [
    "FirecrackerAPI",
    "FirecrackerHypervisor",
    "Hypervisor",
    "HypervisorError",
    "MicroVMRuntime",
    "QMPClient",
    "QemuHypervisor",
    "VMConfig",
    "VMHandle",
    "VMMetrics",
    "VMStatus",
]
