"""Counterfactual properties (hypothesis): every proposed change, once applied, places the
workload (the engine on the changed snapshot); and no smaller change of the same kind does: one
unit more of a reduced resource (a single-resource cut), any one toleration, label edit or moved
instance fewer, each leaves it Pending. A plan of an operation never changes its input."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_placement_properties import nodes_st, request_st

from persys.scheduler.placement import (
    Change,
    Cluster,
    Operation,
    PlacementConfig,
    Running,
    Snapshot,
    WorkloadRequest,
    apply_change,
    counterfactuals,
    decide,
    plan_operation,
)

pytestmark = pytest.mark.slow  # pure, but a minute of examples: the full suite runs them, the fast lane not

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CONFIG = PlacementConfig(percentage_of_nodes_to_score=100)


@st.composite
def cluster_st(draw: Any) -> tuple[Cluster, WorkloadRequest]:
    nodes = draw(nodes_st(min_size=1, max_size=6))
    ids = [n.id for n in nodes]
    running = []
    placed = []
    for i, node in enumerate(nodes):  # a few instances per node, their requests its committed figures
        here = []
        for k in range(draw(st.integers(0, 3))):
            cpu = draw(st.integers(0, max(0, node.cpu_millicores // 2)))
            mem = draw(st.integers(0, max(0, node.memory_mb // 2)))
            req = WorkloadRequest(id=f"r{i}-{k}", cpu_millicores=cpu, memory_mb=mem)
            here.append(req)
            running.append(Running(req, node.id, "" if draw(st.integers(0, 4)) else "pinned here"))
        placed.append(dataclasses.replace(
            node, runtimes=node.runtimes | {"container"}, ready=node.ready or draw(st.booleans()),
            committed_cpu=min(node.cpu_millicores, sum(r.cpu_millicores for r in here)),
            committed_memory_mb=min(node.memory_mb, sum(r.memory_mb for r in here)), committed_disk_mb=0,
            workload_count=len(here)))
    request = draw(request_st(0, ids))
    # Mostly what counterfactuals can change (resources, tolerations, labels, cordons, room);
    # a runtime, a feature or a driver no node has is left to the scenarios.
    request = dataclasses.replace(request, type="container", pinned_node=None, excluded_nodes=frozenset(), disk_mb=0,
                                  volume_drivers=frozenset(), required_features=frozenset(),
                                  cpu_millicores=draw(st.integers(0, 4000)), memory_mb=draw(st.integers(0, 8192)))
    return Cluster(Snapshot(tuple(placed)), tuple(running)), request


def placed(snapshot: Snapshot, request: WorkloadRequest) -> bool:
    return decide(snapshot, request, CONFIG).placed


def smaller_changes(change: Change) -> list[Change]:
    """The changes of the same kind one step smaller."""
    if change.kind == "resources" and len(change.resources) == 1:
        (r, v), = change.resources.items()
        return [dataclasses.replace(change, resources={r: v + 1})]
    if change.kind == "tolerate":
        return [dataclasses.replace(change, tolerations=tuple(t for t in change.tolerations if t != drop))
                for drop in change.tolerations]
    if change.kind == "label-node":
        return [dataclasses.replace(change, labels={k: v for k, v in change.labels.items() if k != drop})
                for drop in change.labels]
    if change.kind == "free-node":
        return [dataclasses.replace(change, moves=tuple(m for m in change.moves if m != drop)) for drop in change.moves]
    return []


@SETTINGS
@given(cluster_st())
def test_every_change_places_it_and_no_smaller_one_does(drawn: tuple[Cluster, WorkloadRequest]) -> None:
    cluster, request = drawn
    found = counterfactuals(cluster, request, CONFIG)
    if found.decision.placed:
        assert found.changes == ()
        return
    for change in found.changes:
        event(change.kind)
        snapshot, changed = apply_change(cluster, request, change)
        d = decide(snapshot, changed, CONFIG)
        assert d.placed and d.feasible == change.fits and d.node_id == change.lands_on, change
        for smaller in smaller_changes(change):
            snap, req = apply_change(cluster, request, smaller)
            assert not placed(snap, req), (change, smaller)
    costs = [c.cost for c in found.changes]
    assert costs == sorted(costs)


@SETTINGS
@given(cluster_st(), st.sampled_from(["drain", "cordon", "lose-node"]), st.data())
def test_operation_plans_account_for_every_affected_instance(drawn: tuple[Cluster, WorkloadRequest], kind: str,
                                                            data: Any) -> None:
    cluster, _ = drawn
    node = data.draw(st.sampled_from(cluster.snapshot.ids))
    before = list(cluster.snapshot.effective)
    plan = plan_operation(cluster, Operation(kind, nodes=(node,)), CONFIG)
    assert list(cluster.snapshot.effective) == before
    on_node = {r.request.id for r in cluster.running if r.node_id == node}
    accounted = [o.instance for o in plan.moves + plan.stranded] + [s.instance for s in plan.stays]
    assert sorted(accounted) == sorted(on_node)  # each exactly once
    assert all(o.to_node != node for o in plan.moves)  # never back onto the node taken away


@SETTINGS
@given(cluster_st())
def test_every_reason_starts_with_the_counted_one(drawn: tuple[Cluster, WorkloadRequest]) -> None:
    """A pending decision's detailed nodes: their first reason is the one the aggregated line
    counts, and each listed reason is a filter that rejects the node when asked alone."""
    from persys.scheduler.placement import DEFAULT_FILTERS, PlacementContext

    cluster, request = drawn
    d = decide(cluster.snapshot, request, CONFIG)
    if d.placed:
        assert not d.reasons
        return
    assert set(d.reasons) <= set(d.rejections)
    ctx = PlacementContext(cluster.snapshot, request)
    for node_id, statuses in d.reasons.items():
        assert statuses and statuses[0] == d.rejections[node_id]
        node = cluster.snapshot.node(node_id)
        assert node is not None
        failing = [f.check(node, request, ctx) for f in DEFAULT_FILTERS if f.applies(request, ctx)]
        assert list(statuses) == [st for st in failing if st is not None]
