"""Devices (GPUs) in placement: the `DeviceFit` filter and which devices a placement gets (pure).

Devices are whole: a node's device is free when no assigned or reserved instance holds it. A
request's needs are met in order, each from the free devices of its vendor with enough memory,
the smallest sufficient first (then by id), so a big device stays for a request that needs it.
"""

from __future__ import annotations

from .framework import Filter, PlacementContext
from .snapshot import DeviceNeed, DeviceSlot, NodeInfo, WorkloadRequest
from .status import Status


def _free(node: NodeInfo, need: DeviceNeed, taken: set[str]) -> list[DeviceSlot]:
    used = node.devices_used
    return sorted((d for d in node.devices if d.vendor == need.vendor and d.memory_mb >= need.min_memory_mb
                   and d.id not in used and d.id not in taken), key=lambda d: (d.memory_mb, d.id))


def shortfall(node: NodeInfo, request: WorkloadRequest) -> Status | None:
    """The first need the node's free devices cannot meet, with its figures (None: all met)."""
    taken: set[str] = set()
    for need in request.devices:
        free = _free(node, need, taken)
        if len(free) < need.count:
            reason = f"insufficient {need.resource}" + (f" with >= {need.min_memory_mb} MiB" if need.min_memory_mb
                                                        else "")
            return Status("insufficient_devices", reason, DeviceFit.name, need.count, len(free), need.resource)
        taken.update(d.id for d in free[:need.count])
    return None


def pick(node: NodeInfo, request: WorkloadRequest) -> tuple[str, ...]:
    """The devices a placement on `node` is given (the node must fit: `shortfall` is None)."""
    taken: list[str] = []
    for need in request.devices:
        taken += [d.id for d in _free(node, need, set(taken))[:need.count]]
    return tuple(taken)


class DeviceFit(Filter):
    name = "device_fit"
    static = False

    def applies(self, request: WorkloadRequest, ctx: PlacementContext) -> bool:
        return bool(request.devices)

    def check(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> Status | None:
        return shortfall(node, request)
