"""One Server-Sent Events connection per browser tab, carrying every topic its page shows:

- `events`: the cluster's events (the scheduler's event bus, optionally one object's), each
  with its id, rendered as the row the page's tables show. The browser resumes after a drop
  with Last-Event-ID (or `last`, the id the page was rendered at) and receives what it missed,
  each once; when the bus no longer holds it all, an `event: gap` says so first.
- `workloads`, `nodes` (and `workload/<id>`, `node/<id>`): change notices from the gateway's
  shared watch (cluster_view), coalesced to one `event: change` per 250 ms naming the topics;
  the page re-fetches just the sections those topics make stale.
- `logs` (with `subject=workload/<id>` and `logsince`): the workload's output followed from the
  agent, `event: log` per batch of lines (log_follow.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from persys._pb.persys.v1 import watch_pb2
from persys.client import SchedulerError
from persys.events.filters import FilterError, check_id, make_filter
from persys.gateway.dashboard.events_page import event_row
from persys.gateway.dashboard.log_follow import LogFollows
from persys.gateway.dashboard.sessions import Session
from persys.gateway.dashboard.web import Dashboard
from persys.gateway.routes.streams import KEEPALIVE_SECONDS, SSE_HEADERS
from persys.security import forwarding

TOPICS = ("events", "workloads", "nodes", "logs")
COALESCE_SECONDS = 0.25
STREAM_SECONDS = 900.0  # then the browser reconnects (and resumes) by itself
MAX_TOPICS_PER_CHANGE = 100


def frame_of(msg: watch_pb2.WatchEventMessage) -> str:
    if msg.gap:
        return f"id: {msg.id}\nevent: gap\ndata: {json.dumps({'gap': msg.gap, 'after': msg.id})}\n\n"
    out = []
    for e in msg.events:
        doc = json.loads(e.json)
        data = {"id": e.id, "subject": doc.get("subject", ""), "kind": doc.get("kind", ""),
                "html": str(event_row(doc))}
        out.append(f"id: {e.id}\nevent: ev\ndata: {json.dumps(data, separators=(',', ':'))}\n\n")
    return "".join(out) or f"id: {msg.id}\n: keep-alive\n\n"


async def _events_feed(dash: Dashboard, subject: str, last: str, queue: asyncio.Queue[str]
                       ) -> asyncio.Task[None] | Response:
    """The event bus from after `last` (this request's caller forwarded), pumped into `queue`;
    or the answer refusing it."""
    try:
        request = watch_pb2.WatchEventsRequest(
            kinds=[], subject=make_filter((), subject, "").subject,
            since_id=check_id(last[:40], "Last-Event-ID") if last else "",
            timeout_seconds=STREAM_SECONDS, keepalive_seconds=KEEPALIVE_SECONDS)
    except FilterError as err:
        return JSONResponse({"error": str(err)}, status_code=400)
    stream = dash.client.watch_events(request)
    try:
        first = await anext(stream)
    except SchedulerError as err:
        return JSONResponse({"error": err.message}, status_code=429 if err.code == "RESOURCE_EXHAUSTED" else 503)
    return asyncio.create_task(_pump_events(stream, first, queue))


async def _feeds(dash: Dashboard, session: Session, topics: set[str], subject: str, last: str,
                 queue: asyncio.Queue[str], since_version: int, logs: tuple[LogFollows, str] | None = None
                 ) -> list[asyncio.Task[None]] | Response:
    tasks: list[asyncio.Task[None]] = []
    if "events" in topics and session.can("list", "events"):
        feed = await _events_feed(dash, subject, last, queue)
        if isinstance(feed, Response):
            return feed
        tasks.append(feed)
    if topics & {"workloads", "nodes"} and session.can("list", "workloads") and session.can("list", "nodes"):
        try:
            await dash.view.ensure(forwarding.current())
        except SchedulerError as err:
            for t in tasks:
                t.cancel()
            return JSONResponse({"error": err.message}, status_code=503)
        tasks.append(asyncio.create_task(_pump_changes(dash, queue, since_version)))
    if logs is not None and "logs" in topics and subject.startswith("workload/") and session.can("logs", "workloads"):
        follows, since = logs
        tasks.append(await follows.start(subject.removeprefix("workload/"), since, queue))
    return tasks


async def _frames(queue: asyncio.Queue[str], tasks: list[asyncio.Task[None]], signed_in: Callable[[], bool]
                  ) -> AsyncIterator[str]:
    yield "retry: 1000\n: connected\n\n"
    try:
        while signed_in():  # signed out (or expired): the stream ends, and the reconnect is refused
            try:
                yield await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
            except TimeoutError:
                yield ": keep-alive\n\n"
            if any(t.done() for t in tasks) and queue.empty():
                return  # a feed ended: the browser reconnects and resumes
    finally:
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


async def open_live(dash: Dashboard, request: Request, follows: LogFollows | None = None) -> Response:
    session = dash.session_of(request)
    if session is None:
        return JSONResponse({"error": "signed out"}, status_code=401)
    q = request.query_params
    topics = {t for t in q.get("topics", "")[:200].split(",") if t}
    if topics - set(TOPICS):
        return JSONResponse({"error": f"topics: one or more of {', '.join(TOPICS)}"}, status_code=400)
    last = request.headers.get("last-event-id", "") or q.get("last", "")
    queue: asyncio.Queue[str] = asyncio.Queue(maxsize=1000)
    token = forwarding.forward(dash.metadata(session, f"live-{uuid.uuid4().hex[:12]}"))
    try:
        version = q.get("version", "")
        since_version = int(version) if version.lstrip("-").isdigit() and len(version) < 20 else -1
        logsince = q.get("logsince", "")[:40]
        tasks = await _feeds(dash, session, topics, q.get("subject", "")[:512], last, queue, since_version,
                             (follows, logsince) if follows is not None else None)
    finally:
        forwarding.reset(token)
    if isinstance(tasks, Response):
        return tasks
    sid = session.sid
    return StreamingResponse(_frames(queue, tasks, lambda: dash.sessions.get(sid) is not None),
                             media_type="text/event-stream", headers=SSE_HEADERS)


def live_routes(dash: Dashboard, follows: LogFollows | None = None) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/ui/live")
    async def live(request: Request) -> Response:
        return await open_live(dash, request, follows)

    return router


async def _pump_events(stream: AsyncIterator[watch_pb2.WatchEventMessage], first: watch_pb2.WatchEventMessage,
                       queue: asyncio.Queue[str]) -> None:
    try:
        await queue.put(frame_of(first))
        async for msg in stream:
            await queue.put(frame_of(msg))
    except SchedulerError as err:
        await queue.put(f"event: error\ndata: {json.dumps({'error': err.message})}\n\n")
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def _pump_changes(dash: Dashboard, queue: asyncio.Queue[str], since_version: int) -> None:
    with dash.view.subscribe() as listener:
        if dash.view.version != since_version:  # changed since the page was rendered: all of it is stale
            await queue.put(f"event: change\ndata: {json.dumps({'all': True, 'version': dash.view.version})}\n\n")
        while True:
            await listener.wake.wait()
            await asyncio.sleep(COALESCE_SECONDS)  # many changes at once: one notice
            topics = sorted(listener.take())
            if len(topics) > MAX_TOPICS_PER_CHANGE:  # the kinds alone: every such section refreshes
                topics = sorted({t for t in topics if "/" not in t})
            body = {"topics": topics, "version": dash.view.version}
            await queue.put(f"event: change\ndata: {json.dumps(body)}\n\n")
