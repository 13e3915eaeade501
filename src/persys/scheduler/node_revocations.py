"""Revoked node identities: recorded durably, known to every replica within a poll interval.

`persysctl node revoke <id>` writes `/persys-auth/revoked-nodes/<id>` (outside /persys/, like
tokens: a restore cannot undo a revocation). Each replica keeps the set in memory, read again
every POLL seconds (and at once on the replica that records it), so a check costs a set lookup:
AgentControl refuses every call of a revoked node, its update stream at its next message (one
heartbeat interval), its desired-state watch at once (it waits on the node's event here).
Renewals and joins read the store itself, so no replica ever signs for a revoked node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

from persys.store.base import StateStore, StoreError

REVOKED = "/persys-auth/revoked-nodes/"
POLL = 1.0  # seconds: how stale another replica's view may be
MAX_REASON = 256

log = logging.getLogger(__name__)
T = TypeVar("T")


class NodeRevokedError(Exception):
    def __init__(self, node_id: str) -> None:
        super().__init__(f"node-revoked: node {node_id}'s identity is revoked (persysctl node revoke); "
                         "join again under a new node id")
        self.node_id = node_id


class NodeRevocations:
    def __init__(self, store: StateStore, poll: float = POLL) -> None:
        self.store = store
        self.poll = poll
        self._revoked: set[str] = set()
        self._events: dict[str, asyncio.Event] = {}  # node -> set when it is revoked (open watches wait on it)
        self._watchers: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    def is_revoked(self, node_id: str) -> bool:
        return node_id in self._revoked

    @contextlib.contextmanager
    def watching(self, node_id: str) -> Iterator[asyncio.Event]:
        """An event set once `node_id` is revoked, for as long as one of its streams waits on it
        (kept per watching node: bounded by the nodes' watch budgets)."""
        ev = self._events.get(node_id)
        if ev is None:
            ev = self._events[node_id] = asyncio.Event()
            if node_id in self._revoked:
                ev.set()
        self._watchers[node_id] = self._watchers.get(node_id, 0) + 1
        try:
            yield ev
        finally:
            self._watchers[node_id] -= 1
            if not self._watchers[node_id]:
                del self._watchers[node_id]
                del self._events[node_id]

    async def first_or_revoked(self, node_id: str, step: Awaitable[T]) -> T:
        """`step`'s result, or NodeRevokedError as soon as `node_id` is revoked (`step` cancelled)."""
        with self.watching(node_id) as revoked:
            task = asyncio.ensure_future(step)
            waiter = asyncio.ensure_future(revoked.wait())
            try:
                await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:  # the call itself was cancelled: so is its step
                task.cancel()
                raise
            finally:
                waiter.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await task
                raise NodeRevokedError(node_id)
            return task.result()

    def _learn(self, ids: set[str]) -> None:
        for node_id in ids - self._revoked:
            log.warning("node %s is revoked: refusing its calls and ending its streams", node_id)
            if ev := self._events.get(node_id):
                ev.set()
        self._revoked |= ids

    async def refresh(self) -> None:
        kvs, _ = await self.store.range(REVOKED)
        self._learn({kv.key[len(REVOKED):] for kv in kvs})

    async def revoked_in_store(self, node_id: str) -> bool:
        """The store's own answer (renewals and joins: never a stale view)."""
        if await self.store.get(REVOKED + node_id) is not None:
            self._learn({node_id})
            return True
        return False

    async def revoke(self, node_id: str, by: str, reason: str) -> dict[str, Any]:
        """Record the revocation (the first one stays) and apply it here at once."""
        doc = {"nodeId": node_id, "revokedAt": time.time(), "revokedBy": by, "reason": reason[:MAX_REASON]}
        if await self.store.cas(REVOKED + node_id, json.dumps(doc).encode(), 0) is None:
            kv = await self.store.get(REVOKED + node_id)
            doc = json.loads(kv.value) if kv else doc
        self._learn({node_id})
        return doc

    def start(self) -> None:
        self._task = asyncio.create_task(self._poll(), name="node-revocations")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _poll(self) -> None:
        while True:
            try:
                await self.refresh()
            except StoreError as err:  # the last view holds; revocations only ever add
                log.debug("revoked nodes not read: %s", err)
            await asyncio.sleep(self.poll)
