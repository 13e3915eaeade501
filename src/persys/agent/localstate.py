"""The agent's small on-disk memory (SQLite, stdlib).

It keeps the assignments the agent last received and what it last applied, so an agent restarted
while workloads run knows what they are and adopts them instead of starting duplicates. The API
is synchronous on purpose (one tiny local file); the agent calls it through asyncio.to_thread.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

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
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")  # a crash mid-write never corrupts the file
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            self._db.executescript(_DISCONNECT_SCHEMA)

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
            self._db.execute("COMMIT")

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
