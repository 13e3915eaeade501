"""The state mirror after a compacted watch, and the catch-up rule before acting as active
(real embedded store; the mirror's watch is stopped to make it miss changes, as a cut-off
standby's would)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from persys.events.memory import MemoryEventBus
from persys.model import Workload, parse_manifests
from persys.scheduler.config import SchedulerConfig
from persys.scheduler.errors import CatchingUp
from persys.scheduler.mirror import keys
from persys.scheduler.mirror.follower import ClusterState
from persys.scheduler.replica.assembly import Scheduler
from persys.store.sqlite import SqliteStore
from tests.waiting import until

HISTORY = 50  # small: a few dozen writes compact what the mirror has not read


def workload(name: str, command: str = "60") -> bytes:
    doc = f"""
apiVersion: persys.dev/v1
kind: Workload
metadata: {{name: {name}}}
spec: {{type: process, process: {{command: [sleep, "{command}"]}}}}
"""
    return Workload.from_manifest(parse_manifests(doc)[0], time.time()).to_json()


async def test_a_mirror_that_missed_a_compaction_reloads_and_drops_vanished_keys(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db", history_limit=HISTORY)
    try:
        for i in range(5):
            await store.put(keys.workload(f"w{i}"), workload(f"w{i}"))
        state = ClusterState(store)
        await state.load()
        assert set(state.workloads) == {f"w{i}" for i in range(5)}
        seen: list[tuple[str, str, frozenset[str]]] = []
        state.subscribe(lambda kind, ident: seen.append((kind, ident, frozenset(state.workloads))))

        # The mirror does not follow meanwhile: deletes, a change and creations it never sees,
        # then enough other writes that the store compacts them away.
        await store.delete(keys.workload("w0"))
        await store.delete(keys.workload("w1"))
        changed_rev = await store.put(keys.workload("w2"), workload("w2", "120"))
        for i in range(5, 8):
            await store.put(keys.workload(f"w{i}"), workload(f"w{i}"))
        for i in range(HISTORY * 2):
            await store.put("/elsewhere/churn", str(i).encode())

        state.start_following()
        await asyncio.wait_for(state.wait_for_revision(await store.current_revision()), 10)
        want = {"w2", "w3", "w4", "w5", "w6", "w7"}
        assert set(state.workloads) == want
        assert state.workloads["w2"].mod_revision == changed_rev
        assert state.compaction_recoveries == 1 and not state.recovering
        notified = {(kind, ident) for kind, ident, _ in seen}
        assert {("workload", "w0"), ("workload", "w1"), ("workload", "w2"), ("workload", "w7")} <= notified
        assert ("workload", "w3") not in notified  # unchanged keys are left alone
        # Listeners are told only once the whole snapshot is in: none saw a half-replaced mirror.
        assert all(names == want for _, _, names in seen)
        health = state.health(time.monotonic())
        assert (health.watch, health.detail) == ("healthy", "")

        # The watch goes on from the snapshot's revision.
        rev = await store.put(keys.workload("w8"), workload("w8"))
        await asyncio.wait_for(state.wait_for_revision(rev), 10)
        assert "w8" in state.workloads
        await state.stop()
    finally:
        await store.close()


async def test_an_elected_replica_acts_only_once_its_mirror_caught_up(tmp_path: Path) -> None:
    s = Scheduler(SqliteStore(tmp_path / "state.db"), MemoryEventBus(),
                  SchedulerConfig(data_dir=tmp_path / "sched", backup_interval_seconds=0, advertise="me:7443",
                                  monitor_interval_seconds=0.05))
    await s.start()
    try:
        assert s.is_active
        # Its mirror stops following (a cut-off watch) and it loses the leadership ...
        await s.state.stop()
        await s.election.stop()
        assert not s.is_active and not s.catching_up
        await s.store.put(keys.workload("late"), workload("late"))
        # ... and wins it again at a revision its mirror has not reached.
        s.election.start()
        await until(lambda: s.election.is_leader)
        assert s.catching_up and not s.is_active
        assert "late" not in s.state.workloads
        with pytest.raises(CatchingUp) as refused:
            s.require_owner("n1")
        assert refused.value.leader == "me:7443"  # agents are told to stay and retry here
        # Health answers from memory: the store's revision is the background probe's, at most a
        # health interval old.
        deadline = asyncio.get_running_loop().time() + 10
        while (h := await s.health())["mirror"]["storeRevision"] < s.election.fence_revision:
            assert asyncio.get_running_loop().time() < deadline, h
            await asyncio.sleep(0.05)
        assert (h["role"], h["active"]) == ("catching-up", False)
        assert "catching up" in h["detail"]
        assert h["mirror"]["revision"] < s.election.fence_revision <= h["mirror"]["storeRevision"]

        s.state.start_following()
        await until(lambda: s.is_active)
        assert "late" in s.state.workloads
        s.require_owner("n1")
        deadline = asyncio.get_running_loop().time() + 10
        while (h := await s.health())["mirror"]["lag"]:  # its own writes reach the mirror by the watch
            assert asyncio.get_running_loop().time() < deadline, h
            await asyncio.sleep(0.01)
        assert (h["role"], h["active"], h["mirror"]["watch"]) == ("active", True, "healthy")
    finally:
        await s.stop()
        await s.store.close()


@pytest.mark.parametrize("bad", [b"[1, 2]", b'"text"', b"42", b"null", b"not json"])
async def test_a_replica_value_of_the_wrong_shape_is_skipped_and_the_mirror_goes_on(
    tmp_path: Path, bad: bytes
) -> None:
    store = SqliteStore(tmp_path / "state.db")
    try:
        await store.put(keys.REPLICAS + "old-bad", bad)
        state = ClusterState(store)
        await state.load()  # a replica starting with it in the store
        state.start_following()
        await store.put(keys.REPLICAS + "bad", bad)
        last = await store.put(keys.workload("w"), workload("w"))
        await asyncio.wait_for(state.wait_for_revision(last), 5)
        assert "w" in state.workloads and not {"bad", "old-bad"} & set(state.replicas)
        assert state.watch_error == ""  # the watch never broke on it
        await store.put(keys.REPLICAS + "good", b'{"address": "10.0.0.1:7000"}')
        await until(lambda: state.replicas.get("good") == "10.0.0.1:7000")
    finally:
        await state.stop()
        await store.close()
