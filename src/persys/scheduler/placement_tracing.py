"""Spans of placement decisions, children of the apply that wrote the workload's spec.

Placement runs in the reconcile worker, after the apply's call has returned, so its parent is
the `traceParent` stored in the workload document (persys.model.Workload), not the current
context. One span per instance decided: from the engine pass to the commit, with the decision's
outcome (Scheduled, Pending, or lost to a concurrent change), the node and the explanation
(node names, scores and resource figures; never a spec's values). Only called when tracing is
enabled: the reconcile worker checks `tracing.enabled()` before building anything for a span.
"""

from __future__ import annotations

from opentelemetry.trace import Status, StatusCode

from persys.observability import trace_context, tracing
from persys.scheduler import placement as pl
from persys.scheduler.reconcile import Need

EXPLANATION_MAX = 512  # characters of the explanation kept on a span


def attributes(need: Need, decision: pl.Decision, outcome: str, explanation: str) -> dict[str, str | int]:
    """What a placement span says (pure). `explanation`: the decision's, as already written in
    the status (building it again costs more than the span)."""
    return {
        "persys.workload": need.workload.id,
        "persys.instance": need.instance,
        "persys.revision": need.workload.revision,
        "persys.placement.outcome": outcome,
        "persys.placement.node": decision.node_id or "",
        "persys.placement.feasible": decision.feasible,
        "persys.placement.evaluated": decision.evaluated,
        "persys.placement.nodes": decision.total,
        "persys.placement.explanation": explanation[:EXPLANATION_MAX],
    }


def record(need: Need, decision: pl.Decision, outcome: str, started_ns: int, explanation: str,
           ok: bool = True) -> None:
    """One finished placement span (nothing when the workload carries no trace context)."""
    parent = need.workload.trace_parent
    if not parent or not trace_context.sampled(parent):  # no trace, or one not sampled: no span is kept
        return
    ctx = trace_context.context_of(parent)
    if ctx is None:
        return
    span = tracing.tracer().start_span("scheduler.place", context=ctx, start_time=started_ns,
                                       attributes=attributes(need, decision, outcome, explanation))
    if not ok:
        span.set_status(Status(StatusCode.ERROR, outcome))
    span.end()
