"""The StateStore interface shared by every backend, plus small helpers.

Revisions follow etcd's model: one store-wide counter, bumped once per successful write
(a transaction with several ops produces a single revision).  Per key we keep the revision
that created it, the revision of its last change and a version (number of puts since creation).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from persys.tlsfiles import TLSFiles as TLSFiles  # re-exported: one TLS triple everywhere

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class WatchEvent:
    # For "delete", kv.value == b"" and kv.mod_revision == revision (the revision of the delete).
    type: Literal["put", "delete"]
    kv: KeyValue
    revision: int


class StoreError(Exception):
    """Base class of every store failure."""


class StoreUnavailable(StoreError):
    """The backend cannot be reached (or did not answer within the deadline)."""


class StoreFull(StoreError):
    """The backend refuses writes for want of space (SQLite's disk is full, etcd's space quota is
    exceeded): reads still work; writes fail until space is freed."""


class CompactedError(StoreError):
    """The requested revision is older than the retained history."""


class WatchCompacted(CompactedError):
    """A watch was asked to start (or, after a reconnect, resume) at a revision older than the
    retained history: the events in between are gone for good. Every backend raises this from
    `watch`; the watcher must reload a snapshot (a range, read at one revision) and watch again
    from the revision after it, dropping keys the snapshot no longer has."""

    def __init__(self, requested: int, compact_revision: int) -> None:
        super().__init__(f"revision {requested} has been compacted (the oldest revision a watch can start from "
                         f"is {compact_revision})")
        self.requested = requested
        self.compact_revision = compact_revision  # the oldest revision a watch can still start from


class FutureRevision(StoreError):
    """The requested revision is newer than the store's current one."""


class LeaseNotFound(StoreError):
    """The lease does not exist (never granted, revoked or expired)."""


class TxnTooLarge(StoreError):
    """A write larger than the store takes in one request: refused before sending, nothing
    written. Every backend enforces the same limit, so what works embedded works on etcd."""


@dataclass(frozen=True)
class Compare:
    key: str
    mod_revision: int  # 0 means "key must not exist"


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True)
class Delete:
    key: str


# etcd's default --max-request-bytes is 1.5 MiB for the whole request; what `txn_bytes` does not
# count (protobuf framing, the raft header) stays well within the 16 KiB left over.
DEFAULT_MAX_TXN_BYTES = (3 << 19) - (16 << 10)
OP_OVERHEAD_BYTES = 16  # per compare or operation, beyond its key and value


def txn_bytes(compares: Sequence[Compare], ops: Sequence[Put | Delete]) -> int:
    """What a transaction costs against the request limit (keys are ASCII: ids are validated)."""
    n = sum(len(c.key) for c in compares) + OP_OVERHEAD_BYTES * (len(compares) + len(ops))
    for op in ops:
        n += len(op.key) + (len(op.value) if isinstance(op, Put) else 0)
    return n


def check_txn_size(compares: Sequence[Compare], ops: Sequence[Put | Delete], limit: int) -> None:
    """Raise TxnTooLarge for a transaction over `limit` bytes (before anything is sent)."""
    size = txn_bytes(compares, ops)
    if size > limit:
        first = ops[0].key if ops else (compares[0].key if compares else "")
        raise TxnTooLarge(f"a write of {size} bytes ({len(ops)} operations, first {first}) exceeds the store's "
                          f"limit of {limit} bytes per request")


@runtime_checkable
class StateStore(Protocol):
    max_txn_bytes: int  # the largest write accepted in one request (see txn_bytes)

    async def get(self, key: str) -> KeyValue | None: ...

    async def range(self, prefix: str) -> tuple[list[KeyValue], int]:
        """All keys starting with prefix, sorted by key, and the store revision of the read."""
        ...

    def range_pages(self, prefix: str, page: int = 1000) -> AsyncIterator[tuple[list[KeyValue], int]]:
        """`range` a page at a time (every page read at the revision of the first, which comes
        with each page), so a large range never has to sit in memory at once."""
        ...

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Returns the new revision. Raises LeaseNotFound for an unknown lease."""
        ...

    async def cas(self, key: str, value: bytes, expected_mod_revision: int, lease: int = 0) -> int | None:
        """Put only if the key's mod_revision equals expected (0 = create-if-absent).

        Returns the new revision, or None on conflict."""
        ...

    async def delete(self, key: str, expected_mod_revision: int | None = None) -> bool:
        """True if a key was deleted; with expected_mod_revision only when it matches."""
        ...

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Put | Delete]) -> int | None:
        """Apply ops atomically iff every compare holds. Returns the store revision after the
        transaction, or None if a compare failed (nothing applied). A key may appear at most
        once in ops. Raises TxnTooLarge (nothing sent) over `max_txn_bytes` by `txn_bytes`;
        `put` and `cas` too."""
        ...

    async def grant_lease(self, ttl: float) -> int:
        """New lease with ttl seconds. etcd rounds ttl up to whole seconds (and to its minimum)."""
        ...

    async def keep_alive(self, lease_id: int) -> float:
        """One refresh; returns the remaining ttl. Raises LeaseNotFound if it expired."""
        ...

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke the lease and delete its keys. Raises LeaseNotFound if unknown."""
        ...

    def watch(self, prefix: str, start_revision: int | None = None) -> AsyncIterator[WatchEvent]:
        """Every change under prefix, in revision order, from start_revision inclusive
        (None = changes after the watch is established). Raises WatchCompacted if the
        start revision, or the revision it resumes from after a reconnect, is no longer in
        history."""
        ...

    async def current_revision(self) -> int: ...

    async def status(self) -> dict[str, object]:
        """backend, endpoint, revision (+ backend specifics). Raises StoreUnavailable."""
        ...

    async def close(self) -> None: ...


