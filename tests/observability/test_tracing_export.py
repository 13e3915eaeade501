"""Tracing set up for real in this process, exporting over OTLP/gRPC to a real endpoint
(tests/otlp_receiver.py): the spans, their parents across a gRPC call (interceptor) and an HTTP
request (ASGI middleware), the response headers, sampling, TLS to an https endpoint, and nothing
at all when off."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from persys.observability import trace_context, tracing
from persys.observability.asgi_tracing import TracingMiddleware
from persys.observability.grpc_tracing import TracingInterceptor, with_trace_context
from persys.security.pki import ClusterCA, standard_identities
from tests.otlp_receiver import OtlpReceiver

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
UNSAMPLED = "00-5bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


@pytest.fixture
def traced(receiver: OtlpReceiver) -> Iterator[OtlpReceiver]:
    receiver.clear()
    handle = tracing.setup(tracing.settings_from(receiver.endpoint, {}, "persys-test", "t1"))
    try:
        yield receiver
    finally:
        handle.shutdown()  # exports what is buffered; tracing is off again for the next test
        assert not tracing.enabled()


def test_a_span_joins_the_trace_it_is_given_and_keeps_no_error_text(traced: OtlpReceiver) -> None:
    with tracing.span("outer", {"persys.workload": "web"}, parent=PARENT) as outer:
        assert trace_context.current()[3:35] == PARENT[3:35]
        with pytest.raises(ValueError), tracing.span("inner", record=False):
            raise ValueError("env API_KEY=hunter2 refused")
        tracing.record_error(outer, "handled")
    tracing.force_flush()
    spans = {s.name: s for s in traced.wait_for(lambda s: len(s) >= 2)}
    assert spans["outer"].trace_id == PARENT[3:35] and spans["outer"].parent_id == PARENT[36:52]
    assert spans["inner"].parent_id == spans["outer"].span_id
    assert (spans["inner"].status, spans["outer"].status) == (2, 2)
    assert spans["outer"].service == "persys-test" and spans["outer"].instance == "t1"
    assert spans["outer"].attributes == {"persys.workload": "web"}
    assert "hunter2" not in repr(spans["inner"])


async def test_grpc_server_span_is_a_child_of_the_callers_metadata(traced: OtlpReceiver) -> None:
    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if request == b"refuse":
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "no")
        return request

    server = grpc.aio.server(interceptors=[TracingInterceptor()])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "test.Echo", {"Say": grpc.unary_unary_rpc_method_handler(echo)})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            say = ch.unary_unary("/test.Echo/Say")
            with tracing.span("client") as client:
                md = with_trace_context(())
                assert md == ((trace_context.TRACEPARENT, trace_context.current()),)
                assert await say(b"hi", metadata=md) == b"hi"
                with pytest.raises(grpc.aio.AioRpcError):
                    await say(b"refuse", metadata=md)
            client_id = f"{client.get_span_context().span_id:016x}"
    finally:
        await server.stop(None)
    tracing.force_flush()
    spans = traced.wait_for(lambda s: len([x for x in s if x.name == "test.Echo/Say"]) == 2)
    served = [s for s in spans if s.name == "test.Echo/Say"]
    assert {s.parent_id for s in served} == {client_id}
    assert sorted((s.status, s.attributes["rpc.grpc.status_code"]) for s in served) == [(0, 0), (2, 7)]
    assert served[0].kind == 2  # SERVER


async def test_http_request_span_by_route_template_and_trace_id_returned(traced: OtlpReceiver) -> None:
    async def item(request: Request) -> PlainTextResponse:
        return PlainTextResponse(request.path_params["item_id"])

    app = TracingMiddleware(Starlette(routes=[Route("/v1/items/{item_id}", item)]),
                            route_of=lambda _m, p: "/v1/items/{item_id}" if p.startswith("/v1/items/") else None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        joined = await http.get("/v1/items/secret-name", headers={"traceparent": PARENT})
        fresh = await http.get("/nowhere")
    assert joined.headers["x-persys-trace-id"] == PARENT[3:35]
    assert trace_context.trace_id_of(joined.headers["traceparent"]) == PARENT[3:35]
    assert fresh.status_code == 404 and len(fresh.headers["x-persys-trace-id"]) == 32  # a trace of its own
    tracing.force_flush()
    spans = {s.name: s for s in traced.wait_for(lambda s: len(s) >= 2)}
    got = spans["GET /v1/items/{item_id}"]
    assert got.parent_id == PARENT[36:52] and got.attributes["http.response.status_code"] == 200
    assert "secret-name" not in repr(got)  # the template names the span, never the raw path
    assert spans["GET unmatched"].parent_id == ""


def test_sampling_ratio_zero_follows_a_sampled_parent_only(receiver: OtlpReceiver) -> None:
    receiver.clear()
    handle = tracing.setup(tracing.settings_from(receiver.endpoint, {"OTEL_TRACES_SAMPLER_ARG": "0"},
                                                 "persys-test"))
    try:
        for i in range(20):
            with tracing.span(f"root-{i}"):
                pass
        with tracing.span("child-of-sampled", parent=PARENT):
            pass
        with tracing.span("child-of-unsampled", parent=UNSAMPLED):
            pass
    finally:
        handle.shutdown()
    assert [s.name for s in receiver.wait_for(lambda s: len(s) >= 1)] == ["child-of-sampled"]


async def test_off_means_nothing(receiver: OtlpReceiver) -> None:
    receiver.clear()
    handle = tracing.setup_from(None, "persys-test", environ={})
    assert not tracing.enabled()
    with tracing.span("nothing", parent=PARENT) as s:
        assert not s.is_recording() and trace_context.current() == ""
    assert with_trace_context((("a", "b"),)) == (("a", "b"),)
    # A gateway that does not trace installs no middleware; this one, if it were there, adds nothing.
    app = TracingMiddleware(Starlette(routes=[Route("/x", lambda _r: PlainTextResponse("x"))]),
                            route_of=lambda _m, _p: "/x")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:
        resp = await http.get("/x", headers={"traceparent": PARENT})
    assert resp.status_code == 200 and "traceparent" not in resp.headers and "x-persys-trace-id" not in resp.headers
    handle.shutdown()
    tracing.force_flush()
    assert receiver.spans() == []


def test_https_endpoint_exports_over_tls_with_the_configured_ca(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    server = standard_identities(ca, "n1")["gateway"]  # any server certificate valid for 127.0.0.1
    creds = grpc.ssl_server_credentials([(server.key.read_bytes(), server.cert.read_bytes())])
    with OtlpReceiver(tls=creds) as receiver:
        assert receiver.endpoint.startswith("https://")
        # Read by the OpenTelemetry exporter itself: the CA that signed the receiver's certificate
        # (without it the handshake fails and nothing arrives).
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(server.ca))
        handle = tracing.setup(tracing.settings_from(receiver.endpoint, {}, "persys-test"))
        try:
            with tracing.span("over-tls"):
                pass
        finally:
            handle.shutdown()
        assert [s.name for s in receiver.wait_for(lambda s: len(s) >= 1)] == ["over-tls"]


def test_placements_of_a_bulk_trace_share_a_span_and_one_alone_keeps_its_own(traced: OtlpReceiver) -> None:
    from persys.model import Workload, WorkloadSpec
    from persys.scheduler.decide.effects import Need
    from persys.scheduler.placement.engine import Decision
    from persys.scheduler.placing import tracing as pt

    bulk, single = PARENT, "00-6bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    spec = WorkloadSpec.model_validate({"type": "process", "process": {"command": ["true"]}})

    def decided(name: str, parent: str, node: str, ok: bool = True) -> pt.Decided:
        w = Workload(id=name, name=name, spec=spec, revision="r1", created_at=0, updated_at=0, trace_parent=parent)
        d = Decision(workload_id=name, node_id=node, scores=[], rejections={}, feasible=2, total=3, evaluated=3)
        return pt.Decided(Need(w, 1, name), d, "Scheduled" if ok else "NotCommitted", 1, f"{name} -> {node}", ok)

    items = [decided(f"w{i}", bulk, f"n{i % 3}", ok=i != 5) for i in range(20)]
    items += [decided("alone", single, "n1"), decided("untraced", UNSAMPLED, "n2")]
    pt.record_batch(items)
    tracing.force_flush()
    spans = {s.trace_id: s for s in traced.wait_for(lambda s: len(s) >= 2)}
    assert len(spans) == 2  # none for the unsampled trace
    shared, own = spans[bulk[3:35]], spans[single[3:35]]
    assert shared.name == own.name == "scheduler.place" and shared.status == 2  # one was not committed
    assert shared.attributes == {"persys.placement.instances": 20, "persys.placement.scheduled": 19,
                                 "persys.placement.outcome": "NotCommitted", "persys.placement.nodes_used": "n0,n1,n2",
                                 "persys.workloads": 20,
                                 "persys.placement.first": [f"w{i}=n{i % 3}:{'NotCommitted' if i == 5 else 'Scheduled'}"
                                                            for i in range(pt.NAMED_MAX)]}
    assert shared.events == []
    assert own.attributes["persys.instance"] == "alone" and own.attributes["persys.placement.node"] == "n1"
    assert own.attributes["persys.placement.explanation"] == "alone -> n1" and own.status != 2
