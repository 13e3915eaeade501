"""Leader election against a real etcd: a leader steps down when its leader key changes or its
lease cannot be confirmed within the TTL, and a standby takes over from a dead holder at once."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from persys.scheduler.ha.election import LeaderElection
from persys.scheduler.ha.takeover import MIN_HOLD_TTLS
from persys.scheduler.mirror import keys
from persys.store import open_store
from persys.store.etcd import EtcdStore
from tests.fixtures_infra import start_etcd
from tests.tcp_proxy import TcpProxy
from tests.waiting import until


@pytest.fixture
async def etcd_url(tmp_path: Path) -> AsyncIterator[str]:
    etcd = start_etcd(tmp_path / "etcd")
    try:
        yield etcd.url
    finally:
        etcd.stop()


def election(store: EtcdStore, name: str, events: list[str], ttl: float = 2.0) -> LeaderElection:
    async def elected() -> None:
        events.append(f"{name} elected")

    async def deposed() -> None:
        events.append(f"{name} deposed")

    return LeaderElection(store, name, f"127.0.0.1:1/{name}", elected, deposed, ttl=ttl,
                          blocking_lease=store.blocking_lease)


async def test_a_leader_steps_down_when_its_key_is_deleted(etcd_url: str) -> None:
    store = open_store(etcd_url)
    assert isinstance(store, EtcdStore)
    events: list[str] = []
    e = election(store, "a", events)
    e.start()
    try:
        await until(lambda: e.is_leader, 10)
        first = e.fence_revision
        assert await store.delete(keys.LEADER)
        await until(lambda: "a deposed" in events, 2)  # far sooner than the lease would expire
        await until(lambda: e.is_leader and e.fence_revision > first, 10)  # and campaigns again
    finally:
        await e.stop()
        await store.close()


async def test_a_leader_cut_off_from_etcd_stops_counting_itself_leader_within_the_ttl(etcd_url: str) -> None:
    proxy = TcpProxy(etcd_url.removeprefix("etcd://"))
    store = open_store(f"etcd://{proxy.address}")
    assert isinstance(store, EtcdStore)
    events: list[str] = []
    e = election(store, "a", events)
    e.start()
    try:
        await until(lambda: e.is_leader, 10)
        proxy.cut()
        cut_at = time.monotonic()
        took = await until(lambda: not e.is_leader, 5)
        assert took <= 2.0 + 0.3, f"still leader {took:.2f}s after the cut (TTL 2 s)"
        await until(lambda: "a deposed" in events, 2)
        print(f"stopped counting itself leader {time.monotonic() - cut_at:.2f}s after the cut")
    finally:
        proxy.heal()
        await e.stop()
        await store.close()
        proxy.close()


async def test_a_standby_takes_over_a_dead_holder_without_waiting_for_its_lease(etcd_url: str) -> None:
    store = open_store(etcd_url)
    assert isinstance(store, EtcdStore)
    # The holder: a listening port (its "gRPC server"; never accepting: the kernel completes the
    # standby's connection in the backlog) and the leader key under a long lease.
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    lease = await store.grant_lease(30)
    await store.put(keys.LEADER, json.dumps({"id": "dead", "address": f"127.0.0.1:{port}"}).encode(), lease)
    events: list[str] = []
    e = election(store, "b", events, ttl=0.5)
    e.start()
    try:
        await until(lambda: e.settled.is_set(), 10)
        # The standby holds its connection to the holder, and has seen it hold the key long
        # enough (MIN_HOLD_TTLS) for a refusal to be trusted.
        await asyncio.sleep(MIN_HOLD_TTLS * 0.5 + 0.3)
        assert not e.is_leader, "a live holder is left alone"
        holder.close()  # the process dies: the kernel resets its connections and refuses new ones
        took = await until(lambda: e.is_leader, 5)
        assert took < 2.0, f"took over after {took:.2f}s (the dead holder's lease has 30 s)"
    finally:
        holder.close()
        await e.stop()
        await store.close()


async def test_a_refusing_holder_elected_moments_ago_is_not_cleared_at_once(etcd_url: str) -> None:
    """A REJECT rule between replicas refuses like a dead process: a standby waits MIN_HOLD_TTLS
    before trusting it, so leadership does not flip back and forth every second."""
    store = open_store(etcd_url)
    assert isinstance(store, EtcdStore)
    refusing = socket.socket()
    refusing.bind(("127.0.0.1", 0))
    port = refusing.getsockname()[1]  # bound, never listening: connects are refused
    lease = await store.grant_lease(30)
    await store.put(keys.LEADER, json.dumps({"id": "new", "address": f"127.0.0.1:{port}"}).encode(), lease)
    events: list[str] = []
    e = election(store, "b", events, ttl=0.5)
    t0 = time.monotonic()
    e.start()
    try:
        took = await until(lambda: e.is_leader, 10)
        assert time.monotonic() - t0 >= MIN_HOLD_TTLS * 0.5, f"cleared a fresh holder's key after {took:.2f}s"
        assert took < MIN_HOLD_TTLS * 0.5 + 3.0
    finally:
        refusing.close()
        await e.stop()
        await store.close()
