"""The gateway's live copy of every workload summary and node, for the dashboard's lists and
overview: two Watch streams (workloads, nodes) shared by every session, instead of a list of
50,000 workloads per page view (the overview's 300 ms budget) or a watch per browser tab (the
scheduler's per-caller stream budget).

The streams are opened with the credentials of a signed-in session (the gateway's own identity
holds no client rights), and reopened with the next session's when they fail. Every page checks
its own session's role before showing anything from here. Changes are fanned out to the live
connections (`subscribe`) as topic names: "workloads", "workload/<id>", "nodes", "node/<id>".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

from persys.client import SchedulerClient, SchedulerError
from persys.gateway.dashboard.figures import NodeSums, Overview, phase_counts, phase_of
from persys.scheduler.replica.heap import HeapGuard
from persys.security import forwarding

log = logging.getLogger(__name__)
SYNC_WAIT_SECONDS = 10.0  # then the page says the view is still loading (the watch goes on)
RETRY_SECONDS = 1.0
LARGE = 5_000  # objects in the view past which its documents are kept out of the collector's walks


class Listener:
    """One live connection's pending topics (coalesced: a set, woken once)."""

    def __init__(self) -> None:
        self.topics: set[str] = set()
        self.wake = asyncio.Event()

    def add(self, topics: tuple[str, ...]) -> None:
        self.topics.update(topics)
        self.wake.set()

    def take(self) -> set[str]:
        out, self.topics = self.topics, set()
        self.wake.clear()
        return out


class ClusterView:
    def __init__(self, client: SchedulerClient) -> None:
        self.client = client
        self.workloads: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self._synced = {"workloads": asyncio.Event(), "nodes": asyncio.Event()}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._listeners: set[Listener] = set()
        self.version = 0  # bumped on every change: caches of derived figures key on it
        self.loading = {"workloads": 0, "nodes": 0}  # read so far, while a watch delivers the current set
        # Kept as objects change, so the overview walks none of them (bench/dashboard_overview.py).
        self.phases: Counter[str] = Counter()
        self.node_sums = NodeSums()
        self._overview: tuple[int, Overview] | None = None
        # The view's documents live long and hold no cycles: frozen out of the cyclic collector's
        # full walks, which at 50,000 workloads stopped the gateway for ~0.3 s (1 s+ under load).
        self._heap = HeapGuard(freeze_every_seconds=1.0)

    def running(self) -> bool:
        return len(self._tasks) == 2 and not any(t.done() for t in self._tasks.values())

    async def ensure(self, metadata: forwarding.Metadata) -> None:
        """Start the watches (with `metadata`: the calling session's credentials) unless they
        run; wait until both have delivered the current set."""
        for kind in ("workloads", "nodes"):
            task = self._tasks.get(kind)
            if task is not None and task.done() and not task.cancelled():
                task.exception()  # seen (logged by _watch already): not "never retrieved"
            if task is None or task.done():
                token = forwarding.forward(metadata)  # the task copies this context
                try:
                    self._tasks[kind] = asyncio.create_task(self._watch(kind), name=f"dashboard-watch-{kind}")
                finally:
                    forwarding.reset(token)
        for kind, ev in self._synced.items():
            if not ev.is_set():
                try:
                    await asyncio.wait_for(ev.wait(), SYNC_WAIT_SECONDS)
                except TimeoutError:
                    task = self._tasks[kind]
                    if task.done() and task.exception() is not None:
                        raise task.exception() from None  # type: ignore[misc]
                    raise SchedulerError("UNAVAILABLE", f"the gateway is still reading the cluster's {kind} "
                                         f"({self.loading[kind]:,} so far): reload in a few seconds") from None

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _watch(self, kind: str) -> None:
        store = self.workloads if kind == "workloads" else self.nodes
        single = kind[:-1]
        while True:
            fresh: dict[str, dict[str, Any]] = {}
            synced = False
            try:
                async for msg in self.client.watch_objects(kind):
                    if msg.type == "SYNCED":
                        synced = True
                        self._synced_with(kind, store, fresh)
                    elif synced:
                        old = _applied(store, msg)
                        self._count(kind, old, store.get(msg.id))
                        self._notify((kind, f"{single}/{msg.id}"))
                    else:
                        _applied(fresh, msg)
                        self.loading[kind] = len(fresh)
            except SchedulerError as err:
                if err.code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
                    log.info("dashboard: %s watch refused (%s); reopened by the next session", kind, err.message)
                    raise
                log.info("dashboard: %s watch ended (%s); reopening", kind, err.message)
            await asyncio.sleep(RETRY_SECONDS)

    def _synced_with(self, kind: str, store: dict[str, dict[str, Any]], fresh: dict[str, dict[str, Any]]) -> None:
        """The list is complete: it replaces what was kept, the sums are counted again and pages
        showing what is gone are told."""
        gone = set(store) - set(fresh)
        store.clear()
        store.update(fresh)
        if kind == "workloads":
            self.phases = phase_counts(store.values())
        else:
            self.node_sums = NodeSums(store.values())
        self._synced[kind].set()
        self._notify((kind, *(f"{kind[:-1]}/{i}" for i in gone)))

    def _count(self, kind: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        for doc, sign in ((old, -1), (new, 1)):
            if doc is None:
                continue
            if kind == "workloads":
                self.phases[phase_of(doc)] += sign
            else:
                self.node_sums.add(doc, sign)

    def overview(self) -> Overview:
        """The overview's figures, from the sums and counts kept as objects changed (no walk)."""
        if self._overview is None or self._overview[0] != self.version:
            self._overview = (self.version, self.node_sums.overview(self.phases))
        return self._overview[1]

    def _notify(self, topics: tuple[str, ...]) -> None:
        if len(self.workloads) + len(self.nodes) >= LARGE:
            self._heap.install()  # idempotent: a young-generation threshold and a pause log
            self._heap.tick()  # at most once a second
        self.version += 1
        for listener in self._listeners:
            listener.add(topics)

    @contextlib.contextmanager
    def subscribe(self) -> Iterator[Listener]:
        listener = Listener()
        self._listeners.add(listener)
        try:
            yield listener
        finally:
            self._listeners.discard(listener)


def _applied(target: dict[str, dict[str, Any]], msg: Any) -> dict[str, Any] | None:
    """One watch change applied to `target`; the document it replaced or deleted."""
    if msg.type == "DELETED":
        return target.pop(msg.id, None)
    old = target.get(msg.id)
    target[msg.id] = json.loads(msg.json)
    return old
