"""Whether the state mirror keeps up with the store: pure rules over what the mirror knows.

The mirror's revision is the last store revision whose events it has applied; the store's
revision is what a probe last read (`ModeGuard.check`, `Scheduler.health`). Every Persys write
is under `/persys/`, so on a store dedicated to the cluster the difference is the number of
changes the mirror has not seen yet. A mirror that is briefly behind under load is normal; one
that has not reached a store revision it saw a while ago has a stuck watch and must say so.
"""

from __future__ import annotations

from dataclasses import dataclass

HEALTHY = "healthy"
RECOVERING = "recovering"  # reloading a snapshot after a compacted watch, or the watch failed and resumes
STALLED = "stalled"  # behind a store revision seen longer ago than the stall limit

STALL_AFTER_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class MirrorSnapshot:
    revision: int  # every event up to this store revision is applied
    store_revision: int  # the store's revision as last seen (0: not seen yet)
    behind_for: float  # seconds the mirror has trailed a store revision it saw (0: not behind)
    recovering: bool  # reloading a snapshot after its watch met a compaction
    error: str  # the watch's last failure; "" once it delivers again


@dataclass(frozen=True, slots=True)
class MirrorHealth:
    watch: str  # HEALTHY | RECOVERING | STALLED
    lag: int  # store revisions the mirror has not applied, as far as last seen
    detail: str  # "" when healthy


def judge(s: MirrorSnapshot, stall_after: float = STALL_AFTER_SECONDS) -> MirrorHealth:
    lag = max(0, s.store_revision - s.revision)
    if s.recovering:
        return MirrorHealth(RECOVERING, lag, f"state mirror at revision {s.revision} is reloading a snapshot: "
                                             "the store compacted history its watch had not read")
    if s.error:
        return MirrorHealth(RECOVERING, lag, f"state mirror watch interrupted ({s.error}); resuming from "
                                             f"revision {s.revision + 1}")
    if lag and s.behind_for >= stall_after:
        return MirrorHealth(STALLED, lag, f"state mirror stalled: {lag} revisions behind the store "
                                          f"(at {s.revision}, store at {s.store_revision}) for {s.behind_for:.0f}s")
    return MirrorHealth(HEALTHY, lag, "")


class LagTracker:
    """Remembers the oldest store revision the mirror was seen behind and since when, so a mirror
    that keeps up with a busy store (always a little behind, never for long) is told apart from
    one whose watch delivers nothing."""

    def __init__(self) -> None:
        self.store_revision = 0
        self._behind_since: float | None = None
        self._target = 0

    def observe(self, store_revision: int, mirror_revision: int, now: float) -> None:
        self.store_revision = store_revision
        if self._behind_since is not None and mirror_revision >= self._target:
            self._behind_since = None  # caught up with what we saw then: start afresh
        if self._behind_since is None and store_revision > mirror_revision:
            self._behind_since, self._target = now, store_revision

    def behind_for(self, mirror_revision: int, now: float) -> float:
        if self._behind_since is None or mirror_revision >= self._target:
            return 0.0
        return max(0.0, now - self._behind_since)
