"""The leader's watch of its own key survives a compaction of the history since its write: it
reads the key instead of resuming a watch that can never start again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from persys.scheduler import keys
from persys.scheduler.ha import LeaderElection, leader_key_change
from persys.store.base import KeyValue
from persys.store.sqlite import SqliteStore

HISTORY = 20
OWN = b'{"id": "a"}'


def kv(value: bytes, mod: int) -> KeyValue:
    return KeyValue(keys.LEADER, value, create_revision=mod, mod_revision=mod, version=1)


@pytest.mark.parametrize(("now", "expect"), [
    (None, "leader key deleted"),
    (kv(OWN, 7), None),
    (kv(OWN, 9), "leader key taken by another replica"),  # deleted and written again, even by us
    (kv(b'{"id": "b"}', 7), "leader key taken by another replica"),
])
def test_leader_key_change(now: KeyValue | None, expect: str | None) -> None:
    assert leader_key_change(now, 7, OWN) == expect


async def noop() -> None:
    pass


async def compacted_after(store: SqliteStore, value: bytes) -> int:
    rev = await store.put(keys.LEADER, value)
    for i in range(HISTORY * 3):
        await store.put("/persys/other", str(i).encode())
    return rev


async def test_unchanged_key_after_compaction_is_watched_again(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db", history_limit=HISTORY)
    try:
        e = LeaderElection(store, "a", "127.0.0.1:1", noop, noop, ttl=1.0)
        rev = await compacted_after(store, e.value)
        task = asyncio.create_task(e._key_changed_after(rev))
        await asyncio.sleep(0.3)
        assert not task.done()  # no change: still watching, not failing
        assert await store.delete(keys.LEADER)
        assert await asyncio.wait_for(task, 2) == "leader key deleted"
    finally:
        await store.close()


async def test_key_replaced_during_compacted_history_is_noticed(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db", history_limit=HISTORY)
    try:
        e = LeaderElection(store, "a", "127.0.0.1:1", noop, noop, ttl=1.0)
        rev = await compacted_after(store, e.value)
        await store.put(keys.LEADER, b'{"id": "b"}')
        for i in range(HISTORY * 3):
            await store.put("/persys/other", str(i).encode())
        got = await asyncio.wait_for(e._key_changed_after(rev), 2)
        assert got == "leader key taken by another replica"
    finally:
        await store.close()
