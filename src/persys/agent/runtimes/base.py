"""The contract between the agent and the things that actually run workloads (Docker, host processes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from persys.model.status import WorkloadUsage
from persys.model.workload import WorkloadSpec
from persys.storage.base import Attachment


class RuntimeState(StrEnum):
    RUNNING = "Running"
    STOPPED = "Stopped"
    FAILED = "Failed"
    MISSING = "Missing"


@dataclass(frozen=True)
class SecretMaterial:
    """Secret values for one start, held in memory only (never in a repr or a log line): env
    variables, files by relative path, and registry credentials by registry host (JSON of
    username and password) for the start's pulls (spec.secrets)."""

    env: dict[str, bytes] = field(default_factory=dict, repr=False)
    files: dict[str, bytes] = field(default_factory=dict, repr=False)
    registry_auth: dict[str, bytes] = field(default_factory=dict, repr=False)

    def env_text(self) -> dict[str, str]:
        """Env values as text (a value that is not UTF-8 is refused: env cannot carry it safely)."""
        try:
            return {k: v.decode() for k, v in self.env.items()}
        except UnicodeDecodeError:
            raise RuntimeFailure("a secret env value is not UTF-8 text; deliver it as a file",
                                 code="InvalidSpec", terminal=True) from None


@dataclass(frozen=True)
class VolumeMount:
    """One of the workload's volumes, attached on this node (persys.agent.volume_attach)."""

    name: str
    mount_path: str  # where the workload sees it (in the container; a device hint for VMs)
    read_only: bool
    attachment: Attachment
    key: str = field(default="", repr=False)  # what QEMU presents for a network disk (cephx); never logged


@dataclass(frozen=True)
class RuntimeWorkload:
    """What the agent wants running: one workload at one revision."""

    workload_id: str
    revision: str
    generation: int
    spec: WorkloadSpec
    secrets: SecretMaterial = field(default_factory=SecretMaterial)  # resolved just before the start
    mounts: tuple[VolumeMount, ...] = ()  # its volumes, attached just before the start
    devices: tuple[str, ...] = ()  # the node's devices (GPU ids) its placement gave it


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

    def __init__(self, message: str, *, code: str = "RuntimeError", terminal: bool = False,
                 credentials: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.terminal = terminal
        # The node's registry credentials (their fingerprint, registry_auth.fingerprint) when a pull
        # failed: a terminal failure is tried again once they change. None: not about credentials.
        self.credentials = credentials

    def __str__(self) -> str:
        return f"{self.code}: {self.args[0] if self.args else ''}"


@dataclass(frozen=True)
class LogQuery:
    tail: int = 100  # lines of history first (0: none)
    since: float = 0.0  # unix time: only output written after it (0: all)
    follow: bool = False  # then keep streaming new output
    service: str = ""  # compose: only this service
    timestamps: bool = False  # prefix each line with its RFC 3339 time


class UnsupportedQuery(ValueError):
    """The query asks what this runtime's logs cannot answer (a caller error, not a failure)."""


# Every stream's first piece is "" once its query is accepted: a refusal (UnsupportedQuery) comes
# before it, so a caller can answer it as an error instead of waiting for output that may not come.
ACCEPTED = ""


class StartPending(RuntimeFailure):
    """Not a failure: the start goes on in the background (an image pull). The agent reports the
    code and message as the instance's Pending reason (the pull's progress) and calls start again
    without backoff; `done` ends with the background work and wakes the agent then."""

    def __init__(self, message: str, *, code: str, done: asyncio.Future[None] | None = None) -> None:
        super().__init__(message, code=code)
        self.done = done


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

    def stream_logs(self, workload_id: str, query: LogQuery) -> AsyncIterator[str]:
        """Output per the query, in pieces of whole lines (persys.agent.runtimes.log_stream): first
        ACCEPTED, or UnsupportedQuery for what this runtime's logs cannot answer."""
        ...

    async def close(self) -> None: ...
