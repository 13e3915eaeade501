"""Embedded StateStore on stdlib sqlite3.

All sqlite calls run on ONE dedicated worker thread (a single-thread executor), so the event
loop never blocks and the connection is never shared between threads. Because that thread
serialises every write, commits are totally ordered; watch notifications are posted to the
loop from the worker right after each commit (call_soon_threadsafe is FIFO), so watchers see
changes in revision order.

Keys are stored as UTF-8 BLOBs so ordering and prefix ranges are plain bytewise comparisons
(the same order as etcd and as Python's str ordering).

The tables and their rows are `sqlite_rows`; one watch's buffer is `sqlite_watcher`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from persys.store.base import (
    DEFAULT_MAX_TXN_BYTES,
    CompactedError,
    Compare,
    Delete,
    FutureRevision,
    KeyValue,
    LeaseNotFound,
    Put,
    StoreError,
    StoreFull,
    StoreUnavailable,
    WatchCompacted,
    WatchEvent,
    check_txn_size,
    prefix_range_end,
)
from persys.store.sqlite_rows import ROW_DELETE, ROW_PUT, SCHEMA, HistoryRow, key_value, watch_event
from persys.store.sqlite_watcher import Watcher

log = logging.getLogger(__name__)

T = TypeVar("T")


_REPLAY_PAGE = 1000


class SqliteStore:
    """StateStore backed by one sqlite file (or ':memory:'). One process owns the file."""

    def __init__(
        self,
        path: str | Path,
        *,
        history_limit: int = 100_000,
        sweep_interval: float = 0.1,
        max_txn_bytes: int = DEFAULT_MAX_TXN_BYTES,
    ) -> None:
        self.path = str(path)
        self.max_txn_bytes = max_txn_bytes  # etcd's limit here too: one contract for both backends
        self.history_limit = history_limit
        self.sweep_interval = sweep_interval
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="persys-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchers: set[Watcher] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False
        self.full = ""  # why writes are refused for want of space ("" while they are not)
        # Opening is quick; doing it eagerly surfaces a bad path at open time.
        self._executor.submit(self._open_sync).result()

    # ---- worker-thread plumbing -------------------------------------------------------

    def _open_sync(self) -> None:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None)  # explicit BEGIN/COMMIT below
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.executescript(SCHEMA)
        self._conn = conn

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreUnavailable("sqlite store is closed")
        return self._conn

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StoreUnavailable("sqlite store is closed")
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        if self._sweeper is None:
            self._sweeper = self._loop.create_task(self._sweep_loop(), name="persys-sqlite-lease-sweeper")
        try:
            return await self._loop.run_in_executor(self._executor, fn, *args)
        except RuntimeError as e:  # executor shut down underneath us
            raise StoreUnavailable(f"sqlite store unavailable: {e}") from e
        except sqlite3.Error as e:
            if getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(e):
                self.full = f"the disk holding {self.path} is full ({e}): writes are refused until space is freed"
                raise StoreFull(self.full) from e
            raise StoreError(f"sqlite error: {e}") from e

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            with contextlib.suppress(sqlite3.Error):  # a full disk may have rolled it back already
                db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        self.full = ""  # a write went through: there is room again

    def _meta(self, db: sqlite3.Connection, name: str) -> int:
        value: int = db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()[0]
        return value

    def _set_meta(self, db: sqlite3.Connection, name: str, value: int) -> None:
        db.execute("UPDATE meta SET value = ? WHERE name = ?", (value, name))

    def _post(self, events: list[WatchEvent]) -> None:
        # Called on the worker thread right after COMMIT; FIFO delivery keeps revision order.
        if events and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._notify, events)

    def _notify(self, events: list[WatchEvent]) -> None:
        for w in self._watchers:
            batch = [ev for ev in events if w.matches(ev.kv.key)]
            if batch:
                w.push(batch)

    # ---- writes (worker thread) ----------------------------------------------------------

    def _write(self, db: sqlite3.Connection, ops: Sequence[Put | Delete], rev: int) -> list[WatchEvent]:
        """Apply ops at revision rev (inside an open transaction); returns the events."""
        events: list[WatchEvent] = []
        for op in ops:
            key = op.key.encode()
            row = db.execute("SELECT create_rev, version FROM kv WHERE key = ?", (key,)).fetchone()
            if isinstance(op, Put):
                if (
                    op.lease
                    and db.execute("SELECT 1 FROM leases WHERE id = ?", (op.lease,)).fetchone() is None
                ):
                    raise LeaseNotFound(f"lease {op.lease:x} not found")
                create_rev, version = (row[0], row[1] + 1) if row else (rev, 1)
                db.execute(
                    "INSERT OR REPLACE INTO kv VALUES (?, ?, ?, ?, ?, ?)",
                    (key, op.value, create_rev, rev, version, op.lease),
                )
                events.append(
                    WatchEvent("put", KeyValue(op.key, op.value, create_rev, rev, version, op.lease), rev)
                )
            elif row is not None:
                db.execute("DELETE FROM kv WHERE key = ?", (key,))
                # Like etcd, a delete event carries only the key and the deleting revision.
                events.append(WatchEvent("delete", KeyValue(op.key, b"", 0, rev, 0, 0), rev))
        if events:
            db.executemany(
                "INSERT INTO history VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        rev,
                        i,
                        ROW_PUT if e.type == "put" else ROW_DELETE,
                        e.kv.key.encode(),
                        e.kv.value,
                        e.kv.create_revision,
                        e.kv.mod_revision,
                        e.kv.version,
                        e.kv.lease,
                    )
                    for i, e in enumerate(events)
                ],
            )
            self._set_meta(db, "revision", rev)
            self._maybe_compact(db, rev)
        return events

    def _maybe_compact(self, db: sqlite3.Connection, rev: int) -> None:
        # Compact in batches (every ~10% of the limit) so the DELETE cost is amortised.
        compact = self._meta(db, "compact_revision")
        if rev - compact >= self.history_limit + max(1, self.history_limit // 10):
            new_compact = rev - self.history_limit
            db.execute("DELETE FROM history WHERE rev <= ?", (new_compact,))
            self._set_meta(db, "compact_revision", new_compact)

    def _txn_sync(
        self, compares: Sequence[Compare], ops: Sequence[Put | Delete]
    ) -> tuple[int | None, list[WatchEvent]]:
        keys = [op.key for op in ops]
        if len(set(keys)) != len(keys):
            raise StoreError("duplicate key in txn ops")
        with self._tx() as db:
            for c in compares:
                row = db.execute("SELECT mod_rev FROM kv WHERE key = ?", (c.key.encode(),)).fetchone()
                if (row[0] if row else 0) != c.mod_revision:
                    return None, []
            current = self._meta(db, "revision")
            events = self._write(db, ops, current + 1)
        self._post(events)
        return (current + 1 if events else current), events

    def _revoke_sync(self, lease_id: int) -> list[WatchEvent]:
        with self._tx() as db:
            if db.execute("DELETE FROM leases WHERE id = ?", (lease_id,)).rowcount == 0:
                raise LeaseNotFound(f"lease {lease_id:x} not found")
            keys = [
                bytes(r[0]).decode()
                for r in db.execute("SELECT key FROM kv WHERE lease = ? ORDER BY key", (lease_id,))
            ]
            events = self._write(db, [Delete(k) for k in keys], self._meta(db, "revision") + 1)
        self._post(events)
        return events

    def _grant_sync(self, ttl: float) -> int:
        with self._tx() as db:
            lease_id = self._meta(db, "lease_seq") + 1
            self._set_meta(db, "lease_seq", lease_id)
            db.execute("INSERT INTO leases VALUES (?, ?, ?)", (lease_id, ttl, time.time() + ttl))
        return lease_id

    def _keep_alive_sync(self, lease_id: int) -> float:
        now = time.time()
        with self._tx() as db:
            row = db.execute("SELECT ttl, expires_at FROM leases WHERE id = ?", (lease_id,)).fetchone()
            if row is not None and row[1] > now:
                db.execute("UPDATE leases SET expires_at = ? WHERE id = ?", (now + row[0], lease_id))
                return float(row[0])
        if row is not None:  # expired but not swept yet: expire it now so keys go promptly
            with contextlib.suppress(LeaseNotFound):
                self._revoke_sync(lease_id)
        raise LeaseNotFound(f"lease {lease_id:x} not found")

    def _expired_sync(self) -> list[int]:
        return [r[0] for r in self._db.execute("SELECT id FROM leases WHERE expires_at <= ?", (time.time(),))]

    async def _sweep_loop(self) -> None:
        while not self._closed:
            try:
                for lease_id in await self._run(self._expired_sync):
                    with contextlib.suppress(LeaseNotFound):  # revoked concurrently
                        await self._run(self._revoke_sync, lease_id)
            except StoreUnavailable:
                return
            except Exception:
                log.exception("lease sweeper failed")
            await asyncio.sleep(self.sweep_interval)

    # ---- reads (worker thread) -----------------------------------------------------------

    def _get_sync(self, key: str) -> KeyValue | None:
        row = self._db.execute(
            "SELECT key, value, create_rev, mod_rev, version, lease FROM kv WHERE key = ?", (key.encode(),)
        ).fetchone()
        return key_value(row) if row else None

    def _range_sync(self, prefix: str) -> tuple[list[KeyValue], int]:
        db = self._db
        sql = "SELECT key, value, create_rev, mod_rev, version, lease FROM kv"
        args: tuple[bytes, ...] = ()
        if prefix:
            p = prefix.encode()
            sql += " WHERE key >= ? AND key < ?"
            args = (p, prefix_range_end(p))
        db.execute("BEGIN")  # one snapshot for rows and revision
        try:
            rows = db.execute(sql + " ORDER BY key", args).fetchall()
            rev = self._meta(db, "revision")
        finally:
            db.execute("COMMIT")
        return [key_value(r) for r in rows], rev

    def _history_sync(self, prefix: bytes, after: tuple[int, int]) -> tuple[list[HistoryRow], int, int]:
        """One page of history strictly after (rev, idx); also the compact and current revision."""
        db = self._db
        db.execute("BEGIN")
        try:
            compact = self._meta(db, "compact_revision")
            current = self._meta(db, "revision")
            sql = (
                "SELECT rev, idx, type, key, value, create_rev, mod_rev, version, lease FROM history"
                " WHERE (rev > ? OR (rev = ? AND idx > ?))"
            )
            args: tuple[Any, ...] = (after[0], after[0], after[1])
            if prefix:
                sql += " AND key >= ? AND key < ?"
                args += (prefix, prefix_range_end(prefix))
            rows = db.execute(sql + " ORDER BY rev, idx LIMIT ?", (*args, _REPLAY_PAGE)).fetchall()
        finally:
            db.execute("COMMIT")
        return rows, compact, current

    def _check_readable(self, db: sqlite3.Connection, revision: int) -> int:
        """The compact revision, once `revision` is known to be neither future nor compacted."""
        compact, current = self._meta(db, "compact_revision"), self._meta(db, "revision")
        if revision > current:
            raise FutureRevision(f"revision {revision} is in the future (the store is at {current})")
        if revision < max(compact, 1):
            raise CompactedError(f"revision {revision} has been compacted (the embedded store keeps history "
                                 f"from revision {compact})")
        return compact

    def _range_at_sync(self, prefix: str, revision: int) -> list[KeyValue]:
        """The keys under prefix at `revision`: the current rows with every later change undone
        from the history table, which holds every change after the compact revision."""
        p = prefix.encode()
        where, args = ("key >= ? AND key < ?", (p, prefix_range_end(p))) if p else ("1", ())
        db = self._db
        db.execute("BEGIN")  # one snapshot for rows, history and revisions
        try:
            compact = self._check_readable(db, revision)
            out = {kv.key: kv for kv in map(key_value, db.execute(
                f"SELECT key, value, create_rev, mod_rev, version, lease FROM kv WHERE {where}", args))}
            first_after: dict[bytes, tuple[int, int]] = {}  # key -> (type, version) of its first later change
            for key, kind, version in db.execute(
                    f"SELECT key, type, version FROM history WHERE rev > ? AND {where} ORDER BY rev, idx",
                    (revision, *args)):
                first_after.setdefault(key, (kind, version))
            before: dict[bytes, Sequence[Any]] = {}
            if first_after:
                for row in db.execute(
                        "SELECT key, value, create_rev, mod_rev, version, lease, type FROM history "
                        f"WHERE rev > ? AND rev <= ? AND {where} ORDER BY rev, idx", (compact, revision, *args)):
                    if row[0] in first_after:
                        before[row[0]] = row
        finally:
            db.execute("COMMIT")
        for key, (kind, version) in first_after.items():
            out.pop(key.decode(), None)
            if kind == ROW_PUT and version == 1:
                continue  # created after `revision`: absent then
            row = before.get(key)
            if row is None:
                raise CompactedError(f"revision {revision}: the value of {key.decode()} then has been compacted "
                                     f"(the embedded store keeps history from revision {compact})")
            if row[6] == ROW_PUT:
                out[key.decode()] = key_value(row[:6])
        return [out[k] for k in sorted(out)]

    def _close_sync(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # ---- public API ---------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        return await self._run(self._get_sync, key)

    async def range(self, prefix: str) -> tuple[list[KeyValue], int]:
        return await self._run(self._range_sync, prefix)

    async def range_at(self, prefix: str, revision: int) -> list[KeyValue]:
        return await self._run(self._range_at_sync, prefix, revision)

    async def range_pages(self, prefix: str, page: int = 1000) -> AsyncIterator[tuple[list[KeyValue], int]]:
        # One consistent read, handed out in pages: the embedded store is for clusters small
        # enough to hold in memory, and a read transaction cannot span yields to other tasks.
        kvs, rev = await self.range(prefix)
        for i in range(0, max(len(kvs), 1), page):
            yield kvs[i : i + page], rev

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        check_txn_size((), (Put(key, value),), self.max_txn_bytes)
        rev, _ = await self._run(self._txn_sync, (), (Put(key, value, lease),))
        assert rev is not None
        return rev

    async def cas(self, key: str, value: bytes, expected_mod_revision: int, lease: int = 0) -> int | None:
        check_txn_size((), (Put(key, value),), self.max_txn_bytes)
        rev, _ = await self._run(
            self._txn_sync, (Compare(key, expected_mod_revision),), (Put(key, value, lease),)
        )
        return rev

    async def delete(self, key: str, expected_mod_revision: int | None = None) -> bool:
        compares = () if expected_mod_revision is None else (Compare(key, expected_mod_revision),)
        _, events = await self._run(self._txn_sync, compares, (Delete(key),))
        return bool(events)

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Put | Delete]) -> int | None:
        check_txn_size(compares, ops, self.max_txn_bytes)
        rev, _ = await self._run(self._txn_sync, tuple(compares), tuple(ops))
        return rev

    async def grant_lease(self, ttl: float) -> int:
        if ttl <= 0:
            raise ValueError("lease ttl must be > 0")
        return await self._run(self._grant_sync, float(ttl))

    async def keep_alive(self, lease_id: int) -> float:
        return await self._run(self._keep_alive_sync, lease_id)

    async def revoke_lease(self, lease_id: int) -> None:
        await self._run(self._revoke_sync, lease_id)

    async def current_revision(self) -> int:
        return await self._run(lambda: self._meta(self._db, "revision"))

    async def status(self) -> dict[str, object]:
        rev = await self.current_revision()
        compact = await self._run(lambda: self._meta(self._db, "compact_revision"))
        return {"backend": "sqlite", "endpoint": self.path, "revision": rev, "compact_revision": compact,
                **({"full": self.full} if self.full else {})}

    async def watch(self, prefix: str, start_revision: int | None = None) -> AsyncIterator[WatchEvent]:
        w = Watcher(prefix.encode())
        # Register before reading history: any commit is then either in the history read
        # or in the live buffer (or both; duplicates are dropped by revision below).
        self._watchers.add(w)
        try:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            floor = start_revision if start_revision and start_revision > 0 else None
            replay_from = floor
            if replay_from is None:
                w.seen_upto = await self.current_revision()
            while True:
                if replay_from is not None:
                    async for ev in self._replay(w, replay_from):
                        yield ev
                    replay_from = None
                    continue
                if not w.events:
                    if self._closed:
                        return
                    w.wakeup.clear()
                    if w.overflow_from is not None:
                        replay_from = max(w.overflow_from, w.seen_upto + 1)
                        w.overflow_from = None
                        continue
                    await w.wakeup.wait()
                    continue
                ev = w.events.popleft()
                if ev.revision <= w.seen_upto or (floor is not None and ev.revision < floor):
                    continue
                yield ev
        finally:
            self._watchers.discard(w)

    async def _replay(self, w: Watcher, replay_from: int) -> AsyncIterator[WatchEvent]:
        """The watch's history from `replay_from` on, a page at a time; afterwards `w.seen_upto`
        covers the store revision the replay reached (live events up to it are duplicates)."""
        cursor = (replay_from - 1, 1 << 62)
        while True:
            rows, compact, current = await self._run(self._history_sync, w.prefix, cursor)
            if cursor[0] < compact:
                # History up to `compact` is deleted: compact + 1 is the oldest left.
                raise WatchCompacted(cursor[0] + 1, compact + 1)
            for row in rows:
                yield watch_event(row)
            if len(rows) < _REPLAY_PAGE:
                w.seen_upto = max(w.seen_upto, current)
                return
            cursor = (rows[-1][0], rows[-1][1])

    async def close(self) -> None:
        if self._closed:
            return
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        self._closed = True
        for w in self._watchers:  # wake watchers so they finish
            w.wakeup.set()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close_sync)
        self._executor.shutdown(wait=False)
