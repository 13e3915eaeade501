"""The replica's dependencies (store, event bus, registered checks), probed in the background.

`Health` must answer from memory in every mode: a replica cut off from etcd used to answer after
~7 s (the store client's retries inside the call), so a health check, a load balancer or an
operator waited exactly when they needed the answer (issue #31). The probes run here every
health interval, each bounded by PROBE_TIMEOUT, and health reads their latest results, saying
how old they are when the probing itself is stuck.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from persys.events.base import EventBus, EventsUnavailable
from persys.observability.health_checks import DependencyState, NamedCheck, run_checks
from persys.store.base import StateStore

PROBE_TIMEOUT = 3.0  # seconds one dependency probe may take; beyond it the dependency is down
STALE_AFTER = 3  # health intervals without a completed probe round before health says so


class ProbeSource(Protocol):
    store: StateStore
    events: EventBus
    health_checks: list[NamedCheck]


@dataclass
class Probed:
    """The latest completed round of probes (wall-clock `at`; 0: none yet)."""

    store: DependencyState = field(default_factory=lambda: DependencyState("store", True))
    backend: str = ""
    store_revision: int = 0
    events: DependencyState = field(default_factory=lambda: DependencyState("event-bus", True))
    checks: list[DependencyState] = field(default_factory=list)
    at: float = 0.0


async def _bounded(what: str, probe: Awaitable[Any]) -> Any:
    try:
        return await asyncio.wait_for(probe, PROBE_TIMEOUT)
    except TimeoutError:
        raise TimeoutError(f"{what} did not answer within {PROBE_TIMEOUT:.0f}s") from None


async def _events_state(events: EventBus) -> DependencyState:
    try:
        await _bounded("the event bus", events.bounds())
    except EventsUnavailable as err:
        return DependencyState("event-bus", False, f"unreachable, events are being dropped: {err}")
    except Exception as err:  # an unexpected backend failure is still the bus's problem
        return DependencyState("event-bus", False, f"{type(err).__name__}: {err}")
    return DependencyState("event-bus", True)


class DependencyProbe:
    def __init__(self, source: ProbeSource, on_store_revision: Callable[[int], None]) -> None:
        self.s = source
        self.on_store_revision = on_store_revision
        self.latest = Probed()

    async def refresh(self) -> Probed:
        async def store() -> tuple[DependencyState, str, int]:
            try:
                st = await _bounded("the state store", self.s.store.status())
            except Exception as err:
                return DependencyState("store", False, str(err) or type(err).__name__), "", 0
            revision = st.get("revision", 0)
            return (DependencyState("store", True), str(st.get("backend", "")),
                    revision if isinstance(revision, int) else 0)

        async def checks() -> list[DependencyState]:
            try:
                found: list[DependencyState] = await _bounded("the dependency checks",
                                                              run_checks(self.s.health_checks))
                return found
            except TimeoutError as err:
                return [DependencyState(c.name, False, str(err)) for c in self.s.health_checks]

        (store_state, backend, revision), events, checked = await asyncio.gather(
            store(), _events_state(self.s.events), checks())
        if store_state.ok:
            self.on_store_revision(revision)
        self.latest = Probed(store_state, backend or self.latest.backend, revision, events, checked, time.time())
        return self.latest

    async def current(self) -> Probed:
        """The latest results; the first call (none yet) probes once, bounded."""
        if self.latest.at == 0.0:
            return await self.refresh()
        return self.latest

    def staleness_note(self, interval: float) -> str:
        age = time.time() - self.latest.at
        if self.latest.at and age > STALE_AFTER * max(interval, 1.0):
            return f"dependency probes last completed {age:.0f}s ago"
        return ""

    async def run(self, interval: float) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(interval)
