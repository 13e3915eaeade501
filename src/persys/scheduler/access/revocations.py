"""Revoked node identities: recorded durably, known to every replica within a poll interval.

`persysctl node revoke <id>` writes `/persys-auth/revoked-nodes/<id>` (outside /persys/, like
tokens: a restore cannot undo a revocation). Each replica keeps the set in memory, read again
every POLL seconds (and at once on the replica that records it), so a check costs a set lookup:
AgentControl refuses every call of a revoked node, its update stream at its next message (one
heartbeat interval), its desired-state watch at once (woken by `on_revoked`, it finds the node
revoked before sending).
Renewals and joins read the store itself, so no replica ever signs for a revoked node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from persys.store.base import StateStore, StoreError

REVOKED = "/persys-auth/revoked-nodes/"
POLL = 1.0  # seconds: how stale another replica's view may be
MAX_REASON = 256

log = logging.getLogger(__name__)


class NodeRevokedError(Exception):
    def __init__(self, node_id: str) -> None:
        super().__init__(f"node-revoked: node {node_id}'s identity is revoked (persysctl node revoke); "
                         "join again under a new node id")
        self.node_id = node_id


class NodeRevocations:
    def __init__(self, store: StateStore, poll: float = POLL, on_revoked: Callable[[str], None] | None = None
                 ) -> None:
        self.store = store
        self.poll = poll
        # Told each node newly known revoked: the scheduler wakes its desired-state watch, which
        # then finds it revoked and ends (no per-message cost while nobody is revoked).
        self.on_revoked = on_revoked
        self._revoked: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def is_revoked(self, node_id: str) -> bool:
        return node_id in self._revoked

    def _learn(self, ids: set[str]) -> None:
        new, self._revoked = ids - self._revoked, self._revoked | ids
        for node_id in new:
            log.warning("node %s is revoked: refusing its calls and ending its streams", node_id)
            if self.on_revoked is not None:
                self.on_revoked(node_id)

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
