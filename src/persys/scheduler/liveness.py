"""Node liveness as a pure decision: now `decide.liveness` (part of the step); this module keeps
the names its callers import until the packages are rearranged."""

from __future__ import annotations

from persys.scheduler.decide.liveness import (
    EXPIRED,
    HEARTBEATS_FLOW,
    NOT_JUDGING,
    OPERATOR,
    TOO_MANY_LOST,
    GuardConfig,
    GuardEvent,
    GuardState,
    Heard,
    Observation,
    Transition,
    Verdict,
    check,
    end_suspension,
    heard_since,
    judge,
    observe,
)

__all__ = ["EXPIRED", "HEARTBEATS_FLOW", "NOT_JUDGING", "OPERATOR", "TOO_MANY_LOST", "GuardConfig", "GuardEvent",
           "GuardState", "Heard", "Observation", "Transition", "Verdict", "check", "end_suspension", "heard_since",
           "judge", "observe"]
