"""The leader's lease keeper thread, against a real etcd: a saturated event loop does not cost
the lease, and a lease that is really gone is reported."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from persys.scheduler.ha.election import ThreadedLeaseKeeper
from persys.store import open_store
from persys.store.etcd import EtcdStore
from tests.fixtures_infra import start_etcd


async def test_a_blocked_event_loop_keeps_its_lease_and_a_revoked_one_is_reported(tmp_path: Path) -> None:
    etcd = start_etcd(tmp_path / "etcd")
    store = open_store(etcd.url)
    assert isinstance(store, EtcdStore)
    try:
        lease = await store.grant_lease(2.0)
        keeper = ThreadedLeaseKeeper(store.blocking_lease, lease, 2.0)
        keeper.start()
        until = time.monotonic() + 6.0  # three TTLs in which this event loop answers nothing
        while time.monotonic() < until:
            sum(range(1000))
        await asyncio.sleep(0.1)
        assert not keeper.lost.is_set()
        assert await store.keep_alive(lease) > 0

        await store.revoke_lease(lease)
        await asyncio.wait_for(keeper.lost.wait(), timeout=5)
        await keeper.stop()
    finally:
        await store.close()
        etcd.stop()
