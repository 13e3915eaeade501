"""Workload runtimes used by the agent: one module or package per workload type (process, docker,
compose/, vm/, microvm/) and the bases they share; docs/architecture.md has the module map."""

from persys.agent.runtimes.base import (
    ObservedWorkload,
    Probe,
    Runtime,
    RuntimeFailure,
    RuntimeState,
    RuntimeWorkload,
)

__all__ = [
    "ObservedWorkload",
    "Probe",
    "Runtime",
    "RuntimeFailure",
    "RuntimeState",
    "RuntimeWorkload",
]
