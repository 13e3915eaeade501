"""What a workload's instances say when placing or reconciling that one workload failed.

A failure is contained to its workload: its unplaced instances are marked Pending with the
reason and the error (the pending retry tries them again later), and the worker goes on with
the others. Pure: the scheduler writes what these return.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from persys.model import Phase, WorkloadStatus

PLACEMENT_ERROR = "PlacementError"  # the engine or the adapter raised for this workload
INTERNAL_ERROR = "InternalError"  # reconciling it (or building its status) raised
MESSAGE_LIMIT = 500


def describe(err: BaseException) -> str:
    """One line naming the error, bounded (a hostile document must not become a huge status)."""
    text = " ".join(f"{type(err).__name__}: {err}".split())
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


def failure_status(prev: WorkloadStatus | None, reason: str, message: str, now: float) -> WorkloadStatus | None:
    """The status that says so, or None when `prev` already does (nothing to write)."""
    if prev is not None and (prev.phase, prev.reason, prev.message) == (Phase.PENDING, reason, message):
        return None
    return WorkloadStatus(phase=Phase.PENDING, reason=reason, message=message,
                          volume_node=prev.volume_node if prev else "", moving_off=prev.moving_off if prev else "",
                          move_to=prev.move_to if prev else "", moved_at=prev.moved_at if prev else 0.0,
                          updated_at=now)


def unplaced(instances: Iterable[str], placement_of: Mapping[str, str]) -> list[str]:
    """The instances without a node: the ones a failure leaves without a place. Placed ones keep
    their status (their agent reports what really runs)."""
    return sorted({i for i in instances if i not in placement_of})
