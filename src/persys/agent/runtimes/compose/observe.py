"""What a compose project's containers say about the workload (pure): one state, message and
exit code rolled up from every service's containers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from persys.agent.runtimes.base import ObservedWorkload, RuntimeState
from persys.agent.runtimes.compose.project import COMPOSE_SERVICE, ComposeMeta
from persys.agent.runtimes.docker_stats import parse_docker_time

_RUNNING = ("running", "restarting", "paused")
# 143/137 = SIGTERM/SIGKILL, what a stop (ours or an operator's) produces: stopped, not failed.
_STOP_EXIT_CODES = (0, 137, 143)


@dataclass(frozen=True)
class ServiceContainer:
    id: str
    service: str
    status: str  # Docker's State.Status: running, exited, created, ...
    exit_code: int
    oom: bool
    started_at: float

    @classmethod
    def of(cls, data: dict[str, Any]) -> ServiceContainer:
        labels = (data.get("Config") or {}).get("Labels") or {}
        st = data.get("State") or {}
        return cls(
            id=str(data.get("Id", "")),
            service=labels.get(COMPOSE_SERVICE, "?"),
            status=str(st.get("Status", "")),
            exit_code=int(st.get("ExitCode") or 0),
            oom=bool(st.get("OOMKilled")),
            started_at=parse_docker_time(st.get("StartedAt")),
        )

    @property
    def running(self) -> bool:
        return self.status in _RUNNING

    @property
    def failed(self) -> bool:
        return self.oom or self.status == "dead" or (
            self.status == "exited" and self.exit_code not in _STOP_EXIT_CODES
        )

    def describe(self) -> str:
        if self.oom:
            return "oomkilled"
        return f"exited({self.exit_code})" if self.status == "exited" else self.status


@dataclass
class _Tally:
    """What the services' containers add up to, service by service."""

    failed: list[tuple[str, int | None]] = field(default_factory=list)
    any_running: bool = False
    all_up: bool = True
    exit_code: int | None = None  # the first non-zero exit code of a stopped container

    def missing(self, svc: str) -> None:
        self.failed.append((svc, None))
        self.all_up = False

    def add(self, svc: str, cs: Sequence[ServiceContainer]) -> None:
        for c in cs:
            if c.running:
                self.any_running = True
                continue
            if c.status in ("exited", "dead") and not self.exit_code:
                self.exit_code = c.exit_code
            if c.failed:
                self.failed.append((svc, c.exit_code))
            if not (c.status == "exited" and c.exit_code == 0):
                self.all_up = False


def rollup(
    containers: Sequence[ServiceContainer], expected: Sequence[str], stopped: bool
) -> tuple[RuntimeState, str, int | None, float]:
    """The workload's (state, message, exit code, started_at) from its services' containers.

    Running only if some service runs and every other one runs or completed (exited 0, a one-shot
    job); Failed if a service crashed or lost its container; otherwise Stopped.
    """
    by_service: dict[str, list[ServiceContainer]] = {s: [] for s in expected}
    for c in containers:
        by_service.setdefault(c.service, []).append(c)
    parts: list[str] = []
    t = _Tally()
    for svc in sorted(by_service):
        cs = by_service[svc]
        if cs:
            parts.append(_service_part(svc, cs))
            t.add(svc, cs)
        else:
            parts.append(f"{svc}: missing")
            t.missing(svc)
    summary = ", ".join(parts)
    started = min((c.started_at for c in containers if c.running and c.started_at), default=0.0)
    if stopped and not t.any_running:
        return RuntimeState.STOPPED, summary, t.exit_code, 0.0
    if t.failed:
        return _failed(t.failed, summary, started)
    if t.any_running and t.all_up:
        return RuntimeState.RUNNING, summary, None, started
    return RuntimeState.STOPPED, summary, t.exit_code, started


def _service_part(svc: str, cs: Sequence[ServiceContainer]) -> str:
    """`web: running`, or for several containers `web: 2 running/1 exited(1)`."""
    states = [c.describe() for c in cs]
    if len(set(states)) == 1 and len(cs) == 1:
        return f"{svc}: {states[0]}"
    return f"{svc}: " + "/".join(f"{states.count(s)} {s}" for s in sorted(set(states)))


def _failed(
    failed: Sequence[tuple[str, int | None]], summary: str, started: float
) -> tuple[RuntimeState, str, int | None, float]:
    """Failed, naming each failed service; the exit code is the first one a container reported."""
    names = ", ".join(f"{s} (no container)" if code is None else f"{s} (exit code {code})" for s, code in failed)
    first = next((code for _, code in failed if code is not None), None)
    return RuntimeState.FAILED, f"failed: {names}; {summary}", first, started


def observe(
    workload_id: str, project: str, data: Sequence[dict[str, Any]], meta: ComposeMeta | None
) -> ObservedWorkload:
    """The workload as its containers' inspect data show it; `meta` of another project is ignored."""
    if meta is not None and meta.project != project:
        meta = None
    containers = [ServiceContainer.of(d) for d in data]
    expected = meta.services if meta else sorted({c.service for c in containers})
    state, message, exit_code, started = rollup(containers, expected, meta.stopped if meta else False)
    return ObservedWorkload(
        workload_id=workload_id,
        revision=meta.revision if meta else "",
        generation=meta.generation if meta else 0,
        state=state,
        runtime_id=project,
        message=message,
        exit_code=exit_code,
        started_at=started,
    )
