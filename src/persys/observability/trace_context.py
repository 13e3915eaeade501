"""W3C trace context (`traceparent`) as Persys carries it: in HTTP headers, gRPC metadata, a
stored workload document, and the assignments sent to agents.

`00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>`. Parsing is strict (lower-case hex,
no all-zero ids, version 00 only, bounded length): a value from outside is either a valid
context or ignored, never an error for the request carrying it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

TRACEPARENT = "traceparent"
TRACE_ID_HEADER = "x-persys-trace-id"
_FORMAT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


def parse(value: str) -> tuple[str, str, int] | None:
    """(trace id, span id, flags) of a valid traceparent; None for anything else."""
    if len(value) != 55:
        return None
    m = _FORMAT.fullmatch(value)
    if m is None or m.group(1) == _ZERO_TRACE or m.group(2) == _ZERO_SPAN:
        return None
    return m.group(1), m.group(2), int(m.group(3), 16)


def sampled(value: str) -> bool:
    """Whether a traceparent is valid and says its trace is sampled (ParentBased keeps its children)."""
    parsed = parse(value)
    return parsed is not None and bool(parsed[2] & 1)


def trace_id_of(value: str) -> str:
    """The trace id a traceparent names ('' if it is not one)."""
    parsed = parse(value)
    return parsed[0] if parsed else ""


def format_context(ctx: SpanContext) -> str:
    """The traceparent of a span context ('' for an invalid one: no-op tracer, nothing sampled)."""
    if not ctx.is_valid:
        return ""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags) & 0xFF:02x}"


def current() -> str:
    """The traceparent of the current span ('' when there is none or tracing is off)."""
    return format_context(trace.get_current_span().get_span_context())


def context_of(value: str) -> Context | None:
    """An OpenTelemetry context whose parent is the remote span `value` names (None if invalid)."""
    parsed = parse(value)
    if parsed is None:
        return None
    trace_id, span_id, flags = parsed
    remote = SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(flags))
    return trace.set_span_in_context(NonRecordingSpan(remote))


def from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The traceparent among gRPC call metadata or HTTP headers ('' if none)."""
    for key, value in metadata or ():
        if key == TRACEPARENT and isinstance(value, str):
            return value
    return ""
