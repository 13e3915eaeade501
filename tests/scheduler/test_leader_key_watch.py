"""The leader's watch of its own key survives a compaction of the history since its write (it
reads the key instead of resuming a watch that can never start again); an elected replica's
catch-up is bounded and raced against losing the leadership. On the embedded store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from persys.scheduler.ha.election import CATCH_UP_TTLS, LeaderElection, leader_key_change
from persys.scheduler.ha.takeover import COOLDOWN_TTLS
from persys.scheduler.mirror import keys
from persys.store.base import KeyValue
from persys.store.sqlite import SqliteStore
from tests.waiting import until

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


def counting(events: list[str], name: str, block: asyncio.Event | None = None) -> Callable[[], Awaitable[None]]:
    async def hook() -> None:
        events.append(name)
        if block is not None:
            await block.wait()

    return hook


async def test_a_catch_up_that_never_ends_resigns_after_its_bound(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    events: list[str] = []
    never = asyncio.Event()
    e = LeaderElection(store, "a", "127.0.0.1:1", counting(events, "elected", never), counting(events, "deposed"),
                       ttl=0.3)
    e.start()
    try:
        await until(lambda: "elected" in events, 5)
        t0 = asyncio.get_running_loop().time()
        await until(lambda: "deposed" in events, 5)
        took = asyncio.get_running_loop().time() - t0
        assert CATCH_UP_TTLS * 0.3 - 0.1 <= took <= CATCH_UP_TTLS * 0.3 + 1.0
        assert await store.get(keys.LEADER) is None or events.count("elected") == 2  # gave the key up
        never.set()
        await until(lambda: events.count("elected") == 2 and e.is_leader, 5)  # and campaigns again
    finally:
        await e.stop()
        await store.close()


async def test_losing_the_key_while_catching_up_steps_down_at_once(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    events: list[str] = []
    e = LeaderElection(store, "a", "127.0.0.1:1", counting(events, "elected", asyncio.Event()),
                       counting(events, "deposed"), ttl=10.0)  # the bound (50 s) is far off
    e.start()
    try:
        await until(lambda: "elected" in events, 5)
        assert await store.delete(keys.LEADER)
        await until(lambda: "deposed" in events, 2)  # not after the bound, nor the lease's TTL
        # Deposed by a change of its key: no fast takeover of its own for a while.
        assert e._no_fast_takeover_until - time.monotonic() > (COOLDOWN_TTLS - 1) * 10.0
    finally:
        await e.stop()
        await store.close()
