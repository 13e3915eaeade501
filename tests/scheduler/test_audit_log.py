"""The audit log on both real store backends: bounded to the newest N, filtered queries, durable
across a scheduler restart, and a store outage neither fails nor loses a record."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from persys.scheduler.access.audit import AUDIT, AuditLog
from persys.scheduler.rpc.server import start_scheduler
from persys.security.pki import ClusterCA, standard_identities
from persys.store import open_store
from persys.store.base import StoreUnavailable
from persys.store.etcd import EtcdStore
from tests.fixtures_infra import start_etcd


def rec(i: int, who: str = "user:a") -> dict[str, object]:
    return {"ts": 1000.0 + i, "principal": who, "via": "", "action": "/persys.v1.AgentControl/DeleteWorkload",
            "object": {"workload_id": f"w{i}"}, "result": "OK", "requestId": f"r{i}"}


async def test_bounded_and_queried(store_url: str) -> None:
    store = open_store(store_url)
    try:
        log = AuditLog(store, keep=5)
        for i in range(12):
            assert await log.record(rec(i, "user:a" if i % 2 else "user:b"))
        assert await log.prune() == 7
        kept = await log.query(limit=100)
        assert [r["requestId"] for r in kept] == [f"r{i}" for i in range(7, 12)]  # the newest, oldest first
        assert [r["requestId"] for r in await log.query(who="user:b", limit=100)] == ["r8", "r10"]
        assert [r["requestId"] for r in await log.query(since=1010.0, limit=100)] == ["r10", "r11"]
        assert [r["requestId"] for r in await log.query(limit=2)] == ["r10", "r11"]
        assert await log.prune() == 0
    finally:
        await store.close()


async def test_survives_a_scheduler_restart(tmp_path: Path) -> None:
    ca = ClusterCA(tmp_path / "pki")
    ca.ensure()
    ids = standard_identities(ca, "n1")
    url = f"sqlite:///{tmp_path / 'state.db'}"
    first = await start_scheduler(url, "memory://", "127.0.0.1:0", ids["scheduler"])
    assert first.audit is not None
    await first.audit.record(rec(1))
    await first.stop()
    again = await start_scheduler(url, "memory://", "127.0.0.1:0", ids["scheduler"])
    try:
        assert again.audit is not None
        assert [r["requestId"] for r in await again.audit.query()] == ["r1"]
        backup = json.loads(await again.scheduler.backups.backup_json())  # history is not part of a backup
        assert not [i for i in backup["items"] if i["key"].startswith(AUDIT)]
    finally:
        await again.stop()


async def _answering(store: EtcdStore) -> None:
    deadline = time.monotonic() + 30.0
    while True:
        try:
            await store.current_revision()
            return
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_a_store_outage_delays_records_without_failing_them(tmp_path: Path) -> None:
    etcd = start_etcd(tmp_path / "etcd")
    store = EtcdStore([etcd.endpoint], timeout=1)
    log = AuditLog(store, keep=100, wait=3.0)
    try:
        etcd.stop()
        assert await log.record(rec(1)) is False  # not stored yet, and no exception
        etcd.start()
        await _answering(store)  # a restarted etcd and the client's reconnection take a while when busy
        assert await log.record(rec(2)) is True  # the next write takes the waiting record along
        assert [r["requestId"] for r in await log.query()] == ["r1", "r2"]
    finally:
        await log.stop()
        await store.close()
        etcd.stop()
