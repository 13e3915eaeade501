"""Node: a machine running the agent, with the capabilities it really has."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, StrictStr

from persys.model.base import Model
from persys.model.devices import MAX_NODE_DEVICES, Device
from persys.model.workload import Quantity


class NodeStatus(StrEnum):
    READY = "Ready"
    NOT_READY = "NotReady"


class Taint(Model):
    key: StrictStr
    value: StrictStr = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"
    # When an operator added it (wall clock): NoExecute's tolerationSeconds count from here.
    # Unset (an agent's own taints): since the node registered.
    added_at: float | None = None

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}"


class RuntimeInfo(Model):
    """One runtime the agent probed and found working (e.g. docker 20.10.24)."""

    version: str = ""
    features: list[str] = Field(default_factory=list)


class Capabilities(Model):
    runtimes: dict[str, RuntimeInfo] = Field(default_factory=dict)  # workload type -> info
    # Runtimes the agent probed and found not working, with why (never placed on; in describe
    # node and the scheduler's health). Bounded by the scheduler when the node registers.
    unavailable: dict[str, str] = Field(default_factory=dict)
    # Driver names and "<driver>:<kind>" entries the node's probes found working, and why a
    # driver or kind is missing (scheduler.placement.storage_offers); bounded at registration.
    storage_drivers: list[str] = Field(default_factory=list)
    storage_missing: dict[str, str] = Field(default_factory=dict)
    # Capacity the placement engine compares requests with: never negative, bounded like requests.
    cpu_millicores: Quantity = 0
    memory_mb: Quantity = 0
    disk_mb: Quantity = 0
    devices: Annotated[list[Device], Field(max_length=MAX_NODE_DEVICES)] = Field(default_factory=list)  # GPUs


class NodeUsage(Model):
    cpu_percent: float = 0.0
    memory_used_mb: int = 0
    disk_used_mb: int = 0
    workloads: int = 0
    # Cumulative bytes of the node's disks and NICs (the meter turns them into rates).
    disk_read_bytes: int = 0
    disk_write_bytes: int = 0
    net_rx_bytes: int = 0
    net_tx_bytes: int = 0


class Node(Model):
    """Stored at `/persys/nodes/<id>`; rewritten only on registration and status transitions."""

    id: StrictStr
    address: str = ""
    agent_version: str = ""
    capabilities: Capabilities = Field(default_factory=Capabilities)
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)
    status: NodeStatus = NodeStatus.READY
    status_reason: str = ""
    cordoned: bool = False
    draining: bool = False
    drain_deadline: float = 0.0  # wall-clock time; 0 = none
    # Set by operators (persysctl label/taint); merged over what the agent reports.
    admin_labels: dict[str, str] = Field(default_factory=dict)
    admin_taints: list[Taint] = Field(default_factory=list)

    def effective_labels(self) -> dict[str, str]:
        return {**self.labels, **self.admin_labels}

    def effective_taints(self) -> list[Taint]:
        keys = {(t.key, t.effect) for t in self.admin_taints}
        return [t for t in self.taints if (t.key, t.effect) not in keys] + list(self.admin_taints)
    registered_at: float = 0.0
    last_heartbeat: float = 0.0
    usage: NodeUsage = Field(default_factory=NodeUsage)
