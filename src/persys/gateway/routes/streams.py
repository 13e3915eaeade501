"""Live streams for the dashboard and persysctl: cluster events, workloads and nodes as Server-Sent
Events (text/event-stream), relayed from the scheduler's Watch service.

Events carry `id:` lines with the event id, so an EventSource reconnects with `Last-Event-ID` and
resumes where it was; a message without an event (`id:` and a `: keep-alive` comment) moves that
position past filtered-out events and keeps proxies from closing an idle stream. A resume older
than what the event bus retains gets a `gap` event first. Errors before the first message are
ordinary HTTP answers (400 naming the field, 429 over the caller's stream budget, 503).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Header, Query
from fastapi.responses import JSONResponse, Response, StreamingResponse

from persys._pb.persys.v1 import watch_pb2
from persys.client import SchedulerClient, SchedulerError
from persys.events.filters import FilterError, check_id, make_filter, parse_since
from persys.gateway.schemas import SCHEDULER_ERRORS

# A list parameter's default as a module-level singleton (not a call in each signature).
KINDS = Query(None, max_length=32, description="Event kinds (repeat or comma-separate)")
KEEPALIVE_SECONDS = 15.0
DEFAULT_TIMEOUT = 300.0
MAX_TIMEOUT = 3600.0
SSE_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {"description": "A stream of Server-Sent Events (ends after `timeout` seconds or `limit` events)",
          "content": {"text/event-stream": {"schema": {"type": "string"}}}},
    429: {"description": "The caller already holds as many streams as allowed (close one)"},
    **{k: v for k, v in SCHEDULER_ERRORS.items() if k != 404},
}
# What an EventSource does after the server ends a stream: reconnect after this many ms.
RETRY = "retry: 2000\n\n"
SSE_HEADERS = {"cache-control": "no-store", "x-accel-buffering": "no"}


def event_frame(msg: watch_pb2.WatchEventMessage) -> str:
    """The SSE frames of a Watch/Events message: one per event, each with its id; a message
    without events is a position frame (and keep-alive)."""
    if msg.gap:
        return f"id: {msg.id}\nevent: gap\ndata: {json.dumps({'gap': msg.gap, 'after': msg.id})}\n\n"
    if msg.events:
        return "".join(f"id: {e.id}\ndata: {e.json.decode()}\n\n" for e in msg.events)
    return f"id: {msg.id}\n: keep-alive\n\n"


def object_frame(msg: watch_pb2.ObjectChange) -> str:
    body = {"type": msg.type, "id": msg.id, "revision": msg.revision,
            **({"object": json.loads(msg.json)} if msg.json else {})}
    return f"event: {msg.type.lower()}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n"


def _events_request(kind: list[str], subject: str, node: str, since: str, since_id: str, limit: int,
                    seconds: float) -> watch_pb2.WatchEventsRequest:
    flt = make_filter(kind, subject, node)
    return watch_pb2.WatchEventsRequest(
        kinds=sorted(flt.kinds), subject=flt.subject, node=flt.node,
        since_id=check_id(since_id) if since_id else "",
        since=parse_since(since, time.time()) if since and not since_id else 0.0,
        limit=limit, timeout_seconds=seconds, keepalive_seconds=KEEPALIVE_SECONDS)


async def _relay(stream: AsyncIterator[Any], frame: Callable[[Any], str]) -> Response:
    """The stream as SSE frames; a refusal before its first message is an ordinary answer."""
    try:
        first = await anext(stream)
    except SchedulerError as err:
        if err.code == "RESOURCE_EXHAUSTED":
            return JSONResponse({"error": err.message, "code": err.code}, status_code=429)
        raise

    async def frames() -> AsyncIterator[str]:
        yield RETRY + frame(first)
        try:
            async for msg in stream:
                yield frame(msg)
        except SchedulerError as err:  # the scheduler went away mid-stream: the client resumes
            yield f"event: error\ndata: {json.dumps({'error': err.message, 'code': err.code})}\n\n"
        finally:  # the client left: end the scheduler's stream now, not when collected
            await stream.aclose()  # type: ignore[attr-defined]

    return StreamingResponse(frames(), media_type="text/event-stream", headers=SSE_HEADERS)


def stream_routes(client: SchedulerClient) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/events/stream", tags=["events"], response_class=StreamingResponse, responses=SSE_ANSWERS)
    async def event_stream(
        kind: list[str] | None = KINDS,
        subject: str = Query("", max_length=512, description="One object's events: workload/web, node/n1"),
        node: str = Query("", max_length=253, description="Events about this node or naming it"),
        since: str = Query("", max_length=64, description="10m, 2h, 1d or an RFC 3339 time: replay from then"),
        since_id: str = Query("", alias="sinceId", max_length=40, description="Resume after this event id"),
        limit: int = Query(0, ge=0, le=10_000, description="End after this many events (0: no limit)"),
        wait: float = Query(DEFAULT_TIMEOUT, gt=0, le=MAX_TIMEOUT, alias="timeout",
                            description="End the stream after this many seconds (an EventSource reconnects "
                                           "by itself, resuming with Last-Event-ID)"),
        last_event_id: str = Header("", alias="last-event-id", max_length=40),
    ) -> Response:
        """Cluster events as they happen (Server-Sent Events; each `data:` is one event as GET
        /v1/events shows it). Resumable: `Last-Event-ID` (or `sinceId`) replays what the bus
        retains after that id; an `event: gap` says when that is not everything."""
        try:
            request = _events_request(kind or [], subject, node, since, last_event_id or since_id, limit, wait)
        except FilterError as err:
            return JSONResponse({"error": str(err), "problems": [str(err)]}, status_code=400)
        return await _relay(client.watch_events(request), event_frame)

    @router.get("/v1/watch/workloads", tags=["workloads"], response_class=StreamingResponse,
                responses=SSE_ANSWERS)
    async def watch_workloads(
        node: str = Query("", max_length=253, description="Only workloads with an instance on this node"),
        wait: float = Query(DEFAULT_TIMEOUT, gt=0, le=MAX_TIMEOUT, alias="timeout",
                          description="End after this many seconds"),
    ) -> Response:
        """Workload summaries as they change (Server-Sent Events: `added` for the current set, then
        `synced`, then `modified`/`added`/`deleted` per change; the latest view of each)."""
        return await _relay(client.watch_objects("workloads", node, wait), object_frame)

    @router.get("/v1/watch/nodes", tags=["nodes"], response_class=StreamingResponse, responses=SSE_ANSWERS)
    async def watch_nodes(
        wait: float = Query(DEFAULT_TIMEOUT, gt=0, le=MAX_TIMEOUT, alias="timeout",
                          description="End after this many seconds"),
    ) -> Response:
        """Nodes as they change (Server-Sent Events, as /v1/watch/workloads)."""
        return await _relay(client.watch_objects("nodes", "", wait), object_frame)

    return router
