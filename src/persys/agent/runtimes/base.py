"""The contract between the agent and the things that actually run workloads (Docker, host processes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from persys.model.status import WorkloadUsage
from persys.model.workload import WorkloadSpec


class RuntimeState(StrEnum):
    RUNNING = "Running"
    STOPPED = "Stopped"
    FAILED = "Failed"
    MISSING = "Missing"


@dataclass(frozen=True)
class RuntimeWorkload:
    """What the agent wants running: one workload at one revision."""

    workload_id: str
    revision: str
    generation: int
    spec: WorkloadSpec


@dataclass
class ObservedWorkload:
    """What a runtime actually sees on this host."""

    workload_id: str
    revision: str
    generation: int
    state: RuntimeState
    runtime_id: str  # container id or pid
    message: str = ""
    exit_code: int | None = None
    started_at: float = 0
    usage: WorkloadUsage = field(default_factory=WorkloadUsage)  # filled in by inspect() while running


@dataclass(frozen=True)
class Probe:
    available: bool
    version: str = ""
    features: tuple[str, ...] = ()
    reason: str = ""  # why unavailable


class RuntimeFailure(Exception):
    """A failure the agent reports as a workload condition.

    `terminal` failures (bad image, invalid spec, port taken) will not heal by retrying the same
    revision, so the agent should stop retrying; retryable ones (daemon hiccup) should back off.
    """

    def __init__(self, message: str, *, code: str = "RuntimeError", terminal: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.terminal = terminal

    def __str__(self) -> str:
        return f"{self.code}: {self.args[0] if self.args else ''}"


@runtime_checkable
class Runtime(Protocol):
    name: str  # the workload type it serves: "container" | "process"

    async def probe(self) -> Probe: ...

    async def start(self, w: RuntimeWorkload) -> ObservedWorkload: ...

    async def stop(self, workload_id: str) -> None: ...

    async def remove(self, workload_id: str) -> None: ...

    async def list(self) -> list[ObservedWorkload]: ...

    async def inspect(self, workload_id: str) -> ObservedWorkload | None: ...

    async def logs(self, workload_id: str, tail: int = 100) -> str: ...

    async def close(self) -> None: ...
