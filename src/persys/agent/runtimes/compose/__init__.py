"""Compose runtime: `type: compose` workloads as Docker Compose v2 projects on the local engine."""

from persys.agent.runtimes.compose.observe import ServiceContainer, observe, rollup
from persys.agent.runtimes.compose.project import (
    COMPOSE_PROJECT,
    LABEL_RUNTIME,
    LABEL_WORKLOAD,
    PROJECT_PREFIX,
    ComposeMeta,
    project_name,
)
from persys.agent.runtimes.compose.runtime import ComposeRuntime

__all__ = [
    "COMPOSE_PROJECT",
    "LABEL_RUNTIME",
    "LABEL_WORKLOAD",
    "PROJECT_PREFIX",
    "ComposeMeta",
    "ComposeRuntime",
    "ServiceContainer",
    "observe",
    "project_name",
    "rollup",
]
