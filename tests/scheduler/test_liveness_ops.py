"""Liveness through a restart, the mass-loss guard's end, and node deletion, on the embedded store.

The node monitor's own loop is slowed to once an hour: each test judges the nodes itself
(`_check_nodes`) at clock values it sets, so nothing depends on timing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from persys.events.memory import MemoryEventBus
from persys.model import NodeUsage, Phase, parse_manifests
from persys.scheduler.config import SchedulerConfig
from persys.scheduler.errors import MutationRefused, NotFound
from persys.scheduler.mirror.reports import WorkloadReport
from persys.scheduler.replica.assembly import Scheduler
from persys.store import open_store
from tests.scheduler.test_core import Clock, manifest, node
from tests.scheduler.test_node_ops import until

Factory = Callable[[], Scheduler]


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Callable[[], Scheduler]]:
    """Schedulers over one store file, one after the other (a restart), sharing a clock."""
    clock = Clock()
    made: list[Scheduler] = []

    def factory() -> Scheduler:
        s = Scheduler(open_store(f"sqlite:///{tmp_path / 'state.db'}"), MemoryEventBus(),
                      SchedulerConfig(node_grace_seconds=10, monitor_interval_seconds=3600), clock=clock)
        s.test_clock = clock  # type: ignore[attr-defined]
        made.append(s)
        return s

    yield factory
    for s in made:
        await s.stop()
        await s.store.close()


def status(s: Scheduler, node_id: str) -> str:
    return str(s.state.nodes[node_id].value.status)


async def kinds(s: Scheduler) -> list[tuple[str, str]]:
    return [(e.kind, e.reason) for e in await s.events.recent(200)]


async def published(s: Scheduler, kind: str, reason: str, times: int = 1) -> None:
    """Wait until the scheduler's publisher task has sent such an event (`times` of them)."""
    deadline = asyncio.get_running_loop().time() + 5
    while (await kinds(s)).count((kind, reason)) < times:
        assert asyncio.get_running_loop().time() < deadline, f"no {kind} ({reason}) event"
        await asyncio.sleep(0.01)


async def test_a_restart_keeps_dead_nodes_not_ready(make: Factory) -> None:
    s = make()
    await s.start()
    for n in ("alive", "dead", "quiet"):
        await s.agent_api.register(node(n))
    s.test_clock.now += 11  # type: ignore[attr-defined]
    s.agent_api.heartbeat("alive", NodeUsage())
    s.agent_api.heartbeat("quiet", NodeUsage())
    await s._check_nodes()
    assert (status(s, "alive"), status(s, "dead"), status(s, "quiet")) == ("Ready", "NotReady", "Ready")
    await s.stop()

    s2 = make()  # the restart: nothing heard yet
    await s2.start()
    await s2._check_nodes()
    assert status(s2, "dead") == "NotReady", "a restart must not revive a node nobody heard from"
    s2.agent_api.heartbeat("alive", NodeUsage())
    s2.test_clock.now += 11  # type: ignore[attr-defined]
    s2.agent_api.heartbeat("alive", NodeUsage())
    await s2._check_nodes()
    # Past the node grace but within the restart grace (six grace periods): "quiet" keeps its
    # stored Ready (its agent may be on its way back) ...
    assert (status(s2, "alive"), status(s2, "dead"), status(s2, "quiet")) == ("Ready", "NotReady", "Ready")
    s2.test_clock.now += 50  # type: ignore[attr-defined]
    s2.agent_api.heartbeat("alive", NodeUsage())
    await s2._check_nodes()
    # ... and loses it once the restart grace has passed without a word from it.
    assert (status(s2, "alive"), status(s2, "dead"), status(s2, "quiet")) == ("Ready", "NotReady", "NotReady")
    assert "since this scheduler became active" in s2.state.nodes["quiet"].value.status_reason
    await published(s2, "NodeNotReady", "")  # events go out in order: a NodeReady would be out by now
    assert ("NodeReady", "") not in await kinds(s2)
    s2.agent_api.heartbeat("dead", NodeUsage())  # it comes back: a heartbeat we saw
    await s2._check_nodes()
    assert status(s2, "dead") == "Ready"


