"""Workload runtimes used by the agent: Docker containers and supervised host processes."""

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
