"""Unit tests for the ledger, snapshot overlay, config validation, sampling and plugins."""

from __future__ import annotations

import json

import pytest

from persys.scheduler.placement import (
    DEFAULT_FILTERS,
    DEFAULT_SCORERS,
    Filter,
    LabelConstraint,
    NodeInfo,
    PlacementConfig,
    PlacementContext,
    Reservation,
    Reservations,
    Scorer,
    Snapshot,
    Status,
    Taint,
    WorkloadRequest,
    decide,
    place_many,
    refresh_static_verdicts,
)
from persys.scheduler.placement.engine import feasible_nodes_to_find


def cluster(n: int) -> Snapshot:
    return Snapshot(
        tuple(
            NodeInfo(id=f"n{i:04d}", cpu_millicores=4000, memory_mb=8192, committed_cpu=(i * 37) % 3000)
            for i in range(n)
        )
    )


def test_ledger_reserve_release_and_view() -> None:
    ledger = Reservations()
    ledger.reserve(Reservation("r1", "n1", 100, 200, 300, "web"))
    ledger.reserve(Reservation("r2", "n1", 10, 20, 30, "web"))
    with pytest.raises(ValueError):
        ledger.reserve(Reservation("r1", "n2", 1, 1, 1))
    view = ledger.view()
    held = view.by_node["n1"]
    assert (held.cpu_millicores, held.memory_mb, held.disk_mb, held.workloads) == (110, 220, 330, 2)
    assert held.services == {"web": 2}
    assert ledger.release("r1") is not None and ledger.release("r1") is None
    assert view.by_node["n1"].cpu_millicores == 110  # views are immutable snapshots
    assert ledger.on_node("n1").cpu_millicores == 10
    ledger.release("r2")
    assert not ledger.view() and len(ledger) == 0


def test_snapshot_overlay_replaces_rather_than_stacks() -> None:
    snap = Snapshot((NodeInfo(id="n1", cpu_millicores=1000, committed_cpu=100),))
    ledger = Reservations()
    ledger.reserve(Reservation("r1", "n1", 300, 0, 0, "web"))
    ledger.reserve(Reservation("r2", "gone", 300, 0, 0))  # vanished node: ignored
    over = snap.with_reservations(ledger.view())
    again = over.with_reservations(ledger.view())
    for s in (over, again):
        node = s.node("n1")
        assert node is not None and node.committed_cpu == 400 and node.service_counts == {"web": 1}
    assert snap.node("n1").committed_cpu == 100  # type: ignore[union-attr]
    assert over.base_node("n1") == snap.node("n1")


def test_snapshot_rejects_duplicate_ids() -> None:
    with pytest.raises(ValueError):
        Snapshot((NodeInfo(id="a"), NodeInfo(id="a")))


def test_place_many_counts_existing_ledger_reservations() -> None:
    snap = Snapshot((NodeInfo(id="n1", cpu_millicores=1000),))
    ledger = Reservations()
    ledger.reserve(Reservation("old", "n1", 800, 0, 0))
    [d] = place_many(snap, [WorkloadRequest(id="w", cpu_millicores=300)], ledger)
    assert d.node_id is None and "best node has 200m free" in d.explain()


def test_input_validation() -> None:
    with pytest.raises(ValueError):
        LabelConstraint("cores", "Gt", ("x",))
    with pytest.raises(ValueError):
        LabelConstraint("cores", "Lt", ())
    with pytest.raises(ValueError):
        LabelConstraint("zone", "In", ())
    with pytest.raises(ValueError):
        WorkloadRequest(id="w", cpu_millicores=-1)
    with pytest.raises(ValueError):
        PlacementConfig(weights={"nope": 1.0})
    with pytest.raises(ValueError):
        PlacementConfig(weights={"spread": -1.0})
    with pytest.raises(ValueError):
        PlacementConfig(percentage_of_nodes_to_score=0)


def test_inputs_are_copied() -> None:
    labels = {"zone": "a"}
    node = NodeInfo(id="n", labels=labels)
    labels["zone"] = "b"
    assert node.labels["zone"] == "a"


