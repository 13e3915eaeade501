"""The agent's small on-disk memory (SQLite, stdlib).

It keeps the assignments the agent last received and what it last applied, so an agent restarted
while workloads run knows what they are and adopts them instead of starting duplicates. The API
is synchronous on purpose (one tiny local file); the agent calls it through asyncio.to_thread.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from persys.security.private_files import private_file

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS desired (
    workload_id   TEXT PRIMARY KEY,
    revision      TEXT NOT NULL,
    generation    INTEGER NOT NULL,
    desired_state TEXT NOT NULL,
    spec_json     TEXT NOT NULL,
    updated_at    REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS applied (
    workload_id   TEXT PRIMARY KEY,
    revision      TEXT NOT NULL,
    generation    INTEGER NOT NULL,
    runtime       TEXT NOT NULL,
    runtime_id    TEXT NOT NULL,
    applied_at    REAL NOT NULL
);
"""
# Instances the agent stopped because it lost every scheduler replica (onDisconnect: Stop): kept
# across agent restarts so that they are not started again before the scheduler says so.
_DISCONNECT_SCHEMA = """
CREATE TABLE IF NOT EXISTS disconnect_stops (
    workload_id   TEXT PRIMARY KEY,
    reason        TEXT NOT NULL,
    stopped_at    REAL NOT NULL
);
"""

# How often the agent restarted each instance (restart policy), so the count reported to the
# scheduler survives the agent's own restart instead of falling back to 0.
_RESTARTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS restarts (
    workload_id   TEXT PRIMARY KEY,
    count         INTEGER NOT NULL
);
"""


@dataclass(frozen=True)
class DesiredRecord:
    workload_id: str
    revision: str
    generation: int
    desired_state: str
    spec_json: str
    updated_at: float


@dataclass(frozen=True)
class AppliedRecord:
    workload_id: str
    revision: str
    generation: int
    runtime: str
    runtime_id: str
    applied_at: float


class LocalState:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # to_thread may call from different worker threads; the lock keeps use serial.
        self._lock = threading.Lock()
        self.moved_aside: Path | None = None  # where a corrupt file went, if one was found
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as err:
            # This file is only a cache of what the scheduler says and what runs here: an agent
            # that refused to start over it would be worse than one that rebuilds it (as it does
            # from an empty file). The bad file is kept for inspection.
            self.moved_aside = self._move_aside()
            log.warning("agent state %s is unreadable (%s): moved to %s; rebuilding from the scheduler "
                        "and the running workloads", self.path, err, self.moved_aside)
            self._db = self._open()
        # Every spec and plain env of the node: the agent's alone. SQLite gives its -wal and
        # -shm files the database file's mode.
        for suffix in ("", "-wal", "-shm"):
            private_file(Path(f"{self.path}{suffix}"))

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")  # a crash mid-write never corrupts the file
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            db.executescript(_DISCONNECT_SCHEMA)
            db.executescript(_RESTARTS_SCHEMA)
            # A bad header fails above; a truncated or damaged body only when its pages are read.
            problems = [r[0] for r in db.execute("PRAGMA quick_check").fetchall()]
            if problems != ["ok"]:
                raise sqlite3.DatabaseError("; ".join(str(p) for p in problems[:3]))
            db.execute("SELECT count(*) FROM desired").fetchone()
            db.execute("SELECT count(*) FROM applied").fetchone()
        except BaseException:
            db.close()
            raise
        return db

    def _move_aside(self) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while aside.exists():  # two corrupt files within a second: keep both
            aside, n = self.path.with_name(f"{self.path.name}.corrupt-{stamp}.{n}"), n + 1
        for suffix in ("", "-wal", "-shm"):  # the journal belongs to the bad file, not to a new one
            src = self.path.with_name(self.path.name + suffix)
            if src.exists():
                src.rename(aside.with_name(aside.name + suffix))
        return aside

    def save_desired(
        self, workload_id: str, revision: str, generation: int, desired_state: str, spec_json: str | bytes
    ) -> None:
        if isinstance(spec_json, bytes):  # Model.to_json() gives bytes; store text either way
            spec_json = spec_json.decode()
        with self._lock:
            self._db.execute(
                "INSERT INTO desired VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(workload_id) DO UPDATE SET "
                "revision=excluded.revision, generation=excluded.generation, "
                "desired_state=excluded.desired_state, spec_json=excluded.spec_json, "
                "updated_at=excluded.updated_at",
                (workload_id, revision, int(generation), str(desired_state), spec_json, time.time()),
            )

    def desired(self) -> dict[str, DesiredRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM desired ORDER BY workload_id").fetchall()
        return {r[0]: DesiredRecord(*r) for r in rows}

    def save_applied(self, workload_id: str, revision: str, generation: int, runtime: str, runtime_id: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO applied VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(workload_id) DO UPDATE SET "
                "revision=excluded.revision, generation=excluded.generation, runtime=excluded.runtime, "
                "runtime_id=excluded.runtime_id, applied_at=excluded.applied_at",
                (workload_id, revision, int(generation), runtime, runtime_id, time.time()),
            )

    def applied(self) -> dict[str, AppliedRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM applied ORDER BY workload_id").fetchall()
        return {r[0]: AppliedRecord(*r) for r in rows}

    def forget(self, workload_id: str) -> None:
        """Drop everything about a workload (after it was removed from this node)."""
        with self._lock:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM desired WHERE workload_id = ?", (workload_id,))
            self._db.execute("DELETE FROM applied WHERE workload_id = ?", (workload_id,))
            self._db.execute("DELETE FROM restarts WHERE workload_id = ?", (workload_id,))
            self._db.execute("COMMIT")

    def save_restarts(self, workload_id: str, count: int) -> None:
        with self._lock:
            if count:
                self._db.execute("INSERT OR REPLACE INTO restarts VALUES (?, ?)", (workload_id, count))
            else:
                self._db.execute("DELETE FROM restarts WHERE workload_id = ?", (workload_id,))

    def restarts(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT workload_id, count FROM restarts").fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def save_disconnect_stops(self, workload_ids: list[str], reason: str) -> None:
        with self._lock:
            self._db.executemany("INSERT OR REPLACE INTO disconnect_stops VALUES (?, ?, ?)",
                                 [(w, reason, time.time()) for w in workload_ids])

    def disconnect_stops(self) -> dict[str, str]:
        """Instance -> the reason it was stopped for disconnection."""
        with self._lock:
            rows = self._db.execute("SELECT workload_id, reason FROM disconnect_stops").fetchall()
        return {r[0]: r[1] for r in rows}

    def clear_disconnect_stops(self, workload_ids: list[str]) -> None:
        with self._lock:
            self._db.executemany("DELETE FROM disconnect_stops WHERE workload_id = ?", [(w,) for w in workload_ids])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> LocalState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
