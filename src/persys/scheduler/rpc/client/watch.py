"""The Watch service: live streams of cluster events and of workloads/nodes (proto watch.proto).

Events come from the bus's `subscribe` (a replay of what is retained after the resume position,
then the live tail); the decisions (filter, start, gap) are pure, in `events.filters`. Workload
and node streams follow the mirror through its listener (`object_changes`). Each caller identity
holds at most STREAMS_PER_CALLER streams at this replica and the replica at most STREAMS_TOTAL:
beyond, RESOURCE_EXHAUSTED before anything is held.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import grpc

from persys._pb.persys.v1 import watch_pb2 as pb
from persys._pb.persys.v1 import watch_pb2_grpc as pb_grpc
from persys.events.base import ClusterEvent, EventBus, EventsUnavailable
from persys.events.filters import EventFilter, FilterError, Start, check_id, event_doc, make_filter, start_of
from persys.scheduler.access.call_budget import CallBudget, OverBudgetError
from persys.scheduler.errors import NotFound
from persys.scheduler.mirror.follower import ClusterState
from persys.scheduler.rpc.authorization import CALLER
from persys.scheduler.rpc.status import UNAVAILABLE_METADATA, dumps
from persys.scheduler.views.changes import NODES, WORKLOADS, ChangeFeed

STREAMS_PER_CALLER = 8
STREAMS_TOTAL = 256
DEFAULT_KEEPALIVE = 15.0
PUMP_QUEUE = 1000  # events read ahead of a slow client (then the bus read waits)
BATCH = 256  # events in one message at most


class WatchSource(Protocol):
    events: EventBus
    state: ClusterState

    def workload_view(self, wid: str, summary: bool = False) -> dict[str, Any]: ...
    def node_view(self, node_id: str) -> dict[str, Any]: ...


def _keepalive(request: pb.WatchEventsRequest) -> float:
    k = request.keepalive_seconds
    if k == 0:
        return DEFAULT_KEEPALIVE
    if not 1 <= k <= 60:
        raise FilterError("keepaliveSeconds: between 1 and 60")
    return k


def _request_filter(request: pb.WatchEventsRequest) -> EventFilter:
    if request.since_id:
        check_id(request.since_id)
    if request.limit < 0 or request.timeout_seconds < 0 or request.since < 0:
        raise FilterError("limit, timeout and since must not be negative")
    return make_filter(list(request.kinds), request.subject, request.node)


def select(batch: list[ClusterEvent], flt: EventFilter, left: int
           ) -> tuple[list[pb.WatchedEvent], str, int]:
    """The batch's events the filter keeps (at most `left` of them; -1: no limit), the position
    after the last event looked at, and how many may still be sent. Events after the limit is
    reached are not looked at: a stream resumed from the position sees them."""
    out: list[pb.WatchedEvent] = []
    cursor = ""
    for ev in batch:
        if not left:
            break
        cursor = ev.id
        if flt.matches(ev):
            out.append(pb.WatchedEvent(id=ev.id, json=dumps(event_doc(ev))))
            left -= 1 if left > 0 else 0
    return out, cursor, left


class WatchService(pb_grpc.WatchServicer):
    def __init__(self, s: WatchSource, per_caller: int = STREAMS_PER_CALLER, total: int = STREAMS_TOTAL) -> None:
        self.s = s
        self.budget = CallBudget(per_caller, "watch streams")
        self.total = total
        # One mirror listener per watched kind, shared by all streams of it.
        self.feeds = {WORKLOADS: ChangeFeed(WORKLOADS), NODES: ChangeFeed(NODES)}
        for feed in self.feeds.values():
            s.state.subscribe(feed.listener)

    @contextlib.asynccontextmanager
    async def _slot(self, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        who = CALLER.get().identity.principal
        if sum(self.budget.held.values()) >= self.total:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"this scheduler serves {self.total} watch streams already; retry later")
        try:
            self.budget.acquire(who)
        except OverBudgetError:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{who} already holds {self.budget.limit} watch streams here (at most "
                                f"{self.budget.limit}); close one first")
        try:
            yield
        finally:
            self.budget.release(who)

    # ---------------------------------------------------------------- events

    async def Events(self, request: pb.WatchEventsRequest, context: grpc.aio.ServicerContext
                     ) -> AsyncIterator[pb.WatchEventMessage]:
        try:
            flt, keepalive = _request_filter(request), _keepalive(request)
        except FilterError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        async with self._slot(context):
            start = await self._start(request, context)
            yield pb.WatchEventMessage(id=start.after, gap=start.gap)
            async for msg in self._tail(start.after, flt, keepalive, request):
                yield msg

    async def _start(self, request: pb.WatchEventsRequest, context: grpc.aio.ServicerContext) -> Start:
        try:
            oldest, last = await self.s.events.bounds()
        except EventsUnavailable as err:
            context.set_trailing_metadata(((UNAVAILABLE_METADATA, "event-bus"),))
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"event bus unavailable ({err}); the control plane is up")
        return start_of(request.since_id, request.since, oldest, last, int(getattr(self.s.events, "maxlen", 0)))

    async def _tail(self, after: str, flt: EventFilter, keepalive: float, request: pb.WatchEventsRequest
                    ) -> AsyncIterator[pb.WatchEventMessage]:
        queue: asyncio.Queue[ClusterEvent] = asyncio.Queue(PUMP_QUEUE)

        async def pump() -> None:
            async for ev in self.s.events.subscribe(after):
                await queue.put(ev)

        task = asyncio.create_task(pump())
        deadline = time.monotonic() + request.timeout_seconds if request.timeout_seconds else None
        cursor = reported = after
        left = request.limit or -1  # -1: no limit
        try:
            while left and (deadline is None or time.monotonic() < deadline):
                wait = keepalive if deadline is None else min(keepalive, max(0.0, deadline - time.monotonic()))
                try:
                    first = await asyncio.wait_for(queue.get(), wait)
                except TimeoutError:
                    # Keep-alive, and the position past filtered-out events (a resume starts there).
                    yield pb.WatchEventMessage(id=cursor)
                    reported = cursor
                    continue
                # What is queued already goes in the same message (a burst costs few messages).
                batch = [first, *(queue.get_nowait() for _ in range(min(queue.qsize(), BATCH - 1)))]
                events, cursor, left = select(batch, flt, left)
                if events:
                    yield pb.WatchEventMessage(id=cursor, events=events)
                    reported = cursor
            if cursor != reported:
                yield pb.WatchEventMessage(id=cursor)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # ---------------------------------------------------------------- workloads and nodes

    async def Workloads(self, request: pb.WatchObjectsRequest, context: grpc.aio.ServicerContext
                        ) -> AsyncIterator[pb.ObjectChange]:
        node = request.node_id

        def render(wid: str) -> dict[str, Any] | None:
            view = self.s.workload_view(wid, summary=True)
            return None if node and node not in view.get("nodes", ()) else view

        async for msg in self._objects(context, WORKLOADS, request, lambda: sorted(self.s.state.workloads), render):
            yield msg

    async def Nodes(self, request: pb.WatchObjectsRequest, context: grpc.aio.ServicerContext
                    ) -> AsyncIterator[pb.ObjectChange]:
        async for msg in self._objects(context, NODES, request, lambda: sorted(self.s.state.nodes), self.s.node_view):
            yield msg

    async def _objects(self, context: grpc.aio.ServicerContext, watched: str, request: pb.WatchObjectsRequest,
                       ids: Callable[[], list[str]], render: Callable[[str], dict[str, Any] | None]
                       ) -> AsyncIterator[pb.ObjectChange]:
        if request.timeout_seconds < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "timeoutSeconds must not be negative")
        async with self._slot(context):
            feed = self.feeds[watched]
            feed.readers += 1
            cursor = feed.cursor  # before the first view: no change falls between
            shown: set[str] = set()
            try:
                for oid in ids():
                    msg = self._change(oid, render, shown, "ADDED")
                    if msg is not None:
                        yield msg
                yield pb.ObjectChange(type="SYNCED", revision=self.s.state.revision)
                async for msg in self._follow(feed, cursor, ids, render, shown, request.timeout_seconds):
                    yield msg
            finally:
                feed.readers -= 1

    async def _follow(self, feed: ChangeFeed, cursor: int, ids: Callable[[], list[str]],
                      render: Callable[[str], dict[str, Any] | None], shown: set[str], seconds: float
                      ) -> AsyncIterator[pb.ObjectChange]:
        deadline = time.monotonic() + seconds if seconds else None
        while deadline is None or time.monotonic() < deadline:
            await feed.wait(cursor, None if deadline is None else max(0.0, deadline - time.monotonic()))
            changed, reset, cursor = feed.take(cursor)
            if reset:
                changed = sorted(set(ids()) | shown)
            for oid in changed:
                msg = self._change(oid, render, shown, "MODIFIED")
                if msg is not None:
                    yield msg

    def _change(self, oid: str, render: Callable[[str], dict[str, Any] | None], shown: set[str], kind: str
                ) -> pb.ObjectChange | None:
        try:
            view = render(oid)
        except NotFound:
            view = None
        rev = self.s.state.revision
        if view is None:
            if oid in shown:
                shown.discard(oid)
                return pb.ObjectChange(type="DELETED", id=oid, revision=rev)
            return None
        typ = kind if oid in shown or kind == "ADDED" else "ADDED"
        shown.add(oid)
        return pb.ObjectChange(type=typ, id=oid, json=dumps(view), revision=rev)