async def test_the_guard_expires_and_an_operator_can_end_it(make: Factory) -> None:
    s = make()
    await s.start()
    for i in range(10):
        await s.agent_api.register(node(f"m{i}"))
    clock = s.test_clock  # type: ignore[attr-defined]
    clock.now += 11
    await s._check_nodes()
    h = await s.health()
    assert h["liveness"]["suspended"] and h["liveness"]["silentNodes"] == 10
    assert h["liveness"]["endsAt"] - h["liveness"]["since"] == pytest.approx(60)  # six grace periods
    assert "liveness suspended: 10 of 10 nodes silent" in h["detail"]
    clock.now += 30
    await s._check_nodes()
    assert all(status(s, f"m{i}") == "Ready" for i in range(10))
    clock.now += 30  # 60 s after it tripped
    await s._check_nodes()
    assert all(status(s, f"m{i}") == "NotReady" for i in range(10))
    await published(s, "LivenessResumed", "Expired")
    assert not (await s.health())["liveness"]["suspended"]

    for i in range(10):
        s.agent_api.heartbeat(f"m{i}", NodeUsage())
    await s._check_nodes()
    assert all(status(s, f"m{i}") == "Ready" for i in range(10))
    clock.now += 11
    await s._check_nodes()  # all silent again: the guard trips again (it re-armed)
    assert s.liveness_guard.suspended
    ended = s.resume_liveness("admin")
    assert ended["resumed"] and not ended["suspended"]
    assert s.resume_liveness("admin")["resumed"] is False  # idempotent
    await s._check_nodes()
    assert all(status(s, f"m{i}") == "NotReady" for i in range(10))
    await published(s, "LivenessResumed", "Operator")


async def test_node_deletion_refused_while_assigned_forced_and_idempotent(make: Factory) -> None:
    s = make()
    await s.start()
    await s.agent_api.register(node("n1"))
    await s.workload_api.apply(parse_manifests(manifest("web"))[0])
    await until(lambda: s.state.placement_of.get("web") == "n1")
    await s.node_api.label("n1", {"disk": "ssd"}, [])
    await s.agent_api.register(node("n2"))
    rev = s.state.revision

    with pytest.raises(MutationRefused, match=r"n1 still has 1 instance\(s\) assigned \(web\): drain it first") as err:
        await s.node_api.delete_node("n1")
    assert "--force" in str(err.value)
    assert s.state.revision == rev, "a refused deletion writes nothing"

    result = await s.node_api.delete_node("n1", force=True)
    assert result == {"node": "n1", "deleted": True, "withdrawn": ["web"]}
    assert "n1" not in s.state.nodes and "n1" not in s.state.assignments
    await until(lambda: s.state.placement_of.get("web") == "n2")
    assert s.state.statuses["web"].value.relocating_from == "n1"
    await published(s, "NodeDeleted", "Forced")
    await published(s, "Relocated", "Relocated")

    with pytest.raises(NotFound):
        await s.node_api.delete_node("n1")

    await s.agent_api.register(node("n1"))  # its agent registers again: a new node, without the old labels
    assert s.state.nodes["n1"].value.effective_labels() == {}
    await published(s, "NodeJoined", "", times=3)  # n1, n2, and n1 again


async def test_a_drained_node_is_deleted_without_force(make: Factory) -> None:
    s = make()
    await s.start()
    await s.agent_api.register(node("n1"))
    await s.workload_api.apply(parse_manifests(manifest("web"))[0])
    await until(lambda: s.state.placement_of.get("web") == "n1")
    w = s.state.workloads["web"].value
    await s.agent_api.report("n1", [WorkloadReport("web", w.revision, w.generation, Phase.RUNNING)], complete=True)
    await s.agent_api.register(node("n2"))
    await s.node_api.drain("n1", 60)
    await until(lambda: "web" not in s.state.assignments.get("n1", {}))
    assert await s.node_api.delete_node("n1") == {"node": "n1", "deleted": True, "withdrawn": []}
    await published(s, "NodeDeleted", "Deleted")
    await until(lambda: s.state.placement_of.get("web") == "n2")


