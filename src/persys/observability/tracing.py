"""OpenTelemetry tracing of one process: its setup, and the spans the rest of Persys opens.

With no OTLP endpoint configured (no `--otlp-endpoint`, no `OTEL_EXPORTER_OTLP_ENDPOINT`) nothing
is set up: no SDK tracer provider, no exporter thread; the API's no-op tracer answers, and code on
a hot path asks `enabled()` (one attribute read) before it builds anything for a span. With an
endpoint: the SDK, a ParentBased(TraceIdRatioBased) sampler (ratio from `OTEL_TRACES_SAMPLER_ARG`
or the option, default 1.0), a BatchSpanProcessor and the OTLP gRPC exporter (plain text for
`http://`, TLS for `https://`: the system's roots or `OTEL_EXPORTER_OTLP_CERTIFICATE`, a client
certificate from `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` and `OTEL_EXPORTER_OTLP_CLIENT_KEY`, all
read by the exporter itself). Resource: `service.name` (persys-scheduler, persys-gateway,
persys-agent, persysctl, persys-dev) and `service.instance.id`.

What a span may hold is decided where it is opened: ids, names, counts, outcomes; never a spec's
env, a secret, a token or a request body.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from persys.observability.trace_context import context_of

log = logging.getLogger(__name__)

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"  # the signal-specific form wins, as in the SDK
RATIO_ENV = "OTEL_TRACES_SAMPLER_ARG"
TRACER_NAME = "persys"
DEFAULT_RATIO = 1.0


class TracingConfigError(ValueError):
    """A bad tracing setting; the message names the option or variable."""


@dataclass(frozen=True, slots=True)
class TracingSettings:
    endpoint: str  # http(s)://host:port of an OTLP/gRPC receiver
    sample_ratio: float
    service_name: str
    instance_id: str


def settings_from(endpoint: str | None, environ: Mapping[str, str], service_name: str,
                  instance_id: str = "") -> TracingSettings | None:
    """The settings of a process (None: tracing off). `endpoint` (the option) wins over the
    environment. Pure: raises TracingConfigError naming the field."""
    source = "--otlp-endpoint"
    if not endpoint:
        source = TRACES_ENDPOINT_ENV if environ.get(TRACES_ENDPOINT_ENV) else ENDPOINT_ENV
        endpoint = environ.get(TRACES_ENDPOINT_ENV) or environ.get(ENDPOINT_ENV) or ""
    endpoint = endpoint.strip()
    if not endpoint:
        return None
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname or len(endpoint) > 2048:
        raise TracingConfigError(f"{source}: {endpoint[:200]!r} is not an http(s)://host:port URL of an "
                                 "OTLP/gRPC receiver")
    try:
        _ = parts.port
    except ValueError:
        raise TracingConfigError(f"{source}: {endpoint[:200]!r} has an invalid port") from None
    raw = environ.get(RATIO_ENV, "").strip()
    try:
        ratio = float(raw) if raw else DEFAULT_RATIO
    except ValueError:
        raise TracingConfigError(f"{RATIO_ENV}: {raw[:50]!r} is not a number between 0 and 1") from None
    if not 0.0 <= ratio <= 1.0:
        raise TracingConfigError(f"{RATIO_ENV}: {raw[:50]!r} is not a number between 0 and 1")
    return TracingSettings(endpoint, ratio, service_name, instance_id or uuid.uuid4().hex[:16])


class _State:
    enabled = False
    provider: Any = None
    tracer: trace.Tracer | None = None  # made once: the SDK builds a new one on every get_tracer


_state = _State()


def enabled() -> bool:
    """Whether this process exports spans (checked before building a span's attributes)."""
    return _state.enabled


class Tracing:
    """The running setup of a process; `shutdown` exports what is buffered (blocking: call it
    off the event loop, or after it)."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider

    def shutdown(self) -> None:
        if self.provider is None:
            return
        try:
            self.provider.shutdown()
        except Exception as err:  # losing spans at exit must never fail the process
            log.warning("tracing: flushing spans at shutdown failed: %s", err)
        self.provider = None
        _state.enabled, _state.provider, _state.tracer = False, None, None


def setup(settings: TracingSettings | None, export_timeout: float = 10.0) -> Tracing:
    """Install the SDK for `settings` (None: nothing at all). `export_timeout`: seconds one
    export may take, retries included (a short-lived client waits that long at most at exit
    when the receiver is down)."""
    if settings is None:
        return Tracing(None)
    # The SDK and the exporter are imported only here: a process without tracing never loads them.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    resource = Resource.create({"service.name": settings.service_name,
                                "service.instance.id": settings.instance_id})
    provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)))
    exporter = OTLPSpanExporter(endpoint=settings.endpoint, insecure=urlsplit(settings.endpoint).scheme == "http",
                                timeout=export_timeout)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=1000))
    # Kept here rather than as OpenTelemetry's global provider (which can be set once per
    # process): a test sets tracing up and tears it down again; nothing else in Persys reads the global.
    _state.enabled, _state.provider, _state.tracer = True, provider, provider.get_tracer(TRACER_NAME)
    log.info("tracing: exporting spans to %s (sampled ratio %.3g) as %s", settings.endpoint,
             settings.sample_ratio, settings.service_name)
    return Tracing(provider)


def setup_from(endpoint: str | None, service_name: str, instance_id: str = "",
               environ: Mapping[str, str] | None = None, export_timeout: float = 10.0) -> Tracing:
    """`setup` from an option and the environment (the one call each process makes)."""
    return setup(settings_from(endpoint, os.environ if environ is None else environ, service_name, instance_id),
                 export_timeout)


def force_flush(timeout_millis: int = 5000) -> None:
    """Export what is buffered now (blocking): a short-lived client before it exits."""
    if _state.provider is not None:
        _state.provider.force_flush(timeout_millis)


def tracer() -> trace.Tracer:
    return _state.tracer if _state.tracer is not None else trace.get_tracer(TRACER_NAME)


@contextmanager
def span(name: str, attributes: Mapping[str, Any] | None = None, parent: str = "",
         kind: SpanKind = SpanKind.INTERNAL, record: bool = True) -> Iterator[Span]:
    """A span (current inside the block), child of the current one, or of `parent` (a W3C
    traceparent carried from another process or stored beside a document) when given. An
    exception leaving the block is recorded on it with an ERROR status (`record=False`: the
    status names only the exception's type, unless the block set one; no exception text is
    kept: for errors whose message may quote input). Disabled: the API's non-recording span, built from nothing."""
    if not _state.enabled:
        yield trace.INVALID_SPAN
        return
    ctx = context_of(parent) if parent else None
    with tracer().start_as_current_span(name, context=ctx, kind=kind, attributes=attributes,
                                        record_exception=record, set_status_on_exception=record) as s:
        try:
            yield s
        except Exception as err:
            status = getattr(s, "status", None)
            if not record and (status is None or status.status_code is StatusCode.UNSET):
                s.set_status(Status(StatusCode.ERROR, type(err).__name__))
            raise


def record_error(s: Span, err: BaseException | str) -> None:
    """Mark `s` failed: an error the code handled (so it never left the span's block)."""
    if not s.is_recording():
        return
    if isinstance(err, BaseException):
        s.record_exception(err)
    s.set_status(Status(StatusCode.ERROR, str(err)[:500]))
