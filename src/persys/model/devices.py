"""Devices (GPUs): what a node advertises, what a workload asks for, what an instance is given.

A node's agent detects its GPUs (agent/devices.py: NVIDIA through `nvidia-smi`) and registers
them; a workload asks `resources.devices: [{vendor: nvidia, count: 1, minMemoryMiB: 8000}]`; the
placement engine filters and reserves whole devices; the assignment names the devices given to
the instance, and the agent hands them to the runtime (Docker's device requests)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StrictInt, StrictStr

from persys.model.base import Model

MAX_NODE_DEVICES = 64  # devices one node may advertise
MAX_DEVICE_REQUESTS = 4  # distinct device requests of one workload
MAX_DEVICE_COUNT = 16  # devices of one request

Vendor = Annotated[StrictStr, Field(pattern=r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")]
DeviceId = Annotated[StrictStr, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9:._/-]+$")]


class Device(Model):
    """One device of a node: `id` is what the runtime is given (an NVIDIA GPU's UUID)."""

    id: DeviceId
    vendor: Vendor
    model: Annotated[StrictStr, Field(max_length=128)] = ""
    memory_mb: Annotated[StrictInt, Field(ge=0, le=10**8)] = 0
    index: Annotated[StrictInt, Field(ge=0, le=1023)] = 0


class DeviceRequest(Model):
    """`count` whole devices of `vendor`, each with at least `minMemoryMiB` of memory."""

    vendor: Vendor
    count: Annotated[StrictInt, Field(ge=1, le=MAX_DEVICE_COUNT)] = 1
    min_memory_mib: Annotated[StrictInt, Field(ge=0, le=10**8, alias="minMemoryMiB")] = 0
