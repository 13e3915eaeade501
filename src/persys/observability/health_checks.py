"""Health per dependency: named checks a process registers at start (the scheduler's secret store,
Persys Meter, ...), run together with a bound on each, and the pure readiness verdict.

A check is any `async () -> CheckResult`; one that raises or does not answer in time is "not ok"
with that as the reason, so a broken dependency can never hang or break the health document.
Reasons must not carry secrets: checks say what failed (host, error), never credentials.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CHECK_SECONDS = 2.0
MAX_REASON_CHARS = 500


@dataclass(frozen=True, slots=True)
class CheckResult:
    ok: bool
    reason: str = ""


HealthCheck = Callable[[], Awaitable[CheckResult]]


@dataclass(frozen=True, slots=True)
class NamedCheck:
    """A dependency's check as registered: `name` is what health shows (secret-store, meter)."""

    name: str
    check: HealthCheck


@dataclass(frozen=True, slots=True)
class DependencyState:
    name: str
    ok: bool
    reason: str = ""
    configured: bool = True

    def to_doc(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "reason": self.reason, "configured": self.configured}


async def _run(c: NamedCheck, seconds: float) -> DependencyState:
    try:
        r = await asyncio.wait_for(c.check(), seconds)
    except TimeoutError:
        return DependencyState(c.name, False, f"no answer in {seconds:g} s")
    except Exception as err:  # any failure of a check is that dependency's problem, not health's
        return DependencyState(c.name, False, f"{type(err).__name__}: {err}"[:MAX_REASON_CHARS])
    return DependencyState(c.name, r.ok, r.reason[:MAX_REASON_CHARS])


async def run_checks(checks: Sequence[NamedCheck], seconds: float = CHECK_SECONDS) -> list[DependencyState]:
    """Every check at once, each bounded by `seconds`; results in registration order."""
    return list(await asyncio.gather(*(_run(c, seconds) for c in checks)))


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    reason: str = ""  # why not: one of the codes below, then the detail
    detail: str = ""


# What a 503 of /readyz means (docs/observability.md, "Health").
SCHEDULER_UNREACHABLE = "scheduler-unreachable"
NO_ACTIVE_REPLICA = "no-active-replica"
STORE_UNREACHABLE = "store-unreachable"


def readiness(health: Mapping[str, Any] | None, error: str = "") -> Readiness:
    """Can the API serve: a scheduler answered (`health` is its document, None with `error` when
    none did), an active replica is known (that replica or the leader it names), and the state
    store is reachable. The operating mode is not part of it: in a frozen or degraded mode reads
    are still served and changes are refused with the reason, which is serving."""
    if health is None:
        return Readiness(False, SCHEDULER_UNREACHABLE, error or "no scheduler replica answered")
    if not health.get("active") and not health.get("leader"):
        return Readiness(False, NO_ACTIVE_REPLICA, "no replica is active (an election is under way, or every "
                                                   "replica lost the store)")
    if not health.get("storeOk"):
        store: Mapping[str, Any] = next((d for d in health.get("dependencies", ()) if d.get("name") == "store"), {})
        return Readiness(False, STORE_UNREACHABLE, str(store.get("reason") or "the state store does not answer"))
    return Readiness(True)
