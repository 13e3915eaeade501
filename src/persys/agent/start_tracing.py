"""The agent's spans for starting an instance: `agent.instance.start` (a child of the apply that
sent the spec, whose traceparent came with the assignment) around the secrets' intake and
`runtime.start`, the runtime's call. Attributes name the instance, the revision, the node and
the runtime; a failure sets the status to its code (ImageNotFound, PortConflict, ...), never its
message, which may quote a process's output.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.trace import Span, Status, StatusCode

from persys.agent.decide.plan import Action, Desired
from persys.agent.runtimes.base import RuntimeFailure, StartPending
from persys.model.workload import workload_of
from persys.observability import tracing


def attributes(node_id: str, action: Action, d: Desired) -> dict[str, str | int | bool]:
    """What `agent.instance.start` says (pure)."""
    return {
        "persys.node": node_id,
        "persys.instance": action.workload_id,
        "persys.workload": workload_of(action.workload_id),
        "persys.revision": d.revision,
        "persys.generation": d.generation,
        "persys.runtime": d.spec.type,
        "persys.restart": action.restart,
    }


def outcome(span: Span, failure: RuntimeFailure | None) -> None:
    if failure is None:
        span.set_attribute("persys.outcome", "Started")
        return
    if isinstance(failure, StartPending):  # under way in the background (an image pull)
        span.set_attribute("persys.outcome", failure.code)
        return
    span.set_attribute("persys.outcome", "Failed")
    span.set_attribute("persys.failure.code", failure.code)
    span.set_attribute("persys.failure.terminal", failure.terminal)
    span.set_status(Status(StatusCode.ERROR, failure.code))


@contextmanager
def runtime_call(runtime: str) -> Iterator[None]:
    """`runtime.start` around the runtime's call (nothing at all when tracing is off)."""
    if not tracing.enabled():
        yield
        return
    with tracing.span("runtime.start", {"persys.runtime": runtime}, record=False) as s:
        try:
            yield
        except RuntimeFailure as err:
            s.set_attribute("persys.failure.code", err.code)
            s.set_status(Status(StatusCode.ERROR, err.code))
            raise
