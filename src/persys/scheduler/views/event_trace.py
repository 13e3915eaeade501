"""Which trace an event joins: `fields["traceId"]` on the events a workload's apply caused.

While a traced call is being served (the apply itself: WorkloadCreated, WorkloadUpdated), its
current span's trace; otherwise (the placement, the agents' reports: WorkloadScheduled,
WorkloadRunning, ...) the trace stored in the workload's document by the apply that wrote its
spec. Nothing when neither exists (tracing off when the spec was applied), or when this
replica does not trace.
"""

from __future__ import annotations

from collections.abc import Callable

from persys.model import Workload
from persys.model.workload import workload_of
from persys.observability import trace_context, tracing

WORKLOAD_SUBJECT = "workload/"


def trace_id(subject: str, workload: Callable[[str], Workload | None]) -> str:
    """The trace id for an event about `subject` ('' for none); `workload(id)` reads the mirror."""
    if not tracing.enabled():  # off: no trace ids anywhere, and one attribute read per event
        return ""
    current = trace_context.current()
    if current:
        return current[3:35]
    if not subject.startswith(WORKLOAD_SUBJECT):
        return ""
    w = workload(workload_of(subject[len(WORKLOAD_SUBJECT):]))
    return trace_context.trace_id_of(w.trace_parent) if w is not None and w.trace_parent else ""