async def test_a_restart_places_only_on_nodes_heard_from_and_keeps_returning_ones(make: Factory) -> None:
    """After a restart, stored Ready nodes nobody has heard from yet are neither placed on nor
    relocated from during the restart grace: a returning agent keeps its workloads."""
    s = make()
    await s.start()
    await s.agent_api.register(node("back"))
    await s.workload_api.apply(parse_manifests(manifest("kept"))[0])
    await until(lambda: s.state.placement_of.get("kept") == "back")
    await s.stop()

    s2 = make()  # the restart: both stored Ready, nothing heard
    await s2.start()
    await s2.workload_api.apply(parse_manifests(manifest("new"))[0])
    s2.test_clock.now += 2  # type: ignore[attr-defined]
    await s2._check_nodes()
    await until(lambda: "new" in s2.state.pending)  # decided: nowhere to go yet
    assert s2.state.placement_of.get("new") is None, "placed on a node not heard from since the restart"
    s2.test_clock.now += 28  # type: ignore[attr-defined]  # 30 s after the restart: past the node grace
    await s2._check_nodes()
    assert status(s2, "back") == "Ready" and s2.state.placement_of.get("kept") == "back"
    s2.agent_api.heartbeat("back", NodeUsage())  # the agent returns
    await until(lambda: s2.state.placement_of.get("new") == "back")
    await s2._check_nodes()
    assert s2.state.placement_of.get("kept") == "back", "a returning agent lost its workload"
    assert s2.state.placement_of.get("new") == "back"


async def test_stop_instances_of_a_lost_node_move_only_once_the_node_guard_acted(tmp_path: Path) -> None:
    """An onDisconnect: Stop instance leaves a lost node only `stop_relocation_seconds` after the
    node's last heartbeat (its node guard kills it by then, persys.agent.node_guard); a Keep one
    moves at once. The wait outlives a restart: the stored last heartbeat counts."""
    clock = Clock()

    def make_one() -> Scheduler:
        s = Scheduler(open_store(f"sqlite:///{tmp_path / 'state.db'}"), MemoryEventBus(),
                      SchedulerConfig(node_grace_seconds=10, monitor_interval_seconds=3600,
                                      stop_relocation_seconds=13), clock=clock)
        s.test_clock = clock  # type: ignore[attr-defined]
        return s

    s = make_one()
    await s.start()
    try:
        await s.agent_api.register(node("lost"))
        await s.workload_api.apply(parse_manifests(manifest("solo", extra="  onDisconnect: Stop\n"))[0])
        await s.workload_api.apply(parse_manifests(manifest("kept", extra="  onDisconnect: Keep\n"))[0])
        await until(lambda: s.state.placement_of.get("solo") == "lost" and s.state.placement_of.get("kept") == "lost")
        await s.agent_api.register(node("other"))
        clock.now += 11
        s.agent_api.heartbeat("other", NodeUsage())
        await s._check_nodes()
        assert status(s, "lost") == "NotReady"
        await until(lambda: s.state.placement_of.get("kept") == "other")  # Keep: at once
        assert s.state.placement_of.get("solo") == "lost", "a Stop instance moved before its guard acted"
    finally:
        await s.stop()
    s2 = make_one()  # a restart within the wait: the stored last heartbeat still holds it
    await s2.start()
    try:
        s2.agent_api.heartbeat("other", NodeUsage())
        await s2._check_nodes()
        assert s2.state.placement_of.get("solo") == "lost" and "lost" in s2.monitor.held
        await asyncio.sleep(2.2)  # silent 11 s on the test clock: 2 s of the 13 s wait are left
        s2.monitor.release_held()
        await until(lambda: s2.state.placement_of.get("solo") == "other")
    finally:
        await s2.stop()
        await s2.store.close()
        await s.store.close()
