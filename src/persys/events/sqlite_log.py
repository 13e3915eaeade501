"""Embedded EventBus with a durable, bounded history: a SQLite file (`sqlite:///path/events.db`).

The default of `persys dev`: events (and what `persysctl events` shows) survive a restart, as
with Redis Streams, without a server. One process owns the file; subscribers in that process
are woken in memory, and replay what they missed from the file. The newest `maxlen` events are
kept (trimmed every TRIM_EVERY appends, so the file holds at most maxlen + TRIM_EVERY).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from persys.events.base import ClusterEvent, EventsUnavailable, parse_id

TRIM_EVERY = 256
_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    ms      INTEGER NOT NULL,
    seq     INTEGER NOT NULL,
    kind    TEXT NOT NULL,
    subject TEXT NOT NULL,
    message TEXT NOT NULL,
    reason  TEXT NOT NULL,
    fields  TEXT NOT NULL,
    ts      REAL NOT NULL,
    PRIMARY KEY (ms, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS events_subject ON events (subject, ms, seq);
"""
_COLUMNS = "ms, seq, kind, subject, message, reason, fields, ts"
Row = tuple[int, int, str, str, str, str, str, float]


def _event(r: Row) -> ClusterEvent:
    return ClusterEvent(kind=r[2], subject=r[3], message=r[4], reason=r[5], fields=json.loads(r[6]), ts=r[7],
                        id=f"{r[0]}-{r[1]}")


class SqliteEventBus:
    def __init__(self, path: str | Path, maxlen: int = 10_000) -> None:
        self.path = Path(path)
        self.maxlen = maxlen
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # a power cut may lose the last events, never the file
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()  # calls come from to_thread's varying worker threads
        last = self._db.execute("SELECT ms, seq FROM events ORDER BY ms DESC, seq DESC LIMIT 1").fetchone()
        self._last: tuple[int, int] = (last[0], last[1]) if last else (0, 0)  # ids stay monotonic across restarts
        self._appends = 0
        self._changed = asyncio.Event()  # replaced on every publish, as in the memory bus
        self._closed = False

    def _next_id(self) -> tuple[int, int]:
        ms = int(time.time() * 1000)
        self._last = (ms, 0) if ms > self._last[0] else (self._last[0], self._last[1] + 1)
        return self._last

    def _append(self, rows: list[Row]) -> None:
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany(f"INSERT INTO events ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
            self._appends += len(rows)
            if self._appends >= TRIM_EVERY:
                self._appends = 0
                self._db.execute(
                    "DELETE FROM events WHERE (ms, seq) < (SELECT ms, seq FROM events ORDER BY ms DESC, seq DESC "
                    "LIMIT 1 OFFSET ?)", (self.maxlen - 1,))
            self._db.execute("COMMIT")

    async def publish(self, event: ClusterEvent) -> str:
        return (await self.publish_many([event]))[0]

    async def publish_many(self, events: Sequence[ClusterEvent]) -> list[str]:
        if self._closed or not events:
            return [""] * len(events)
        keyed = [(self._next_id(), e) for e in events]  # ids taken in order, on the loop
        rows: list[Row] = [(k[0], k[1], e.kind, e.subject, e.message, e.reason, json.dumps(e.fields), e.ts)
                           for k, e in keyed]
        try:
            await asyncio.to_thread(self._append, rows)
        except sqlite3.Error:
            return [""] * len(events)  # publishing never fails the caller (events are not state)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return [f"{k[0]}-{k[1]}" for k, _ in keyed]

    def _select(self, sql: str, args: tuple[object, ...]) -> list[Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    async def recent(self, limit: int = 100, subject: str | None = None) -> list[ClusterEvent]:
        where, args = ("WHERE subject = ?", (subject,)) if subject is not None else ("", ())
        try:
            rows = await asyncio.to_thread(
                self._select, f"SELECT {_COLUMNS} FROM events {where} ORDER BY ms DESC, seq DESC LIMIT ?",
                (*args, min(limit, self.maxlen)))
        except sqlite3.Error as err:
            raise EventsUnavailable(f"event log {self.path}: {err}") from err
        return [_event(r) for r in reversed(rows)]

    async def subscribe(self, since_id: str | None = None) -> AsyncIterator[ClusterEvent]:
        cursor = parse_id(since_id) if since_id else self._last
        while not self._closed:
            changed = self._changed
            try:
                rows = await asyncio.to_thread(
                    self._select, f"SELECT {_COLUMNS} FROM events WHERE (ms, seq) > (?, ?) ORDER BY ms, seq LIMIT 500",
                    cursor)
            except sqlite3.Error as err:
                if self._closed:
                    return
                raise EventsUnavailable(f"event log {self.path}: {err}") from err
            if not rows:
                await changed.wait()
                continue
            for r in rows:
                cursor = (r[0], r[1])
                yield _event(r)

    async def bounds(self) -> tuple[str | None, str | None]:
        try:
            rows = await asyncio.to_thread(
                self._select, "SELECT ms, seq FROM (SELECT ms, seq FROM events ORDER BY ms, seq LIMIT 1) UNION ALL "
                "SELECT ms, seq FROM (SELECT ms, seq FROM events ORDER BY ms DESC, seq DESC LIMIT 1)", ())
        except sqlite3.Error as err:
            raise EventsUnavailable(f"event log {self.path}: {err}") from err
        if not rows:
            return None, None
        return f"{rows[0][0]}-{rows[0][1]}", f"{rows[-1][0]}-{rows[-1][1]}"

    async def healthy(self) -> bool:
        return not self._closed

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._changed.set()
        with self._lock:
            self._db.close()
