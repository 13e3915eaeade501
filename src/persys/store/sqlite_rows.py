"""The embedded store's tables (`kv`, its `history` of every change since the compact revision,
`leases`, `meta`) and its rows read back as key-values and watch events."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from persys.store.base import (
    KeyValue,
    WatchEvent,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS kv (
    key BLOB PRIMARY KEY, value BLOB NOT NULL, create_rev INTEGER NOT NULL,
    mod_rev INTEGER NOT NULL, version INTEGER NOT NULL, lease INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_lease ON kv(lease) WHERE lease != 0;
CREATE TABLE IF NOT EXISTS history (
    rev INTEGER NOT NULL, idx INTEGER NOT NULL, type INTEGER NOT NULL, key BLOB NOT NULL,
    value BLOB NOT NULL, create_rev INTEGER NOT NULL, mod_rev INTEGER NOT NULL,
    version INTEGER NOT NULL, lease INTEGER NOT NULL, PRIMARY KEY (rev, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases (id INTEGER PRIMARY KEY, ttl REAL NOT NULL, expires_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS leases_expiry ON leases(expires_at);
INSERT OR IGNORE INTO meta VALUES ('revision', 1), ('compact_revision', 0), ('lease_seq', 0);
"""


ROW_PUT, ROW_DELETE = 0, 1  # history.type

HistoryRow = tuple[int, int, int, bytes, bytes, int, int, int, int]


def key_value(row: Sequence[Any]) -> KeyValue:
    key, value, create_rev, mod_rev, version, lease = row
    return KeyValue(bytes(key).decode(), bytes(value), create_rev, mod_rev, version, lease)


def watch_event(row: HistoryRow) -> WatchEvent:
    rev, _idx, typ, key, value, create_rev, mod_rev, version, lease = row
    kind: Literal["put", "delete"] = "put" if typ == ROW_PUT else "delete"
    return WatchEvent(
        kind, KeyValue(bytes(key).decode(), bytes(value), create_rev, mod_rev, version, lease), rev
    )