def test_to_dict_is_json() -> None:
    snap = Snapshot((NodeInfo(id="n1", cpu_millicores=1000), NodeInfo(id="n2", ready=False)))
    d = decide(snap, WorkloadRequest(id="w", cpu_millicores=100))
    data = json.loads(json.dumps(d.to_dict()))
    assert data["node_id"] == "n1" and data["rejections"]["n2"]["code"] == "node_not_ready"
    assert data["explanation"] == d.explain() and data["scores"][0]["node_id"] == "n1"


def test_feasible_nodes_to_find() -> None:
    assert feasible_nodes_to_find(50, None) == 50
    assert feasible_nodes_to_find(5000, None) == 500  # 50% - 5000/125 = 10%
    assert feasible_nodes_to_find(100_000, None) == 5000  # floor of 5%
    assert feasible_nodes_to_find(1000, None) == 420
    assert feasible_nodes_to_find(5000, 100) == 5000
    assert feasible_nodes_to_find(150, 10) == 100  # never fewer than 100


def test_sampling_is_deterministic_and_order_independent() -> None:
    snap = cluster(1000)
    reversed_snap = Snapshot(tuple(reversed(snap.nodes)))
    request = WorkloadRequest(id="w1", cpu_millicores=100)
    a, b = decide(snap, request), decide(reversed_snap, request)
    assert a.to_dict() == b.to_dict()
    assert a.evaluated < a.total == 1000 and a.feasible == 420
    assert "420/1000 nodes feasible, 420 evaluated" in a.explain()
    full = decide(snap, request, PlacementConfig(percentage_of_nodes_to_score=100))
    assert full.evaluated == full.feasible == 1000
    # Sampling trades optimality for latency but never feasibility.
    assert a.node_id is not None and a.scores[0].total <= full.scores[0].total


def test_pending_large_cluster_evaluates_everything() -> None:
    d = decide(cluster(300), WorkloadRequest(id="w", cpu_millicores=10_000))
    assert d.node_id is None and d.evaluated == 300 and len(d.rejections) == 300
    assert d.explain() == (
        "0/300 nodes available: 300 insufficient cpu (needs 10000m, best node has 4000m free)"
    )


