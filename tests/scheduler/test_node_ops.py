"""Cordon, labels, taints, drain and relocation off lost nodes, on the embedded store."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from persys.events.memory import MemoryEventBus
from persys.model import NodeUsage, Phase, Taint, parse_manifests
from persys.scheduler.config import SchedulerConfig
from persys.scheduler.decide import reconcile
from persys.scheduler.mirror.reports import WorkloadReport
from persys.scheduler.replica.assembly import Scheduler
from persys.store import open_store
from tests import waiting
from tests.scheduler.test_core import Clock, manifest, node

until = functools.partial(waiting.until, ignore=(KeyError,))  # an object not there yet is "not yet"


async def until_event(s: Scheduler, kind: str) -> None:
    """Wait until the publisher task has sent such an event (publishing is asynchronous)."""
    deadline = asyncio.get_running_loop().time() + 5
    while kind not in [e.kind for e in await s.events.recent(50)]:
        assert asyncio.get_running_loop().time() < deadline, f"no {kind} event"
        await asyncio.sleep(0.01)


@pytest.fixture
async def s(tmp_path: Path) -> AsyncIterator[Scheduler]:
    clock = Clock()
    sched = Scheduler(open_store(f"sqlite:///{tmp_path / 'state.db'}"), MemoryEventBus(),
                      SchedulerConfig(node_grace_seconds=10, monitor_interval_seconds=0.02), clock=clock)
    sched.test_clock = clock  # type: ignore[attr-defined]
    await sched.start()
    yield sched
    await sched.stop()
    await sched.store.close()


async def running(s: Scheduler, inst: str, node_id: str) -> None:
    w = s.state.workloads[inst.partition(".")[0]].value
    await s.agent_api.report(node_id, [WorkloadReport(inst, w.revision, w.generation, Phase.RUNNING)], complete=False)


async def test_cordon_keeps_new_work_away(s: Scheduler) -> None:
    await s.agent_api.register(node("n1"))
    await s.node_api.cordon("n1")
    await s.workload_api.apply(parse_manifests(manifest("web"))[0])
    await until(lambda: s.state.statuses["web"].value.reason == "Unschedulable")
    assert "cordoned" in s.state.statuses["web"].value.message
    await s.node_api.cordon("n1", on=False)
    await until(lambda: s.state.placement_of.get("web") == "n1")


async def test_operator_labels_and_taints_survive_reregistration(s: Scheduler) -> None:
    await s.agent_api.register(node("n1"))
    await s.agent_api.register(node("n2"))
    await s.node_api.label("n1", {"disk": "ssd"}, [])
    await s.node_api.taint("n2", [Taint(key="maint", value="yes", effect="NoSchedule")], [])
    await s.agent_api.register(node("n1"))  # the agent re-registers with its own labels: ours stay
    assert s.state.nodes["n1"].value.effective_labels() == {"disk": "ssd"}
    await s.workload_api.apply(parse_manifests(manifest("web", extra="  nodeSelector: {disk: ssd}\n"))[0])
    await until(lambda: s.state.placement_of.get("web") == "n1")
    await s.node_api.label("n1", {}, ["disk"])
    await s.workload_api.apply(parse_manifests(manifest("db", extra="  nodeSelector: {disk: ssd}\n"))[0])
    await until(lambda: s.state.statuses["db"].value.reason == "Unschedulable")
    msg = s.state.statuses["db"].value.message
    assert "untolerated taint maint=yes:NoSchedule" in msg and "node selector" in msg
    await s.node_api.taint("n2", [], ["maint"])
    assert s.state.nodes["n2"].value.effective_taints() == []


async def test_drain_moves_work_only_after_the_node_stopped_it(s: Scheduler) -> None:
    await s.agent_api.register(node("n1"))
    await s.workload_api.apply(parse_manifests(manifest("web"))[0])
    await until(lambda: s.state.placement_of.get("web") == "n1")
    await running(s, "web", "n1")
    await s.agent_api.report("n1", [WorkloadReport("web", s.state.workloads["web"].value.revision, 1, Phase.RUNNING)],
                   complete=True)
    await s.agent_api.register(node("n2"))
    await s.node_api.drain("n1", 60)
    await until(lambda: "web" not in s.state.placement_of)
    status = s.drain_status("n1")
    assert status["remaining"] == [{"instance": "web", "phase": "Pending"}] and not status["done"]
    # The decision itself, not a wait: while n1 still runs it, reconciling places no second copy.
    assert reconcile.plan(s.state, "web", s.placer.inflight, s.runs_on, time.time()).needs == []
    assert "web" not in s.state.placement_of, "no second copy while n1 still runs it"
    await s.agent_api.report("n1", [], complete=True)  # the agent on n1 stopped it
    await until(lambda: s.state.placement_of.get("web") == "n2")
    assert s.drain_status("n1")["moving"][0]["node"] == "n2"
    await running(s, "web", "n2")
    await until(lambda: s.drain_status("n1")["done"])


async def test_lost_node_work_moves_unless_pinned_by_a_local_volume(s: Scheduler) -> None:
    await s.agent_api.register(node("n1"))
    await s.workload_api.apply(parse_manifests(manifest("web"))[0])
    vol = "  volumes: [{name: data, driver: local, mountPath: /data}]\n"
    await s.workload_api.apply(parse_manifests(manifest("db", extra=vol))[0])
    await until(lambda: s.state.placement_of.get("web") == "n1" and s.state.placement_of.get("db") == "n1")
    await s.agent_api.register(node("n2"))
    s.agent_api.heartbeat("n2", NodeUsage())
    clock = s.test_clock  # type: ignore[attr-defined]
    clock.now += 11
    s.agent_api.heartbeat("n2", NodeUsage())  # n2 keeps heartbeating, n1 went silent
    await until(lambda: s.state.placement_of.get("web") == "n2")
    await until(lambda: "node-local volume" in s.state.statuses["db"].value.message)
    assert s.state.placement_of["db"] == "n1"
    # Published asynchronously, after the writes the mirror already shows (it failed 3 in 10
    # runs on main when read at once).
    for kind in ("Relocating", "RelocationBlocked", "Relocated"):
        await until_event(s, kind)


async def test_drift_is_recorded_and_resolved(s: Scheduler) -> None:
    await s.agent_api.register(node("n1"))
    await s.workload_api.apply(parse_manifests(manifest("web"))[0])
    await until(lambda: s.state.placement_of.get("web") == "n1")
    rev = s.state.workloads["web"].value.revision
    stopped = WorkloadReport("web", rev, 1, Phase.STOPPED)
    orphan = WorkloadReport("ghost", "x", 1, Phase.RUNNING)
    await s.agent_api.report("n1", [stopped, orphan], complete=True)
    drift = s.workload_view("web")["drift"]
    assert drift[0]["kind"] == "unexpected-stop" and "restarts it" in drift[0]["action"]
    await s.agent_api.report("n1", [WorkloadReport("web", rev, 1, Phase.RUNNING)], complete=True)
    assert s.workload_view("web")["drift"] == []
    kinds = [(e.kind, e.reason) for e in await s.events.recent(50)]
    assert ("DriftDetected", "orphan") in kinds and ("DriftResolved", "unexpected-stop") in kinds


async def test_mass_silence_suspends_liveness_instead_of_relocating_everything(s: Scheduler) -> None:
    for i in range(10):
        await s.agent_api.register(node(f"m{i}"))
    clock = s.test_clock  # type: ignore[attr-defined]
    clock.now += 11  # every node silent at once: our problem, most likely, not theirs
    await s._check_nodes()  # the liveness step, not a wait for the monitor loop to take it
    assert all(n.value.status == "Ready" for n in s.state.nodes.values())
    assert s.liveness_guard.suspended
    await until_event(s, "LivenessSuspended")
    for i in range(9):
        s.agent_api.heartbeat(f"m{i}", NodeUsage())  # heartbeats flow again, except from m9
    await until(lambda: s.state.nodes["m9"].value.status == "NotReady")
    assert sum(n.value.status == "Ready" for n in s.state.nodes.values()) == 9


async def test_a_drained_instance_that_fits_nowhere_keeps_the_drain_unfinished(s: Scheduler) -> None:
    await s.agent_api.register(node("n1", cpu=4000))
    await s.workload_api.apply(parse_manifests(manifest("big", cpu=3000))[0])
    await until(lambda: s.state.placement_of.get("big") == "n1")
    await running(s, "big", "n1")
    await s.agent_api.report("n1", [WorkloadReport("big", s.state.workloads["big"].value.revision, 1, Phase.RUNNING)],
                   complete=True)
    await s.agent_api.register(node("n2", cpu=1000))
    await s.node_api.drain("n1", 60)
    await until(lambda: "big" not in s.state.placement_of)
    await s.agent_api.report("n1", [], complete=True)  # the agent on n1 stopped it
    await until(lambda: s.state.statuses["big"].value.reason == "Unschedulable")
    status = s.drain_status("n1")
    # It used to vanish from the drain (its Pending status forgot where it came from): done.
    assert not status["done"] and status["remaining"] == []
    (moving,) = status["moving"]
    assert moving["instance"] == "big" and moving["node"] == "" and moving["reason"] == "Unschedulable"
    assert "n2: insufficient cpu (needs 3000m, node has 1000m free, short by 2000m)" in moving["message"]
    await s.agent_api.register(node("n3", cpu=4000))  # room at last: it moves, then runs, and the drain is done
    await until(lambda: s.state.placement_of.get("big") == "n3")
    await running(s, "big", "n3")
    await until(lambda: s.drain_status("n1")["done"])
