"""The meter's SampleBus (in-process ring and a real Redis stream with a consumer group), the
publishing outbox that never blocks, and the ingester on top of them writing to DuckDB."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from persys.events.sample_memory import MemorySampleBus
from persys.events.sample_outbox import SampleOutbox
from persys.events.sample_redis import STREAM, RedisSampleBus
from persys.events.samples import WORKLOAD, Sample, SampleBus, decode, encode, label_text
from persys.meter.duckdb_store import open_duckdb
from persys.meter.ingester import Ingester
from persys.meter.query import Query
from tests.fixtures_infra import RedisServer, start_redis


def batch(n: int, start: float = 1_700_000_000.0, workload: str = "web") -> list[Sample]:
    return [Sample(start + i, WORKLOAD, "n1", workload, workload, "process", "app=x", cpu=float(i)) for i in range(n)]


def redis_bus(server: RedisServer, stream: str) -> RedisSampleBus:
    import redis.asyncio as aioredis

    return RedisSampleBus(aioredis.Redis.from_url(server.url, protocol=2), stream=stream, maxlen=100)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[SampleBus]:
    b: SampleBus
    if request.param == "memory":
        b = MemorySampleBus(maxlen=100)
    else:
        b = redis_bus(request.getfixturevalue("redis_server"), f"persys:test-samples:{uuid.uuid4().hex[:8]}")
    yield b
    await b.close()


def test_encoding_round_trip_and_bounded_labels() -> None:
    b = batch(3)
    assert decode(encode(b)) == b
    assert decode(b"not json") == [] and decode(b'[[1, "workload"], "x"]') == []
    many = {f"k{i:02d}": "v" for i in range(20)} | {"bad,key": "v", "k": "has=equals", "long": "x" * 64}
    text = label_text(many)
    assert text.count("=") == 8 and "bad" not in text and "equals" not in text and "long" not in text


async def test_unacknowledged_entries_come_back_then_new_ones(bus: SampleBus) -> None:
    assert await bus.publish(batch(3)) and await bus.publish(batch(2, workload="db"))
    first = await bus.read("c1", count=10, block_ms=100)
    assert [len(d.samples) for d in first] == [3, 2]
    assert await bus.backlog() == 0
    assert await bus.read("c1", count=10, block_ms=100) == []  # each entry goes out once
    await bus.ack([first[0].id])
    await bus.publish(batch(1))
    assert await bus.backlog() == 1
    assert [len(d.samples) for d in await bus.read("c1", count=10, block_ms=100)] == [1]


async def test_a_restarted_reader_gets_what_it_left_unacknowledged() -> None:
    bus = MemorySampleBus()
    await bus.publish(batch(1))
    got = await bus.read("meter-r0", block_ms=10)
    bus.forget_reader("meter-r0")  # as after a restart
    assert [d.id for d in await bus.read("meter-r0", block_ms=10)] == [got[0].id]


@pytest.mark.redis
async def test_a_restarted_ingester_resumes_where_it_stopped(redis_server: RedisServer) -> None:
    stream = f"persys:test-samples:{uuid.uuid4().hex[:8]}"
    before = redis_bus(redis_server, stream)
    for i in range(3):
        await before.publish(batch(2, start=1_700_000_000.0 + 100 * i))
    got = await before.read("meter-r0", count=2, block_ms=100)
    await before.ack([got[0].id])  # stored one, died before storing the second
    await before.close()
    after = redis_bus(redis_server, stream)  # the same consumer after a restart
    resumed = await after.read("meter-r0", count=10, block_ms=100)
    assert [d.id for d in resumed] == [got[1].id]  # its unacknowledged entry first
    await after.ack([got[1].id])
    rest = await after.read("meter-r0", count=10, block_ms=100)
    assert len(rest) == 1 and rest[0].id > got[1].id
    await after.close()


class DownBus(MemorySampleBus):
    """A bus whose backend is down: publish refuses (as RedisSampleBus does when Redis is unreachable)."""

    async def publish(self, batch: Sequence[Sample]) -> bool:
        return False


async def test_the_outbox_never_blocks_and_counts_what_it_drops() -> None:
    full = SampleOutbox(MemorySampleBus(), maxsize=5)
    full.offer(batch(8))  # no publisher running: the queue fills, the rest is dropped at once
    assert full.queued == 5 and full.counts.dropped_full == 3
    down = SampleOutbox(DownBus(), batch=4)
    down.offer(batch(10))
    task = asyncio.create_task(down.run())
    for _ in range(100):
        if down.counts.dropped_bus == 10:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    assert down.health() == {"queued": 0, "published": 0, "droppedQueueFull": 0, "droppedBusDown": 10}


async def test_the_ingester_stores_what_was_published_and_reports_lag() -> None:
    bus = MemorySampleBus()
    store = open_duckdb(None)
    outbox = SampleOutbox(bus, batch=50)
    now = 1_700_000_400.0  # a whole minute
    ing = Ingester(bus, store, "meter-test", clock=lambda: now, block_ms=50)
    outbox.offer(batch(120, start=now - 600))
    publisher = asyncio.create_task(outbox.run())
    stored = 0
    for _ in range(20):
        stored += await ing.step()
        if stored == 120:
            break
    publisher.cancel()
    assert stored == 120 and ing.stats.batches >= 1 and await bus.read("meter-test", block_ms=10) == []
    assert ing.stats.max_lag_seconds == 600.0  # the oldest sample was ten minutes old when stored
    series = await store.query(Query("workload", "web", "cpu", now - 600, now, 60, "max"))
    assert [p[1] for p in series[0].points] == [float(i) for i in range(59, 120, 60)]
    await store.close()


async def test_a_failed_write_is_retried_not_lost() -> None:
    bus = MemorySampleBus()
    store = open_duckdb(None)
    real_write = store.write
    calls: list[int] = []

    async def flaky(samples: Sequence[Sample]) -> None:
        # The engine failing once (a full disk, a ClickHouse server restarting): not reproducible
        # on demand here, so the first write raises as those would.
        calls.append(len(samples))
        if len(calls) == 1:
            raise OSError("disk full")
        await real_write(samples)

    store.write = flaky  # type: ignore[method-assign]
    ing = Ingester(bus, store, "meter-test", block_ms=10)
    await bus.publish(batch(5))
    with pytest.raises(OSError):
        await ing.step()
    assert await ing.step() == 5 and calls == [5, 5]
    assert (await store.summary(WORKLOAD, 1_699_999_000, 1_700_001_000))[0].samples == 5
    await store.close()


@pytest.mark.redis
async def test_the_ingester_recreates_its_group_after_a_redis_restart_lost_it(tmp_path: Path) -> None:
    """Issue #31: after a Redis restart without its data the meter failed with NOGROUP until the
    scheduler restarted. A real restart whose append-only file is gone: the group is created
    again and samples published after it are stored."""
    server = start_redis(tmp_path / "redis")
    b = redis_bus(server, STREAM)
    store = open_duckdb(tmp_path / "meter.duckdb")
    ing = Ingester(b, store, "meter-1", block_ms=100)
    try:
        assert await b.publish(batch(2))
        assert await ing.step() == 2
        server.stop()
        for f in [*server.workdir.glob("appendonly*"), *server.workdir.glob("*.aof"), *server.workdir.glob("*.rdb")]:
            shutil.rmtree(f) if f.is_dir() else f.unlink()
        server.start()
        for _ in range(50):  # the client's old connection fails once, as the outbox's would
            if await b.publish(batch(3, start=1_700_000_100.0)):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("could not publish after the restart")
        assert await ing.step() == 3, "the lost consumer group was not created again"
        assert ing.stats.read_failures == 0 and ing.stats.write_failures == 0
    finally:
        await b.close()
        store.close()
        server.stop()