class OnlyEvenNodes(Filter):
    """A custom dynamic filter: proves the Protocol is the extension point."""

    name = "only_even"
    static = False

    def applies(self, request: WorkloadRequest, ctx: PlacementContext) -> bool:
        return True

    def check(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> Status | None:
        return None if int(node.id[1:]) % 2 == 0 else Status("odd", "odd node", self.name)


class PreferHighIds(Scorer):
    name = "high_ids"

    def constant(self, request: WorkloadRequest, ctx: PlacementContext) -> float | None:
        return None

    def score(self, node: NodeInfo, request: WorkloadRequest, ctx: PlacementContext) -> float:
        return float(int(node.id[1:]) % 100)


def test_custom_plugins() -> None:
    assert isinstance(OnlyEvenNodes(), Filter) and isinstance(PreferHighIds(), Scorer)
    config = PlacementConfig(
        filters=(*DEFAULT_FILTERS, OnlyEvenNodes()),
        scorers=(PreferHighIds(),),
        weights={"high_ids": 1.0},
        percentage_of_nodes_to_score=100,
    )
    d = decide(cluster(10), WorkloadRequest(id="w"), config)
    assert d.node_id == "n0008" and d.feasible == 5
    assert d.explain().endswith("; rejected: 5 odd node")
    assert list(d.scores[0].breakdown) == ["high_ids"]


def test_default_scorers_registered_in_weights() -> None:
    names = {s.name for s in DEFAULT_SCORERS}
    assert set(PlacementConfig().weights) == names


def test_static_verdicts_survive_rebuilds_and_follow_changed_nodes() -> None:
    """Memoised static verdicts (labels, taints, readiness) are shared across snapshots of the
    same node set; a node whose static facts change has its verdicts recomputed, not all."""
    nodes = [NodeInfo(id=f"n{i}", cpu_millicores=4000, memory_mb=8192, labels={"disk": "hdd"}) for i in range(4)]
    memo: dict[object, object] = {}
    ssd = WorkloadRequest(id="w", cpu_millicores=100, node_selector={"disk": "ssd"})
    first = Snapshot(tuple(nodes)).sharing_static_caches(memo)
    assert decide(first, ssd).node_id is None
    assert memo, "the verdicts were memoised"

    relabelled = [*nodes[:2], NodeInfo(id="n2", cpu_millicores=4000, memory_mb=8192, labels={"disk": "ssd"}), nodes[3]]
    stale = Snapshot(tuple(relabelled)).sharing_static_caches(memo)
    assert decide(stale, ssd).node_id is None  # the contract: the caller must say what changed
    refresh_static_verdicts(stale, ["n2"])
    assert decide(stale, ssd).node_id == "n2"
    assert decide(Snapshot(tuple(relabelled)), ssd).node_id == "n2"  # same as an unmemoised snapshot


def test_replacing_nodes_matches_a_snapshot_built_from_scratch() -> None:
    nodes = [NodeInfo(id=f"n{i}", cpu_millicores=4000, memory_mb=8192, service_counts={f"s{i % 3}": 1})
             for i in range(6)]
    base = Snapshot(tuple(nodes))
    changed = [
        NodeInfo(id="n1", cpu_millicores=4000, memory_mb=8192, service_counts={"s0": 2, "s9": 1}),
        NodeInfo(id="n4", cpu_millicores=4000, memory_mb=8192, service_counts={},
                 taints=(Taint("spot", "true", "PreferNoSchedule"),)),
    ]
    replaced = base.replacing(changed)
    fresh = Snapshot(tuple(changed[0] if n.id == "n1" else changed[1] if n.id == "n4" else n for n in nodes))
    assert replaced.effective == fresh.effective
    assert replaced.static.service_nodes == fresh.static.service_nodes
    assert (replaced.static.has_soft_taints, replaced.static.has_hard_taints) == (True, False)
    request = WorkloadRequest(id="w", cpu_millicores=100, service="s0")
    assert decide(replaced, request) == decide(fresh, request)
    with pytest.raises(KeyError):
        base.replacing([NodeInfo(id="new")])


@pytest.mark.parametrize("percentage", [2, None, 100])
def test_walking_only_statically_passing_nodes_changes_nothing(percentage: int | None) -> None:
    """decide() skips statically rejected nodes in bulk unless a dynamic filter precedes a static
    one for the request (then it walks node by node): both walks give the same decision."""
    nodes = tuple(
        NodeInfo(id=f"n{i:04d}", cpu_millicores=4000, memory_mb=8192, committed_cpu=(i * 613) % 4000,
                 labels={"zone": "abc"[i % 3], "disk": "ssd" if i % 4 else "hdd"},
                 taints=(Taint("gpu", "true", "NoSchedule"),) if i % 10 == 0 else ())
        for i in range(1000)
    )
    snap = Snapshot(nodes)
    config = PlacementConfig(percentage_of_nodes_to_score=percentage)
    for k in range(40):
        selector = [{}, {"zone": "abc"[k % 3]}, {"disk": "ssd", "zone": "b"}, {"zone": "none"}][k % 4]
        plain = WorkloadRequest(id=f"w{k}", cpu_millicores=500 + 100 * (k % 20), node_selector=selector)
        # excluding a node that does not exist rejects nothing, but puts a dynamic filter first
        stepwise = WorkloadRequest(id=f"w{k}", cpu_millicores=500 + 100 * (k % 20), node_selector=selector,
                                   excluded_nodes=frozenset({"absent"}))
        fast, slow = decide(snap, plain, config), decide(snap, stepwise, config)
        assert (fast.node_id, fast.feasible, fast.evaluated, fast.rejections, fast.scores) == (
            slow.node_id, slow.feasible, slow.evaluated, slow.rejections, slow.scores), k
