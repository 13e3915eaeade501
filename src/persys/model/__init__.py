"""Persys data model: manifests, stored documents and their validation."""

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
