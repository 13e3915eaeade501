"""Spans of placement decisions, children of the apply that wrote the workload's spec.

Placement runs in the reconcile worker, after the apply's call has returned, so its parent is
the `traceParent` stored in the workload document (persys.model.Workload), not the current
context. A span covers the engine pass to the commit, with the decision's outcome (Scheduled,
Pending, or lost to a concurrent change), the node and the explanation (node names, scores and
resource figures; never a spec's values): one per instance for a trace with one instance in a
commit (an operator's apply), one per trace and commit for the instances a bulk apply's trace
has in it (counts, the nodes, and the first NAMED_MAX instances in one attribute): a span per
instance cost 17 % of the scale benchmark's throughput at ratio 1.0 (bench/observability_overhead.py),
and naming them as span events instead of one attribute tripled a shared span's cost (~490 µs
to make and encode against ~145 µs).
Only called when tracing is enabled: the reconcile worker checks `tracing.enabled()` before
building anything for a span.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry.trace import Status, StatusCode

from persys.observability import trace_context, tracing
from persys.scheduler import placement as pl
from persys.scheduler.decide.effects import Need

EXPLANATION_MAX = 512  # characters of the explanation kept on a span
NAMED_MAX = 16  # instances named on a span that covers several
NODES_MAX = 32  # node names listed on a span that covers several


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


@dataclass(frozen=True, slots=True)
class Decided:
    """One instance's placement as a span records it."""

    need: Need
    decision: pl.Decision
    outcome: str  # Scheduled, NotCommitted
    started_ns: int
    explanation: str
    ok: bool


def batch_attributes(items: Sequence[Decided]) -> dict[str, str | int | list[str]]:
    """What the span of several instances of one trace says (pure): counts and nodes."""
    nodes = sorted({d.decision.node_id for d in items if d.decision.node_id})
    named = [f"{d.need.instance}={d.decision.node_id or '-'}:{d.outcome}" for d in items[:NAMED_MAX]]
    return {
        "persys.placement.instances": len(items),
        "persys.placement.scheduled": sum(1 for d in items if d.ok),
        "persys.placement.outcome": "Scheduled" if all(d.ok for d in items) else "NotCommitted",
        "persys.placement.nodes_used": ",".join(nodes[:NODES_MAX]) + (",..." if len(nodes) > NODES_MAX else ""),
        "persys.workloads": len({d.need.workload.id for d in items}),
        "persys.placement.first": named,  # instance=node:outcome
    }


def record_batch(items: Sequence[Decided]) -> None:
    """The spans of one commit's placements: per trace, one span for one instance (as `record`),
    one span with counts and the first instances named for several."""
    by_trace: dict[str, list[Decided]] = {}
    for d in items:
        parent = d.need.workload.trace_parent
        if parent and trace_context.sampled(parent):
            by_trace.setdefault(parent, []).append(d)
    for parent, group in by_trace.items():
        if len(group) == 1:
            d = group[0]
            record(d.need, d.decision, d.outcome, d.started_ns, d.explanation, d.ok)
            continue
        ctx = trace_context.context_of(parent)
        if ctx is None:
            continue
        span = tracing.tracer().start_span("scheduler.place", context=ctx, start_time=min(d.started_ns for d in group),
                                           attributes=batch_attributes(group))
        if not all(d.ok for d in group):
            span.set_status(Status(StatusCode.ERROR, "NotCommitted"))
        span.end()
