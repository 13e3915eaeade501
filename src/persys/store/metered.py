"""A `StateStore` that counts and times every call of the one it wraps, by operation and
result: the instrumentation of every backend in one place instead of at every call site.

Result `ok` is any answer (a compare-and-swap that lost is an answer: `cas`/`txn` returning None
are counted `ok`, conflicts are not errors); `error` is an exception (unavailable, too large,
lease not found). Watches and paged ranges pass through (a watch is one long call). Anything
else a backend offers (its blocking leases, access check) is reached through `__getattr__`, so
capability checks such as `isinstance(store, BlockingLeases)` see what the backend has.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from persys.observability.metrics import Metrics
from persys.store.base import Compare, Delete, HistoryReads, KeyValue, Put, StateStore, StoreError, WatchEvent

T = TypeVar("T")
OPERATIONS = "persys_store_operations_total"
DURATION = "persys_store_operation_duration_seconds"


class MeteredStore:
    def __init__(self, inner: StateStore, metrics: Metrics) -> None:
        self.inner = inner
        self.max_txn_bytes = inner.max_txn_bytes
        self._ops = metrics.counter(OPERATIONS)
        self._seconds = metrics.histogram(DURATION)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def _timed(self, op: str, call: Callable[[], Awaitable[T]]) -> T:
        started = time.perf_counter()
        try:
            result = await call()
        except BaseException:
            self._ops.inc((op, "error"))
            raise
        finally:
            self._seconds.observe(time.perf_counter() - started, (op,))
        self._ops.inc((op, "ok"))
        return result

    async def get(self, key: str) -> KeyValue | None:
        return await self._timed("get", lambda: self.inner.get(key))

    async def range(self, prefix: str) -> tuple[list[KeyValue], int]:
        return await self._timed("range", lambda: self.inner.range(prefix))

    async def range_at(self, prefix: str, revision: int) -> list[KeyValue]:
        inner = self.inner
        if not isinstance(inner, HistoryReads):
            raise StoreError(f"{type(inner).__name__} cannot read past revisions")
        return await self._timed("range_at", lambda: inner.range_at(prefix, revision))

    def range_pages(self, prefix: str, page: int = 1000) -> AsyncIterator[tuple[list[KeyValue], int]]:
        return self.inner.range_pages(prefix, page)

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        return await self._timed("put", lambda: self.inner.put(key, value, lease))

    async def cas(self, key: str, value: bytes, expected_mod_revision: int, lease: int = 0) -> int | None:
        return await self._timed("cas", lambda: self.inner.cas(key, value, expected_mod_revision, lease))

    async def delete(self, key: str, expected_mod_revision: int | None = None) -> bool:
        return await self._timed("delete", lambda: self.inner.delete(key, expected_mod_revision))

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Put | Delete]) -> int | None:
        return await self._timed("txn", lambda: self.inner.txn(compares, ops))

    async def grant_lease(self, ttl: float) -> int:
        return await self._timed("grant_lease", lambda: self.inner.grant_lease(ttl))

    async def keep_alive(self, lease_id: int) -> float:
        return await self._timed("keep_alive", lambda: self.inner.keep_alive(lease_id))

    async def revoke_lease(self, lease_id: int) -> None:
        await self._timed("revoke_lease", lambda: self.inner.revoke_lease(lease_id))

    def watch(self, prefix: str, start_revision: int | None = None) -> AsyncIterator[WatchEvent]:
        return self.inner.watch(prefix, start_revision)

    async def current_revision(self) -> int:
        return await self._timed("current_revision", lambda: self.inner.current_revision())

    async def status(self) -> dict[str, object]:
        return await self._timed("status", lambda: self.inner.status())

    async def close(self) -> None:
        await self.inner.close()
