"""Property-based tests: invariants that must hold for any snapshot and burst."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from persys.scheduler.placement import (
    DEFAULT_FILTERS,
    DeviceNeed,
    DeviceSlot,
    LabelConstraint,
    NodeInfo,
    PlacementConfig,
    PlacementContext,
    Reservations,
    Snapshot,
    Taint,
    Toleration,
    WorkloadRequest,
    decide,
    place_many,
    refresh_static_verdicts,
)

pytestmark = pytest.mark.slow  # pure, but minutes of examples: the full suite runs them, the fast lane not

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TYPES = ["container", "process", "microvm", "vm"]
FEATURES = ["vm:kvm", "vm:tcg"]
DRIVERS = ["local", "zfs"]
TAINTS = [
    Taint("gpu", "true", "NoSchedule"),
    Taint("maint", "", "NoExecute"),
    Taint("spot", "true", "PreferNoSchedule"),
]
TOLERATIONS = [
    Toleration("gpu", "Equal", "true"),
    Toleration("maint", "Exists"),
    Toleration("spot", "Exists", effect="PreferNoSchedule"),
    Toleration("", "Exists"),
]
CONSTRAINTS = [
    LabelConstraint("zone", "In", ("z0", "z1")),
    LabelConstraint("zone", "NotIn", ("z2",)),
    LabelConstraint("gpu", "Exists"),
    LabelConstraint("gpu", "DoesNotExist"),
    LabelConstraint("cores", "Gt", ("8",)),
    LabelConstraint("cores", "Lt", ("32",)),
]


def subset(items: list[str]) -> st.SearchStrategy[frozenset[str]]:
    return st.frozensets(st.sampled_from(items))


@st.composite
def nodes_st(draw: Any, min_size: int = 0, max_size: int = 10) -> list[NodeInfo]:
    count = draw(st.integers(min_size, max_size))
    nodes = []
    for i in range(count):
        cpu = draw(st.integers(0, 4000))
        mem = draw(st.integers(0, 8192))
        disk = draw(st.integers(0, 10_000))
        labels: dict[str, str] = {}
        gpus = tuple(DeviceSlot(f"n{i}-gpu{k}", draw(st.sampled_from(["nvidia", "amd"])),
                                draw(st.sampled_from([8192, 16384, 81920]))) for k in range(draw(st.integers(0, 3))))
        if draw(st.booleans()):
            labels["zone"] = draw(st.sampled_from(["z0", "z1", "z2"]))
        if draw(st.booleans()):
            labels["cores"] = draw(st.sampled_from(["4", "16", "64", "lots"]))
        if draw(st.booleans()):
            labels["gpu"] = "1"
        nodes.append(
            NodeInfo(
                id=f"n{i:02d}",
                ready=draw(st.integers(0, 9)) > 0,
                schedulable=draw(st.integers(0, 9)) > 0,
                runtimes=draw(subset(TYPES)),
                runtime_features=draw(subset(FEATURES)),
                storage_drivers=draw(subset(DRIVERS)),
                cpu_millicores=cpu,
                memory_mb=mem,
                disk_mb=disk,
                labels=labels,
                taints=tuple(draw(st.lists(st.sampled_from(TAINTS), max_size=2, unique=True))),
                committed_cpu=draw(st.integers(0, cpu)),
                committed_memory_mb=draw(st.integers(0, mem)),
                committed_disk_mb=draw(st.integers(0, disk)),
                workload_count=draw(st.integers(0, 5)),
                service_counts=draw(st.dictionaries(st.sampled_from(["web", "db"]), st.integers(1, 3))),
                devices=gpus,
                devices_used=frozenset(d.id for d in gpus if draw(st.integers(0, 3)) == 0),
            )
        )
    return nodes


@st.composite
def request_st(draw: Any, i: int, node_ids: list[str]) -> WorkloadRequest:
    pinned = draw(st.sampled_from(node_ids)) if node_ids and draw(st.integers(0, 5)) == 0 else None
    return WorkloadRequest(
        id=f"w{i}",
        type=draw(st.sampled_from(TYPES)),
        cpu_millicores=draw(st.integers(0, 2000)),
        memory_mb=draw(st.integers(0, 4096)),
        disk_mb=draw(st.integers(0, 5000)),
        node_selector=draw(st.sampled_from([{}, {}, {"zone": "z1"}, {"gpu": "1"}])),
        constraints=tuple(draw(st.lists(st.sampled_from(CONSTRAINTS), max_size=2))),
        tolerations=tuple(draw(st.lists(st.sampled_from(TOLERATIONS), max_size=2))),
        volume_drivers=draw(subset(DRIVERS)),
        pinned_node=pinned,
        excluded_nodes=draw(subset(node_ids)) if node_ids else frozenset(),
        required_features=draw(st.sampled_from([frozenset(), frozenset({"vm:kvm"})])),
        service=draw(st.sampled_from(["", "web", "db"])),
        spread_label=draw(st.sampled_from([None, "zone"])),
        devices=draw(st.sampled_from([(), (), (DeviceNeed("nvidia"),), (DeviceNeed("nvidia", 2, 16000),),
                                      (DeviceNeed("nvidia"), DeviceNeed("amd"))])),
    )


@st.composite
def scenario_st(draw: Any, max_requests: int = 12) -> tuple[list[NodeInfo], list[WorkloadRequest]]:
    nodes = draw(nodes_st())
    ids = [n.id for n in nodes]
    count = draw(st.integers(1, max_requests))
    return nodes, [draw(request_st(i, ids)) for i in range(count)]


def first_rejection(node: NodeInfo, request: WorkloadRequest, snapshot: Snapshot) -> Any:
    ctx = PlacementContext(snapshot, request)
    for f in DEFAULT_FILTERS:
        status = f.check(node, request, ctx)
        if status is not None:
            return status
    return None


@SETTINGS
@given(scenario_st())
def test_place_many_never_overcommits(data: tuple[list[NodeInfo], list[WorkloadRequest]]) -> None:
    nodes, requests = data
    ledger = Reservations()
    decisions = place_many(Snapshot(tuple(nodes)), requests, ledger)
    by_id = {n.id: n for n in nodes}
    used = {n.id: [n.committed_cpu, n.committed_memory_mb, n.committed_disk_mb] for n in nodes}
    for request, decision in zip(requests, decisions, strict=True):
        if decision.node_id is not None:
            u = used[decision.node_id]
            u[0] += request.cpu_millicores
            u[1] += request.memory_mb
            u[2] += request.disk_mb
    for node_id, (cpu, mem, disk) in used.items():
        node = by_id[node_id]
        assert cpu <= node.cpu_millicores and mem <= node.memory_mb and disk <= node.disk_mb
        held = ledger.on_node(node_id)
        assert held.cpu_millicores == cpu - node.committed_cpu
    assert len(ledger) == sum(d.placed for d in decisions)
    # Devices: each given once, a free one of the node, of the vendor and memory asked for.
    given: dict[str, list[str]] = {}
    for request, decision in zip(requests, decisions, strict=True):
        if decision.node_id is None:
            assert decision.devices == ()
            continue
        assert len(decision.devices) == sum(need.count for need in request.devices)
        node = by_id[decision.node_id]
        slots = {d.id: d for d in node.devices}
        ids = iter(decision.devices)
        for need in request.devices:
            for _ in range(need.count):
                slot = slots[next(ids)]
                assert slot.vendor == need.vendor and slot.memory_mb >= need.min_memory_mb
                assert slot.id not in node.devices_used
        given.setdefault(node.id, []).extend(decision.devices)
    for ids_given in given.values():
        assert len(ids_given) == len(set(ids_given))


@SETTINGS
@given(scenario_st(max_requests=6), st.randoms(use_true_random=False))
def test_deterministic_and_node_order_independent(
    data: tuple[list[NodeInfo], list[WorkloadRequest]], rnd: Any
) -> None:
    nodes, requests = data
    shuffled = list(nodes)
    rnd.shuffle(shuffled)
    a = place_many(Snapshot(tuple(nodes)), requests, Reservations())
    b = place_many(Snapshot(tuple(shuffled)), requests, Reservations())
    c = place_many(Snapshot(tuple(nodes)), requests, Reservations())
    assert [d.to_dict() for d in a] == [d.to_dict() for d in b] == [d.to_dict() for d in c]


@SETTINGS
@given(scenario_st(max_requests=8))
def test_every_filter_respected_and_reasons_are_first_failing_filter(
    data: tuple[list[NodeInfo], list[WorkloadRequest]],
) -> None:
    nodes, requests = data
    ledger = Reservations()
    snapshot = Snapshot(tuple(nodes))
    config = PlacementConfig(top_candidates=100)
    for request in requests:
        current = snapshot.with_reservations(ledger.view())
        decision = decide(current, request, config)
        assert decision.total == len(nodes) == decision.evaluated  # small clusters: no sampling
        for node in current.effective:
            expected = first_rejection(node, request, current)
            assert decision.rejections.get(node.id) == expected
        if decision.node_id is None:
            # Pending: every node carries a reason, and the explanation counts all of them.
            assert decision.feasible == 0 and len(decision.rejections) == len(nodes)
            assert decision.explain().startswith(f"0/{len(nodes)} nodes available")
            continue
        chosen = current.node(decision.node_id)
        assert chosen is not None and first_rejection(chosen, request, current) is None
        assert decision.feasible + len(decision.rejections) == len(nodes)
        totals = [s.total for s in decision.scores]
        assert decision.scores[0].node_id == decision.node_id
        assert totals == sorted(totals, reverse=True) and len(totals) == decision.feasible
        for s in decision.scores:
            assert 0.0 <= s.total <= 100.0 + 1e-9
            assert abs(sum(s.breakdown.values()) - s.total) < 1e-6
        place_many(current, [request], ledger, config)  # reserve exactly like a burst would


@SETTINGS
@given(nodes_st(min_size=1), nodes_st(min_size=1), scenario_st(max_requests=6), st.randoms(use_true_random=False))
def test_memoised_verdicts_follow_changed_nodes(
    before: list[NodeInfo], after: list[NodeInfo], data: tuple[list[NodeInfo], list[WorkloadRequest]], rnd: Any
) -> None:
    """Verdicts memoised for one snapshot, then refreshed for the nodes whose facts changed,
    decide and explain exactly as a snapshot built from scratch (label index, per-filter
    verdicts and combined shapes all follow the change)."""
    _, requests = data
    size = min(len(before), len(after))
    old = before[:size]
    changed = rnd.sample(range(size), rnd.randint(0, size))
    new = [after[i] if i in changed else old[i] for i in range(size)]
    memo: dict[object, object] = {}
    first = Snapshot(tuple(old)).sharing_static_caches(memo)
    for request in requests:
        decide(first, request)
    stale = Snapshot(tuple(new)).sharing_static_caches(memo)
    refresh_static_verdicts(stale, [new[i].id for i in changed])
    fresh = Snapshot(tuple(new))
    for request in requests:
        a, b = decide(stale, request), decide(fresh, request)
        assert a.to_dict() == b.to_dict()
