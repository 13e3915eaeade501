"""What the automation needs from the rest of Persys, as Protocols: the client API it reads and
acts through (`SchedulerClient` fits), Persys Intelligence's signals, and a what-if placement.

The automation is a client like persysctl: it reads the meter and the store and acts through the
same API, as its own identity (an operator certificate), so every action is authorized and
audited as that identity. The policies' edges depend on these Protocols only; what implements
them is chosen where the automation is started (cli/servers/automation.py, cli/servers/dev_automation.py),
e.g. disk_forecasts.NodeDiskForecasts (Intelligence's own forecast over the meter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class AutomationApi(Protocol):
    async def list_automation_policies(self) -> dict[str, Any]: ...
    async def get_automation_policy(self, name: str) -> dict[str, Any]: ...
    async def record_decisions(self, decisions: list[dict[str, Any]]) -> list[str]: ...
    async def list_decisions(self, policy: str = "", since: float = 0.0, limit: int = 0, outcome: str = ""
                             ) -> list[dict[str, Any]]: ...
    async def get_workload(self, workload_id: str) -> dict[str, Any]: ...
    async def list_workloads(self, node_id: str = "") -> list[dict[str, Any]]: ...
    async def list_nodes(self) -> list[dict[str, Any]]: ...
    async def get_node(self, node_id: str) -> dict[str, Any]: ...
    async def apply(self, manifest: dict[str, Any], dry_run: bool = False) -> dict[str, Any]: ...
    async def control(self, workload_id: str, action: str) -> dict[str, Any]: ...
    async def cordon(self, node_id: str, on: bool) -> dict[str, Any]: ...
    async def events(self, limit: int = 100, subject: str = "") -> list[dict[str, Any]]: ...
    async def meter_query(self, selector: str, value: str, metric: str, since: float, step: int, agg: str
                          ) -> dict[str, Any]: ...
    async def move_instance(self, workload_id: str, instance: str, to_node: str = "", dry_run: bool = False
                            ) -> dict[str, Any]: ...
    async def automation_lease(self, holder: str, ttl: float, release: bool = False) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Signal:
    """A finding of Persys Intelligence a policy may act on (a disk filling, a consolidation),
    with the evidence it cites."""

    kind: str  # e.g. disk-filling, consolidate
    subject: str  # node/n1, workload/web
    evidence: str
    confidence: float = 0.0


class IntelligenceSignals(Protocol):
    """Persys Intelligence, once it exists: its current signals. A forecast alone never scales
    in (docs/automation.md); the automation runs without any source of signals."""

    async def signals(self) -> list[Signal]: ...


class DiskForecasts(Protocol):
    """Persys Intelligence's disk-space forecasts, one per node, fitted on the last
    `history_seconds` of the meter's samples, `horizon_seconds` ahead:
    `{"node", "capacityBytes", "evidence": <its id>, "forecast": <intelligence.forecast.Forecast.
    to_dict(): {"points": [[t, point, lower80, upper80], ...], "unpredictable", "verdict", ...}>}`
    of the node's used disk bytes. The remediate policy reads it through this seam only
    (disk_forecasts.NodeDiskForecasts in the running automation)."""

    async def disk_forecasts(self, history_seconds: float, horizon_seconds: float) -> list[dict[str, Any]]: ...


class WhatIfPlanner(Protocol):
    """The scheduler's what-if plan for moving an instance (the placement issue's API, being
    built): where it would land, or why nowhere. Until it exists the rebalance policy checks a
    move with the pure placement engine over the nodes the API lists."""

    async def plan_move(self, workload: str, instance: str, avoid: list[str]) -> dict[str, Any]: ...
