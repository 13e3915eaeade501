"""A real OTLP/gRPC endpoint for tests: `TraceService/Export` from the `opentelemetry-proto`
package, served on a kernel-chosen port, keeping every span it receives.

The OpenTelemetry collector is not packaged here; this speaks the same protocol the collector
does (the SDK's OTLP exporter cannot tell the difference), and keeps the spans as plain records.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    instance: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # '' for a root span
    kind: int
    status: int  # 0 unset, 1 ok, 2 error
    attributes: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (name, attributes)
    start_ns: int = 0  # wall clock, Unix nanoseconds
    end_ns: int = 0


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else str(v)


class _Service(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: OtlpReceiver) -> None:
        self.sink = sink

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any  # noqa: N802
               ) -> trace_service_pb2.ExportTraceServiceResponse:
        got = []
        for rs in request.resource_spans:
            res = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(ReceivedSpan(
                        service=str(res.get("service.name", "")), instance=str(res.get("service.instance.id", "")),
                        name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(), kind=s.kind, status=s.status.code,
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        events=[(e.name, {a.key: _value(a.value) for a in e.attributes}) for e in s.events],
                        start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano))
        self.sink.add(got)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """`with OtlpReceiver() as r:` ... `r.endpoint` (http://127.0.0.1:<port>), `r.spans()`."""

    def __init__(self, tls: grpc.ServerCredentials | None = None) -> None:
        """`tls`: serve TLS (the endpoint is then https://), else plain gRPC."""
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Service(self), self.server)
        if tls is None:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            self.port = self.server.add_secure_port("127.0.0.1:0", tls)
        self.endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"

    def add(self, spans: list[ReceivedSpan]) -> None:
        with self._lock:
            self._spans.extend(spans)

    def spans(self, trace_id: str | None = None) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()

    def wait_for(self, ok: Callable[[list[ReceivedSpan]], bool], timeout: float = 20.0) -> list[ReceivedSpan]:
        """The spans once `ok(spans)` holds (AssertionError with what arrived after `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans()
            if ok(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError("spans received: " + "; ".join(f"{s.service}:{s.name}" for s in spans))
            time.sleep(0.1)

    def __enter__(self) -> OtlpReceiver:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(grace=None).wait()
