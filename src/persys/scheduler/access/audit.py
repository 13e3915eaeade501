"""The audit log: one record per client request that changes something (or reads every key),
allowed or refused, kept durably in the state store and bounded to the newest `keep` records.

Records live under their own prefix (outside /persys/: the state mirror does not follow them,
backups do not carry them and a restore cannot rewrite history). Keys sort by time, so the
oldest are the first of a range. Writes are group-committed: concurrent requests share one
store transaction, and a request waits for its record to be stored (at most `wait` seconds)
before it is answered, so an acknowledged mutation has its record. If the store refuses, the
records wait in memory (at most `MAX_PENDING`) and go out with the next write.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

from persys.store.base import Delete, Put, StateStore, StoreError

AUDIT = "/persys-audit/"
DEFAULT_KEEP = 10_000
MAX_PENDING = 10_000
BATCH = 100  # records per transaction: well within etcd's 128 operations and 1.5 MiB
PRUNE_EVERY = 60.0  # seconds; and after every keep/10 records this replica wrote

log = logging.getLogger(__name__)


def matches(record: dict[str, Any], since: float, who: str) -> bool:
    """A query's filter (pure): at or after `since`, and `who` in the principal or the gateway."""
    if since and float(record.get("ts", 0)) < since:
        return False
    return not who or who in str(record.get("principal", "")) or who in str(record.get("via", ""))


def select(records: Sequence[dict[str, Any]], since: float, who: str, limit: int) -> list[dict[str, Any]]:
    """The newest `limit` matching records, oldest first."""
    found = [r for r in records if matches(r, since, who)]
    return found[-limit:] if limit > 0 else found


def excess(count: int, keep: int) -> int:
    return max(0, count - keep)


class AuditLog:
    def __init__(self, store: StateStore, keep: int = DEFAULT_KEEP, wait: float = 2.0) -> None:
        self.store = store
        self.keep = keep
        self.wait = wait
        self._tag = secrets.token_hex(3)  # tells this replica's keys from another's written the same ns
        self._seq = 0
        self._pending: list[tuple[Put, asyncio.Future[bool]]] = []
        self._flushing: asyncio.Task[None] | None = None
        self._since_prune = 0
        self._task: asyncio.Task[None] | None = None
        self.failed_writes = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._housekeeping(), name="audit-housekeeping")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self._flush()  # what is still pending, once

    async def record(self, record: dict[str, Any]) -> bool:
        """Store one record; True once it is durable. Never raises: auditing must not turn a done
        mutation into an error (a failure is logged and retried)."""
        self._seq += 1
        key = f"{AUDIT}{time.time_ns():020d}-{self._tag}-{self._seq:08d}"
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if len(self._pending) >= MAX_PENDING:
            self._pending.pop(0)[1].set_result(False)
            log.warning("audit: %d records wait for the store; dropping the oldest", MAX_PENDING)
        self._pending.append((Put(key, json.dumps(record, separators=(",", ":")).encode()), fut))
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.create_task(self._flush(), name="audit-flush")
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.wait)
        except TimeoutError:
            log.warning("audit: a record was not stored within %.1f s; it stays queued", self.wait)
            return False

    async def _flush(self) -> None:
        while self._pending:
            batch = self._pending[:BATCH]
            try:
                await self.store.txn([], [p for p, _ in batch])
            except StoreError as err:
                self.failed_writes += 1
                log.warning("audit: storing %d records failed (%s); retrying later", len(batch), err)
                for _, fut in batch:
                    if not fut.done():
                        fut.set_result(False)
                return  # they stay pending: the next record or the housekeeping retries
            del self._pending[:len(batch)]
            self._since_prune += len(batch)
            for _, fut in batch:
                if not fut.done():
                    fut.set_result(True)

    async def _housekeeping(self) -> None:
        last_prune = 0.0
        while True:
            await asyncio.sleep(1.0)
            try:
                if self._pending and (self._flushing is None or self._flushing.done()):
                    await self._flush()
                if time.monotonic() - last_prune >= PRUNE_EVERY or self._since_prune >= max(1, self.keep // 10):
                    last_prune = time.monotonic()
                    self._since_prune = 0
                    await self.prune()
            except StoreError as err:
                log.warning("audit housekeeping: %s", err)

    async def prune(self) -> int:
        """Delete the oldest records beyond `keep`; how many were deleted."""
        found: list[str] = []
        async for kvs, _ in self.store.range_pages(AUDIT):
            found.extend(kv.key for kv in kvs)
        drop = found[:excess(len(found), self.keep)]
        for i in range(0, len(drop), BATCH):
            await self.store.txn([], [Delete(k) for k in drop[i:i + BATCH]])
        return len(drop)

    async def query(self, since: float = 0.0, who: str = "", limit: int = 100) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        async for kvs, _ in self.store.range_pages(AUDIT):
            for kv in kvs:
                with contextlib.suppress(ValueError):
                    doc = json.loads(kv.value)
                    if isinstance(doc, dict) and matches(doc, since, who):
                        records.append(doc)
            if limit > 0 and len(records) > 4 * limit:
                del records[:-limit]  # bounded memory while scanning
        return select(records, 0.0, "", limit)
