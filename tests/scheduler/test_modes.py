"""Operating modes on the embedded store: a wiped store is recovery, never an empty cluster."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from persys.events.memory import MemoryEventBus
from persys.model import parse_manifests
from persys.scheduler.config import SchedulerConfig
from persys.scheduler.errors import Frozen, MutationRefused
from persys.scheduler.ha.mode_guard import Mode
from persys.scheduler.replica.assembly import Scheduler
from persys.store import open_store

MANIFEST = """
apiVersion: persys.dev/v1
kind: Workload
metadata: {name: web}
spec: {type: process, process: {command: [sleep, "60"]}}
"""


def config(tmp_path: Path) -> SchedulerConfig:
    return SchedulerConfig(data_dir=tmp_path / "sched", health_interval_seconds=0.05, backup_interval_seconds=0)


async def started(tmp_path: Path) -> Scheduler:
    s = Scheduler(open_store(f"sqlite:///{tmp_path / 'state.db'}"), MemoryEventBus(), config(tmp_path))
    await s.start()
    return s


async def stopped(s: Scheduler) -> None:
    await s.stop()
    await s.store.close()


async def test_new_cluster_gets_a_marker_and_a_wiped_store_is_recovery(tmp_path: Path) -> None:
    s = await started(tmp_path)
    assert s.guard.mode == Mode.NORMAL and s.guard.cluster_id
    await s.workload_api.apply(parse_manifests(MANIFEST)[0])
    await asyncio.sleep(0.2)  # a rolling backup is written
    assert (tmp_path / "sched" / "backups" / "latest.json").exists()
    await stopped(s)

    (tmp_path / "state.db").unlink()  # the database is lost
    s = await started(tmp_path)
    try:
        assert s.guard.mode == Mode.RECOVERY
        assert "no cluster marker" in s.guard.reason
        with pytest.raises(Frozen, match="recovery"):
            await s.workload_api.apply(parse_manifests(MANIFEST)[0])
        await s.guard.check()  # the health loop's step, rather than a wait for the loop to take it
        assert s.guard.mode == Mode.RECOVERY  # the health loop does not "fix" it on its own
        assert not (await s.backups.backup())["items"]
        # The rolling backup of the old store is intact (an empty store never overwrites it).
        result = await s.backups.restore(s.backups.local_backup())
        assert result["restored"] >= 2
        assert s.guard.mode == Mode.NORMAL and "web" in s.state.workloads
    finally:
        await stopped(s)


async def test_recover_confirms_the_empty_store(tmp_path: Path) -> None:
    s = await started(tmp_path)
    cluster = s.guard.cluster_id
    await stopped(s)
    (tmp_path / "state.db").unlink()
    s = await started(tmp_path)
    try:
        assert s.guard.mode == Mode.RECOVERY
        r = await s.backups.recover()
        assert r["clusterId"] == cluster and s.guard.mode == Mode.NORMAL
        with pytest.raises(MutationRefused, match="not in recovery"):
            await s.backups.recover()
        with pytest.raises(MutationRefused, match="--force"):
            await s.backups.restore({"format": "persys-backup/v1", "items": []})
    finally:
        await stopped(s)


async def test_restore_rejects_what_is_not_a_backup(tmp_path: Path) -> None:
    s = await started(tmp_path)
    try:
        with pytest.raises(ValueError, match="not a Persys backup"):
            await s.backups.restore({"hello": 1}, force=True)
        with pytest.raises(ValueError, match="outside"):
            outside = {"format": "persys-backup/v1", "items": [{"key": "/etc/x", "value": 1}]}
            await s.backups.restore(outside, force=True)
    finally:
        await stopped(s)