class ThreadLease(Protocol):
    """Lease keep-alives a plain thread can call: blocking, on a connection of its own."""

    def keep_alive(self, lease_id: int, timeout: float | None = None) -> float: ...

    def close(self) -> None: ...


@runtime_checkable
class BlockingLeases(Protocol):
    """A store capability: keep-alives that get through while the event loop is saturated.

    Only a networked backend needs it (etcd); the embedded store lives in the process it serves.
    Callers ask `isinstance(store, BlockingLeases)` instead of naming a backend class.
    """

    def blocking_lease(self) -> ThreadLease: ...


@runtime_checkable
class AccessCheck(Protocol):
    """A store capability: tell a configuration problem (credentials, TLS identity) from an outage.

    `check_access` raises StoreError for the former and returns for the latter, so a replica
    refuses to start with a wrong password but starts (frozen) while its etcd is down."""

    async def check_access(self) -> None: ...


@runtime_checkable
class HistoryReads(Protocol):
    """A store that reads the past (etcd's MVCC; the embedded store from its history table)."""

    async def range_at(self, prefix: str, revision: int) -> list[KeyValue]:
        """Every key under prefix as it was at `revision`, sorted by key. Raises CompactedError
        naming the revision when the history needed is gone, FutureRevision past the current one."""
        ...


def prefix_range_end(prefix: bytes) -> bytes:
    """Smallest key greater than every key with this prefix (etcd's convention).

    b"" (all keys) maps to b"\\0", which etcd reads as "to the end of the keyspace"."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


class KeepAliveSchedule:
    """When to refresh a lease next, and when to give it up: every ttl/3 (following the ttl the
    store reports, which etcd may round), sooner while the store is flaky; lost when the store
    says the lease is gone or nothing got through for a whole ttl. Shared by `LeaseKeeper` and
    the scheduler's threaded keeper, so both give a lease up on the same terms."""

    def __init__(self, lease_id: int, ttl: float) -> None:
        self.lease_id = lease_id
        self.ttl = ttl
        self.interval = max(ttl / 3, 0.05)
        self._last_ok = time.monotonic()

    def refreshed(self, remaining_ttl: float) -> None:
        self._last_ok = time.monotonic()
        if remaining_ttl > 0:
            self.interval = max(remaining_ttl / 3, 0.05)

    def failed(self, err: StoreError) -> bool:
        """Whether the lease must now be considered lost (logged once here)."""
        if isinstance(err, LeaseNotFound):
            log.warning("lease %x lost", self.lease_id)
            return True
        if time.monotonic() - self._last_ok >= self.ttl:
            log.warning("lease %x presumed lost: %s", self.lease_id, err)
            return True
        self.interval = max(self.ttl / 10, 0.05)  # retry sooner while the store is flaky
        return False


class LeaseKeeper:
    """Keeps a lease alive from a background task, refreshing every ttl/3.

    `lost` is set when the lease is gone (LeaseNotFound) or could not be refreshed for a
    whole ttl (the store was unreachable, so the lease must be presumed expired).
    Use as `async with LeaseKeeper(store, lease_id, ttl) as keeper:` or start()/stop().
    """

    def __init__(self, store: StateStore, lease_id: int, ttl: float) -> None:
        self.store = store
        self.lease_id = lease_id
        self.ttl = ttl
        self.lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"lease-keeper-{self.lease_id}"
            )

    async def stop(self, revoke: bool = False) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if revoke and not self.lost.is_set():
            with contextlib.suppress(StoreError):
                await self.store.revoke_lease(self.lease_id)

    async def __aenter__(self) -> LeaseKeeper:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _run(self) -> None:
        schedule = KeepAliveSchedule(self.lease_id, self.ttl)
        while True:
            await asyncio.sleep(schedule.interval)
            try:
                schedule.refreshed(await self.store.keep_alive(self.lease_id))
            except StoreError as e:
                if schedule.failed(e):
                    self.lost.set()
                    return
