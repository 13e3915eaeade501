"""The scheduler on the embedded store: apply, place, explain, report, delete, liveness, restart."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from persys.events.memory import MemoryEventBus
from persys.model import (
    Capabilities,
    Node,
    NodeStatus,
    NodeUsage,
    Phase,
    RuntimeInfo,
    Taint,
    WorkloadUsage,
    parse_manifests,
)
from persys.scheduler.config import SchedulerConfig
from persys.scheduler.errors import MutationRefused, NotFound
from persys.scheduler.mirror import keys
from persys.scheduler.mirror.reports import WorkloadReport
from persys.scheduler.replica.assembly import Scheduler
from persys.store import open_store
from persys.store.base import Delete, Put
from tests.waiting import settled


def manifest(name: str, type_: str = "process", cpu: int = 100, mem: int = 64, extra: str = "") -> str:
    body = {"process": "process: {command: [sleep, '60']}", "container": "container: {image: img}"}[type_]
    return f"""
apiVersion: persys.dev/v1
kind: Workload
metadata: {{name: {name}}}
spec:
  type: {type_}
  resources: {{cpuMillicores: {cpu}, memoryMb: {mem}}}
  {body}
{extra}"""


def node(node_id: str, cpu: int = 2000, mem: int = 2048, runtimes: tuple[str, ...] = ("process",),
         taints: tuple[Taint, ...] = ()) -> Node:
    return Node(
        id=node_id,
        capabilities=Capabilities(runtimes={r: RuntimeInfo(version="1") for r in runtimes}, storage_drivers=["local"],
                                  cpu_millicores=cpu, memory_mb=mem, disk_mb=10_000),
        taints=list(taints),
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def make(tmp_path: Path, clock: Clock) -> AsyncIterator[Callable[[], asyncio.Future[Scheduler]]]:
    made: list[Scheduler] = []

    async def factory() -> Scheduler:
        s = Scheduler(open_store(f"sqlite:///{tmp_path / 'state.db'}"), MemoryEventBus(),
                      SchedulerConfig(node_grace_seconds=10, monitor_interval_seconds=0.05), clock=clock)
        await s.start()
        made.append(s)
        return s

    yield factory  # type: ignore[misc]
    for s in made:
        await s.stop()
        await s.store.close()


async def settle(s: Scheduler, cond: Callable[[], bool], within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within

    def holds() -> bool:
        try:
            return cond()
        except KeyError:  # the document does not exist yet
            return False

    while not holds():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


async def test_pending_with_reason_then_placed_when_a_node_joins(make: Callable) -> None:
    s = await make()
    (m,) = parse_manifests(manifest("web"))
    _, created, _ = await s.workload_api.apply(m)
    assert created
    await settle(s, lambda: s.state.statuses["web"].value.reason == "Unschedulable")
    assert "0/0 nodes" in s.workload_view("web")["message"]
    await s.agent_api.register(node("n1"))
    await settle(s, lambda: s.state.placement_of.get("web") == "n1")
    v = s.workload_view("web")
    assert v["phase"] == "Scheduled" and v["node"] == "n1"
    assert v["placement"]["node_id"] == "n1"


async def test_apply_is_idempotent_and_revision_tracks_spec(make: Callable) -> None:
    s = await make()
    (m,) = parse_manifests(manifest("web"))
    w1, created, changed = await s.workload_api.apply(m)
    w2, created2, changed2 = await s.workload_api.apply(m)
    assert (created, changed, created2, changed2) == (True, True, False, False)
    assert w1.revision == w2.revision
    (m2,) = parse_manifests(manifest("web", mem=128))
    w3, _, changed3 = await s.workload_api.apply(m2)
    assert changed3 and w3.revision != w1.revision and w3.generation == 2


async def test_restart_needs_a_placed_instance_and_a_new_spec_forgets_restarts(make: Callable) -> None:
    s = await make()
    (m,) = parse_manifests(manifest("web"))
    w1, _, _ = await s.workload_api.apply(m)
    await settle(s, lambda: s.state.statuses["web"].value.reason == "Unschedulable")
    with pytest.raises(MutationRefused, match=r"no placed instance to restart \(Pending: Unschedulable\)"):
        await s.workload_api.restart("web")
    assert s.state.workloads["web"].value.revision == w1.revision  # nothing written
    await s.agent_api.register(node("n1"))
    await settle(s, lambda: s.state.placement_of.get("web") == "n1")
    restarted = await s.workload_api.restart("web")
    assert restarted.revision == f"{w1.revision}-1"
    (m2,) = parse_manifests(manifest("web", mem=128))
    w2, _, _ = await s.workload_api.apply(m2)
    # The new spec's revision is its content hash alone: no restart suffix carried over.
    assert w2.revision == w2.spec.spec_revision() and w2.restart_epoch == 0


async def test_capacity_counts_requests_not_usage(make: Callable) -> None:
    s = await make()
    await s.agent_api.register(node("n1", cpu=1000, mem=1024))
    for i in range(3):
        (m,) = parse_manifests(manifest(f"w{i}", cpu=400))
        await s.workload_api.apply(m)
    await settle(s, lambda: len(s.state.assignments.get("n1", {})) == 2)
    await settle(s, lambda: s.state.statuses["w2"].value.reason == "Unschedulable")
    assert "insufficient cpu" in s.state.statuses["w2"].value.message


async def test_explains_type_and_taint_refusals(make: Callable) -> None:
    s = await make()
    await s.agent_api.register(node("tainted", runtimes=("container",), taints=(Taint(key="gpu", value="true"),)))
    await s.agent_api.register(node("proc-only"))
    (m,) = parse_manifests(manifest("c1", type_="container"))
    await s.workload_api.apply(m)
    await settle(s, lambda: s.state.statuses["c1"].value.reason == "Unschedulable")
    msg = s.state.statuses["c1"].value.message
    assert msg.startswith("0/2 nodes available:")
    assert "gpu=true:NoSchedule" in msg and "no container runtime" in msg


async def test_reports_drive_status_and_delete_waits_for_the_agent(make: Callable) -> None:
    s = await make()
    await s.agent_api.register(node("n1"))
    (m,) = parse_manifests(manifest("web"))
    w, _, _ = await s.workload_api.apply(m)
    await settle(s, lambda: s.state.placement_of.get("web") == "n1")
    run = WorkloadReport("web", w.revision, w.generation, Phase.RUNNING, runtime_id="123",
                         usage=WorkloadUsage(memory_bytes=42))
    await s.agent_api.report("n1", [run], complete=True)
    assert s.workload_view("web")["phase"] == "Running"
    assert s.workload_view("web")["usage"]["memoryBytes"] == 42
    await s.workload_api.delete("web")
    await settle(s, lambda: "web" not in s.state.placement_of)
    assert s.state.statuses["web"].value.phase == Phase.DELETING  # agent still reports it
    await s.agent_api.report("n1", [], complete=True)  # agent removed it
    await settle(s, lambda: "web" not in s.state.workloads)
    assert await s.store.get(keys.workload("web")) is None
    assert (await s.workload_api.delete("web")) == (False, True)  # idempotent


async def test_a_report_from_the_wrong_node_is_ignored(make: Callable) -> None:
    s = await make()
    await s.agent_api.register(node("n1"))
    await s.agent_api.register(node("n2", cpu=10))
    (m,) = parse_manifests(manifest("web"))
    w, _, _ = await s.workload_api.apply(m)
    await settle(s, lambda: s.state.placement_of.get("web") == "n1")
    await s.agent_api.report("n2", [WorkloadReport("web", w.revision, 1, Phase.RUNNING)], complete=True)
    assert s.workload_view("web")["phase"] == "Scheduled"


async def test_node_goes_not_ready_without_heartbeats(make: Callable, clock: Clock) -> None:
    s = await make()
    await s.agent_api.register(node("n1"))
    assert s.agent_api.heartbeat("n1", NodeUsage())
    clock.now += 11
    await settle(s, lambda: s.state.nodes["n1"].value.status == NodeStatus.NOT_READY)
    assert "no heartbeat" in s.state.nodes["n1"].value.status_reason
    assert s.agent_api.heartbeat("n1", NodeUsage())
    await settle(s, lambda: s.state.nodes["n1"].value.status == NodeStatus.READY)
    assert not s.agent_api.heartbeat("ghost", NodeUsage())  # unknown nodes are told to register


async def test_heartbeats_do_not_write_to_the_store(make: Callable) -> None:
    s = await make()
    await s.agent_api.register(node("n1"))
    before = await s.store.current_revision()
    for _ in range(50):
        s.agent_api.heartbeat("n1", NodeUsage(cpu_percent=5))
    await s._check_nodes()  # the only step that could write what heartbeats change
    assert await s.store.current_revision() == before


async def test_restart_finds_the_same_state(make: Callable) -> None:
    s = await make()
    await s.agent_api.register(node("n1"))
    (m,) = parse_manifests(manifest("web"))
    await s.workload_api.apply(m)
    await settle(s, lambda: s.state.placement_of.get("web") == "n1")
    await s.stop()
    s2 = await make()
    assert s2.state.placement_of == {"web": "n1"}
    assert s2.workload_view("web")["node"] == "n1"
    assert s2.state.cluster_marker is not None


async def test_desired_stream_follows_assignments(make: Callable) -> None:
    s = await make()
    await s.agent_api.register(node("n1"))
    stream = s.delivery.desired_stream("n1")
    assert await anext(stream) == []
    (m,) = parse_manifests(manifest("web"))
    await s.workload_api.apply(m)
    first = await asyncio.wait_for(anext(stream), 5)
    while not first:
        first = await asyncio.wait_for(anext(stream), 5)
    assert [a.instance_id for a in first] == ["web"]


def zoned(node_id: str, zone: str) -> Node:
    n = node(node_id)
    n.labels = {"zone": zone}
    return n


async def test_replicas_spread_across_zones_and_scale(make: Callable) -> None:
    s = await make()
    for nid, zone in (("a1", "a"), ("a2", "a"), ("b1", "b"), ("c1", "c")):
        await s.agent_api.register(zoned(nid, zone))
    (m,) = parse_manifests(manifest("web", extra="  replicas: 3\n  spreadBy: zone\n"))
    await s.workload_api.apply(m)
    await settle(s, lambda: all(i in s.state.placement_of for i in ("web", "web.1", "web.2")))
    zones = {s.state.nodes[s.state.placement_of[i]].value.labels["zone"] for i in ("web", "web.1", "web.2")}
    assert zones == {"a", "b", "c"}
    view = s.workload_view("web")
    assert view["replicas"] == 3 and view["ready"] == "0/3" and len(view["instances"]) == 3
    # Scale down: the surplus replica's assignment and status go away; replica 0 stays put.
    first = s.state.placement_of["web"]
    (m1,) = parse_manifests(manifest("web", extra="  replicas: 1\n  spreadBy: zone\n"))
    await s.workload_api.apply(m1)
    await settle(s, lambda: set(s.state.instances.get("web", ())) == {"web"})
    assert s.state.placement_of["web"] == first


async def test_a_scale_keeps_the_revision_so_nothing_restarts(make: Callable) -> None:
    s = await make()
    await s.agent_api.register(node("n1"))
    (m,) = parse_manifests(manifest("web"))
    w1, _, _ = await s.workload_api.apply(m)
    await settle(s, lambda: "web" in s.state.placement_of)
    (m3,) = parse_manifests(manifest("web", extra="  replicas: 3\n"))
    w3, created, changed = await s.workload_api.apply(m3)
    assert (created, changed) == (False, True) and w3.spec.replicas == 3
    assert (w3.revision, w3.generation) == (w1.revision, w1.generation)  # a scale is not a new revision
    await settle(s, lambda: all(i in s.state.placement_of for i in ("web", "web.1", "web.2")))
    assert {a.value.revision for a in s.state.assignments["n1"].values()} == {w1.revision}
    again, _, changed = await s.workload_api.apply(m3)
    assert not changed and again.revision == w1.revision
    (m4,) = parse_manifests(manifest("web", mem=128, extra="  replicas: 3\n"))
    w4, _, _ = await s.workload_api.apply(m4)  # a real change of the spec still is
    assert w4.revision == w4.spec.spec_revision() != w1.revision and w4.generation == w1.generation + 1


async def test_avoid_nodes_is_respected(make: Callable) -> None:
    s = await make()
    await s.agent_api.register(node("n1"))
    await s.agent_api.register(node("n2", cpu=100))
    (m,) = parse_manifests(manifest("web", cpu=50, extra="  avoidNodes: [n1]\n"))
    await s.workload_api.apply(m)
    await settle(s, lambda: s.state.placement_of.get("web") == "n2")
    (m2,) = parse_manifests(manifest("w2", extra="  avoidNodes: [n1, n2]\n"))
    await s.workload_api.apply(m2)
    await settle(s, lambda: s.state.statuses["w2"].value.reason == "Unschedulable")
    assert "excluded" in s.state.statuses["w2"].value.message


async def test_node_local_volume_pins_the_instance(make: Callable) -> None:
    s = await make()
    await s.agent_api.register(node("n1"))
    vol = "  volumes: [{name: data, driver: local, mountPath: /data}]\n"
    (m,) = parse_manifests(manifest("db", extra=vol))
    await s.workload_api.apply(m)
    await settle(s, lambda: s.state.placement_of.get("db") == "n1")
    assert s.state.statuses["db"].value.volume_node == "n1"
    await s.agent_api.register(node("n2", cpu=64_000, mem=64_000))  # far roomier: would win on scores
    # Lose the assignment (as relocation would): the instance must go back to its volume.
    await s.state.commit([], [Delete(keys.assignment("n1", "db"))])
    await settle(s, lambda: s.state.placement_of.get("db") == "n1")
    # With its volume's node gone unschedulable it waits, and says why.
    cordoned = s.state.nodes["n1"].value.model_copy(update={"cordoned": True})
    await s.state.commit([], [Put(keys.node("n1"), cordoned.to_json())])
    await s.state.commit([], [Delete(keys.assignment("n1", "db"))])
    await settle(s, lambda: s.state.statuses["db"].value.reason == "Unschedulable")
    assert "n2" not in s.state.placement_of.values()


async def test_plan_writes_nothing_and_explain_shows_every_verdict(make: Callable) -> None:
    s = await make()
    await s.agent_api.register(node("big"))
    await s.agent_api.register(node("gpu", taints=(Taint(key="gpu", value="true"),)))
    await s.agent_api.register(node("tiny", cpu=2000, mem=32))
    (m,) = parse_manifests(manifest("web", mem=512))
    before = await s.store.current_revision()
    plan = s.workload_api.plan(m)
    assert [(inst, d.node_id) for inst, d in plan] == [("web", "big")]
    assert "1 insufficient memory" in plan[0][1].explain() and "untolerated taint gpu=true" in plan[0][1].explain()
    assert await s.store.current_revision() == before
    assert len(s.placement.ledger) == 0
    await s.workload_api.apply(m)
    await settle(s, lambda: s.state.placement_of.get("web") == "big")
    ex = s.workload_api.explain("web", node_id="tiny")
    assert ex["replicas"][0]["node"] == "big"
    assert ex["replicas"][0]["explanation"].startswith("placed on big (1/3 nodes feasible)")
    verdicts = {f["filter"]: f["passed"] for f in ex["node"]["filters"]}
    assert verdicts["memory_fit"] is False and verdicts["taint_toleration"] is True


def test_placement_documents_are_stored_compact_and_shown_in_full() -> None:
    from persys.scheduler import placement as pl
    from persys.scheduler.views.documents import placement_doc as _placement_doc
    from persys.scheduler.views.documents import placement_view

    snap = pl.Snapshot(tuple(pl.NodeInfo(id=f"n{i}", cpu_millicores=1000, memory_mb=1000) for i in range(3)))
    decision = pl.decide(snap, pl.WorkloadRequest(id="w", cpu_millicores=100))
    stored = _placement_doc(decision, decision.explain())
    assert stored["scorers"] == list(decision.scores[0].breakdown)
    assert all(isinstance(s, list) for s in stored["scores"])
    shown = placement_view(stored)
    assert "scorers" not in shown and shown["explanation"] == decision.explain()
    assert [s["node_id"] for s in shown["scores"]] == [s.node_id for s in decision.scores]
    assert shown["scores"][0]["breakdown"] == {k: round(v, 3) for k, v in decision.scores[0].breakdown.items()}
    verbose = {"node_id": "n0", "scores": [{"node_id": "n0", "total": 1.0, "breakdown": {"spread": 1.0}}]}
    assert placement_view(verbose) == verbose  # documents stored before the compact form still read


async def test_partial_reports_count_as_present_until_a_complete_one_leaves_them_out(make: Callable) -> None:
    """Agents report changes only; an instance first seen in such a report must still be noticed
    gone when a later complete report leaves it out (a sharded owner records that for the leader)."""
    s = await make()
    await s.agent_api.register(node("n1"))
    await s.agent_api.report("n1", [WorkloadReport("a", "r1", 1, Phase.RUNNING)], complete=True)
    await s.agent_api.report("n1", [WorkloadReport("b", "r1", 1, Phase.RUNNING)], complete=False)
    assert s.live["n1"].present == {"a", "b"}
    await s.agent_api.report("n1", [WorkloadReport("a", "r1", 1, Phase.RUNNING)], complete=True)
    assert s.live["n1"].present == {"a"}


async def test_the_placement_snapshot_is_prepared_ahead_in_small_steps(make: Callable) -> None:
    """After a start (or a reset) every node's placement inputs must be computed: the node
    monitor does it ahead of the first decision, a chunk at a time with the loop free between,
    and the result is the snapshot a decision would have built itself."""
    s = await make()
    for i in range(300):
        await s.agent_api.register(node(f"n{i:03d}", cpu=1000 + i))
    await settle(s, lambda: s.placement._base is not None and len(s.placement._base) == 300)

    s.placement.reset()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    await s.placement.prepare(chunk=50)
    task.cancel()
    assert ticks >= 300 // 50 - 1, "prepare() let other tasks run between chunks"
    prepared = s.placement._base
    assert prepared is not None
    s.placement.reset()
    built = s.placement.base()  # the same inputs, computed in one piece
    assert prepared.effective == built.effective and len(built) == 300


async def test_pending_says_every_reason_per_node_in_status_event_and_explain(make: Callable) -> None:
    s = await make()
    await s.agent_api.register(node("small", cpu=500, mem=256))
    await s.agent_api.register(node("tainted", cpu=500, mem=4096, taints=(Taint(key="gpu", value="true"),)))
    (m,) = parse_manifests(manifest("big", cpu=1000, mem=1024))
    await s.workload_api.apply(m)
    await settle(s, lambda: s.state.statuses["big"].value.reason == "Unschedulable")
    message = s.workload_view("big")["message"]
    # The aggregated line counts each node once (its first reason), as before ...
    assert message.startswith("0/2 nodes available: 1 insufficient cpu (needs 1000m, best node has 500m free), "
                              "1 untolerated taint gpu=true:NoSchedule. Per node: "), message
    # ... then every failing filter of each node, with its figures.
    assert ("small: insufficient cpu (needs 1000m, node has 500m free, short by 500m); insufficient memory "
            "(needs 1024 MiB, node has 256 MiB free, short by 768 MiB)") in message
    assert "tainted: untolerated taint gpu=true:NoSchedule; insufficient cpu (needs 1000m, node has 500m free, " \
           "short by 500m)" in message
    reasons = s.workload_view("big")["placement"]["reasons"]
    assert [r["code"] for r in reasons["small"]] == ["insufficient_cpu", "insufficient_memory"]
    assert reasons["small"][1] | {} == {"code": "insufficient_memory", "message": reasons["small"][1]["message"],
                                         "needed": 1024, "available": 256, "shortBy": 768, "unit": "MiB"}
    async def pending_events() -> list[Any]:
        return [e for e in await s.events.recent(50) if e.kind == "WorkloadPending"]

    # The event goes out after the status is written: read at once, it was not there yet at load 18.
    events = await settled(pending_events, 30)
    assert events and "small: insufficient cpu" in events[-1].message and "insufficient memory" in events[-1].message
    replica = s.workload_api.explain("big")["replicas"][0]
    assert replica["decision"]["reasons"] == reasons and "Per node: small:" in replica["explanation"]


async def test_what_if_plans_and_counterfactuals_read_the_mirror_and_write_nothing(make: Callable) -> None:
    from persys.model import ManifestError
    from persys.scheduler.placing import whatif as whatif_api
    from persys.scheduler.views.models import WhatIfPlanView, WhatIfView

    s = await make()
    await s.agent_api.register(node("a", cpu=2000))
    await s.agent_api.register(node("b", cpu=1000))
    for name, cpu in (("web", 600), ("api", 900)):
        (m,) = parse_manifests(manifest(name, cpu=cpu, extra="  nodeSelector: {}\n"))
        await s.workload_api.apply(m)
    await settle(s, lambda: {s.state.placement_of.get("web"), s.state.placement_of.get("api")} <= {"a", "b"}
                 and len(s.state.placement_of) == 2)
    # A workload too big for either node.
    (m,) = parse_manifests(manifest("big", cpu=1800))
    await s.workload_api.apply(m)
    await settle(s, lambda: s.state.statuses["big"].value.reason == "Unschedulable")
    before, reserved = await s.store.current_revision(), sorted(r.id for r in s.placement.ledger)
    on_a = sorted(i for i, n in s.state.placement_of.items() if n == "a")
    plan = await whatif_api.plan_operation(s.state, s.placement, {"kind": "drain", "nodes": ["a"]})
    assert plan["affectedNodes"] == ["a"]
    assert sorted(m["instance"] for m in plan["moves"] + plan["pending"]) == on_a
    added = await whatif_api.plan_operation(s.state, s.placement, {"kind": "add-node", "nodes": [
        {"name": "c", "cpuMillicores": 4000, "memoryMb": 4096, "labels": {"zone": "z"}, "taints": ["x=y:NoSchedule"]}]})
    assert added["affectedNodes"] == ["c"] and added["moves"] == []
    WhatIfPlanView.model_validate(plan), WhatIfPlanView.model_validate(added)  # the OpenAPI document's shapes
    for bad, field in (({"kind": "explode"}, "kind"), ({"kind": "drain", "nodes": ["nope"]}, "nodes"),
                       ({"kind": "lose-label", "label": "zone"}, "label"), ({"kind": "drain"}, "nodes"),
                       ({"kind": "add-node", "nodes": [{"name": "c", "cpuMillicores": -1}]}, "nodes[0].cpuMillicores"),
                       ({"kind": "add-node", "nodes": [{"name": "a"}]}, "nodes"), ({"kind": "drain", "x": 1}, "x")):
        with pytest.raises(ManifestError, match=f"^{re.escape(field)}: "):
            await whatif_api.plan_operation(s.state, s.placement, bad)
    # big: a smaller request, or moving what is on a node.
    answer = whatif_api.what_if(s.state, s.placement, "big")
    changes = answer["replicas"][0]["changes"]
    assert answer["replicas"][0]["pending"] and changes
    assert {c["kind"] for c in changes} >= {"resources", "free-node"}, changes
    WhatIfView.model_validate(answer)
    assert added["placed"] == [] or added["placed"][0]["instance"] == "big"
    # Nothing written, nothing reserved by the questions.
    assert await s.store.current_revision() == before
    assert sorted(r.id for r in s.placement.ledger) == reserved
    with pytest.raises(NotFound):
        whatif_api.what_if(s.state, s.placement, "ghost")


async def test_topology_spread_max_skew_from_the_manifest(make: Callable) -> None:
    s = await make()
    for node_id, zone in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        await s.agent_api.register(node(node_id, cpu=4000, mem=4096))
        await s.node_api.label(node_id, {"zone": zone}, [])
    spread = "  replicas: 4\n  topologySpread: [{label: zone, maxSkew: 1, whenUnsatisfiable: DoNotSchedule}]\n"
    (m,) = parse_manifests(manifest("web", extra=spread))
    await s.workload_api.apply(m)
    await settle(s, lambda: sum(1 for i in s.state.placement_of if i.startswith("web")) == 4)
    zones = {"a1": "a", "a2": "a", "b1": "b"}
    placed = [zones[n] for i, n in s.state.placement_of.items() if i.startswith("web")]
    assert sorted(placed) == ["a", "a", "b", "b"]  # b1 alone holds zone b's two: the skew stays <= 1
    (m,) = parse_manifests(manifest("web", extra=spread.replace("replicas: 4", "replicas: 6")))
    await s.workload_api.apply(m)
    await settle(s, lambda: sum(1 for i in s.state.placement_of if i.startswith("web")) == 6)
    placed = [zones[n] for i, n in s.state.placement_of.items() if i.startswith("web")]
    assert placed.count("a") == 3 and placed.count("b") == 3
    assert "topologySpread" not in parse_manifests(manifest("plain"))[0].spec.to_doc()  # unset: same revision
