"""Build placement inputs from plain data (YAML scenarios and hypothesis strategies share this)."""

from __future__ import annotations

from typing import Any

from persys.scheduler.placement import (
    DeviceNeed,
    DeviceSlot,
    LabelConstraint,
    NodeInfo,
    PlacementConfig,
    SpreadConstraint,
    Taint,
    Toleration,
    WorkloadRequest,
)

NODE_DEFAULTS: dict[str, Any] = {"cpu_millicores": 4000, "memory_mb": 8192, "disk_mb": 100_000}


def parse_taint(text: str) -> Taint:
    """``key=value:Effect`` or ``key:Effect``."""
    head, effect = text.rsplit(":", 1)
    key, _, value = head.partition("=")
    return Taint(key, value, effect)  # type: ignore[arg-type]


def node_from_data(data: dict[str, Any]) -> NodeInfo:
    d = {**NODE_DEFAULTS, **data}
    for key in ("runtimes", "runtime_features", "storage_drivers"):
        if key in d:
            d[key] = frozenset(d[key])
    d["taints"] = tuple(parse_taint(t) for t in d.get("taints", ()))
    d["labels"] = {k: str(v) for k, v in d.get("labels", {}).items()}
    d["devices"] = tuple(DeviceSlot(**x) for x in d.get("devices", ()))
    d["devices_used"] = frozenset(d.get("devices_used", ()))
    return NodeInfo(**d)


def request_from_data(data: dict[str, Any]) -> WorkloadRequest:
    d = {k: v for k, v in data.items() if k != "expect"}
    d["tolerations"] = tuple(Toleration(**t) for t in d.get("tolerations", ()))
    d["constraints"] = tuple(
        LabelConstraint(c["key"], c["operator"], tuple(str(v) for v in c.get("values", ())))
        for c in d.get("constraints", ())
    )
    d["spread_constraints"] = tuple(SpreadConstraint(**c) for c in d.get("spread_constraints", ()))
    d["devices"] = tuple(DeviceNeed(**x) for x in d.get("devices", ()))
    for key in ("volume_drivers", "excluded_nodes", "required_features"):
        if key in d:
            d[key] = frozenset(d[key])
    if "node_selector" in d:
        d["node_selector"] = {k: str(v) for k, v in d["node_selector"].items()}
    return WorkloadRequest(**d)


def config_from_data(data: dict[str, Any] | None) -> PlacementConfig:
    data = dict(data or {})
    # Scenarios are small; evaluate every node unless a case asks for sampling explicitly.
    data.setdefault("percentage_of_nodes_to_score", 100)
    if "weights" in data:
        merged = dict(PlacementConfig().weights)
        merged.update(data["weights"])
        data["weights"] = merged
    return PlacementConfig(**data)
