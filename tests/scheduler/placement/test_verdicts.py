"""Bit-set verdicts and lazily expanded rejections (placement/verdicts.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from persys.scheduler.placement import (
    NodeInfo,
    PlacementConfig,
    Snapshot,
    Status,
    WorkloadRequest,
    aggregate_rejections,
    decide,
)
from persys.scheduler.placement.nodebits import bits_of, positions, range_bits
from persys.scheduler.placement.verdicts import Rejections


@given(st.sets(st.integers(0, 2000)))
def test_positions_and_bits_of_are_inverse(indices: set[int]) -> None:
    bits = bits_of(indices, 2001)
    assert bits == sum(1 << i for i in indices)
    assert positions(bits) == sorted(indices)


@given(st.integers(1, 300), st.data())
def test_range_bits_wraps_around(n: int, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, n - 1))
    last = data.draw(st.integers(0, n - 1))
    walked = list(range(start, last + 1)) if start <= last else [*range(start, n), *range(last + 1)]
    assert positions(range_bits(start, last, n)) == sorted(walked)


def test_rejections_expand_lazily_and_summarise_by_counting() -> None:
    order = [NodeInfo(id=f"n{i}") for i in range(6)]
    tainted = Status("untolerated_taint", "untolerated taint gpu=true:NoSchedule", "taint_toleration")
    small = Status("insufficient_cpu", "insufficient cpu", "cpu_fit", 2000, 500, "cpu")
    smaller = Status("insufficient_cpu", "insufficient cpu", "cpu_fit", 2000, 100, "cpu")
    rejected = Rejections({"n1": small, "n4": smaller}, [(tainted, bits_of([0, 3, 5], 6))], order)
    assert len(rejected) == 5 and rejected._expanded is None  # counted without expanding
    assert rejected.summary() == (
        "3 untolerated taint gpu=true:NoSchedule, 2 insufficient cpu (needs 2000m, best node has 500m free)")
    assert rejected.summary() == aggregate_rejections(rejected.values())
    assert dict(rejected) == {"n0": tainted, "n1": small, "n3": tainted, "n4": smaller, "n5": tainted}
    assert rejected.get("n2") is None and "n5" in rejected


def test_a_sampled_decision_counts_only_the_walked_range() -> None:
    """With sampling, the explanation counts the statically rejected nodes the walk passed, not
    all of them: the same figures as a node-by-node count of the decision's rejections."""
    nodes = tuple(NodeInfo(id=f"n{i:04d}", cpu_millicores=4000, memory_mb=8192,
                           labels={"disk": "ssd" if i % 3 else "hdd"}) for i in range(3000))
    request = WorkloadRequest(id="w", cpu_millicores=100, node_selector={"disk": "ssd"})
    d = decide(Snapshot(nodes), request, PlacementConfig(percentage_of_nodes_to_score=2))
    assert d.evaluated < 3000 and d.feasible == 100
    assert len(d.rejections) == d.evaluated - d.feasible
    assert f"{len(d.rejections)} node selector disk=ssd not matched" in d.explain()
