"""Persys data model: manifests, stored documents and their validation.

The names below load on first use (PEP 562): the models cost a noticeable part of a second to
build, and what needs none of them (persysctl listing workloads, a label selector, a limit) should
not pay for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from persys.model.manifest import ManifestError, parse_manifests
    from persys.model.node import Capabilities, Node, NodeStatus, NodeUsage, RuntimeInfo, Taint
    from persys.model.status import Assignment, Phase, WorkloadStatus, WorkloadUsage
    from persys.model.workload import (
        WORKLOAD_TYPES,
        AccessMode,
        DesiredState,
        OnDisconnect,
        RestartPolicy,
        Workload,
        WorkloadManifest,
        WorkloadSpec,
    )

_WHERE = {
    **dict.fromkeys(("ManifestError", "parse_manifests"), "persys.model.manifest"),
    **dict.fromkeys(("Capabilities", "Node", "NodeStatus", "NodeUsage", "RuntimeInfo", "Taint"), "persys.model.node"),
    **dict.fromkeys(("Assignment", "Phase", "WorkloadStatus", "WorkloadUsage"), "persys.model.status"),
    **dict.fromkeys(("WORKLOAD_TYPES", "AccessMode", "DesiredState", "OnDisconnect", "RestartPolicy", "Workload",
                     "WorkloadManifest", "WorkloadSpec"), "persys.model.workload"),
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'persys.model' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


__all__ = [
    "WORKLOAD_TYPES",
    "AccessMode",
    "Assignment",
    "Capabilities",
    "DesiredState",
    "ManifestError",
    "Node",
    "NodeStatus",
    "NodeUsage",
    "OnDisconnect",
    "Phase",
    "RestartPolicy",
    "RuntimeInfo",
    "Taint",
    "Workload",
    "WorkloadManifest",
    "WorkloadSpec",
    "WorkloadStatus",
    "WorkloadUsage",
    "parse_manifests",
]
