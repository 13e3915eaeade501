"""One contract, every EventBus backend: in-memory ring and a real Redis server."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from persys.events import ClusterEvent, EventBus, EventsUnavailable, open_events
from persys.events.base import parse_id
from persys.events.memory import MemoryEventBus
from persys.events.redis_stream import RedisEventBus
from persys.events.sqlite_log import TRIM_EVERY, SqliteEventBus
from tests.fixtures_infra import RedisServer

MAXLEN = 50


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def bus(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[EventBus]:
    b: EventBus
    if request.param == "memory":
        b = MemoryEventBus(maxlen=MAXLEN)
    elif request.param == "sqlite":
        b = SqliteEventBus(tmp_path / "events.db", maxlen=MAXLEN)
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        # A fresh stream per test: the server is shared by the session.
        b = RedisEventBus(server.url, stream=f"test:{uuid.uuid4().hex[:8]}", maxlen=MAXLEN)
    yield b
    await b.close()


def ev(i: int, subject: str = "workload/web") -> ClusterEvent:
    return ClusterEvent(
        kind="WorkloadScheduled", subject=subject, message=f"m{i}", reason="Fit", fields={"i": str(i)}
    )


async def take(it: AsyncIterator[ClusterEvent], n: int, within: float = 5.0) -> list[ClusterEvent]:
    out: list[ClusterEvent] = []

    async def run() -> None:
        async for e in it:
            out.append(e)
            if len(out) == n:
                return

    try:
        await asyncio.wait_for(run(), within)
    except TimeoutError:
        raise AssertionError(f"got {len(out)} of {n} events") from None
    return out


async def test_publish_and_recent_order(bus: EventBus) -> None:
    ids = [await bus.publish(ev(i)) for i in range(5)]
    assert all(ids)
    assert [parse_id(i) for i in ids] == sorted({parse_id(i) for i in ids})  # strictly increasing
    recent = await bus.recent()
    assert [e.message for e in recent] == [f"m{i}" for i in range(5)]  # newest last
    assert [e.id for e in recent] == ids
    first = recent[0]
    assert (first.kind, first.subject, first.reason, first.fields) == (
        "WorkloadScheduled",
        "workload/web",
        "Fit",
        {"i": "0"},
    )
    assert abs(first.ts - time.time()) < 60
    assert [e.message for e in await bus.recent(limit=2)] == ["m3", "m4"]


async def test_publish_many_keeps_order(bus: EventBus) -> None:
    first = await bus.publish(ev(0))
    ids = await bus.publish_many([ev(i) for i in range(1, 6)])
    assert len(ids) == 5 and all(ids)
    assert [parse_id(i) for i in [first, *ids]] == sorted({parse_id(i) for i in [first, *ids]})
    assert [e.message for e in await bus.recent()] == [f"m{i}" for i in range(6)]
    assert await bus.publish_many([]) == []


async def test_recent_subject_filter(bus: EventBus) -> None:
    for i in range(10):
        await bus.publish(ev(i, subject="node/n1" if i % 3 == 0 else "workload/web"))
    node = await bus.recent(subject="node/n1")
    assert [e.message for e in node] == ["m0", "m3", "m6", "m9"]
    assert [e.message for e in await bus.recent(limit=2, subject="node/n1")] == ["m6", "m9"]
    assert await bus.recent(subject="node/none") == []


async def test_maxlen_bound(bus: EventBus) -> None:
    for i in range(MAXLEN * 4):
        await bus.publish(ev(i))
    kept = await bus.recent(limit=MAXLEN * 10)
    # Redis trims with MAXLEN ~ (whole macro nodes, 100 entries by default): allow slack.
    assert MAXLEN <= len(kept) <= MAXLEN + 100
    assert kept[-1].message == f"m{MAXLEN * 4 - 1}"


async def test_bounds_are_the_oldest_and_newest_retained(bus: EventBus) -> None:
    assert await bus.bounds() == (None, None)
    ids = [await bus.publish(ev(i)) for i in range(MAXLEN * 4)]
    kept = await bus.recent(limit=MAXLEN * 10)
    oldest, newest = await bus.bounds()
    # After trimming, the oldest retained one (a replay from the start begins there): what a
    # resumed live stream compares its id with.
    assert newest == ids[-1] and oldest is not None and oldest in ids
    assert (await take(bus.subscribe(since_id="0-0"), 1))[0].id == oldest
    assert parse_id(oldest) <= parse_id(kept[0].id)


async def test_subscribe_live_tail_in_order(bus: EventBus) -> None:
    await bus.publish(ev(-1))  # published before subscribing: not part of the live tail
    received: list[ClusterEvent] = []
    ready = asyncio.Event()

    async def run() -> None:
        async for e in bus.subscribe():
            received.append(e)
            ready.set()

    task = asyncio.create_task(run())
    try:
        # A subscription starts asynchronously; publish probes until it sees one.
        deadline = time.monotonic() + 5
        while not ready.is_set():
            assert time.monotonic() < deadline, "subscription never started"
            await bus.publish(ClusterEvent(kind="Probe", subject="test/probe", message=""))
            await asyncio.sleep(0.05)
        ids = [await bus.publish(ev(i)) for i in range(20)]
        deadline = time.monotonic() + 5
        while not set(ids) <= {e.id for e in received}:
            assert time.monotonic() < deadline, "live events not delivered"
            await asyncio.sleep(0.02)
        assert "m-1" not in [e.message for e in received]
        real = [e for e in received if e.kind != "Probe"]
        assert [e.id for e in real] == ids
        assert [e.message for e in real] == [f"m{i}" for i in range(20)]
    finally:
        task.cancel()


async def test_subscribe_since_id_replays_then_tails(bus: EventBus) -> None:
    ids = [await bus.publish(ev(i)) for i in range(5)]
    it = bus.subscribe(since_id=ids[1])
    replayed = await take(it, 3)
    assert [e.id for e in replayed] == ids[2:]
    new_id = await bus.publish(ev(5))
    (live,) = await take(it, 1)
    assert live.id == new_id and live.message == "m5"
    await it.aclose()  # type: ignore[attr-defined]


async def test_healthy(bus: EventBus) -> None:
    assert await bus.healthy() is True


@pytest.mark.redis
async def test_redis_down_drops_events_then_recovers(redis_server: RedisServer) -> None:
    bus = RedisEventBus(redis_server.url, stream=f"test:{uuid.uuid4().hex[:8]}", maxlen=MAXLEN)
    try:
        assert await bus.publish(ev(0))
        redis_server.stop()
        t0 = time.monotonic()
        assert await bus.publish(ev(1)) == ""  # never raises to the caller
        assert await bus.publish(ev(2)) == ""
        assert time.monotonic() - t0 < 3, "publish must fail fast while redis is down"
        assert await bus.publish_many([ev(8), ev(9)]) == ["", ""]
        assert bus.dropped == 4
        assert await bus.healthy() is False
        with pytest.raises(EventsUnavailable):
            await bus.recent()

        redis_server.start()
        assert redis_server.pid is not None
        deadline = time.monotonic() + 10
        while not await bus.healthy():
            assert time.monotonic() < deadline, "bus did not recover"
            await asyncio.sleep(0.05)
        new_id = await bus.publish(ev(3))
        assert new_id
        assert [e.message for e in await bus.recent()] == ["m0", "m3"]  # appendonly kept m0
    finally:
        redis_server.start()  # leave the shared server running even if the test failed
        await bus.close()


@pytest.mark.redis
async def test_redis_subscriber_survives_restart(redis_server: RedisServer) -> None:
    bus = RedisEventBus(redis_server.url, stream=f"test:{uuid.uuid4().hex[:8]}", block_ms=200)
    try:
        first = await bus.publish(ev(0))
        it = bus.subscribe(since_id="0-0")
        (got,) = await take(it, 1)
        assert got.id == first
        redis_server.stop()
        redis_server.start()
        deadline = time.monotonic() + 10
        while not await bus.healthy():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        second = await bus.publish(ev(1))
        (got,) = await take(it, 1, within=10)
        assert got.id == second
        await it.aclose()  # type: ignore[attr-defined]
    finally:
        redis_server.start()
        await bus.close()


async def test_open_events_urls(redis_server: RedisServer) -> None:
    assert isinstance(open_events("memory://"), MemoryEventBus)
    b = open_events(redis_server.url)
    assert isinstance(b, RedisEventBus)
    await b.close()
    with pytest.raises(ValueError):
        open_events("kafka://x")


async def test_sqlite_log_survives_a_restart_bounded_with_ids_still_increasing(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    bus = open_events(f"sqlite://{path}", maxlen=MAXLEN)
    assert isinstance(bus, SqliteEventBus)
    for i in range(MAXLEN * 2 + TRIM_EVERY):
        await bus.publish(ev(i))
    before = await bus.recent(limit=MAXLEN)
    await bus.close()

    again = SqliteEventBus(path, maxlen=MAXLEN)  # persys dev restarted
    try:
        assert await again.recent(limit=MAXLEN) == before  # the history is still there
        with sqlite3.connect(path) as db:
            (rows,) = db.execute("SELECT count(*) FROM events").fetchone()
        assert MAXLEN <= rows <= MAXLEN + TRIM_EVERY, rows  # bounded on disk
        new_id = await again.publish(ev(-1))
        assert parse_id(new_id) > parse_id(before[-1].id)
        # A subscriber resuming from an id of the previous run replays what came after it.
        replay = await take(again.subscribe(since_id=before[-2].id), 2)
        assert [e.id for e in replay] == [before[-1].id, new_id]
    finally:
        await again.close()
